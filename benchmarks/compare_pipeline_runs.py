"""Two runs of ``real_model_pipeline.py`` compared model by model, paired on the same problems.

Both runs measure the same held-out problems in the same order (``tiers.problems(..., seed=1,
side="test")``), so the difference of two models is bootstrapped with the problems drawn once
for both (:func:`coscale.scoring.stats.paired_difference`): an interval that excludes 0 is a
difference beyond the measurement's sampling noise. It says nothing about the spread between
training seeds (each run is one seed).

Run: .venv/bin/python benchmarks/compare_pipeline_runs.py A/results.json B/results.json
[--names LoRA,full] [--models "iteration 1,final"]
"""

from __future__ import annotations

import argparse
import json

from real_model_pipeline import EASY, HELD_OUT

from coscale.scoring.stats import paired_difference


def values(report: dict, model: str, name: str, metric: str) -> list[float]:
    """Per-problem values of ``metric`` for set ``name`` of ``model`` in a results.json report."""
    try:
        return report[model][name][metric]["values"]
    except KeyError as err:
        raise SystemExit(f"results.json has no {model!r} / {name!r} / {metric!r}") from err


def row(reports: list[dict], model: str, metric: str) -> str:
    """One markdown row: ``A - B`` per set [95% paired interval], then the held-out average."""
    cells = []
    for name in (*HELD_OUT, EASY):
        a, b = (values(r, model, name, metric) for r in reports)
        cells.append(paired_difference([a], [b]).fmt())
    a_sets, b_sets = ([values(r, model, n, metric) for n in HELD_OUT] for r in reports)
    cells.append(paired_difference(a_sets, b_sets).fmt())
    return f"| {model} | {metric} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", help="results.json of run A")
    ap.add_argument("second", help="results.json of run B")
    ap.add_argument("--names", default="A,B", help="labels of the two runs, e.g. LoRA,full")
    ap.add_argument("--models", default="iteration 1,final")
    ap.add_argument("--metrics", default="pass@1,pass@4")
    args = ap.parse_args()
    reports = []
    for path in (args.first, args.second):
        with open(path) as f:
            reports.append(json.load(f)["report"])
    first, second = args.names.split(",")
    print(f"{first} - {second}, in points of %, 95% paired bootstrap intervals:\n")
    sets = " | ".join((*HELD_OUT, EASY, "held-out avg"))
    print(f"| model | metric | {sets} |\n|" + "---|" * (len(HELD_OUT) + 4))
    for model in args.models.split(","):
        for metric in args.metrics.split(","):
            print(row(reports, model, metric))


if __name__ == "__main__":
    main()
