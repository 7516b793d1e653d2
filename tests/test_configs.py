"""Every shipped YAML parses, reads its data and builds its modules, offline.

Names that would reach the network resolve to small local stand-ins (`offline_hub`): a hub
model name (``Qwen/Qwen2.5-0.5B-Instruct``) or a packaged GGUF model (about 30 s to convert) becomes
a tiny chat model built in a temporary folder; ``datasets.load_dataset`` serves a few in-memory
rows with the columns of the published data set it is asked for, and refuses any other name,
as an offline machine would. ``builtin:`` models and problem sets are built for real.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from coscale.app.cli import lightning_cli, pipeline_parser
from coscale.datamodules import ProblemDataModule
from coscale.models import gguf, policy
from coscale.modules import GRPOModule, SFTModule
from coscale.pipeline import Pipeline, PipelineSettings
from coscale.tasks.benchmarks import load_benchmark, parse_source

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted(ROOT.glob("configs/overlays/*.yaml"))
"""Partial configs given after a whole one (``--config base.yaml --config overlay.yaml``); each
names its bases on a ``# on:`` line."""
CONFIGS = sorted(
    {*ROOT.glob("configs/**/*.yaml"), *ROOT.glob("coscale/configs/*.yaml")} - set(OVERLAYS)
)
IDS = [str(p.relative_to(ROOT)) for p in CONFIGS]
QWEN = ROOT / "configs" / "run" / "qwen2.5-0.5b"
EIGHT_GPUS = ROOT / "configs" / "overlays" / "8gpu_fsdp.yaml"
CHEAP_BUILTIN_MODELS = ("builtin:demo", "builtin:tiny")  # shipped, or built in a second
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = "What is 2+3?"

# ------------------------------------------------------------------ hub data stand-ins
OMR_ANSWERS = {"Find 2+3.": "5", "How many primes are below 10?": "4", "Solve x+1=3.": "2"}
OMR_SOLUTIONS = 3  # distinct generated solutions per answerable problem
OMR_VAL = {"Find 13+13.": "26"}  # on the validation side of the hash split (coscale.tasks.sides)


def _omr_row(
    problem: str, answer: str, solution: str, kind: str = "has_answer_extracted"
) -> dict[str, Any]:
    """One row of nvidia/OpenMathReasoning (split ``cot``): one generated solution."""
    return {
        "expected_answer": answer,
        "problem_type": kind,
        "problem_source": "aops_c4_high_school_math",
        "generation_model": "DeepSeek-R1",
        "pass_rate_72b_tir": "0.5",
        "problem": problem,
        "generated_solution": solution,
        "inference_mode": "cot",
    }


def _omr_rows() -> list[dict[str, Any]]:
    """Solutions of each problem spread over the split (as in the real one), a repeated
    solution, and a proof row that the ``openmathreasoning`` source filters out."""
    rows = [
        _omr_row(q, a, f"Attempt {i}: the answer is \\boxed{{{a}}}.")
        for i in range(OMR_SOLUTIONS)
        for q, a in (OMR_ANSWERS | OMR_VAL).items()
    ]
    rows.insert(2, dict(rows[0]))  # the same solution twice: merged once
    rows.append(_omr_row("Prove that 7 is prime.", "n/a", "Proof.", kind="converted_proof"))
    return rows


def _math500_rows() -> list[dict[str, Any]]:
    """HuggingFaceH4/MATH-500 (split ``test``): one row per problem, with an id."""
    columns = ("problem", "solution", "answer", "subject", "level", "unique_id")
    return [
        dict(zip(columns, (f"Compute {i}+{i}.", f"{2 * i}", str(2 * i), "Algebra", 1, f"t/{i}")))
        for i in range(1, 5)
    ]


def _amc_rows() -> list[dict[str, Any]]:
    """AI-MO/aimo-validation-amc (split ``train``): numeric answers."""
    return [{"id": i, "problem": f"Find {i}*7.", "answer": 7.0 * i, "url": "u"} for i in (1, 2)]


def _olymmath_rows(level: str) -> list[dict[str, Any]]:
    """RUC-AIBOX/OlymMATH, subset ``en-<level>`` (split ``test``)."""
    return [
        {"unique_id": f"{level}-{i}", "problem": f"{level}: {i}^2?", "answer": str(i * i),
         "subject": "Number Theory"}
        for i in (2, 3)
    ]  # fmt: skip


HUB_DATA = {  # (path, subset, split) -> rows, with the published columns
    ("nvidia/OpenMathReasoning", None, "cot"): _omr_rows(),
    ("HuggingFaceH4/MATH-500", None, "test"): _math500_rows(),
    ("AI-MO/aimo-validation-amc", None, "train"): _amc_rows(),
    ("RUC-AIBOX/OlymMATH", "en-easy", "test"): _olymmath_rows("easy"),
    ("RUC-AIBOX/OlymMATH", "en-hard", "test"): _olymmath_rows("hard"),
}


@dataclass
class Hub:
    """What the configs asked the (stand-in) hub for."""

    models: list[str] = field(default_factory=list)
    datasets: list[tuple[str, str | None, str]] = field(default_factory=list)


@pytest.fixture(scope="module")
def stand_in_model(tmp_path_factory) -> str:
    """A 1-layer character-level Llama whose tokenizer has a ChatML chat template."""
    from coscale.models.tiny import build_char_tokenizer, save_tiny

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHATML
    folder = tmp_path_factory.mktemp("stand_in_model")
    sizes = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    return str(save_tiny(folder, tokenizer, **sizes))


def install_stand_ins(stand_in_model: str, setattr_=setattr) -> Hub:
    """Model names and hub data sets resolved to the stand-ins (``setattr_``: pytest's
    ``monkeypatch.setattr``, or plain ``setattr`` in a worker process); returns what was asked."""
    import datasets

    hub, resolve = Hub(), policy.resolve_model_path

    def resolve_model_path(name: str) -> str:
        if name.startswith(CHEAP_BUILTIN_MODELS) or Path(name).exists():
            return resolve(name)
        packaged = name.removeprefix(policy.BUILTIN_PREFIX).partition("?")[0]
        if name.startswith(policy.BUILTIN_PREFIX) and packaged not in gguf.PACKAGED:
            return resolve(name)  # an unknown builtin: its own error
        hub.models.append(name)
        return stand_in_model

    def load_dataset(path, name=None, split=None, streaming=False, **kwargs):
        key = (path, name, split)
        if key not in HUB_DATA:
            raise FileNotFoundError(f"{key} is not in the offline stand-in hub")
        hub.datasets.append(key)
        data = datasets.Dataset.from_list(HUB_DATA[key])
        return data.to_iterable_dataset() if streaming else data

    setattr_(policy, "resolve_model_path", resolve_model_path)
    setattr_(datasets, "load_dataset", load_dataset)
    return hub


@pytest.fixture
def offline_hub(monkeypatch, stand_in_model) -> Hub:
    """Model names and hub data sets resolved to the stand-ins; returns what was asked for."""
    return install_stand_ins(stand_in_model, monkeypatch.setattr)


# ---------------------------------------------------------------------- building a config
def _kind(path: Path) -> str:
    """``eval``, ``pipeline`` (coscale run) or ``fit`` (LightningCLI), by the top-level keys."""
    keys = yaml.safe_load(path.read_text())
    return "eval" if "eval" in keys else "pipeline" if "pipeline" in keys else "fit"


def _model_of(path: Path) -> str:
    """The model a config names: ``pipeline.model``, ``eval.model`` or its module's."""
    config = yaml.safe_load(path.read_text())
    return (config.get("pipeline") or config.get("eval") or config["model"]["init_args"])["model"]


def _pipeline(*paths: Path) -> Any:
    """``coscale run``'s parse of ``paths`` in turn: ``.pipeline`` and ``.data`` (not loaded)."""
    parser = pipeline_parser()
    return parser.instantiate(parser.parse_args([a for p in paths for a in ("--config", str(p))]))


def _stage_modules(config: PipelineSettings, data: ProblemDataModule) -> list[Any]:
    """The SFT and GRPO modules the stages build, from the arguments a `Pipeline` makes."""
    ctx = Pipeline(replace(config, logger="none"), data).ctx
    return [
        SFTModule(model=config.model, peft=config.peft, **ctx.sft_args),
        GRPOModule(model=config.model, peft=config.peft, **ctx.grpo_args),
    ]


def _check_prompt(module: Any) -> None:
    """The module's prompt format renders a question with its policy's tokenizer (a chat
    template where ``chat: true``)."""
    assert QUESTION in module.prompts_for([QUESTION])[0]


def _check_pipeline(path: Path) -> None:
    """``coscale run``'s parse and data load, then the stages' SFT and GRPO modules."""
    init = _pipeline(path)
    assert isinstance(init.pipeline, PipelineSettings)
    assert isinstance(init.data, ProblemDataModule)
    init.data.load()
    assert init.data.problems
    for module in _stage_modules(init.pipeline, init.data):
        assert module.policy is not None
        _check_prompt(module)


def _check_fit(path: Path) -> None:
    """``coscale fit``'s LightningCLI objects, and the DataModule's data."""
    cli = lightning_cli(["--config", str(path), "--trainer.logger=false"], run=False)
    assert cli.model.policy is not None
    _check_prompt(cli.model)
    assert isinstance(cli.datamodule, ProblemDataModule)
    cli.datamodule.load()
    assert cli.datamodule.problems


def _check_eval(path: Path) -> None:
    """`run_eval`'s steps short of sampling: benchmarks, tokenizer, prompts."""
    from coscale.app.evaluate import EvalSettings, eval_parser

    parser = eval_parser()
    config = parser.instantiate(parser.parse_args(["--config", str(path)])).eval
    assert isinstance(config, EvalSettings)
    benchmarks = {parse_source(s).name: load_benchmark(s) for s in config.benchmarks}
    assert len(benchmarks) == len(config.benchmarks) and all(benchmarks.values())
    tokenizer = policy.load_tokenizer(config.tokenizer or config.model)
    assert QUESTION in config.prompt(QUESTION, tokenizer)


CHECKS = {"eval": _check_eval, "pipeline": _check_pipeline, "fit": _check_fit}


# -------------------------------------------------------------------------------- tests
def test_there_are_configs():
    assert len(CONFIGS) >= 3
    assert {_kind(p) for p in CONFIGS} == set(CHECKS)


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_config_parses_loads_its_data_and_builds_its_modules(
    path, tmp_path, monkeypatch, offline_hub
):
    monkeypatch.chdir(tmp_path)
    assert path.read_text().startswith("#"), (
        "every config opens with what it trains and how to launch it"
    )
    CHECKS[_kind(path)](path)
    assert set(offline_hub.models) <= {_model_of(path)}  # the only stand-in model


def _overlay_pairs() -> list[tuple[Path, Path]]:
    pairs = []
    for overlay in OVERLAYS:
        (line,) = [x for x in overlay.read_text().splitlines() if x.startswith("# on: ")]
        pairs += [(ROOT / base, overlay) for base in line.removeprefix("# on: ").split()]
    return pairs


@pytest.mark.parametrize(
    "base, overlay", _overlay_pairs(), ids=[f"{b.name}+{o.name}" for b, o in _overlay_pairs()]
)
def test_an_overlay_over_each_config_it_names_builds_the_stage_modules(
    base, overlay, tmp_path, monkeypatch, offline_hub
):
    monkeypatch.chdir(tmp_path)
    assert base.exists() and base in CONFIGS, base
    init = _pipeline(base, overlay)
    plain = _pipeline(base)
    init.data.load()
    changed = yaml.safe_load(overlay.read_text())["pipeline"]
    if "peft" in changed:
        from coscale.models.adapters import has_adapter

        assert all(has_adapter(m.policy) for m in _stage_modules(init.pipeline, init.data))
    for group in ("sft", "grpo"):  # the overlay's settings replace, the others are kept
        new = changed.get(group, {}).get("optimizer", {})
        merged = asdict(getattr(init.pipeline, group)["optimizer"])
        kept = asdict(getattr(plain.pipeline, group)["optimizer"])
        assert merged == kept | new, group


def test_offline_hub_refuses_names_it_does_not_hold(offline_hub):
    with pytest.raises(ValueError, match="could not load problem source 'typo'"):
        load_benchmark("typo?path=nvidia/OpenMathReasonin")
    with pytest.raises(ValueError, match="could not load source='HuggingFaceH4/MATH-5000'"):
        ProblemDataModule(train="HuggingFaceH4/MATH-5000", read={"split": "test"}).load()
    with pytest.raises(ValueError, match="unknown builtin model"):
        policy.resolve_model_path("builtin:nope")


@pytest.mark.parametrize("overlays", [(), (EIGHT_GPUS,)], ids=["1gpu", "8gpu_fsdp"])
def test_qwen_pipelines_train_on_openmathreasoning_with_solutions_merged(overlays, offline_hub):
    """Data scaling needs many solutions per problem: the OpenMathReasoning rows of one
    problem become one training problem with all its distinct solutions."""
    data = _pipeline(QWEN / "pipeline_1gpu.yaml", *overlays).data
    data.load()
    problems = list(data.problems.values())
    solutions = {p.question: len(p.solutions) for p in problems}
    assert len(problems) == len(OMR_ANSWERS), f"one problem per row, not per question: {solutions}"
    assert solutions == dict.fromkeys(OMR_ANSWERS, OMR_SOLUTIONS)  # proof row dropped
    assert ("nvidia/OpenMathReasoning", None, "cot") in offline_hub.datasets
    assert {p.question: p.answer for p in problems} == OMR_ANSWERS
    assert data.curriculum.bank.total() == 0  # handed out per round by the pipeline
    # validation: the same source's problems on the other side of the hash split
    assert {p.question: p.answer for p in data.val_problems} == OMR_VAL


def test_the_8gpu_overlay_splits_the_1gpu_run_over_8_ranks():
    """Same stages, hyper-parameters, validation and data family; batches per rank; more
    problems: the overlay changes placement, batch sizes and the training slice only."""
    base, overlay = QWEN / "pipeline_1gpu.yaml", yaml.safe_load(EIGHT_GPUS.read_text())
    assert set(overlay) == {"pipeline", "data"} and set(overlay["pipeline"]) == {
        "run_dir",
        "trainer",
    }
    assert set(overlay["pipeline"]["trainer"]) == {"devices", "num_nodes", "strategy"}
    one, eight = _pipeline(base), _pipeline(base, EIGHT_GPUS)
    ranks = eight.pipeline.trainer["strategy"]._data_parallel_size
    assert ranks == eight.pipeline.trainer["devices"] == 8
    for key in ("batch_size", "sft_batch_size"):
        assert getattr(one.data, key) == ranks * getattr(eight.data, key), key
    assert one.data.val_source == eight.data.val_source
    small, large = parse_source(one.data.train_source), parse_source(eight.data.train_source)
    assert replace(small, limit=None, max_rows=None) == replace(large, limit=None, max_rows=None)
    assert small.limit * ranks == large.limit and small.max_rows * ranks == large.max_rows


# ------------------------------------------------- the first steps and saves of every pipeline
PIPELINES = [p for p in CONFIGS if _kind(p) == "pipeline"]
WORKER = Path(__file__).with_name("config_worker.py")


def _processes(path: Path) -> int:
    """CPU processes the config's own strategy runs on here: 2 for a multi-device one."""
    trainer = yaml.safe_load(path.read_text())["pipeline"].get("trainer", {})
    return 2 if trainer.get("devices", 1) != 1 or "strategy" in trainer else 1


def _saves_on_two_processes(path: Path, stand_in: str, out: Path) -> list[dict[str, Any]]:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(WORKER), str(path), stand_in, str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=out)
    assert (out / "first_saves.json").exists(), done.stderr[-4000:]
    return json.loads((out / "first_saves.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", PIPELINES, ids=[str(p.relative_to(ROOT)) for p in PIPELINES])
def test_pipeline_config_trains_its_first_stage_to_its_second_checkpoint(
    path, tmp_path, monkeypatch, offline_hub, stand_in_model
):
    """The config's own stages, settings and strategy (FSDP2 on 2 CPU processes for the 8-GPU
    config), on CPU stand-ins, with a checkpoint after every step: the first fit takes its first
    optimiser steps and replaces its first checkpoint by a second one (where FSDP2 used to fail:
    a folder of shards cannot be renamed over another)."""
    from config_worker import first_saves

    monkeypatch.chdir(tmp_path)
    processes = _processes(path)
    if processes == 1:
        saves = first_saves(path, tmp_path / "run")
    else:
        saves = _saves_on_two_processes(path, stand_in_model, tmp_path)
    first, second = saves
    assert first["stage"] == second["stage"] in ("warmup", "it1/sft")
    assert first["step"] >= 1 and second["checkpoint"] != first["checkpoint"]
    assert second["world_size"] == processes
    last, before = Path(second["checkpoint"]), Path(first["checkpoint"]).name
    kept = [name + suffix for name in (before, last.name) for suffix in ("", ".manifest.json")]
    assert sorted(p.name for p in last.parent.iterdir()) == sorted(["latest", *kept])
    if processes == 1:
        assert second["strategy"] == "SingleDeviceStrategy"
        assert torch.load(last, weights_only=False)["global_step"] == second["step"]
    else:  # the config's strategy: a folder of one shard per rank
        assert second["strategy"] == "ModelParallelStrategy"
        assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
        assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == second["step"]
