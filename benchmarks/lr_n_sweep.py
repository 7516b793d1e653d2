"""The lr / N law on the built-in task: GRPO at a fixed rollout budget over a grid of (lr, N).

The paper (docs/method.md): the efficiency of an RL step is quadratic in x = lr / N, E(x) = x mu_p - x^2 mu_n,
with an optimum at x* = mu_p / (2 mu_n). This sweep measures it: from one start model, on the
training problems that model can solve sometimes (0 < acc < 1), every (lr, N) of the grid runs
plain GRPO (fixed N) for the same number of rollouts, and its efficiency is the pass@1 gained
on those problems. A least-squares fit of the quadratic (coscale.rl.theory.fit_efficiency) gives
mu_p, mu_n and x*; the plot shows the points, the fit and x*. Held-out sets are never used.

Run: .venv/bin/python benchmarks/lr_n_sweep.py --start runs/demo/it1/sft/model
(reproduce.py runs it on its CoScale-RL arm's first SFT model).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import lightning as L
from rollout_budget import RolloutBudget
from step_lines import StepLines

from coscale.app.demo import count_correct
from coscale.callbacks import RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule
from coscale.rl.theory import fit_efficiency, optimal_lr_over_n
from coscale.tasks import tiers

GRID = [(lr, n) for n in (4, 16) for lr in (2.5e-5, 1e-4, 4e-4)]
"""(lr, N) pairs of the default sweep: x = lr / N from 1.6e-6 to 1e-4, with x = 6.25e-6 and
2.5e-5 each reached by two (lr, N). lr 1.6e-3 was tried and dropped: its collapsed policy's
rollouts made one run take over 8 minutes."""


def plain_grpo(
    start: str,
    problems: list,
    rollouts: int,
    n: int,
    grpo_args: dict[str, Any],
    batch_size: int,
    out: str,
    seed: int = 0,
    precision: str | None = None,
) -> str:
    """GRPO with a fixed N on every one of ``problems`` until it has sampled ``rollouts``
    rollouts (:mod:`rollout_budget`), however many problems its batches serve: a batch of fewer
    problems (the curriculum leaves out the ones the policy always solves) is a step of fewer
    rollouts."""
    dm = ProblemDataModule(
        train=[p.to_dict() for p in problems],
        batch_size=min(batch_size, len(problems)),
        curriculum={
            "rl_unmeasured": True,
            "low": 0.0,
            "high": 1.0,
            "max_rl_rounds": 1000000,
            "seed": seed,
        },
    )
    L.seed_everything(seed, workers=True)
    module = GRPOModule(model=start, **grpo_args)
    spent = RolloutBudget(rollouts)
    trainer = L.Trainer(
        max_steps=-1,
        max_epochs=-1,
        accelerator="cpu",
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        callbacks=[RolloutNSchedule(n_init=n, factor=1.0), StepLines("grpo"), spent],
    )
    trainer.fit(module, datamodule=dm)
    return module.export(out)


def sometimes_solved(start: str, pool: list, k: int, limit: int) -> list:
    """Up to ``limit`` problems of ``pool`` the start model solves in some but not all of k."""
    counts = count_correct(start, pool, k, seed=11)
    return [p for p, c in zip(pool, counts) if 0 < c < k][:limit]


def sweep(
    start: str,
    pool: list,
    grpo_args: dict[str, Any],
    work: str,
    rollouts: int = 2048,
    grid: list[tuple[float, int]] = GRID,
    k: int = 16,
    limit: int = 64,
    precision: str | None = None,
) -> dict[str, Any]:
    """Runs the grid; returns the rows (lr, N, x, gain), the fit and the chosen problems."""
    problems = sometimes_solved(start, pool, k, limit)
    if len(problems) < 4:
        raise ValueError(f"lr/N sweep: only {len(problems)} sometimes-solved problems in the pool")
    before = sum(count_correct(start, problems, k)) / (k * len(problems))
    rows = []
    for lr, n in grid:
        t0 = time.time()
        args, out = {**grpo_args, "lr": lr}, os.path.join(work, f"{lr}_{n}")
        path = plain_grpo(start, problems, rollouts, n, args, 32, out, precision=precision)
        after = sum(count_correct(path, problems, k)) / (k * len(problems))
        rows.append({"lr": lr, "n": n, "x": lr / n, "gain": after - before, "after": after})
        print(
            f"lr/N sweep: lr {lr:g} N {n}: pass@1 {before:.3f} -> {after:.3f} "
            f"({time.time() - t0:.0f}s)",
            flush=True,
        )
    mu_p, mu_n = fit_efficiency([r["x"] for r in rows], [r["gain"] for r in rows])
    best = optimal_lr_over_n(mu_p, mu_n) if mu_p > 0 and mu_n > 0 else None
    return {
        "rows": rows,
        "mu_p": mu_p,
        "mu_n": mu_n,
        "x_star": best,
        "before": before,
        "problems": len(problems),
        "rollouts": rollouts,
        "k": k,
    }


def report(result: dict[str, Any]) -> str:
    """Markdown: one row per (lr, N), then the fit."""
    lines = ["| lr | N | lr/N | pass@1 after | gain (efficiency) |", "|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: r["x"]):
        lines.append(
            f"| {r['lr']:g} | {r['n']} | {r['x']:.2e} | {r['after'] * 100:.1f} | "
            f"{r['gain'] * 100:+.1f} |"
        )
    best = result["x_star"]
    fit = f"fit E(x) = x * {result['mu_p']:.4g} - x^2 * {result['mu_n']:.4g}; " + (
        f"optimum x* = lr/N = {best:.2e}" if best else "not concave: no optimum in range"
    )
    head = (
        f"{result['problems']} training problems solved sometimes by the start model, "
        f"pass@1 {result['before'] * 100:.1f}% before (k={result['k']}); "
        f"{result['rollouts']} rollouts per run."
    )
    return "\n".join([head, "", *lines, "", fit])


def plot(result: dict[str, Any], path: str) -> str:
    """Gain against lr/N (log axis), the fitted quadratic and its optimum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for n in sorted({r["n"] for r in rows}):
        pts = [(r["x"], r["gain"] * 100) for r in rows if r["n"] == n]
        ax.scatter(*zip(*pts), label=f"N={n}")
    lo, hi = min(r["x"] for r in rows), max(r["x"] for r in rows)
    xs = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    ax.plot(
        xs,
        [100 * (x * result["mu_p"] - x * x * result["mu_n"]) for x in xs],
        "k--",
        label="fit x mu_p - x^2 mu_n",
    )
    if result["x_star"]:
        ax.axvline(result["x_star"], color="grey", linestyle=":", label="x*")
    ax.set_xscale("log")
    ax.set_xlabel("lr / N")
    ax.set_ylabel("pass@1 gained (points)")
    ax.set_title("Efficiency at a fixed rollout budget")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", required=True, help="start model folder (e.g. an SFT model)")
    parser.add_argument("--rollouts", type=int, default=2048)
    parser.add_argument("--lrs", default="2.5e-5,1e-4,4e-4", help="learning rates")
    parser.add_argument("--ns", default="4,16", help="Rollout N values")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    grid = [(float(lr), int(n)) for n in args.ns.split(",") for lr in args.lrs.split(",")]
    pool = [p for t in tiers.BENCHMARKS for p in tiers.problems(t, 64, seed=0, side="train")]
    grpo = {"prompt": tiers.PROMPT, "max_new_tokens": 96, "temperature": 1.0}
    work = os.path.join("runs", "lr_n_sweep")
    result = sweep(args.start, pool, grpo, work, args.rollouts, grid=grid)
    write(result, args.out, ".venv/bin/python " + " ".join(sys.argv))


def write(result: dict[str, Any], out: str, command: str) -> str:
    os.makedirs(out, exist_ok=True)
    plot(result, os.path.join(out, "lr_n_sweep.png"))
    text = f"# lr/N sweep, {time.strftime('%Y-%m-%d')}\ncommand: {command}\n\n{report(result)}\n"
    with open(os.path.join(out, "lr_n_sweep.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
