"""A kill anywhere gives the same result: `coscale run` SIGKILLed, restarted, compared.

Each config runs once uninterrupted with its commit points logged (``COSCALE_COMMIT_LOG``). Then
the same command runs in a chain of processes, each one SIGKILLed (``COSCALE_KILL_AT=<label>``)
at the next chosen point and restarted until one finishes; the final ``pipeline_state.json``
(pools, histories, N, groups, bank, replay buffer, spend, results) and the final weights must
equal those of the uninterrupted run of the same strategy, bit for bit. What is covered:

* configs/run/tiny.yaml, one process: inside each stage that trains, right after each stage's
  last-step checkpoint (before its end-of-epoch work), between each stage's end and its state
  file; and once by a timer, at no commit point, logging to W&B (offline) as the config ships:
  the two processes leave one W&B run on one rising step axis, its final model an artifact.
* configs/run/tiny.yaml with tests/configs/tiny_lora.yaml over it, one process: every stage trains a
  LoRA adapter (its checkpoints hold the adapter, not the base), killed inside the warm-up SFT,
  between a stage's end and its state file, inside RL and after its last step, inside the final
  retrain; the final weights and every stage's saved adapter must be equal.
* tests/configs/every_switch.yaml, one process: every switch the demo and the SmolLM2 configs
  turn on (checkpoint selection, re-distillation each iteration, ``distill_weight``, the
  forgetting guard, ``final.rl``, ``final.keep: better``, a replay share), killed inside a
  selection scoring, inside a distilled and guarded re-distillation, between the final judge
  and its copy, and between the final stage and the state file; and under
  tests/configs/rl_every_batch.yaml, with and without a measurement after each RL epoch, inside
  an epoch of each RL stage (both iterations', the final one).

Every kill point is asserted to lie strictly inside its stage in the reference run (an optimizer
step before it, a checkpoint of the stage after it): a run's steps depend on the CPU's numerics,
and a point that slips out of its stage would test less on that machine. The spend of every stage
(samples, SFT examples) is compared with the rest.
* tests/configs/two_ranks.yaml under DDP and under FSDP2 (2 CPU processes, gloo; an FSDP2
  checkpoint is a folder of shards): the same chain, inside a selection scoring, right after a
  last-step checkpoint, inside RL with only rank 1 killed (rank 0 then fails at its next
  collective, as a job loses one process), and between a stage's end and its state file (the
  final stage's points are the one-process chains'). The uninterrupted runs are those of
  tests/test_multiprocess.py (conftest's ``two_rank_runs``). After each kill what is left of the
  job is killed (``tests/runs.py``), as a launcher does, so each restart starts clean.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import runs
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "run" / "tiny.yaml"
EVERY_SWITCH = ROOT / "tests" / "configs" / "every_switch.yaml"
TINY_LORA = ROOT / "tests" / "configs" / "tiny_lora.yaml"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _cmd(run_dir: Path, config: Path = TINY) -> list[str]:
    return runs.command(config, run_dir, "--pipeline.checkpoint_every_n_steps", "1")


def _run(run_dir: Path, config: Path = TINY, **extra: str) -> int:
    """The config's run into ``run_dir`` (output appended to ``<run_dir>.log``); its status."""
    return runs.run(_cmd(run_dir, config), run_dir.parent / f"{run_dir.name}.log", **extra)


def _final(run_dir: Path) -> tuple[dict, dict]:
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    weights = load_file(run_dir / "final" / "model" / "model.safetensors")
    return state, weights


def _assert_same(got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    (state, weights), (ref_state, ref_weights) = got, want
    spend, ref_spend = state["results"]["spend"], ref_state["results"]["spend"]
    for stage, counts in ref_spend.items():  # samples and SFT examples, stage by stage
        assert spend.get(stage) == counts, f"{stage} spent {spend.get(stage)}, not {counts}"
    for key in ("done", "curriculum", "results", "models"):
        a, b = state[key], ref_state[key]
        if key == "models":  # folders differ by run dir only
            a, b = sorted(a), sorted(b)
        assert a == b, f"{key} differs after the kills"
    for name, tensor in ref_weights.items():
        assert torch.equal(weights[name], tensor), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full") / "run"
    commits = run_dir.parent / "commits.tsv"
    assert _run(run_dir, COSCALE_COMMIT_LOG=str(commits)) == 0
    return _final(run_dir), runs.commit_labels(commits), run_dir


def _step_of(label: str) -> int:
    """The optimizer step a checkpoint's label names (``... ckpt step 3``, ``... ckpt epoch 0
    end, step 3``)."""
    return int(label.rsplit("step ", 1)[1])


def _assert_inside(labels: list[str], point: str) -> str:
    """``point``, after asserting that it lies strictly inside its stage in the reference run:
    a checkpoint after an optimizer step of the stage, with a checkpoint of the stage after it
    (the stage's work goes on past the kill). Numerics differ between CPUs, so a stage's steps
    do too: a kill that lands elsewhere would test less on that machine, and fails here."""
    stage = point.split(" ckpt ")[0]
    ckpts = [x for x in labels if x.startswith(f"{stage} ckpt ")]
    later = ckpts[ckpts.index(point) + 1 :]
    assert _step_of(point) > 0 and later, f"{point!r} is not inside {stage}: {ckpts}"
    return point


def _mid_stage(labels: list[str], stage: str, kind: str = "") -> str:
    """The middle of the checkpoints of ``stage`` (``kind``: ``step`` for those inside an
    epoch only) that lie inside it in the reference run (:func:`_assert_inside`)."""
    ckpts = [x for x in labels if x.startswith(f"{stage} ckpt {kind}")]
    last = [x for x in labels if x.startswith(f"{stage} ckpt ")][-1]
    inside = [x for x in ckpts if _step_of(x) > 0 and x != last]
    assert inside, f"no {kind or 'checkpoint'} inside {stage} in the reference run: {ckpts}"
    return _assert_inside(labels, inside[len(inside) // 2])


def _after_a_step(labels: list[str], stage: str) -> str:
    """The first checkpoint of ``stage`` after one of its optimizer steps in the reference run,
    asserted to be there: inside the stage, before its end and its state file, though maybe
    its last checkpoint (two_ranks.yaml's RL stage is one epoch of one step here)."""
    ckpts = [x for x in labels if x.startswith(f"{stage} ckpt ") and _step_of(x) > 0]
    assert ckpts, f"{stage} took no optimizer step in the reference run on this CPU: {labels}"
    assert labels.index(ckpts[0]) < labels.index(f"{stage} end, before the state file")
    return ckpts[0]


def _last_step_of_first_epoch(labels: list[str], stage: str) -> str:
    """The last step checkpoint before the stage's first epoch-end checkpoint (the epoch's last
    step has none: its epoch-end checkpoint follows the end work, coscale.run.checkpoint).
    Killed there and again inside the next epoch, the epoch's end work and the next epoch's
    batches must each run once."""
    end = next(i for i, x in enumerate(labels) if x.startswith(f"{stage} ckpt epoch 0 end"))
    assert labels[end - 1].startswith(f"{stage} ckpt step"), labels[end - 1]
    return _assert_inside(labels, labels[end - 1])


def _kill_points(labels: list[str]) -> list[str]:
    """The points to kill at, in the order a run reaches them."""
    points = []
    for stage in ("warmup", "it1/sft", "it1/measure", "it1/rl", "final/retrain", "final"):
        steps = [x for x in labels if x.startswith(f"{stage} ckpt step")]
        if stage == "it1/rl":  # after its first epoch's last step, before that epoch's end,
            first = _last_step_of_first_epoch(labels, stage)  # then inside the next epoch
            later = steps[steps.index(first) + 1 : -1]
            assert later, f"{stage}: no step inside its second epoch to kill at ({steps})"
            points += [first, _assert_inside(labels, later[len(later) // 2])]
        if stage in ("warmup", "final/retrain"):
            points.append(_mid_stage(labels, stage, "step"))  # inside the stage
        if stage in ("it1/sft", "it1/rl"):
            points.append(_assert_inside(labels, steps[-1]))  # right after its last step
        # between the stage's end and its state file
        points += [x for x in labels if x == f"{stage} end, before the state file"]
    assert points == sorted(set(points), key=labels.index), points
    return points


def test_sigkill_at_every_kind_of_commit_point_resumes_to_the_same_result(uninterrupted, tmp_path):
    want, labels, _ = uninterrupted
    points = _kill_points(labels)
    # every stage that trains is killed inside and after its last step, RL also after its first
    # epoch's last step; every stage at its end
    assert len(points) == 12, points
    run_dir = tmp_path / "run"
    for point in points:
        assert _run(run_dir, COSCALE_KILL_AT=point) == -signal.SIGKILL, point
    assert _run(run_dir) == 0
    _assert_same(_final(run_dir), want)


WANDB = ("--pipeline.logger", "wandb", "--pipeline.wandb", '{"log_model": true}')
"""The timer chain logs to W&B (offline), as configs/run/tiny.yaml ships, its final model too."""


def test_sigkill_by_a_timer_inside_the_rl_stage_resumes_to_the_same_result(uninterrupted, tmp_path):
    want, _, ref_dir = uninterrupted
    run_dir = tmp_path / "run"
    log = tmp_path / "timer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*_cmd(run_dir), *WANDB], env=runs.env(), stdout=out, stderr=out, start_new_session=True
        )
        deadline, first_step = time.time() + 600, run_dir / "it1" / "rl" / "ckpt" / "latest"
        while not first_step.exists() and proc.poll() is None:  # RL took a step
            assert time.time() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # then somewhere in the RL epochs, at no particular point
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        runs.kill_session(proc.pid)
    killed_at = len(log.read_text())
    assert runs.run([*_cmd(run_dir), *WANDB], log) == 0
    resumed = log.read_text()[killed_at:].split("resuming after stages: ")[1].splitlines()[0]
    assert "it1/measure" in resumed and "it1/rl" not in resumed, resumed  # killed inside RL
    got = _final(run_dir)
    _assert_same(got, want)
    _assert_one_wandb_run(run_dir, got[0], _csv_steps(ref_dir))


def _csv_steps(run_dir: Path) -> set[int]:
    """The steps of the rows of the run's CSV log."""
    import csv

    (path,) = run_dir.glob("logs/*/version_*/metrics.csv")
    return {int(row["step"]) for row in csv.DictReader(path.open()) if row["step"]}


def _assert_one_wandb_run(run_dir: Path, state: dict, want_steps: set[int]) -> None:
    """The killed and restarted run is one W&B run: both processes' offline folders carry the
    run id kept in the logs folder; each logs on the run's rising step axis (Lightning's
    one-step lag allowed), the restart going on from the killed one's last checkpoint, so
    together they log the steps the uninterrupted run logs (to CSV), but those the killed run's
    W&B service had not written, and no other; one
    completions table key and the curriculum table; the whole config; the final model as a model
    artifact with its validation scores."""
    from coscale.modules.wandb_file import artifacts, history, records

    run_id = (run_dir / "logs" / "wandb_run_id").read_text().strip()
    files = sorted((run_dir / "logs" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files), files
    deadline = time.monotonic() + 30  # W&B's service may still be writing the last file
    while not any(a.type == "model" for a in artifacts(files[1])) and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = [history(f) for f in files]
    steps = [
        [r["trainer/global_step"] for r in part if "trainer/global_step" in r] for part in rows
    ]
    for part in steps:
        assert all(s >= max(part[:i], default=0) - 1 for i, s in enumerate(part)), part
    # W&B writes its file from a service process, killed with the run: the killed run's last
    # rows may not reach it (14 steps once, on a tiny model at ~10 steps/s). Only steps after
    # the last it wrote and before the restart's first optimiser step (from the last
    # checkpoint) may be missing; no step is extra
    logged = set(steps[0]) | set(steps[1])
    resumed_at = min(r["trainer/global_step"] for r in rows[1] if "train/loss" in r)
    assert logged <= want_steps, sorted(logged - want_steps)
    assert all(steps[0][-1] < s < resumed_at for s in want_steps - logged), (
        sorted(want_steps - logged),
        steps[0][-1],
        resumed_at,
    )
    assert max(steps[1]) == state["results"]["run_steps"]
    keys = {k for part in rows for r in part for k in r}
    for table in ("completions", "pool/problems"):  # one key each, growing
        assert {k for k in keys if k.startswith(table)} == {table}
    assert "curriculum" in keys and "run/stage" in keys
    config = [i.key for r in records(files[1]) if r.HasField("config") for i in r.config.update]
    assert "run" in config  # coscale.app.cli logs the whole resolved config under "run"
    (model,) = [a for a in artifacts(files[1]) if a.type == "model"]
    assert model.name == f"model-{run_id}" and "val/final_before_pass@1" in model.metadata
    paths = {entry.path for entry in model.manifest.contents}
    assert "model.safetensors" in paths


def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(uninterrupted, tmp_path):
    """Killed inside RL, its latest checkpoint then truncated (storage that lost the end of a
    write): the restart names the damage, resumes from the checkpoint before and redoes the
    step, to the uninterrupted run's result."""
    want, labels, _ = uninterrupted
    run_dir = tmp_path / "run"
    assert _run(run_dir, COSCALE_KILL_AT=_mid_stage(labels, "it1/rl", "step")) == -signal.SIGKILL
    folder = run_dir / "it1" / "rl" / "ckpt"
    latest = folder / (folder / "latest").read_text().split()[0]
    with open(latest, "r+b") as f:
        f.truncate(latest.stat().st_size // 2)
    assert _run(run_dir) == 0
    assert f"checkpoint {latest} is damaged" in (tmp_path / "run.log").read_text()
    _assert_same(_final(run_dir), want)


# -------------------------------------------------------------- LoRA, one process
def _lora_run(run_dir: Path, **extra: str) -> int:
    """configs/run/tiny.yaml with tests/configs/tiny_lora.yaml over it (every stage a LoRA)."""
    cmd = runs.command(TINY, run_dir, "--config", str(TINY_LORA))
    cmd += ["--pipeline.checkpoint_every_n_steps", "1"]
    return runs.run(cmd, run_dir.parent / f"{run_dir.name}.log", **extra)


def _adapters(run_dir: Path, state: dict) -> dict[str, dict]:
    """Each stage's saved adapter weights (``model/adapter``), by stage."""
    return {
        stage: load_file(run_dir / stage / "model" / "adapter" / "adapter_model.safetensors")
        for stage in state["models"]
    }


def test_lora_killed_inside_each_training_stage_resumes_to_the_same_result(tmp_path):
    ref_dir, commits = tmp_path / "full" / "run", tmp_path / "commits.tsv"
    ref_dir.parent.mkdir()
    assert _lora_run(ref_dir, COSCALE_COMMIT_LOG=str(commits)) == 0
    want, labels = _final(ref_dir), runs.commit_labels(commits)
    steps = {
        stage: [x for x in labels if x.startswith(f"{stage} ckpt step")]
        for stage in ("warmup", "it1/sft", "it1/rl", "final/retrain")
    }
    assert all(steps.values()), steps  # every stage trained and checkpointed
    points = [
        _mid_stage(labels, "warmup", "step"),  # inside the first adapter's SFT
        "it1/sft end, before the state file",
        _last_step_of_first_epoch(labels, "it1/rl"),  # inside RL on the SFT stage's export
        _assert_inside(labels, steps["it1/rl"][-1]),  # then right after its last step
        _mid_stage(labels, "final/retrain", "step"),
    ]
    assert points == sorted(set(points), key=labels.index) and set(points) <= set(labels), points
    run_dir = tmp_path / "run"
    for point in points:
        assert _lora_run(run_dir, COSCALE_KILL_AT=point) == -signal.SIGKILL, point
    assert _lora_run(run_dir) == 0
    got = _final(run_dir)
    _assert_same(got, want)
    ref_adapters, adapters = _adapters(ref_dir, want[0]), _adapters(run_dir, got[0])
    assert (
        ref_adapters.keys() == adapters.keys() == {"warmup", "it1/sft", "it1/rl", "final/retrain"}
    )
    for stage, tensors in ref_adapters.items():
        for name, tensor in tensors.items():
            assert torch.equal(adapters[stage][name], tensor), (stage, name)


# --------------------------------------------------------- every switch, one process
@pytest.fixture(scope="module")
def every_switch(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("every_switch") / "run"
    commits = run_dir.parent / "commits.tsv"
    assert _run(run_dir, EVERY_SWITCH, COSCALE_COMMIT_LOG=str(commits)) == 0
    return _final(run_dir), runs.commit_labels(commits), run_dir


RL_STAGES = ("it1/rl", "it2/rl", "final/rl")  # every_switch.yaml's: both iterations, final


def _every_switch_points(labels: list[str]) -> list[str]:
    points = [
        next(x for x in labels if x.startswith("it1/sft select step") and "150" not in x),
        _mid_stage(labels, "it1/redistill", "step"),  # distilled from it1/rl, guarded, selected
        "final judged, before the copy",
        "final end, before the state file",
    ]
    assert points == sorted(set(points), key=labels.index) and set(points) <= set(labels), points
    return points


def test_every_switch_killed_in_scoring_redistillation_and_judge_resumes_to_the_same_result(
    every_switch, tmp_path
):
    want, labels, ref_dir = every_switch
    # the switches did their work in the uninterrupted run: the guard froze coordinates, the
    # KL to the RL model was part of a loss, the final stage judged the RL'd retrain
    logged = _logged(ref_dir)
    assert any(v > 0 for v in logged["train/masked_frac"]) and logged["train/kl"]
    # one step axis for the run: the stages' fits follow one another, never back to 0 (a step's
    # training row comes at Lightning's step - 1, after what a callback logged at the step)
    steps, stages = logged["step"], logged["run/stage"]
    assert all(s >= max(steps[:i], default=0) - 1 for i, s in enumerate(steps))
    assert stages == sorted(stages) and len(set(stages)) > 5
    assert max(steps) == want[0]["results"]["run_steps"]
    assert {"it1/redistill", "final/rl"} <= set(want[0]["models"])
    assert "val/final_kept_retrained" in want[0]["results"]["final"]
    run_dir = tmp_path / "run"
    for point in _every_switch_points(labels):
        assert _run(run_dir, EVERY_SWITCH, COSCALE_KILL_AT=point) == -signal.SIGKILL, point
    assert _run(run_dir, EVERY_SWITCH) == 0
    _assert_same(_final(run_dir), want)


@pytest.mark.parametrize("measure_every", [1, 0])
def test_every_rl_stage_killed_inside_an_epoch_resumes_to_the_same_result(measure_every, tmp_path):
    """every_switch.yaml under tests/configs/rl_every_batch.yaml (a reward with spread in every
    group and several batches an epoch, so every RL stage steps inside its epochs on any CPU),
    with and without a measurement after each RL epoch: each RL stage (both iterations', the
    final one) killed at its middle step checkpoint inside an epoch; the curriculum, the spend
    of every stage and the weights must equal the uninterrupted run's."""
    graded = {"PYTHONPATH": f"{runs.ROOT}:{runs.ROOT / 'tests'}"}  # reward_examples
    extra = ("--config", str(ROOT / "tests" / "configs" / "rl_every_batch.yaml"))
    extra += ("--pipeline.rl_measure_every", str(measure_every))
    ref_dir, commits = tmp_path / "full" / "run", tmp_path / "commits.tsv"
    ref_dir.parent.mkdir()
    cmd = [*_cmd(ref_dir, EVERY_SWITCH), *extra]
    assert runs.run(cmd, tmp_path / "full.log", COSCALE_COMMIT_LOG=str(commits), **graded) == 0
    want, labels = _final(ref_dir), runs.commit_labels(commits)
    points = [_mid_stage(labels, stage, "step") for stage in RL_STAGES]
    assert all(want[0]["results"]["spend"][stage]["rollouts"] > 0 for stage in RL_STAGES)
    run_dir, log = tmp_path / "run", tmp_path / "chain.log"
    cmd = [*_cmd(run_dir, EVERY_SWITCH), *extra]
    for point in points:
        assert runs.run(cmd, log, COSCALE_KILL_AT=point, **graded) == -signal.SIGKILL, point
    assert runs.run(cmd, log, **graded) == 0
    _assert_same(_final(run_dir), want)


def _logged(run_dir: Path) -> dict[str, list[float]]:
    """Every value of each metric in the run's CSV log."""
    import csv

    (path,) = run_dir.glob("logs/*/version_*/metrics.csv")
    values: dict[str, list[float]] = {}
    for row in csv.DictReader(path.open()):
        for key, value in row.items():
            if value:
                values.setdefault(key, []).append(float(value))
    return values


# ------------------------------------------------------------- DDP and FSDP2, 2 ranks
def _two_rank_points(labels: list[str]) -> list[tuple[str, str | None]]:
    """(label, the one rank to kill or None for every rank), in the order a run reaches them."""
    sft_steps = [x for x in labels if x.startswith("it1/sft ckpt step")]
    points = [
        ("it1/sft select step 2 scored", None),  # inside a selection scoring
        (_assert_inside(labels, sft_steps[-1]), None),  # right after the last-step checkpoint
        (_after_a_step(labels, "it1/rl"), "1"),  # inside RL, rank 1 alone
        ("it1/rl end, before the state file", None),
    ]
    names = [p for p, _ in points]
    assert names == sorted(set(names), key=labels.index) and set(names) <= set(labels), names
    return points


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_sigkill_under_ddp_and_fsdp2_resumes_to_the_same_result(strategy, two_rank_runs, tmp_path):
    ref_dir, labels = two_rank_runs(strategy)
    run_dir = tmp_path / "run"
    cmd, log = runs.two_ranks_command(run_dir, strategy), tmp_path / "chain.log"
    for point, rank in _two_rank_points(labels):
        extra = {**runs.TWO_RANK_ENV, "COSCALE_KILL_AT": point}
        extra |= {"COSCALE_KILL_RANK": rank} if rank else {}
        before = len(log.read_text()) if log.exists() else 0
        status = runs.run(cmd, log, timeout=300, **extra)
        said = log.read_text()[before:]  # this attempt's output
        # every rank killed: rank 0's status is the SIGKILL; rank 1 alone: rank 0 fails after it
        # (exit 1), unless Lightning's observer of its dead child SIGKILLs it first (and says so)
        observed = "Child process with PID" in said and "terminated with code -9" in said
        want = (
            {-signal.SIGKILL} if rank is None else {1} | ({-signal.SIGKILL} if observed else set())
        )
        assert status in want, f"{point}: {status}\n{said[-3000:]}"
    assert runs.run(cmd, log, timeout=300, **runs.TWO_RANK_ENV) == 0, log.read_text()[-3000:]
    _assert_same(_final(run_dir), _final(ref_dir))
