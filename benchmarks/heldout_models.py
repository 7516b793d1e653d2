"""Held-out pass@1 of any exported models on the demo's sets, with 95% intervals.

The demo's own table measures the base and the final model in full (128 problems per set,
8 samples) and every intermediate model on half of that; this measures any models in full, so
iterations can be compared with intervals (issue 14: iteration 2 and the final model against
iteration 1).

Run: .venv/bin/python benchmarks/heldout_models.py runs/demo/it1/rl/model runs/demo/it2/rl/model
(the demo's table: pass@1 and pass@k per set, the average, the ratio over the first model,
then each later model's lead over the first in points, paired on the same problems)
"""

from __future__ import annotations

import argparse
import datetime

from paired import cpu_line

from coscale.app.demo import SETS, evaluate_model, lead_cell, table
from coscale.tasks import tiers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="exported model folders (the first is the base)")
    ap.add_argument("--n", type=int, default=128, help="held-out problems per set")
    ap.add_argument("--samples", "--k", dest="k", type=int, default=8, help="samples per problem")
    args = ap.parse_args()
    sets = {name: tiers.problems(name, args.n, seed=1, side="test") for name in SETS}
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{when}; {cpu_line()}; in %, {args.n} problems x {args.k} samples per set\n")
    models = {
        path: {name: evaluate_model(path, p, args.k) for name, p in sets.items()}
        for path in args.models
    }
    report = {"k": args.k, "models": models}
    print(table(report, base=args.models[0]))
    print(f"\navg pass@1 (4 sets) ahead of {args.models[0]}, points, paired 95% interval:")
    for path in args.models[1:]:
        print(f"- {path}: {lead_cell(report, path, args.models[0])}")


if __name__ == "__main__":
    main()
