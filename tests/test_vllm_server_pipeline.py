"""The tiny pipeline with its one engine a vLLM server (``pipeline.rollout.backend:
vllm-server``) and asynchronous RL (``pipeline.grpo.update.max_staleness: 1``): `coscale run
--config configs/tiny.yaml --config tests/configs/vllm_tiny.yaml` starts the server once,
samples every measurement, selection scoring, RL rollout and the final judge on it, samples
each RL batch a step ahead, syncs each stage's weights into it, and stops it at the end."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed: ./run.sh setup installs vLLM's CPU build (x86_64 Linux)",
    ),
]
CONFIGS = (ROOT / "configs" / "tiny.yaml", ROOT / "tests" / "configs" / "vllm_tiny.yaml")


def test_every_sample_of_the_run_goes_to_one_server_started_once(tmp_path):
    run_dir, log, server_log = tmp_path / "run", tmp_path / "run.log", tmp_path / "server.log"
    rollout = {
        "backend": "vllm-server",
        "options": {"engine": {"kwargs": {"enforce_eager": True}}, "server": {"log": str(server_log)}},
    }  # fmt: skip
    configs = [arg for path in CONFIGS for arg in ("--config", str(path))]
    cmd = [
        sys.executable, "-m", "coscale", "run", *configs,
        "--pipeline.rollout", json.dumps(rollout),
        "--pipeline.selection", "{problems: 8, every: 40, k: 2}",
        "--pipeline.grpo.update.max_staleness", "1",
        "--pipeline.run_dir", str(run_dir),
    ]  # fmt: skip
    with open(log, "w") as out:
        code = subprocess.run(cmd, env=dict(os.environ), stdout=out, stderr=out).returncode
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert text.count("[coscale] vLLM server started at") == 1
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    sampled = {name for name, s in state["results"]["spend"].items() if s["rollouts"] > 0}
    assert {"warmup", "it1/sft", "it1/eval", "it1/rl", "final/retrain", "final"} <= sampled
    for name in sampled:
        spend = state["results"]["spend"][name]
        assert spend["rollouts_on_vllm-server"] == spend["rollouts"], (name, spend)
    assert sum(parts["engine_starts"] for parts in state["timing"].values()) == 1
    assert state["done"][-1] == "final"
    url = text.split("[coscale] vLLM server started at ")[1].split()[0]
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(url + "/health", timeout=5)
    assert "Application startup complete" in server_log.read_text()
    # RL ran with max_staleness 1 (here its epochs hold one batch of the few solvable
    # problems, so there is nothing ahead to sample: staleness 0; sampling ahead is tested on 4
    # batches in tests/test_vllm_server.py)
    staleness = [
        float(row["train/staleness"])
        for path in run_dir.rglob("metrics.csv")
        for row in csv.DictReader(path.open())
        if row.get("train/staleness")
    ]
    assert staleness and set(staleness) <= {0.0, 1.0}
