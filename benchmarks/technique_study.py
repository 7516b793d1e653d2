"""One of the paper's techniques alone: more solutions per problem (its Fig. 5), on validation.

Two parts:

* ``solutions``: SFT from the demo's base at equal SFT examples, the same number of distinct
  (problem, teacher solution) pairs in every arm, spread as ``m`` solutions on each of
  ``pairs / m`` fresh training-side problems (``--per-problem``, e.g. 1, 4, 16); every arm with
  the demo's SFT settings, replay share and checkpoint selection on validation
  (``baselines_study.sft``). Scored per seed on the validation problems (pass@1 and
  pass@<samples>) and on the problems every arm trained on (the ``pairs / max m`` first ones:
  how well a problem seen once is learnt against one seen ``m`` times).
* ``needed``: from the ``changes_1207`` runs of ``loop_study.py --variant full`` (:data:`NEEDED_ARM`,
  the demo as it shipped until 2026-12-07): how many bank solutions
  each training problem had when a measurement first found it solvable, from every measurement's
  ``pass_rates.json`` (the paper's premise: some problems need many solutions before RL can
  solve them).

Writes ``<out>/study-techniques.json`` (resumes from it: a scored arm and seed is skipped, a
trained model is kept) and ``study-techniques.md``.

Run: .venv/bin/python benchmarks/technique_study.py [--parts solutions,needed] [--seeds 0,1,2]
     [--pairs 1536] [--per-problem 1,4,16] [--out runs/loop_study]
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

from baselines_study import sft
from loop_study import (
    PRECISION,
    mean,
    mean_sd,
    paired_cell,
    pass_rates_of,
    run_dir,
    run_settings,
    save,
)
from paired import code_commit, cpu_line

from coscale.app.report_engine import ReportEngine
from coscale.loop.problem import Problem
from coscale.tasks import tiers

NEEDED_ARM = "changes_1207"
"""The ``full`` arm whose runs the ``needed`` part reads: two iterations of 6 solutions a round,
so a problem can be found solvable at 0, 6 or 12 solutions (one round of 11 tells 0 or 11)."""


def fresh(pairs: int, per_problem: int) -> list[tuple[Problem, list[str]]]:
    """``pairs / per_problem`` training-side problems of the four patterns (interleaved, the
    same first ones for every ``per_problem``), each with its first ``per_problem`` solutions;
    problems with fewer than 16 distinct solutions (the largest ``per_problem``) are passed
    over."""
    count = pairs // per_problem
    per = [iter(tiers.problems(t, 4 * pairs, seed=3, side="train")) for t in tiers.BENCHMARKS]
    chosen: list[tuple[Problem, list[str]]] = []
    while len(chosen) < count:
        for source in per:
            p = next(source)
            solutions = list(tiers.solutions(p.question))[:16]
            if len(solutions) >= 16 and len(chosen) < count:
                chosen.append((p, solutions[:per_problem]))
    return chosen


def solutions_arm(init, args, m: int, seed: int) -> dict[str, list[float]]:
    """One arm and seed: its SFT model's per-problem pass rates on validation and on the
    problems every arm trained on."""
    rows = [{**p.to_dict(), "solutions": s} for p, s in fresh(args.pairs, m)]
    share = 1 - init.data.curriculum.settings.replay_fraction
    examples = round(args.epochs * args.pairs / share)  # replay fills the rest of each epoch
    folder = os.path.join(args.out, f"technique-solutions-{m}x-s{seed}")
    model = sft(init, rows, examples, seed, folder)
    common = [p for p, _ in fresh(args.pairs, max(args.per_problem))]
    engine = ReportEngine(init.pipeline)
    try:
        return {
            "val": pass_rates_of(model, init.data.val_problems, args.samples, engine),
            "trained": pass_rates_of(model, common, args.samples, engine),
        }
    finally:
        engine.close()


def needed(out: str, seed: int) -> dict[str, int]:
    """Bank solutions each training problem had when a measurement first found it solvable (or
    solved), counted by that number; ``never``: no measurement found it so."""
    folder = run_dir(out, "full", NEEDED_ARM, seed)
    with open(os.path.join(folder, "pipeline_state.json")) as f:
        done = json.load(f)["done"]
    first: dict[str, int | None] = {}
    for stage in done:
        path = os.path.join(folder, stage, "pass_rates.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for pid, row in json.load(f).items():
                if first.get(pid) is None:
                    first[pid] = row["solutions"] if row["pool"] in ("solvable", "solved") else None
    return dict(Counter("never" if n is None else str(n) for n in first.values()))


def summary(study: dict) -> str:
    """The ``solutions`` table (each arm, seed by seed, and each against one per problem) and
    the ``needed`` table."""
    lines = []
    arms = study.get("solutions", {})
    if arms:
        samples = study["samples"]
        lines += [f"| solutions per problem | val pass@1 % | val pass@{samples} % | "
                  f"trained problems pass@1 % | val pass@1 vs 1 per problem | paired 95% |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        ref = arms.get("1", {})
        for m, runs in arms.items():
            seeds = sorted(runs, key=int)
            val = [mean(runs[s]["val"]) * 100 for s in seeds]
            at_k = [mean([float(r > 0) for r in runs[s]["val"]]) * 100 for s in seeds]
            trained = [mean(runs[s]["trained"]) * 100 for s in seeds]
            both = [s for s in seeds if s in ref]
            lead = [val[seeds.index(s)] - mean(ref[s]["val"]) * 100 for s in both]
            pair = paired_cell([runs[s]["val"] for s in both], [ref[s]["val"] for s in both])
            lines.append(
                f"| {m} | {mean_sd(val)} | {mean_sd(at_k)} | {mean_sd(trained)} | "
                f"{mean_sd(lead) if m != '1' and lead else '-'} | {pair if m != '1' else '-'} |"
            )
        lines.append("")
    counts = study.get("needed", {})
    if counts:
        keys = {k for c in counts.values() for k in c}
        keys = sorted(keys, key=lambda k: (k == "never", int(k) if k != "never" else 0))
        lines += [
            f"| {NEEDED_ARM} run, seed | " + " | ".join(keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        for seed, c in counts.items():
            lines.append(f"| {seed} | " + " | ".join(str(c.get(k, 0)) for k in keys) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="solutions,needed")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pairs", type=int, default=1536, help="distinct pairs in every arm")
    parser.add_argument("--per-problem", default="1,4,16")
    parser.add_argument("--epochs", type=int, default=4, help="passes over the pairs")
    parser.add_argument("--samples", type=int, default=8, help="samples per scored problem")
    parser.add_argument("--out", default="runs/loop_study")
    args = parser.parse_args()
    args.per_problem = [int(m) for m in args.per_problem.split(",")]
    if bad := [m for m in args.per_problem if m < 1 or m > 16 or args.pairs % m]:
        raise SystemExit(f"--per-problem: {bad}: each must be in 1..16 and divide --pairs")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "study-techniques.json")
    study = {}
    if os.path.exists(path):
        with open(path) as f:
            study = json.load(f)
    study |= {"cpu": cpu_line(), "k": args.samples, "samples": args.samples}
    study |= {"precision": PRECISION, "pairs": args.pairs, "epochs": args.epochs}
    parts = args.parts.split(",")
    if "solutions" in parts:
        init = run_settings(os.path.join(args.out, "technique-settings"), "full", "paper_loop")
        for m in args.per_problem:
            for seed in args.seeds.split(","):
                runs = study.setdefault("solutions", {}).setdefault(str(m), {})
                if seed not in runs:
                    runs[seed] = solutions_arm(init, args, m, int(seed))
                    runs[seed]["commit"] = code_commit()
                    save(path, study)
                    print(f"[techniques] {m} per problem, seed {seed}", flush=True)
    if "needed" in parts:
        for seed in args.seeds.split(","):
            if os.path.isdir(run_dir(args.out, "full", NEEDED_ARM, int(seed))):
                study.setdefault("needed", {})[seed] = needed(args.out, int(seed))
        save(path, study)
    text = summary(study)
    with open(path.replace(".json", ".md"), "w") as f:
        f.write(f"{study['cpu']}\n\n{PRECISION}, {args.samples} samples per problem\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
