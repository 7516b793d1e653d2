"""The run's one sampling definition and its one engine (`coscale.run.settings`,
`coscale.rollout.run_engine`), without an engine process: the vLLM path runs on the real engine
in tests/test_vllm_pipeline.py."""

from __future__ import annotations

import copy

import pytest
import torch

from coscale.models.prompting import PromptSettings
from coscale.rollout.base import SamplingParams
from coscale.rollout.cached.backend import CachedDecodeBackend
from coscale.rollout.factory import RolloutSettings, resolve_backend
from coscale.rollout.run_engine import RunEngine
from coscale.run.settings import RunSamplingSettings, set_by_run_errors


def test_one_definition_is_written_into_both_modules_settings():
    run = RunSamplingSettings(prompt="Q:{question}\nA:", max_new_tokens=40, temperature=0.7)
    assert run.prompt == PromptSettings(template="Q:{question}\nA:")
    sft = run.sft_args({"max_length": 96, "validation": {"samples": 4}})
    grpo = run.grpo_args({"sampling": {"seed": 3}})
    assert sft["prompt"] == grpo["prompt"] == run.prompt and sft["max_length"] == 96
    assert sft["validation"] == {"samples": 4, "max_new_tokens": 40, "temperature": 0.7}
    rollouts = {"max_new_tokens": 40, "temperature": 0.7, "top_p": 1.0, "top_k": 0}
    assert grpo["sampling"] == {"seed": 3, **rollouts}
    judged = RunSamplingSettings(temperature=1.0, judge_temperature=0.2)
    assert judged.grpo_args({})["validation"]["temperature"] == 0.2  # selection and the judge
    assert judged.grpo_args({})["sampling"]["temperature"] == 1.0  # RL and the measurements
    assert RunSamplingSettings(max_new_tokens=0, top_p=0).errors() == [
        "max_new_tokens must be an int >= 1, got 0",
        "top_p must be in (0, 1], got 0",
    ]


def test_the_clis_unset_copies_are_dropped_and_set_ones_refused():
    unset = dict.fromkeys(("max_new_tokens", "temperature", "top_p", "top_k"))
    grpo = {"sampling": {**unset, "seed": 1}}
    assert set_by_run_errors("grpo", grpo) == [] and grpo == {"sampling": {"seed": 1}}
    sft = {"validation": {"temperature": 0.3, "samples": 2}, "max_length": 64}
    (error,) = set_by_run_errors("sft", sft)
    assert error.startswith("sft.validation.temperature is set by the run for every stage: set ")
    assert "pipeline.sampling.judge_temperature" in error
    assert sft == {"validation": {"samples": 2}, "max_length": 64}


def test_auto_takes_vllm_only_on_cuda_where_it_is_installed(monkeypatch):
    kind, why = resolve_backend("auto", cuda=False)
    assert kind == "cached" and "no CUDA device" in why
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    assert resolve_backend("auto", cuda=True)[0] == "vllm"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert resolve_backend("auto", cuda=True)[0] == "cached"
    assert resolve_backend("hf", cuda=True) == ("hf", "rollout.backend=hf")


def test_on_a_gpu_the_vllm_engine_sleeps_at_level_2_unless_told(monkeypatch):
    gpu = RunEngine(RolloutSettings("vllm"), dtype="bfloat16", cuda=True)
    assert gpu.options["engine"] == {"sleep_level": 2} and gpu.dtype == "bfloat16"
    told = RunEngine(RolloutSettings("vllm", {"engine": {"sleep_level": 1}}), "float32", cuda=True)
    assert told.options["engine"] == {"sleep_level": 1}
    cpu = RunEngine(
        RolloutSettings("vllm"), "float32", cuda=False
    )  # vLLM's CPU build has no sleep mode
    assert cpu.options == {} and cpu.spec == RolloutSettings("vllm", {})


def test_one_backend_follows_each_stages_model(tiny_model, tiny_model_dir, char_tokenizer):
    engine = RunEngine(RolloutSettings("auto"), cuda=False)
    first, second = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(0.0)  # a model that samples otherwise
    backend = engine.attach(first, char_tokenizer, tiny_model_dir)
    assert isinstance(backend, CachedDecodeBackend) and backend.model is first
    assert engine.attach(second, char_tokenizer, tiny_model_dir) is backend
    assert backend.model is second and engine.starts == 0  # no engine process to start
    sampling = SamplingParams(max_new_tokens=6, seed=0)
    theirs = CachedDecodeBackend(second, char_tokenizer).generate(["1+2="], 2, sampling)
    ours = backend.generate(["1+2="], 2, sampling)
    assert torch.equal(ours.input_ids, theirs.input_ids)
    engine.release()  # a stage's end: its model can be freed
    assert backend.model is None
    assert (
        engine.attach(first, char_tokenizer, tiny_model_dir) is backend and backend.model is first
    )


def test_a_lent_backend_is_not_closed_by_the_module(tiny_model_dir):
    from coscale.modules import GRPOModule

    closed = []

    class Lent(CachedDecodeBackend):
        def close(self):
            closed.append(True)

    module = GRPOModule(model=str(tiny_model_dir))
    module.backend = Lent(module.policy, module.tokenizer)
    module.teardown("fit")
    assert closed == []
    assert RolloutSettings("fast").errors() == [
        "backend must be one of auto, cached, hf, vllm, vllm-server; got 'fast'"
    ]


def test_a_grpo_module_alone_samples_as_the_run_does_with_the_same_settings(tiny_model_dir):
    """One set of sampling defaults: GRPOModule's own `sampling` / `validation` and the run's
    `pipeline.sampling` (which the run writes into the module it builds) agree when unset, and
    when set the same way."""
    from coscale.modules import GRPOModule
    from coscale.pipeline import PipelineSettings
    from coscale.run.settings import instantiate

    def built(module_args: dict, run_sampling: dict) -> tuple[GRPOModule, GRPOModule]:
        cfg = PipelineSettings(
            model=str(tiny_model_dir), sampling=RunSamplingSettings(**run_sampling)
        )
        run_args = cfg.sampling.grpo_args(instantiate({**cfg.grpo}))
        in_run = {k: run_args[k] for k in ("sampling", "validation")}
        alone = GRPOModule(model=str(tiny_model_dir), **module_args)
        return alone, GRPOModule(model=str(tiny_model_dir), **in_run)

    for module_args, run_sampling in [
        ({}, {}),  # nothing set: the same defaults (temperature 1.0, as TRL's)
        (
            {"sampling": {"temperature": 0.6, "max_new_tokens": 32}},
            {"temperature": 0.6, "max_new_tokens": 32},
        ),
    ]:
        alone, in_run = built(module_args, run_sampling)
        assert alone.sampling == in_run.sampling, (alone.sampling, in_run.sampling)
        assert alone.val_sampling.temperature == in_run.val_sampling.temperature
    assert alone.sampling.temperature == 0.6 and built({}, {})[0].sampling.temperature == 1.0


def test_one_definition_of_the_sampling_settings_for_the_module_the_run_and_the_backends():
    from coscale.modules.grpo import GROUPS
    from coscale.rollout.base import SamplingParams, SamplingSettings
    from coscale.run.settings import SET_BY_RUN, set_by_run_errors

    assert GROUPS["sampling"] is SamplingParams
    assert issubclass(SamplingParams, SamplingSettings) and issubclass(
        RunSamplingSettings, SamplingSettings
    )
    assert RunSamplingSettings().errors() == [] and RunSamplingSettings(
        temperature=-1
    ).errors() == ["temperature must be a number >= 0, got -1"]
    with pytest.raises(ValueError, match=r"sampling: temperature must be a number >= 0, got None"):
        SamplingParams(temperature=None)  # strict, but for the run parser's all-unset group
    assert SamplingParams(None, None, None, None, seed=3).seed == 3
    # stop strings would stop RL's rollouts and not the measurements: the run refuses them
    assert ("grpo", "sampling.stop") in SET_BY_RUN
    args = {"sampling": {"stop": ["\n"], "seed": 3}}
    assert set_by_run_errors("grpo", args) == [
        "grpo.sampling.stop is not taken by coscale run yet (RL, the measurements and the judge "
        "must sample alike)"
    ]
    assert args == {"sampling": {"seed": 3}}  # GRPO's own seed stays its setting
