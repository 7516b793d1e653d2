"""Names changed by the one-rule renaming (settings groups are ``<Thing>Settings``; samples per
problem are ``samples``): the old names still work for one release, each with a warning that
names the new one, and a pickle that names an old class (a checkpoint's hyper-parameters)
loads the new one."""

import builtins
import dataclasses
import importlib
import pickle
import sys
import typing
import zipfile

import pytest
import torch

from coscale.renamed import GOES_IN

RENAMED = [
    ("coscale.modules.grpo_settings", "Update", "UpdateSettings"),
    ("coscale.modules.settings", "PolicyLoad", "PolicyLoadSettings"),
    ("coscale.modules.settings", "AdamW", "AdamWSettings"),
    ("coscale.modules.settings", "Validation", "ValidationSettings"),
    ("coscale.rollout.vllm.settings", "Engine", "EngineSettings"),
    ("coscale.rollout.vllm.settings", "Sync", "SyncSettings"),
    ("coscale.rollout.vllm.settings", "Parity", "ParitySettings"),
    ("coscale.rollout.vllm.server.settings", "Server", "ServerSettings"),
    ("coscale.rl.mismatch", "Mismatch", "MismatchSettings"),
    ("coscale.rl.losses", "Mismatch", "MismatchSettings"),
    ("coscale.sft.distill", "Distillation", "DistillationSettings"),
    ("coscale.measure.selection", "Selection", "SelectionSettings"),
    ("coscale.callbacks", "Selection", "SelectionSettings"),
    ("coscale.callbacks", "SFTLoop", "SFTLoopSettings"),
    ("coscale.callbacks.sft_in_fit", "SFTLoop", "SFTLoopSettings"),
    ("coscale.datamodules.problems", "ReadOptions", "ReadSettings"),
    ("coscale.loop.pools", "PoolRules", "PoolSettings"),
    ("coscale.pipeline", "PipelineConfig", "PipelineSettings"),
    ("coscale.run.settings", "RunSampling", "RunSamplingSettings"),
    ("coscale.app.evaluate", "EvalConfig", "EvalSettings"),
    ("coscale.models.prompting", "PromptFormat", "PromptSettings"),
    ("coscale.tasks.fields", "FieldMap", "FieldSettings"),
    ("coscale.tasks.loaders", "FieldMap", "FieldSettings"),
    ("coscale.tasks", "FieldMap", "FieldSettings"),
    ("coscale.rollout.factory", "Rollout", "RolloutSettings"),
    ("coscale.callbacks", "PassRateEvaluation", "PassRateMeasurement"),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED, ids=[f"{m}.{o}" for m, o, _ in RENAMED])
def test_an_old_class_name_warns_and_is_the_new_class(module, old, new):
    mod = importlib.import_module(module)
    assert new.endswith("Settings") or old in ("PassRateEvaluation",)
    with pytest.warns(
        FutureWarning, match=rf"{module}\.{old} is now {new} \({old} goes in coscale {GOES_IN}"
    ):
        assert getattr(mod, old) is getattr(mod, new)
    with pytest.warns(FutureWarning):  # a checkpoint pickled before the rename names the old one
        assert pickle.loads(f"c{module}\n{old}\n.".encode()) is getattr(mod, new)
    with pytest.raises(AttributeError, match=rf"module '{module}' has no attribute 'Nothing'"):
        mod.Nothing  # noqa: B018


def test_old_argument_names_warn_and_set_the_new_one():
    from coscale.loop.solution_sources import TeacherSolutions
    from coscale.measure.pass_rate_measurement import PassRateMeasurement
    from coscale.measure.selection import SelectionSettings
    from coscale.rollout.vllm.settings import ParitySettings, settings_errors

    with pytest.warns(FutureWarning, match=r"PassRateMeasurement\(k=\.\.\.\) is now samples="):
        assert PassRateMeasurement(k=3).samples == 3
    with pytest.warns(
        FutureWarning, match=r"TeacherSolutions\(samples_per_problem=\.\.\.\) is now"
    ):
        assert TeacherSolutions("m", samples_per_problem=3).samples == 3
    with pytest.warns(FutureWarning, match=r"ParitySettings\(samples=\.\.\.\) is now prompts= "):
        parity = ParitySettings(samples=2)
    assert (parity.prompts, parity.samples) == (2, None)
    assert ParitySettings(prompts=2) == parity
    with pytest.warns(FutureWarning, match=r"SelectionSettings\(k=\.\.\.\) is now samples="):
        assert SelectionSettings(k=2) == SelectionSettings(samples=2)
    with pytest.warns(FutureWarning):  # the old key in a run's YAML mapping, not refused
        assert settings_errors({"parity": {"samples": 0}}) == [
            "parity.prompts must be an int >= 1, got 0"
        ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: __import__("coscale.pipeline").pipeline.PipelineSettings(
            model="m", measure_samples=5, measure_k=3
        ),
        lambda: __import__("coscale.callbacks").callbacks.FinalRetrain(judge_samples=4, judge_k=2),
        lambda: __import__("coscale.rollout.vllm.settings").rollout.vllm.settings.ParitySettings(
            prompts=3, samples=2
        ),
    ],
    ids=["pipeline", "FinalRetrain", "ParitySettings"],
)
def test_an_old_and_a_new_name_set_together_are_refused(build):
    with pytest.raises(ValueError, match=r"is the earlier name of (measure|judge_)?\w+; set"):
        build()


class _Unresolved(dict):
    """Names a module imports only for type checkers (``peft.PeftConfig``): ``object``."""

    def __init__(self, module: str) -> None:
        super().__init__()
        self.known = vars(sys.modules[module]).keys() | vars(builtins).keys()

    def __missing__(self, name: str) -> type:
        if name in self.known:
            raise KeyError(name)
        return object


def _hints(obj) -> dict:
    return typing.get_type_hints(obj, localns=_Unresolved(obj.__module__))


def _groups(hints: dict, seen: set) -> None:
    """The dataclasses among ``hints``' types (unions and containers opened), and theirs."""
    stack = list(hints.values())
    while stack:
        tp = stack.pop()
        stack += typing.get_args(tp)
        if dataclasses.is_dataclass(tp) and tp.__module__.startswith("coscale") and tp not in seen:
            seen.add(tp)
            stack += _hints(tp).values()


def test_every_settings_group_a_user_sets_is_named_thing_settings():
    from coscale.app.evaluate import EvalSettings
    from coscale.callbacks import FinalRetrain, ReDistillation, RolloutNSchedule
    from coscale.datamodules import ProblemDataModule
    from coscale.loop.solution_sources import TeacherSolutions
    from coscale.measure.pass_rate_measurement import PassRateMeasurement
    from coscale.modules import GRPOModule, SFTModule
    from coscale.pipeline import PipelineSettings
    from coscale.rollout.vllm.settings import GROUPS

    seen: set = set()
    for owner in (GRPOModule, SFTModule, ProblemDataModule, FinalRetrain, ReDistillation,
                  RolloutNSchedule, PassRateMeasurement, TeacherSolutions):  # fmt: skip
        _groups(_hints(owner.__init__), seen)
    _groups({"": PipelineSettings, "e": EvalSettings, **GROUPS}, seen)
    names = {tp.__name__ for tp in seen}
    assert {"PipelineSettings", "AdamWSettings", "EngineSettings", "FinalSettings"} <= names
    # SamplingParams keeps vLLM's name: it is also what a backend is handed with each call
    assert sorted(n for n in names if not n.endswith("Settings")) == ["SamplingParams"]


def test_a_checkpoint_holding_the_prompt_class_under_its_old_name_loads_weights_only(tmp_path):
    from coscale.models.prompting import PromptSettings

    new, old = tmp_path / "new.ckpt", tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"prompt": PromptSettings(template="Q: {question}")}}, new)
    with zipfile.ZipFile(new) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():  # the pickle as a release before the rename wrote it
            data = src.read(item)
            if item.filename.endswith("data.pkl"):
                assert b"PromptSettings" in data
                data = data.replace(b"PromptSettings", b"PromptFormat")
            dst.writestr(item, data)
    loaded = torch.load(old, weights_only=True)["hyper_parameters"]["prompt"]
    assert loaded == PromptSettings(template="Q: {question}")
