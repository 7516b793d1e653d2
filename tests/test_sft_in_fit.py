"""The retrain callbacks in a user's own Trainer run the pipeline's SFT, under its strategy.

``ReDistillation`` and ``FinalRetrain`` train inside the running fit on Fabric with the fit's
strategy and precision (``coscale/callbacks/sft_in_fit.py``). tests/retrain_worker.py runs them in
a plain GRPO fit (one process; DDP and FSDP2 on 2 CPU processes over gloo), then a plain
``Trainer.fit`` of an SFTModule on the curriculum's pairs the way the pipeline's re-distillation
stage trains. The three must end with the same weights, every rank alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("retrain_worker.py")
ATOL = {"single": 1e-6, "ddp": 1e-5, "fsdp2": 1e-5}  # fp32; measured 2026-12-02: bitwise equal


def _run(strategy: str, guard: str, model_dir: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(WORKER), strategy, guard, str(model_dir), str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _close(a: dict, b: dict, atol: float) -> float:
    assert a.keys() == b.keys()
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert worst <= atol, worst
    return worst


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "strategy,guard", [("single", "parameter"), ("ddp", "parameter"), ("fsdp2", "none")]
)
def test_retrain_callbacks_train_what_the_pipeline_stage_trains(
    strategy, guard, tiny_model_dir, tmp_path
):
    done = _run(strategy, guard, tiny_model_dir, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == (1 if strategy == "single" else 2)
    seen = ranks[0]
    assert all(r == seen for r in ranks), ranks  # every rank saw the same
    assert seen["redistill_runs"] == seen["final_runs"] == 1
    assert seen["redistill_size"] == seen["items"] > 0
    weights = {k: torch.load(tmp_path / f"{k}.pt") for k in ("redistilled", "stage", "final")}
    stage_gap = _close(weights["redistilled"], weights["stage"], ATOL[strategy])
    final_gap = _close(weights["final"], weights["redistilled"], ATOL[strategy])
    print(
        f"{strategy}: |redistilled - stage| {stage_gap:.1e}, |final - redistilled| {final_gap:.1e}"
    )
    initial = torch.load(tmp_path / "stage.pt")  # trained: not the initial weights
    from safetensors.torch import load_file

    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(start[k], initial[k]) for k in start if k in initial)
    if strategy == "fsdp2":
        assert seen["sharded"] == "DTensor"
    if guard != "none":  # the guard ran in the callback as in the stage, to the same figures
        report, stage = seen["redistill_guard"], seen["stage_guard"]
        assert {"mastered_loss_start", "mastered_loss_end", "masked_frac_mean"} <= set(report)
        assert report.keys() == stage.keys()
        assert all(abs(report[k] - stage[k]) <= 1e-5 for k in report), (report, stage)
        assert 0 < report["masked_frac_mean"] < 1
        assert {f"final/{k}" for k in report} <= set(seen["final_results"])
