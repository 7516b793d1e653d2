"""A picture of what a `coscale run` logged to W&B, drawn from its offline run file(s).

What a W&B user sees on the run's page, on the run's one step axis (``trainer/global_step``):
the loss of every training stage, RL's reward, and the pools, each stage shaded and named, a red
line where a killed run's restart took its first step. Read
from ``<run_dir>/logs/wandb/offline-run-*/*.wandb`` (every process of a resumed run, in order)
with :mod:`coscale.modules.wandb_file`, the stage names from ``pipeline_state.json``.

Run: .venv/bin/python benchmarks/wandb_picture.py --run runs/tiny --out docs/images/wandb_run.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from coscale.modules.wandb_file import history

PANELS = {
    "train/loss": ["train/loss"],
    "train/reward (RL)": ["train/reward"],
    "pools": ["pool/unsolvable", "pool/solvable", "pool/solved"],
}
"""Each panel's title and the metrics drawn in it."""
STEP, STAGE = "trainer/global_step", "run/stage"


def rows_of(run_dir: Path) -> list[list[dict]]:
    """Every logged row of the run, per process (its file; in order of the folders' times)."""
    files = sorted((run_dir / "logs" / "wandb").glob("offline-run-*/*.wandb"))
    if not files:
        raise SystemExit(f"--run: no offline W&B run under {run_dir / 'logs' / 'wandb'}")
    return [[row for row in history(f) if STEP in row] for f in files]


def restarts(parts: list[list[dict]]) -> list[float]:
    """Where each restarted process took its first optimiser step."""
    steps = [[r[STEP] for r in part if "train/loss" in r] for part in parts[1:]]
    return [min(s) for s in steps if s]


def stage_spans(rows: list[dict], names: list[str]) -> dict[str, tuple[float, float]]:
    """Each stage's first and last step on the axis."""
    spans: dict[str, tuple[float, float]] = {}
    for row in rows:
        if STAGE in row and int(row[STAGE]) < len(names):
            name, step = names[int(row[STAGE])], row[STEP]
            low, high = spans.get(name, (step, step))
            spans[name] = (min(low, step), max(high, step))
    return spans


def draw(run_dir: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = rows_of(run_dir)
    rows = [row for part in parts for row in part]
    names = json.loads((run_dir / "pipeline_state.json").read_text())["done"]
    spans = stage_spans(rows, names)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 7), sharex=True)
    for ax, (title, keys) in zip(axes, PANELS.items()):
        for key in keys:
            points = sorted((r[STEP], r[key]) for r in rows if isinstance(r.get(key), int | float))
            if points:
                ax.plot(*zip(*points), marker=".", markersize=3, linewidth=1, label=key)
        for i, (low, high) in enumerate(spans.values()):
            ax.axvspan(low, max(high, low + 0.5), alpha=0.08 if i % 2 else 0.16, color="grey")
        for i, step in enumerate(restarts(parts)):
            label = "killed; restarted from its checkpoint" if i == 0 else None
            ax.axvline(step, color="red", linestyle="--", linewidth=1, label=label)
        ax.set_title(title, fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
    for name, (low, high) in spans.items():
        axes[0].annotate(name, ((low + high) / 2, 1.0), xycoords=("data", "axes fraction"),
                         ha="center", va="bottom", fontsize=6, rotation=45)  # fmt: skip
    axes[-1].set_xlabel(f"{STEP} (the run's one step axis; shaded: stages)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out} from {len(rows)} rows logged by {len(parts)} processes of {run_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a coscale run's run_dir")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    draw(args.run, args.out)


if __name__ == "__main__":
    main()
