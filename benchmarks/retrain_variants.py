"""The final retrain under other settings, on the banks of finished loop_study runs, on validation.

Each finished run of ``benchmarks/loop_study.py --variant iterations`` ends after its last
iteration, with the bank and pools the final retrain would start from (the final stage changes
neither). It is copied, rolled back to the end of its last iteration stage, and ``coscale run``
adds the final retrain under each variant's settings (:data:`VARIANTS`, on top of the run's own
arm); the retrain's model is scored on the validation problems with the study's seeded samples.
A variant's copy that stopped resumes; a scored one is skipped. Nothing here reads the test side.

Writes ``<study>/retrain-<arm>.json`` and ``.md``: per variant, validation pass@1 over the seeds
(mean, sd, each seed), the retrain's optimiser steps and seconds.

Run: .venv/bin/python benchmarks/retrain_variants.py --study runs/loop_study
     --arm measure_each_epoch --seeds 0,1,2 --variants shipped,cosine6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from loop_study import (
    ARMS,
    PRECISION,
    arm_args,
    mean,
    mean_sd,
    pass_rates_of,
    report,
    run_dir,
    run_settings,
    save,
)
from paired import cpu_line
from rollback_run import rolled_back

from coscale.app.demo import demo_config
from coscale.app.report_engine import ReportEngine


def retrain_settings(passes: int, lr: str, decay: str, *more: str) -> list[str]:
    """The final retrain's passes, its peak learning rate and decay, and any ``more`` flags."""
    return [
        "--pipeline.final.epochs", str(passes), "--pipeline.sft.optimizer.lr", lr,
        "--pipeline.sft.optimizer.decay", decay, *more,
    ]  # fmt: skip


BATCH16 = ("--data.sft_batch_size", "16")
VARIANTS: dict[str, list[str]] = {
    "shipped": [],  # demo.yaml's final retrain
    "constant15": retrain_settings(15, "5.0e-4", "constant"),  # demo.yaml's before 2026-12-07
    "cosine6": retrain_settings(6, "5.0e-4", "cosine"),
    "cosine8": retrain_settings(8, "5.0e-4", "cosine"),
    "constant6": retrain_settings(6, "5.0e-4", "constant"),
    "lr1e-3_cosine5": retrain_settings(5, "1.0e-3", "cosine"),
    "lr2e-3_cosine5": retrain_settings(5, "2.0e-3", "cosine"),
    "lr2e-3_constant5": retrain_settings(5, "2.0e-3", "constant"),
    "lr4e-3_cosine5": retrain_settings(5, "4.0e-3", "cosine"),
    "lr2e-3_cosine8": retrain_settings(8, "2.0e-3", "cosine"),
    "bs16_lr1e-3_cosine5": retrain_settings(5, "1.0e-3", "cosine", *BATCH16),
    "bs16_lr2e-3_cosine5": retrain_settings(5, "2.0e-3", "cosine", *BATCH16),
    "replay25_lr2e-3_cosine5": retrain_settings(
        5, "2.0e-3", "cosine", "--data.curriculum.replay_fraction", "0.25"
    ),
}
"""Each variant's settings of the final retrain."""

COMMON = [
    "--pipeline.final.retrain", "true", "--pipeline.final.rl", "false",
    "--pipeline.final.source", "bank",
]  # fmt: skip
"""Every variant: the final retrain alone, on the bank (``demo.yaml``'s ``final.source`` until
2026-12-07, when these variants were measured)."""


def copy_run(src: str, dst: str) -> None:
    """``src`` rolled back to the end of its last iteration stage, in ``dst`` (once)."""
    if os.path.exists(os.path.join(dst, "pipeline_state.json")):
        return
    with open(os.path.join(src, "pipeline_state.json")) as f:
        state = json.load(f)
    last = [st for st in state["done"] if st.startswith("it")][-1]
    new = rolled_back(state, src, dst, last, state["curriculum"])
    for stage in new["models"]:
        shutil.copytree(os.path.join(src, stage, "model"), os.path.join(dst, stage, "model"))
    with open(os.path.join(dst, "pipeline_state.json"), "w") as f:
        json.dump(new, f)


def retrain(folder: str, arm: str, variant: str, seed: int) -> float:
    """``coscale run`` of the copy: its final retrain under ``variant``; wall seconds."""
    args = ["--config", demo_config(), "--pipeline.run_dir", folder, "--pipeline.logger", "csv"]
    args += ["--pipeline.seed", str(seed), "--data.curriculum.seed", str(seed)]
    args += ["--pipeline.trainer.precision", PRECISION, *arm_args(arm), *COMMON, *VARIANTS[variant]]
    coscale = os.path.join(os.path.dirname(sys.executable), "coscale")
    start = time.perf_counter()
    with open(folder + ".log", "a") as log:
        subprocess.run([coscale, "run", *args], stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def score(folder: str, arm: str, k: int) -> list[float]:
    """Per-problem validation pass@1 of the copy's final retrain."""
    init = run_settings(folder, "iterations", arm)
    engine = ReportEngine(init.pipeline)
    try:
        model = os.path.join(folder, "final", "retrain", "model")
        return pass_rates_of(model, init.data.val_problems, k, engine)
    finally:
        engine.close()


def table(results: dict) -> str:
    lines = ["| final retrain | val pass@1 % (mean, sd) | each seed | seconds (mean) |"]
    lines.append("|---|---|---|---|")
    for variant, runs in results["variants"].items():
        seeds = sorted(runs, key=int)
        values = [mean(runs[s]["scores"]) * 100 for s in seeds]
        seconds = mean([runs[s]["seconds"] for s in seeds])
        each = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {variant} | {mean_sd(values)} | {each} | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def merged(path: str, variant: str, seed: str, run: dict) -> dict:
    """The results file as it is now (another process may have written to it), with ``run``."""
    results = {"variants": {}}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    results["variants"].setdefault(variant, {})[seed] = run
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", default="runs/loop_study")
    parser.add_argument("--arm", default="measure_each_epoch", choices=sorted(ARMS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="shipped,cosine6")
    parser.add_argument("--samples", "--k", dest="k", type=int, default=8)
    args = parser.parse_args()
    path = os.path.join(args.study, f"retrain-{args.arm}.json")
    results = {"variants": {}}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    for seed in args.seeds.split(","):
        src = run_dir(args.study, "iterations", args.arm, int(seed))
        for variant in args.variants.split(","):
            runs = results["variants"].setdefault(variant, {})
            if seed in runs:
                continue
            dst = f"{src}-retrain-{variant}"
            copy_run(src, dst)
            seconds = retrain(dst, args.arm, variant, int(seed))
            runs[seed] = {"seconds": seconds, "scores": score(dst, args.arm, args.k)}
            results = merged(path, variant, seed, runs[seed])
            save(path, results)
            print(f"[retrain_variants] {variant} seed {seed}: {seconds:.0f} s", flush=True)
    report(path, f"{cpu_line()}\n\narm {args.arm}, k {args.k}, {PRECISION}", table(results))


if __name__ == "__main__":
    main()
