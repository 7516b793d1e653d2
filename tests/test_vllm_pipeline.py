"""The tiny pipeline with ``rollout.backend: vllm`` on the real engine, end to end and resumed.

`coscale run --config configs/tiny.yaml --config tests/configs/vllm_tiny.yaml`: the GRPO rollouts
from vLLM (its CPU build here), on the same random tiny Llama with 2 heads of size 32 (vLLM's
CPU attention refuses size 16), shorter SFT stages, and a checkpoint every step. Then the same
command SIGKILLed inside the RL stage (between its two epochs) and restarted: the new engine starts from the stage's first model and must get the
trained weights before its first rollout (the resumed fit syncs at its start, and the parity
check follows), so the final state file and weights equal the uninterrupted run's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

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


VLLM = (  # eager: on these 2 cores the engine's torch.compile warm-up took 88 s of a 295 s stage
    *(
        "--pipeline.grpo.rollout",
        '{"backend": "vllm", "options": {"engine": {"kwargs": {"enforce_eager": true}}}}',
    ),
)


def _cmd(run_dir: Path) -> list[str]:
    configs = [arg for path in CONFIGS for arg in ("--config", str(path))]
    run = [sys.executable, "-m", "coscale", "run", *configs, *VLLM]
    return [*run, "--pipeline.run_dir", str(run_dir)]


def _run(run_dir: Path, **extra: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCALE_KILL")}
    # vLLM's own INFO lines show the engine ran; importing TRL (the parity tests do, in this
    # process) sets VLLM_LOGGING_LEVEL=ERROR, which the run would inherit: ask for them here
    env |= {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:
        cmd = _cmd(run_dir)
        return subprocess.run(cmd, env={**env, **extra}, stdout=log, stderr=log).returncode


def _final(run_dir: Path) -> tuple[dict, dict]:
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    return state, load_file(run_dir / "final" / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vllm_full") / "run"
    commits = run_dir.parent / "commits.tsv"
    assert _run(run_dir, COSCALE_COMMIT_LOG=str(commits)) == 0
    labels = [line.split("\t", 1)[1] for line in commits.read_text().splitlines()]
    log = (run_dir.parent / "run.log").read_text()
    return run_dir, _final(run_dir), labels, log


def test_the_tiny_pipeline_runs_its_rl_stages_on_vllm(uninterrupted):
    from transformers import AutoModelForCausalLM

    run_dir, (state, _), labels, log = uninterrupted
    assert "LLM engine (v" in log  # vLLM's own start line: the rollouts came from it
    assert "it1/rl ckpt epoch 0 end" in labels
    assert state["done"][-1] == "final"
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "model")
    assert model.config.head_dim == 32


def test_killed_inside_the_rl_stage_resumes_to_the_same_result(uninterrupted, tmp_path):
    _, (want_state, want_weights), labels, _ = uninterrupted
    inside = [x for x in labels if x.startswith("it1/rl ckpt")]
    point = inside[len(inside) // 2]  # its 2 epochs are 1 step each: after the first
    run_dir = tmp_path / "run"
    assert _run(run_dir, COSCALE_KILL_AT=point) == -signal.SIGKILL
    assert _run(run_dir) == 0
    state, weights = _final(run_dir)
    for key in ("done", "curriculum", "results"):
        assert state[key] == want_state[key], f"{key} differs after the kill at {point!r}"
    for name, tensor in want_weights.items():
        assert torch.equal(weights[name], tensor), name
