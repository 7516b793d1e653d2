"""The tiny pipeline on one vLLM engine (``pipeline.rollout.backend: vllm``), end to end and
killed anywhere it samples.

`coscale run --config configs/run/tiny.yaml --config tests/configs/vllm_tiny.yaml` with the run's
engine on vLLM (its CPU build here), on the same random tiny Llama with 2 heads of size 32
(vLLM's CPU attention refuses size 16), shorter SFT stages, checkpoint selection in every SFT
from the initial model, and a checkpoint every step. Every sample the run takes (the pool
measurements, the selection scorings, RL, the final judge) goes to that one engine, started once
per process; each stage's model reaches it by a weight sync.

Then the same command SIGKILLed where it samples (after a measurement sampled, before its state
file: nothing of a measurement is kept until then; inside the RL stage; after the final judge)
and restarted: the restarted process starts its engine once, from the first model it samples,
and syncs the right weights before each sample, so the final state file and weights equal the
uninterrupted run's.
"""

from __future__ import annotations

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
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1500)]
# rl_every_batch.yaml: a reward with spread in every group, so that RL takes steps on any CPU
# (with the verifier's reward alone, it1/rl took none on a 2-core EPYC: no RL kill to test)
CONFIGS = (
    ROOT / "configs" / "run" / "tiny.yaml",
    ROOT / "tests" / "configs" / "vllm_tiny.yaml",
    ROOT / "tests" / "configs" / "rl_every_batch.yaml",
)
STARTED = "[coscale] vLLM engine started"


VLLM = (  # eager: on these 2 cores the engine's torch.compile warm-up took 88 s of a 295 s stage
    *(
        "--pipeline.rollout",
        '{"backend": "vllm", "options": {"engine": {"kwargs": {"enforce_eager": true}}}}',
    ),
    # one scoring at each SFT's end (ties keep the earliest step, and the tiny model scores 0
    # early on): the selection samples on the engine, and RL still finds solvable problems
    *("--pipeline.selection", "{problems: 8, every: 40, samples: 2}"),
)


def _cmd(run_dir: Path) -> list[str]:
    configs = [arg for path in CONFIGS for arg in ("--config", str(path))]
    run = [sys.executable, "-m", "coscale", "run", *configs, *VLLM]
    return [*run, "--pipeline.run_dir", str(run_dir)]


def _run(run_dir: Path, log: Path, **extra: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCALE_KILL")}
    # vLLM's own INFO lines show the engine ran; importing TRL (the parity tests do, in this
    # process) sets VLLM_LOGGING_LEVEL=ERROR, which the run would inherit: ask for them here
    env |= {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'tests'}"  # reward_examples, for rl_every_batch.yaml
    with open(log, "a") as out:
        cmd = _cmd(run_dir)
        return subprocess.run(cmd, env={**env, **extra}, stdout=out, stderr=out).returncode


def _final(run_dir: Path) -> tuple[dict, dict]:
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    return state, load_file(run_dir / "final" / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vllm_full") / "run"
    commits, log = run_dir.parent / "commits.tsv", run_dir.parent / "run.log"
    assert _run(run_dir, log, COSCALE_COMMIT_LOG=str(commits)) == 0, log.read_text()[-3000:]
    labels = [line.split("\t", 1)[1] for line in commits.read_text().splitlines()]
    return run_dir, _final(run_dir), labels, log.read_text()


def test_every_sample_of_the_run_goes_to_one_vllm_engine_started_once(uninterrupted):
    from transformers import AutoModelForCausalLM

    run_dir, (state, _), labels, log = uninterrupted
    assert log.count(STARTED) == 1 and log.count("LLM engine (v") == 1  # vLLM's own start line
    spend = state["results"]["spend"]
    sampled = {name for name, s in spend.items() if s["rollouts"] > 0}
    # the warm-up's and it1's measurements, it1/sft's and final/retrain's selection scorings,
    # RL, the final judge: all of them, and only on the engine
    assert {"warmup", "it1/sft", "it1/measure", "it1/rl", "final/retrain", "final"} <= sampled
    for name in sampled:
        assert spend[name]["rollouts_on_vllm"] == spend[name]["rollouts"], (name, spend[name])
    assert "rollout.backend=vllm" in log and "it1/measure: " in log and "samples on vllm" in log
    # the stage times split: the one start in the warm-up; weights synced into it after
    timing = state["timing"]
    assert sum(parts["engine_starts"] for parts in timing.values()) == 1
    assert timing["warmup"]["engine_start"] > 0 and "weight_sync" in timing["it1/measure"]
    assert any(x.startswith("it1/rl ckpt epoch 0 end") for x in labels)
    assert state["done"][-1] == "final"
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "model")
    assert model.config.head_dim == 32


def _inside_rl(labels: list[str]) -> str:
    """A checkpoint of it1/rl after a step of it, with another after it (inside the stage)."""
    inside = [x for x in labels if x.startswith("it1/rl ckpt")][:-1]
    inside = [x for x in inside if int(x.rsplit("step ", 1)[1]) > 0]
    assert inside, f"it1/rl has no checkpoint inside it: {labels}"
    return inside[len(inside) // 2]


@pytest.mark.parametrize(
    "where", ["a measurement", "the RL stage", "the final judge"], ids=["measure", "rl", "judge"]
)
def test_killed_where_it_samples_resumes_to_the_same_result(uninterrupted, tmp_path, where):
    _, (want_state, want_weights), labels, _ = uninterrupted
    point = {
        "a measurement": "it1/measure end, before the state file",
        "the RL stage": _inside_rl(labels),
        "the final judge": "final judged, before the copy",
    }[where]
    assert point in labels
    run_dir = tmp_path / "run"
    assert _run(run_dir, tmp_path / "killed.log", COSCALE_KILL_AT=point) == -signal.SIGKILL
    assert _run(run_dir, tmp_path / "resumed.log") == 0
    assert (tmp_path / "resumed.log").read_text().count(STARTED) == 1
    state, weights = _final(run_dir)
    for key in ("done", "curriculum", "results"):
        assert state[key] == want_state[key], f"{key} differs after the kill at {point!r}"
    for name, tensor in want_weights.items():
        assert torch.equal(weights[name], tensor), name


def test_ddp_on_two_cpu_ranks_runs_every_stage_on_one_engine_per_rank(two_rank_runs):
    """tests/configs/two_ranks.yaml (selection in every SFT from the initial model, the final
    retrain's own measurement and RL) under DDP on 2 processes, its engine on vLLM."""
    run_dir, _ = two_rank_runs("ddp", ROOT / "tests" / "configs" / "two_ranks_vllm.yaml")
    log = (run_dir.parent / "run.log").read_text()
    assert log.count(STARTED) == 2  # one engine per rank, each started once
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"][-1] == "final" and "it2/rl" in state["models"]
    spend = state["results"]["spend"]
    sampled = [name for name, s in spend.items() if s["rollouts"] > 0]
    assert {"warmup", "it1/sft", "it1/measure", "it1/rl", "final/measure", "final"} <= set(sampled)
    for name in sampled:  # rank 0's count: its share of every stage's samples, all on vLLM
        assert spend[name]["rollouts_on_vllm"] == spend[name]["rollouts"], (name, spend[name])


def test_a_lora_run_syncs_each_stages_merged_weights_into_one_engine(two_rank_runs):
    """tests/configs/two_ranks.yaml with a LoRA adapter in every stage
    (tests/configs/two_ranks_lora.yaml), one process, on one vLLM engine: it samples each
    stage's merged weights, parity-checked after every sync."""
    lora, vllm = (ROOT / "tests" / "configs" / f"two_ranks_{x}.yaml" for x in ("lora", "vllm"))
    run_dir, _ = two_rank_runs("single", lora, vllm)
    log = (run_dir.parent / "run.log").read_text()
    assert log.count(STARTED) == 1
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"][-1] == "final"
    assert (run_dir / "it1" / "rl" / "model" / "adapter").is_dir()  # RL trained an adapter
    spend = state["results"]["spend"]
    for name in ("warmup", "it1/sft", "it1/measure", "it1/rl", "final"):
        assert spend[name]["rollouts_on_vllm"] == spend[name]["rollouts"] > 0, name
