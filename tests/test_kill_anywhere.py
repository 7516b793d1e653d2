"""A kill anywhere gives the same result: `coscale run` SIGKILLed, restarted, compared.

The tiny pipeline (configs/tiny.yaml) runs once uninterrupted with its commit points logged
(``COSCALE_COMMIT_LOG``). Then the same command runs in a chain of processes, each one killed
with SIGKILL (``COSCALE_KILL_AT=<label>``) at the next chosen point, and restarted until one
finishes. The chosen points: inside each stage that trains, right after each stage's last-step
checkpoint (before its end-of-epoch work), and between each stage's end and its state file.
A second test kills by a timer, at no commit point. The final ``pipeline_state.json``
(pools, histories, N, groups, bank, replay buffer, spend, results) and the final weights must
equal those of the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _cmd(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "coscale",
        "run",
        "--config",
        str(TINY),
        "--pipeline.run_dir",
        str(run_dir),
        "--pipeline.logger",
        "csv",
        "--pipeline.checkpoint_every_n_steps",
        "1",
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCALE_KILL")}
    return {**env, **extra}  # COSCALE_CACHE: the session's (conftest), so the model is built once


def _run(run_dir: Path, **extra: str) -> int:
    out = run_dir.parent / f"{run_dir.name}.log"
    with open(out, "a") as log:
        return subprocess.run(_cmd(run_dir), env=_env(**extra), stdout=log, stderr=log).returncode


def _final(run_dir: Path) -> tuple[dict, dict]:
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    weights = load_file(run_dir / "final" / "model" / "model.safetensors")
    return state, weights


def _assert_same(got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    (state, weights), (ref_state, ref_weights) = got, want
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
    labels = [line.split("\t", 1)[1] for line in commits.read_text().splitlines()]
    return _final(run_dir), labels


def _kill_points(labels: list[str]) -> list[str]:
    """The points to kill at, in the order a run reaches them."""
    points = []
    for stage in ("warmup", "it1/sft", "it1/eval", "it1/rl", "final/retrain", "final"):
        steps = [x for x in labels if x.startswith(f"{stage} ckpt step")]
        if stage in ("warmup", "it1/rl", "final/retrain"):
            points.append(steps[len(steps) // 2])  # inside the stage
        if stage in ("it1/sft", "it1/rl"):
            points.append(steps[-1])  # right after its last-step checkpoint
        # between the stage's end and its state file
        points += [x for x in labels if x == f"{stage} end, before the state file"]
    assert points == sorted(set(points), key=labels.index), points
    return points


def test_sigkill_at_every_kind_of_commit_point_resumes_to_the_same_result(uninterrupted, tmp_path):
    want, labels = uninterrupted
    points = _kill_points(labels)
    # every stage that trains is killed inside and after its last step; every stage at its end
    assert len(points) == 11, points
    run_dir = tmp_path / "run"
    for point in points:
        assert _run(run_dir, COSCALE_KILL_AT=point) == -signal.SIGKILL, point
    assert _run(run_dir) == 0
    _assert_same(_final(run_dir), want)


def test_sigkill_by_a_timer_inside_the_rl_stage_resumes_to_the_same_result(uninterrupted, tmp_path):
    want, _ = uninterrupted
    run_dir = tmp_path / "run"
    log = tmp_path / "timer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_cmd(run_dir), env=_env(), stdout=out, stderr=out)
        deadline = time.time() + 600
        while "== stage it1/rl" not in log.read_text() and proc.poll() is None:
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # somewhere in the RL epochs, at no particular point
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _run(run_dir) == 0
    _assert_same(_final(run_dir), want)
