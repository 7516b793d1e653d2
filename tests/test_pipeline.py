"""`coscale run --config configs/run/tiny.yaml` end to end, its W&B offline run, export and resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from coscale.app.cli import main
from coscale.run.plan import plan, upgrade_state
from coscale.run.settings import FinalSettings
from coscale.sft.distill import DistillationSettings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "run" / "tiny.yaml"
STAGES = ["warmup", "it1/scale", "it1/sft", "it1/measure", "it1/rl", "final/retrain", "final"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_pipeline_runs_every_stage(tmp_path, capfd, caplog, recwarn, wandb_log):
    run_dir = tmp_path / "run"
    assert main(["run", "--config", str(TINY), "--pipeline.run_dir", str(run_dir)]) == 0
    out, err = capfd.readouterr()
    for stage in STAGES:
        assert f"== stage {stage} |" in out
    # one program's console: Lightning's banner once for four fits, no tip or library warning
    # a user cannot act on, one bar per fit that names its stage
    console = out + err + caplog.text + "".join(str(w.message) for w in recwarn)
    assert console.count("GPU available:") == 1 and "litlogger" not in console
    for noise in ("LeafSpec", "IterableDataset", "in eval mode", "Loading weights"):
        assert noise not in console, noise
    for fit in ("warmup epoch 40/40", "it1/sft epoch 40/40", "it1/rl epoch 2/2: 100%"):
        assert fit in out, fit
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"] == STAGES
    counts = state["results"]["pools"]
    assert sum(counts.values()) == 48
    assert counts["solvable"] + counts["solved"] > 0  # SFT moved problems inside the boundary
    assert set(state["results"]["final"]) >= {"val/final_before_pass@1", "val/final_after_pass@1"}
    # each stage's wall time split: a measurement samples, an SFT stage trains and selects
    timing = state["timing"]
    assert set(timing) == set(STAGES)
    assert timing["it1/measure"]["sampling"] > 0 and timing["it1/sft"]["other"] > 0
    for stage, parts in timing.items():
        seconds = sum(v for k, v in parts.items() if k != "engine_starts")
        assert seconds == pytest.approx(state["seconds"][stage], abs=0.3), stage
    assert "[coscale] it1/measure took" in out and "sampling" in out
    # each measurement's per-problem counts and labels, as the pools took them
    measured = json.loads((run_dir / "it1" / "measure" / "pass_rates.json").read_text())
    assert 0 < len(measured) <= 48
    assert all(
        set(r) == {"samples", "correct", "pool", "solutions", "rl_rounds"}
        for r in measured.values()
    )
    # the W&B offline run holds pool sizes, pass rates, N per group and a completions table
    keys = [
        b"pool/solvable",
        b"pool/unsolvable",
        b"pool/pass@1",
        b"sched/n_group0",
        b"sched/n_eff_group0",
        b"train/reward",
        b"train/entropy",
        b"train/rewards/MathReward",  # each reward function's mean (the default: MathReward)
        b"train/correct",
        b"completions",
        b"curriculum",  # the pools-over-time table
    ]
    data = wandb_log(run_dir / "logs" / "wandb", keys)
    for key in keys:
        assert key in data, key
    # every stage's model is a plain HF folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for stage in ["it1/sft", "it1/rl", "final"]:
        folder = run_dir / stage / "model"
        assert (folder / "model.safetensors").exists() and (
            folder / "generation_config.json"
        ).exists()
    AutoModelForCausalLM.from_pretrained(run_dir / "final" / "model")
    AutoTokenizer.from_pretrained(run_dir / "final" / "model")


def _pipeline(tmp_path, data=None, **settings):
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineSettings

    rows = [{"id": i, "question": f"{i}+1", "answer": "2"} for i in "abc"]
    cfg = PipelineSettings(model="unused", run_dir=str(tmp_path), logger="none", **settings)
    return Pipeline(cfg, ProblemDataModule(train=rows, **(data or {})))


def test_the_run_closes_its_one_engine_at_its_end_and_when_a_stage_fails(tmp_path):
    pipe = _pipeline(tmp_path)
    closed = []
    pipe.ctx.engine.close = lambda: closed.append("close")

    def fails(name):
        raise RuntimeError("stage failed")

    pipe.warmup = fails  # the runner is looked up when the stage runs
    with pytest.raises(RuntimeError, match="stage failed"):
        pipe.run()
    assert closed == ["close"]  # a vLLM engine's memory is not left behind
    done = _pipeline(tmp_path / "done")
    done.ctx.engine.close = lambda: closed.append("end")
    for kind in ("warmup", "scale", "sft", "measure", "rl", "final"):
        setattr(done, kind, lambda name: None)
    done.run()
    assert closed == ["close", "end"]


class _StubSFT:
    """Stands in for SFTModule in stage tests: records how it was built, exports a folder."""

    built: ClassVar[list[dict]] = []  # every instance's arguments, in order

    def __init__(self, model, **kwargs):
        self.model = model
        _StubSFT.built.append({"model": model, **kwargs})

    def export(self, path):
        return str(path)


def _capture_sft_stage(pipe, monkeypatch) -> list[dict]:
    """Runs nothing: every fit records what it would train on and with which limits."""
    seen: list[dict] = []

    def fake_fit(name, module, data, callbacks, epochs, max_steps=None):
        seen.append(
            {"name": name, "items": data.items("sft"), "epochs": epochs, "max_steps": max_steps}
        )

    monkeypatch.setattr("coscale.stages.sft.SFTModule", _StubSFT)
    pipe.ctx.fit = fake_fit
    return seen


def test_redistillation_uses_the_data_sections_redistill_settings(tmp_path, monkeypatch):
    # the first build ran per-iteration re-distillation with its own defaults (1 per problem,
    # cap 1000) instead of data.redistill_per_problem / redistill_max_total
    data = {
        "curriculum": {"redistill_per_problem": 2, "redistill_max_total": 3},
        "bank_solutions": 0,
    }
    pipe = _pipeline(tmp_path, data=data, sft_max_steps=7)
    seen = _capture_sft_stage(pipe, monkeypatch)
    pipe.data.load()
    cur = pipe.curriculum
    for step, (pid, text) in enumerate([("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")]):
        cur.bank.record_rollout(pid, text, True, step)
    pipe.sft("it1/redistill")
    (fit,) = seen
    texts = [item["solution"] for item in fit["items"]]
    assert texts == [t for _, t in cur.bank.redistill_set(2, 3, seed=0)] and len(texts) == 3
    assert set(texts) <= {"a3", "a2", "b1"}  # 2 latest of a, 1 of b, capped at 3
    assert fit["max_steps"] == 7  # sft_max_steps reaches every SFT stage
    assert pipe.models["it1/redistill"].endswith("it1/redistill/model")


def test_final_sft_epochs_reach_only_the_final_retrain(tmp_path, monkeypatch):
    pipe = _pipeline(tmp_path, sft_epochs=3, final={"epochs": 11})
    seen = _capture_sft_stage(pipe, monkeypatch)
    pipe.data.load()
    pipe.curriculum.bank.record_rollout("a", "2", True, 0)  # something to train on
    for name in ("it1/sft", "it1/redistill", "final/retrain"):
        pipe.sft(name)
    assert [(fit["name"], fit["epochs"]) for fit in seen] == [
        ("it1/sft", 3),
        ("it1/redistill", 3),
        ("final/retrain", 11),
    ]
    plain = _pipeline(tmp_path / "plain", sft_epochs=3)  # unset: the final retrain's too
    seen = _capture_sft_stage(plain, monkeypatch)
    plain.data.load()
    plain.curriculum.bank.record_rollout("a", "2", True, 0)
    plain.sft("final/retrain")
    assert seen[0]["epochs"] == 3
    from coscale.pipeline import PipelineSettings

    with pytest.raises(ValueError, match=r"final\.epochs must be an int >= 1 or None"):
        PipelineSettings(model="m", final={"epochs": 0})


def test_final_sft_source_shapes_only_the_final_retrain(tmp_path, monkeypatch):
    pipe = _pipeline(tmp_path, final={"source": "bank"}, data={"bank_solutions": 0})
    seen = _capture_sft_stage(pipe, monkeypatch)
    pipe.data.load()
    pipe.curriculum.bank.add("a", "a-bank")
    pipe.curriculum.bank.record_rollout("b", "b-rl", True, 0)
    pipe.sft("it1/sft")
    pipe.sft("final/retrain")
    texts = [sorted(item["solution"] for item in fit["items"]) for fit in seen]
    assert texts == [["a-bank", "b-rl"], ["a-bank"]]  # the rollouts stay out of the final set
    from coscale.pipeline import PipelineSettings

    with pytest.raises(ValueError, match=r"final\.source must be one of bank, redistill, all"):
        PipelineSettings(model="m", final={"source": "rollouts"})


def test_sft_after_rl_distils_from_the_latest_rl_model(tmp_path, monkeypatch):
    pipe = _pipeline(tmp_path, distill_weight=0.4, iterations=3)  # it2/redistill in the plan
    _capture_sft_stage(pipe, monkeypatch)
    pipe.data.load()
    pipe.curriculum.bank.record_rollout("a", "2", True, 0)  # something to train on
    _StubSFT.built.clear()
    pipe.sft("it1/sft")  # no RL yet: plain SFT
    pipe.models["it1/rl"] = "runs/x/it1/rl/model"
    pipe.sft("it1/redistill")
    pipe.models["it2/rl"] = "runs/x/it2/rl/model"
    pipe.sft("it2/redistill")
    first, redistill, later = _StubSFT.built
    assert "distill" not in first
    assert redistill["distill"] == DistillationSettings("runs/x/it1/rl/model", weight=0.4)
    assert later["distill"].teacher == "runs/x/it2/rl/model"
    pipe.sft(
        "final/retrain"
    )  # the final retrain too; final/measure and final/rl then start from it
    assert _StubSFT.built[-1]["distill"].teacher == "runs/x/it2/rl/model"
    assert pipe.current == pipe.models["final/retrain"]
    off = _pipeline(tmp_path / "off", distill_weight=0.0)
    _capture_sft_stage(off, monkeypatch)
    off.data.load()
    off.curriculum.bank.record_rollout("a", "2", True, 0)
    off.models["it1/rl"] = "runs/x/it1/rl/model"
    _StubSFT.built.clear()
    off.sft("it1/redistill")
    assert "distill" not in _StubSFT.built[0]  # weight 0: the paper's token-only SFT


def _stage_plan(tmp_path, **settings) -> list[str]:
    """The stages a pipeline runs, in order (every stage stubbed)."""
    pipe, plan = _pipeline(tmp_path, **settings), []
    for stage in ("warmup", "scale", "sft", "measure", "rl", "final"):
        setattr(pipe, stage, lambda name: plan.append(name))
    pipe.run()
    return plan


def test_redistillation_each_iteration_or_only_through_the_next_sft(tmp_path):
    plan = _stage_plan(tmp_path / "a", iterations=3)
    assert plan == [
        "warmup",
        *[f"it{i}/{s}" for i in (1, 2) for s in ("scale", "sft", "measure", "rl", "redistill")],
        *[f"it3/{s}" for s in ("scale", "sft", "measure", "rl")],  # last: the final retrain
        "final/retrain",
        "final",
    ]
    plan = _stage_plan(tmp_path / "b", iterations=3, redistill_each_iteration=False)
    assert not any(name.endswith("/redistill") for name in plan) and plan[-1] == "final"
    plan = _stage_plan(
        tmp_path / "c", iterations=2, redistill_each_iteration=False, final={"retrain": False}
    )
    assert plan[-1] == "it2/redistill" and "it1/redistill" not in plan
    plan = _stage_plan(tmp_path / "d", iterations=1, final={"rl": True})
    assert plan[-4:] == ["final/retrain", "final/measure", "final/rl", "final"]


def test_stages_carry_their_kind_and_iteration_as_data(tmp_path):
    from coscale.run.plan import Stage

    pipe = _pipeline(tmp_path, iterations=2, final={"rl": True})
    assert list(pipe.plan.values())[:2] == [
        Stage("warmup", "warmup", 0),
        Stage("it1/scale", "scale", 1),
    ]
    assert pipe.plan["it1/redistill"] == Stage("it1/redistill", "redistill", 1)
    assert [pipe.plan[n] for n in ("final/retrain", "final/measure", "final/rl", "final")] == [
        Stage("final/retrain", "retrain", None),
        Stage("final/measure", "measure", None),
        Stage("final/rl", "rl", None),
        Stage("final", "final", None),
    ]
    # what the models are to later stages follows the records: the final RL model is not an
    # iteration's (a later SFT distils from it2/rl), the last iteration's model comes before it
    pipe.models = {"it1/rl": "r1", "it1/redistill": "d1", "it2/rl": "r2", "final/rl": "f1"}
    assert pipe._latest_rl() == "r2" and pipe._before_final() == "r2"
    assert pipe._iteration_model(1) == "d1" and pipe._iteration_model(2) == "r2"


def test_final_judges_the_retrain_after_its_rl_against_the_last_iterations_model(
    tmp_path, monkeypatch
):
    from coscale import pipeline as pipeline_module

    pipe, calls = _pipeline(tmp_path, iterations=1, final={"rl": True}), []
    pipe.models = {"it1/sft": "s1", "it1/rl": "r1", "final/retrain": "f0", "final/rl": "f1"}

    def fake_final(ctx, name, current, candidate, earlier):
        calls.append((current, candidate))
        return {}, candidate

    monkeypatch.setattr(pipeline_module, "final_stage", fake_final)
    pipe.final("final")
    del pipe.models["final/rl"]  # RL had nothing solvable: the retrain itself
    pipe.final("final")
    assert calls == [("r1", "f1"), ("r1", "f0")]


def test_eval_max_problems_measures_a_seeded_subset_each_time(tmp_path):
    """A measurement of a large problem set can take a subset: ``measure_max_problems`` of the
    unfailed problems get K samples, a new seeded subset at each measurement."""
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineSettings

    rows = [{"id": f"p{i}", "question": f"{i}+1", "answer": str(i + 1)} for i in range(6)]
    model = "builtin:tiny?hidden_size=32&num_layers=1&seed=0"
    settings = {"run_dir": str(tmp_path), "logger": "none", "measure_samples": 1}
    cfg = PipelineSettings(model=model, measure_max_problems=2, **settings)
    pipe = Pipeline(cfg, ProblemDataModule(train=rows))
    pipe.data.load()
    pools = pipe.curriculum.pools
    measured = []
    for _ in range(3):
        pipe.measure("it1/measure")
        measured.append({p for p in pipe.curriculum.problems if pools.history(p)})
    sizes = [len(m) for m in measured]
    assert sizes[0] == 2 and sizes[0] < sizes[1] <= sizes[2] <= 6  # 2 more problems each time
    every = Pipeline(PipelineSettings(model=model, **settings), ProblemDataModule(train=rows))
    every.data.load()
    every.measure("it1/measure")
    assert all(every.curriculum.pools.history(p) for p in every.curriculum.problems)


def test_settings_are_checked_before_any_work():
    from coscale.pipeline import PipelineSettings

    with pytest.raises(ValueError, match="sft_max_steps must be an int >= 1"):
        PipelineSettings(model="m", sft_max_steps=0)
    with pytest.raises(ValueError, match=r"final\.keep must be one of"):
        PipelineSettings(model="m", final={"keep": "newest"})
    with pytest.raises(ValueError) as err:
        PipelineSettings(
            model="m", grpo={"lrr": 1e-3}, sft={"optimizer": {"lr": 1e-3}},
            schedule={"n_init": -4},
        )  # fmt: skip
    msg = str(err.value)
    assert "grpo: Option 'lrr' is not accepted (GRPOModule takes: " in msg and "sft" not in msg
    assert "schedule.n_init must be an int >= 1, got -4" in msg
    with pytest.raises(ValueError) as err:  # wrong types, and ranges the modules check
        PipelineSettings(model="m", grpo={"optimizer": {"lr": "fast"}}, sft={"max_length": 1})
    msg = str(err.value)
    assert "grpo: Parser key \"optimizer.lr\": Expected a <class 'float'>. Got value: fast" in msg
    assert "sft.max_length must be an int >= 2, got 1" in msg


def test_trainer_keys_are_lightning_trainer_arguments_the_stages_leave_to_the_user():
    from coscale.pipeline import PipelineSettings

    with pytest.raises(ValueError) as err:
        PipelineSettings(model="m", trainer={"max_epoch": 3, "acelerator": "cpu", "zzz": 1})
    msg = str(err.value)
    assert "trainer.max_epoch is not a lightning.Trainer argument (did you mean max_epochs" in msg
    assert "trainer.acelerator is not a lightning.Trainer argument (did you mean accelerator" in msg
    assert "trainer.zzz is not a lightning.Trainer argument;" in msg + ";"
    with pytest.raises(ValueError, match=r"trainer\.max_epochs is set by each stage: use pipe"):
        PipelineSettings(model="m", trainer={"max_epochs": 3})
    # Trainer's own arguments, and the run's precision: auto
    PipelineSettings(model="m", trainer={"accelerator": "cpu", "precision": "auto", "devices": 2})
    with pytest.raises(ValueError, match=r"distill_weight must be in \[0, 1\]; got 2"):
        PipelineSettings(model="m", distill_weight=2)
    with pytest.raises(ValueError, match=r"sft\.distill is set by the run .* pipeline\.distill_w"):
        PipelineSettings(model="m", sft={"distill": {"teacher": "other"}})
    with pytest.raises(ValueError, match=r"grpo\.model is set by the run .* set pipeline\.model"):
        PipelineSettings(model="m", grpo={"model": "other"})
    ok = {"loss": {"class_path": "coscale.rl.losses.DAPOLoss", "init_args": {"epsilon": 0.2}}}
    PipelineSettings(model="m", grpo=ok, sampling={"prompt": {"template": "Q:{question}"}})
    # the run's one sampling definition: a module's own copy is refused, naming where it goes
    with pytest.raises(ValueError) as err:
        PipelineSettings(
            model="m",
            sft={"prompt": "Q:{question}", "validation": {"max_new_tokens": 9}},
            grpo={"rollout": {"backend": "vllm"}, "sampling": {"temperature": 0.5, "seed": 3}},
        )
    msg = str(err.value)
    for key, where in (
        ("sft.prompt", "pipeline.sampling.prompt"),
        ("sft.validation.max_new_tokens", "pipeline.sampling.max_new_tokens"),
        ("grpo.rollout", "pipeline.rollout"),
        ("grpo.sampling.temperature", "pipeline.sampling.temperature"),
    ):
        assert f"{key} is set by the run for every stage: set {where} instead" in msg
    assert "seed" not in msg  # GRPO's own sampling seed stays its setting
    with pytest.raises(ValueError, match=r"sampling\.max_new_tokens must be an int >= 1"):
        PipelineSettings(model="m", sampling={"max_new_tokens": 0})
    with pytest.raises(ValueError, match=r"rollout\.backend must be one of auto, cached"):
        PipelineSettings(model="m", rollout={"backend": "fast"})


class _StubGRPO:
    """Stands in for GRPOModule in the RL stage: no model, no backend."""

    lr, _backend = 1e-3, None

    def __init__(self, model, **kwargs):
        pass

    def export(self, path):
        return str(path)


def test_the_schedule_is_built_once_and_each_rl_stage_starts_it_afresh(tmp_path, monkeypatch):
    from coscale.loop.schedule import NSchedule
    from coscale.stages.rl import rl_stage

    pipe = _pipeline(tmp_path, schedule={"num_groups": 2, "n_init": 3})
    sched = pipe.curriculum.schedule
    assert isinstance(sched, NSchedule) and sched.n == [3, 3]
    pipe.data.load()
    pipe.curriculum.record_measurement({"a": (4, 1)})  # something solvable
    sched.n, sched.best, sched.stalled = [9, 6], [0.5, None], [1, 0]  # as the last RL stage left it
    monkeypatch.setattr("coscale.stages.rl.GRPOModule", _StubGRPO)
    pipe.ctx.fit = pipe.ctx.attach = lambda *args, **kwargs: None
    rl_stage(pipe.ctx, "it2/rl", "m")
    assert pipe.curriculum.schedule is sched  # the same object, not a new one from the dict
    assert (sched.n, sched.best, sched.stalled) == ([3, 3], [None, None], [0, 0])
    assert pipe.curriculum.n_per_problem == {"a": 3}
    # a schedule the data's curriculum holds is refused, never silently replaced
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline

    data = ProblemDataModule(train=[{"id": "a", "question": "1+1", "answer": "2"}])
    data.curriculum.use_schedule(NSchedule(n_init=5))
    with pytest.raises(ValueError, match=r"takes it from pipeline\.schedule only"):
        Pipeline(pipe.cfg, data)


def test_stage_fits_carry_the_commit_checkpoint_and_resume_from_it(tmp_path):
    from coscale.loop.checkpoint_store import switch_to
    from coscale.run.checkpoint import CommitCheckpoint, RunState
    from coscale.run.epoch_counts import WholeEpochCounts

    with pytest.raises(ValueError, match="checkpoint_every_n_steps must be an int >= 1, got 0"):
        _pipeline(tmp_path, checkpoint_every_n_steps=0)
    pipe = _pipeline(tmp_path, checkpoint_every_n_steps=25)
    seen = []

    class _Trainer:
        global_step = 7  # the fit's steps: the stage's share of the run's step axis

        def fit(self, module, datamodule, ckpt_path):
            seen.append(ckpt_path)

    def fake_trainer(name, callbacks, epochs, max_steps=None):
        seen.append(callbacks)
        return _Trainer()

    pipe.ctx.trainer = fake_trainer
    pipe.ctx.fit("it1/sft", module=SimpleNamespace(), data=None, callbacks=[], epochs=1)
    assert pipe.ctx.fit_steps == 7
    (state, counts, ckpt), resume = seen
    assert isinstance(state, RunState) and isinstance(ckpt, CommitCheckpoint)
    assert isinstance(counts, WholeEpochCounts)
    assert ckpt.every_n_steps == 25 and resume is None
    assert ckpt.dirpath == str(tmp_path / "it1" / "sft" / "ckpt") and ckpt.last() is None
    folder = tmp_path / "it1" / "sft" / "ckpt"
    (folder / "v000001.ckpt").mkdir(parents=True)  # a folder of shards, as FSDP2 writes
    (folder / "v000002.ckpt").write_text("half")  # a save killed before its switch
    switch_to(str(folder / "v000001.ckpt"))
    pipe.ctx.fit("it1/sft", module=SimpleNamespace(), data=None, callbacks=[], epochs=1)
    assert seen[-1] == str(folder / "v000001.ckpt")  # the stage resumes from its whole version
    # the switch removed it; the whole version has its manifest
    assert sorted(os.listdir(folder)) == ["latest", "v000001.ckpt", "v000001.ckpt.manifest.json"]


def test_final_keep_best_keeps_an_earlier_iteration_that_scores_higher(tmp_path, monkeypatch):
    from coscale.stages import final as final_module

    def folder(name):
        path = tmp_path / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "who").write_text(name)
        return str(path)

    scores = {"last": 0.4, "retrain": 0.2, "it1": 0.5, "it2": 0.3}
    judged = []

    def fake_judge(ctx, model, problems, tag, k):
        judged.append(tag)
        return {f"val/final_{tag}_pass@1": scores[os.path.basename(model)]}

    monkeypatch.setattr(final_module, "judge_model", fake_judge)
    monkeypatch.setattr(final_module, "judged_problems", lambda held_out, curriculum: [])
    pipe = _pipeline(tmp_path / "run", final={"keep": "best"}, iterations=3)
    earlier = [(1, folder("it1")), (2, folder("it2"))]
    out, kept = final_module.final_stage(
        pipe.ctx, "final", folder("last"), folder("retrain"), earlier
    )
    assert judged == ["before", "after", "it2", "it1"]  # latest first
    assert out["val/final_kept_retrained"] == 0.0 and out["val/final_kept_iteration"] == 1.0
    assert Path(kept, "who").read_text() == "it1"
    # a tie with what the final stage kept keeps the final stage's model
    scores.update(it1=0.4, it2=0.4)
    out, kept = final_module.final_stage(
        pipe.ctx, "final2", folder("last"), folder("retrain"), earlier
    )
    assert out["val/final_kept_iteration"] == 0.0 and Path(kept, "who").read_text() == "last"
    # two earlier iterations tie above it: the later one (2) is kept
    scores.update(it1=0.5, it2=0.5)
    out, kept = final_module.final_stage(
        pipe.ctx, "final3", folder("last"), folder("retrain"), earlier
    )
    assert out["val/final_kept_iteration"] == 2.0 and Path(kept, "who").read_text() == "it2"
    # retrained: the paper's choice, whatever the scores
    pipe.cfg.final = FinalSettings(keep="retrained")
    out, kept = final_module.final_stage(
        pipe.ctx, "final4", folder("last"), folder("retrain"), earlier
    )
    assert Path(kept, "who").read_text() == "retrain" and "val/final_kept_iteration" not in out


def test_a_state_file_of_an_earlier_release_resumes_under_todays_stage_names():
    old = {
        "done": ["warmup", "it1/scale", "it1/sft", "it1/eval"],
        "current": "runs/x/it1/sft/model",
        "models": {"it1/sft": "runs/x/it1/sft/model"},
        "results": {"it1/eval": {"solvable": 3}, "spend": {"it1/eval": {"rollouts": 8}}},
        "seconds": {"it1/eval": 1.5},
        "curriculum": {},
    }
    new = upgrade_state(old)
    assert new["done"][-1] == "it1/measure" and new["done"][:3] == old["done"][:3]
    assert new["results"] == {
        "it1/measure": {"solvable": 3},
        "spend": {"it1/measure": {"rollouts": 8}},
    }
    assert new["seconds"] == {"it1/measure": 1.5} and new["timing"] == {}
    assert new["models"] == old["models"] and upgrade_state(new) == new
    from coscale.pipeline import PipelineSettings

    assert "it1/measure" in plan(PipelineSettings(model="m"))  # the names the plan runs


def test_the_settings_renamed_to_measure_keep_their_old_names_for_one_release():
    from coscale.callbacks import FinalRetrain
    from coscale.pipeline import PipelineSettings

    with pytest.warns(FutureWarning, match=r"pipeline\.eval_k is now pipeline\.measure_samples"):
        cfg = PipelineSettings(model="m", eval_k=4, rl_eval_every=2)
    assert (cfg.measure_samples, cfg.rl_measure_every, cfg.eval_k) == (4, 2, None)
    with pytest.warns(FutureWarning, match=r"measure_k is now pipeline\.measure_samples"):
        assert PipelineSettings(model="m", measure_k=3).measure_samples == 3
    for old in ("eval_k", "judge_k"):
        with pytest.warns(
            FutureWarning, match=rf"FinalRetrain\({old}=\.\.\.\) is now judge_samples="
        ):
            assert FinalRetrain(**{old: 3}).judge_samples == 3
