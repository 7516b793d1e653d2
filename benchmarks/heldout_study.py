"""The held-out test sets, scored once per finished run: the study's figures for the report.

Every choice in the study reads validation only (``loop_study.py``, ``baselines_study.py``). This
step scores the models those choices were made for on the demo's test sets
(``coscale.app.demo.test_sets``: 128 test-side problems of each of T3, T3v, T3w, T3x and the easy
tier T1, seed 1), ``--samples`` samples each, the same seeded samples for every model, as the
demo's report samples (the run's engine and prompt). Once: a run with a record in
``<out>/study-test.json`` is never scored again, so running the command again cannot make the
test sets a choice. The models: the final model of every :data:`FULL_ARMS` run of the ``full``
step and the GRPO model of every recipe of the ``baselines`` step, for each seed that finished
(and was scored on validation); a run not there yet is left for a later call.

Writes ``<out>/study-test.json`` (per set, every problem's pass rate) and ``study-test.md``: per arm
the four patterns' mean pass@1 and T1's over the seeds, then the shipped arm's lead over each
other arm on the four patterns, seed by seed and paired (the same problems and samples).

Run: .venv/bin/python benchmarks/heldout_study.py --seeds 0,1,2 [--out runs/loop_study]
"""

from __future__ import annotations

import argparse
import os
import sys

from loop_study import (
    BUDGET_ARM,
    PRECISION,
    each_seed,
    load_study,
    mean,
    mean_sd,
    paired_cell,
    run_dir,
    run_settings,
    save,
)
from paired import code_commit, cpu_line

from coscale.app.demo import count_correct, test_sets
from coscale.app.report_engine import ReportEngine
from coscale.tasks import tiers

SHIPPED = BUDGET_ARM
"""The arm ``demo.yaml`` runs (the paper's loop with ``final.rl``, one iteration; the one whose
budgets the recipes get): the leads are its."""

FULL_ARMS = (SHIPPED, "paper_loop_final_rl", "paper_loop", "changes_1207")
"""The ``full`` step's arms the report scores: the shipped loop, it with two iterations, the
paper's loop, the demo before 2026-12-07."""

RECIPES = ("g", "h", "grpo", "fresh")
"""The ``baselines`` step's recipes (their GRPO model, the one each recipe ends with)."""

N_TEST = 128
"""Test-side problems per set (the demo's report)."""


def candidates(out: str, seeds: list[str]) -> dict[str, dict[str, str]]:
    """arm -> seed -> model folder of every run that finished and was scored on validation."""
    found: dict[str, dict[str, str]] = {}
    for step, arms in (("full", FULL_ARMS), ("baselines", RECIPES)):
        scored = load_study(os.path.join(out, f"study-{step}.json"))["runs"]
        for arm in arms:
            for seed in seeds:
                path = _model(out, step, arm, seed)
                if seed in scored.get(arm, {}) and os.path.isdir(path):
                    found.setdefault(arm, {})[seed] = path
    return found


def _model(out: str, step: str, arm: str, seed: str) -> str:
    if step == "full":
        return os.path.join(run_dir(out, "full", arm, int(seed)), "final", "model")
    return os.path.join(out, f"baseline-{arm}-s{seed}", "grpo", "model")


def score_once(study: dict, todo: dict[str, dict[str, str]], engine, k: int, path: str) -> dict:
    """Every model in ``todo`` without a record scored on the test sets and recorded (the file is
    saved after each); a recorded one is skipped, whatever its folder holds now."""
    sets = test_sets(N_TEST)
    for arm, seeds in todo.items():
        for seed, model in seeds.items():
            if seed in study["runs"].get(arm, {}):
                continue
            scores = {
                name: [c / k for c in count_correct(model, probs, k, seed=0, engine=engine)]
                for name, probs in sets.items()
            }
            study["runs"].setdefault(arm, {})[seed] = {
                "model": model, "commit": code_commit(), "scores": scores,
            }  # fmt: skip
            save(path, study)
            print(f"[test] {arm} seed {seed}: {patterns_mean(scores) * 100:.1f}", flush=True)
    return study


def patterns_mean(scores: dict[str, list[float]]) -> float:
    """The four patterns' mean pass@1 (each set weighs the same, as in the demo's report)."""
    return mean([mean(scores[name]) for name in tiers.BENCHMARKS])


def summary(study: dict) -> str:
    """Per arm the four patterns' and T1's pass@1 over the seeds; the shipped arm's leads."""
    lines = ["| arm | test, 4 patterns, pass@1 % (mean, sd) | each seed | T1 pass@1 % |"]
    lines.append("|---|---|---|---|")
    for arm, runs in study["runs"].items():
        seeds = sorted(runs, key=int)
        per = [patterns_mean(runs[s]["scores"]) * 100 for s in seeds]
        easy = mean([mean(runs[s]["scores"][tiers.EASY]) * 100 for s in seeds])
        lines.append(f"| {arm} | {mean_sd(per)} | {each_seed(per)} | {easy:.1f} |")
    return "\n".join(lines) + "\n\n" + leads(study)


def leads(study: dict) -> str:
    """The shipped arm's lead over each other arm, on the seeds both have."""
    ours = study["runs"].get(SHIPPED, {})
    lines = [f"| {SHIPPED} ahead of | points, 4 patterns (mean, sd) | each seed | paired 95% |"]
    lines.append("|---|---|---|---|")
    for arm, runs in study["runs"].items():
        seeds = sorted(set(runs) & set(ours), key=int)
        if arm == SHIPPED or not seeds:
            continue
        diff = [(patterns_mean(ours[s]["scores"]) - patterns_mean(runs[s]["scores"])) * 100
                for s in seeds]  # fmt: skip
        pooled = (
            [_pooled(ours[s]["scores"]) for s in seeds],
            [_pooled(runs[s]["scores"]) for s in seeds],
        )
        lines.append(f"| {arm} | {mean_sd(diff)} | {each_seed(diff)} | {paired_cell(*pooled)} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def _pooled(scores: dict[str, list[float]]) -> list[float]:
    """The four patterns' problems as one list (equal sets: its mean is the patterns' mean)."""
    return [v for name in tiers.BENCHMARKS for v in scores[name]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--samples", "--k", dest="k", type=int, default=8, help="samples per test problem"
    )
    parser.add_argument("--out", default="runs/loop_study")
    args = parser.parse_args()
    path = os.path.join(args.out, "study-test.json")
    study = load_study(path)
    if study.get("k", args.k) != args.k:
        raise SystemExit(f"--samples {args.k}: {path} was scored with {study['k']}")
    study |= {"cpu": cpu_line(), "k": args.k, "precision": PRECISION, "n_test": N_TEST}
    todo = candidates(args.out, args.seeds.split(","))
    init = run_settings(os.path.join(args.out, "test-engine"), "full", SHIPPED)
    engine = ReportEngine(init.pipeline)  # the demo's engine kind and sampling definition
    try:
        study = score_once(study, todo, engine, args.k, path)
    finally:
        engine.close()
    text = summary(study) if study["runs"] else "no finished run yet\n"
    with open(path.replace(".json", ".md"), "w") as f:
        f.write(f"{study['cpu']}\n\ncommand: {' '.join([sys.executable, *sys.argv])}\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
