"""PNG plots of a demo run: pool sizes per stage, accuracy per set per model, N per group."""

from __future__ import annotations

import os
from typing import Any

from coscale.tasks import tiers


def plot_all(run_dir: str, results: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """Writes the three plots into ``run_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    return [_pools(run_dir, results), _accuracy(run_dir, report), _n_per_group(run_dir, results)]


def _save(fig: Any, run_dir: str, name: str) -> str:
    path = os.path.join(run_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _pools(run_dir: str, results: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    stages = [
        (k, v.get("pools", v))
        for k, v in results.items()
        if isinstance(v, dict) and ("unsolvable" in v or "pools" in v)
    ]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for pool in ("unsolvable", "solvable", "solved", "failed"):
        ax.plot([s for s, _ in stages], [c.get(pool, 0) for _, c in stages], marker="o", label=pool)
    ax.set_ylabel("problems")
    ax.set_title("Pool sizes after each stage")
    ax.tick_params(axis="x", rotation=30)
    ax.legend()
    return _save(fig, run_dir, "pools.png")


def _accuracy(run_dir: str, report: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    labels = list(report["curve"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name in (*tiers.BENCHMARKS, tiers.EASY):
        rows = [report["curve"][lab][name] for lab in labels]
        ax.errorbar(
            labels,
            [r.mean * 100 for r in rows],
            yerr=[[(r.mean - r.low) * 100 for r in rows], [(r.high - r.mean) * 100 for r in rows]],
            marker="o",
            capsize=3,
            label=name,
        )
    ax.set_ylabel("held-out pass@1 (%)")
    ax.set_title("Accuracy per set (95% intervals)")
    ax.legend()
    return _save(fig, run_dir, "accuracy.png")


def _n_per_group(run_dir: str, results: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    stages = [
        (k, v["n_per_group"])
        for k, v in results.items()
        if isinstance(v, dict) and "n_per_group" in v
    ]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    groups = sorted({int(g) for _, table in stages for g in table})
    for g in groups:
        ax.plot(
            [s for s, _ in stages],
            [t.get(g, t.get(str(g))) for _, t in stages],
            marker="o",
            label=f"group {g}",
        )
    ax.set_ylabel("Rollout N")
    ax.set_title("N per difficulty group at the end of each RL stage")
    if groups:
        ax.legend()
    return _save(fig, run_dir, "n_per_group.png")
