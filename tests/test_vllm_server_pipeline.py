"""Whole runs with their one engine a vLLM server (``pipeline.rollout.backend: vllm-server``)
and asynchronous RL (``pipeline.grpo.update.max_staleness: 1``), each server started by the run.

The tiny pipeline (`coscale run --config configs/run/tiny.yaml --config tests/configs/vllm_tiny.yaml`)
starts its server, samples the warm-up's and it1's measurements and selection scorings on it,
and then loses it: the server is SIGKILLed as RL begins. The run stops with an error naming the
server, its exit code and its log's last lines; the stages done stay done. The same command
again starts one server, resumes at RL, samples the rest (RL, the final retrain's selection,
the final judge) on it and stops it at the end.

SmolLM2-135M-Instruct (`configs/run/smollm2-135m/smoke.yaml`, one iteration): a real chat model
through every stage on a server, its RL batches sampled a step ahead.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coscale.rollout.vllm.server.launch import LAUNCHER

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1800)]
TINY = (ROOT / "configs" / "run" / "tiny.yaml", ROOT / "tests" / "configs" / "vllm_tiny.yaml")
SMOLLM2 = (ROOT / "configs" / "run" / "smollm2-135m" / "smoke.yaml",)
STARTED = "[coscale] vLLM server started at"
SAMPLED_TINY = {"warmup", "it1/sft", "it1/measure", "it1/rl", "final/retrain", "final"}


def _cmd(configs: tuple[Path, ...], run_dir: Path, server_log: Path, *extra: str) -> list[str]:
    rollout = {
        "backend": "vllm-server",
        "options": {"engine": {"kwargs": {"enforce_eager": True}}, "server": {"log": str(server_log)}},
    }  # fmt: skip
    flags = [arg for path in configs for arg in ("--config", str(path))]
    return [
        sys.executable, "-m", "coscale", "run", *flags,
        "--pipeline.rollout", json.dumps(rollout),
        "--pipeline.grpo.update.max_staleness", "1",
        "--pipeline.run_dir", str(run_dir), *extra,
    ]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COSCALE_KILL")} | extra


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "pipeline_state.json").read_text())


def _staleness(run_dir: Path) -> list[float]:
    return [
        float(row["train/staleness"])
        for path in run_dir.rglob("metrics.csv")
        for row in csv.DictReader(path.open())
        if row.get("train/staleness")
    ]


def _server_of(pid: int) -> int:
    """The pid of the vLLM server the run `pid` started (a session of its own)."""
    import psutil  # vLLM's dependency

    for child in psutil.Process(pid).children(recursive=True):
        if LAUNCHER in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"run {pid} has no vLLM server among its children")


def _kill_server_when(label: str, run: subprocess.Popen, commits: Path) -> int:
    """SIGKILLs the run's server once the run passed the commit point `label`."""
    deadline = time.monotonic() + 1200
    while not (commits.exists() and f"\t{label}\n" in commits.read_text()):
        assert run.poll() is None, "the run ended before the server was killed"
        assert time.monotonic() < deadline, f"the run never reached {label!r}"
        time.sleep(0.05)
    server = _server_of(run.pid)
    os.killpg(server, signal.SIGKILL)
    return server


def _all_sampled_on_the_server(state: dict, stages: set[str]) -> dict:
    """The finished run's spend, after checking that ``stages`` sampled and every sample of the
    run went to the server."""
    assert state["done"][-1] == "final"
    spend = state["results"]["spend"]
    sampled = {name for name, s in spend.items() if s["rollouts"] > 0}
    assert sampled >= stages, sampled
    for name in sampled:
        assert spend[name]["rollouts_on_vllm-server"] == spend[name]["rollouts"], (name, spend)
    return spend


def test_the_server_dying_mid_run_is_a_clear_error_and_the_same_command_resumes(tmp_path):
    run_dir, server_log, commits = tmp_path / "run", tmp_path / "server.log", tmp_path / "c.tsv"
    selection = ("--pipeline.selection", "{problems: 8, every: 40, samples: 2}")
    cmd = _cmd(TINY, run_dir, server_log, *selection)
    first = tmp_path / "first.log"
    with open(first, "w") as out:
        run = subprocess.Popen(
            cmd, env=_env(COSCALE_COMMIT_LOG=str(commits)), stdout=out, stderr=out
        )
        server = _kill_server_when("it1/measure state file written", run, commits)
        code = run.wait(600)
    text = first.read_text()
    assert code != 0 and text.count(STARTED) == 1, text[-3000:]
    assert f"the vLLM server (pid {server}) exited with code -9 while" in text, text[-3000:]
    assert f"its log {server_log} ends with:" in text  # and its last lines
    before = _state(run_dir)
    assert before["done"] == ["warmup", "it1/scale", "it1/sft", "it1/measure"]

    again = tmp_path / "again.log"
    with open(again, "w") as out:
        code = subprocess.run(cmd, env=_env(), stdout=out, stderr=out, timeout=900).returncode
    text = again.read_text()
    assert code == 0 and text.count(STARTED) == 1, text[-3000:]
    state = _state(run_dir)
    spend = _all_sampled_on_the_server(state, SAMPLED_TINY)
    for name in before["done"]:  # nothing done is redone or lost
        assert spend[name] == before["results"]["spend"][name], name
    assert sum(parts["engine_starts"] for parts in state["timing"].values()) == 2  # one a process
    url = text.split(f"{STARTED} ")[1].split()[0]
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(url + "/health", timeout=5)
    # RL ran with max_staleness 1 (its epochs hold one batch of the few solvable problems here,
    # so nothing is sampled ahead; SmolLM2's below and tests/test_vllm_server.py's fits are)
    assert _staleness(run_dir) and set(_staleness(run_dir)) <= {0.0, 1.0}


def test_smollm2_runs_every_stage_on_one_server_with_its_rl_sampled_a_step_ahead(
    smollm2_dir, tmp_path
):
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    # batches of 2: an RL epoch of any two solvable problems has a batch to sample ahead
    extra = ("--pipeline.iterations", "1", "--data.batch_size", "2")
    cmd = _cmd(SMOLLM2, run_dir, tmp_path / "server.log", *extra)
    with open(log, "w") as out:
        code = subprocess.run(cmd, env=_env(), stdout=out, stderr=out, timeout=1500).returncode
    text = log.read_text()
    assert code == 0 and text.count(STARTED) == 1, text[-3000:]
    _all_sampled_on_the_server(_state(run_dir), {"warmup", "it1/measure", "it1/rl", "final"})
    assert 1.0 in _staleness(run_dir)  # a batch sampled by the weights one step before its own
