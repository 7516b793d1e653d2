"""Forgetting guard: what a fine-tuning stage keeps and gains with and without it.

On the built-in arithmetic task (``builtin:arithmetic``), per seed:

1. *Base* (the stage's initial model): a random tiny Llama (``builtin:tiny`` sizes, init seed =
   the seed) is fine-tuned on the *easy tier*: two-term problems with their bank solutions.
2. *Mastered set*: the easy problems the base answers correctly (greedy), each with the base's
   own correct completion, as the replay buffer's latest correct solution would be.
3. *Stage*: SFT from the base on *new* three-term problems (re-distillation / final-retrain
   style: the initial model fine-tuned on solutions found later) through
   :func:`coscale.callbacks.run_sft` with the ``sft`` kwargs those callbacks pass,
   once per arm (:data:`ARMS`): guard ``none`` / ``parameter`` / ``neuron`` on the new pairs
   only, and the usual remedy, ``replay`` (the mastered pairs added to the training set),
   without and with the parameter guard. Same seed, same shuffle for every arm.
4. Greedy accuracy after the stage on the mastered (already-solved) problems, on the whole easy
   tier, and on the new problems (the base solves ~none of them); the mastered-set loss.

Accuracies pool all seeds with 95% Wilson intervals; differences are paired (same problems),
with 95% bootstrap intervals (problems resampled within each seed, 2,000 draws).

Run: `.venv/bin/python benchmarks/bench_forgetting.py [--seeds 6] [--out FILE]` (~50 s a seed
on one core; torch runs one thread by default: the tiny model is slower with more).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import random
import sys
import tempfile
import time
import warnings

import torch

from coscale.callbacks import run_sft
from coscale.models.tiny import save_tiny
from coscale.rollout.base import SamplingParams
from coscale.scoring.rewards import extract_boxed
from coscale.tasks.builtin import builtin_rows

ARMS = {  # name: (forgetting_guard, mastered pairs also in the training set)
    "none": ("none", False),
    "parameter": ("parameter", False),
    "neuron": ("neuron", False),
    "replay": ("none", True),
    "replay+param": ("parameter", True),
}
PAIRS = (("parameter", "none"), ("neuron", "none"), ("replay", "none"), ("replay+param", "replay"))
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


class BoxedInteger:
    """Reward 1.0 when the last ``\\boxed{}`` holds exactly the integer answer (no math-verify)."""

    def __call__(self, completions: list[str], answers: list[str], **_) -> list[float]:
        boxes = [extract_boxed(c) for c in completions]
        return [float(b is not None and b[7:-1].strip() == a) for b, a in zip(boxes, answers)]


def pairs(rows: list[dict]) -> list[dict]:
    """Every (question, bank solution) pair of ``rows``."""
    return [
        {"id": r["id"], "question": r["question"], "solution": s}
        for r in rows
        for s in r["solutions"]
    ]


def greedy(module, rows: list[dict]) -> tuple[list[int], list[str]]:
    """Greedy correctness (0/1) and completion of each problem."""
    module.eval()
    correct, texts = [], []
    for i in range(0, len(rows), 64):
        rollouts, scores = module.sample(rows[i : i + 64], 1, GREEDY)
        correct += scores.correct.long().tolist()
        texts += rollouts.texts
    return correct, texts


def run_seed(seed: int, args: argparse.Namespace, tmp: str) -> dict:
    """Base -> mastered set -> every arm; per-problem 0/1 results of one seed."""
    easy = builtin_rows(
        f"builtin:arithmetic?n={args.easy}&terms=2&seed={seed}&solutions=4&prefix=e"
    )
    new = builtin_rows(
        f"builtin:arithmetic?n={args.new}&terms=3&seed={100 + seed}"
        f"&solutions={args.new_solutions}&prefix=n"
    )
    start = time.perf_counter()
    init = save_tiny(os.path.join(tmp, f"init{seed}"), seed=seed)
    base = run_sft(init, pairs(easy), sft_kwargs(args), {"max_epochs": args.base_epochs}, seed)
    base_easy, texts = greedy(base, easy)
    mastered = [
        {"id": r["id"], "question": r["question"], "solution": text}
        for r, ok, text in zip(easy, base_easy, texts)
        if ok
    ]
    out = {"base_easy": base_easy, "base_new": greedy(base, new)[0], "arms": {}}
    out["loss_start"], out["base_s"] = base.mastered_loss(mastered), time.perf_counter() - start
    base_path = base.export(os.path.join(tmp, f"base{seed}"))
    for arm, (guard, replay) in ARMS.items():
        start = time.perf_counter()
        items = pairs(new) + (mastered if replay else [])
        mode = {"mode": guard, "batch_size": 16, "refresh_every": args.refresh_every}
        kwargs = sft_kwargs(args) | {"forgetting_guard": mode, "mastered": mastered}
        stage = run_sft(base_path, items, kwargs, {"max_epochs": args.stage_epochs}, seed)
        easy_ok = greedy(stage, easy)[0]
        out["arms"][arm] = {
            "kept": [ok for ok, was in zip(easy_ok, base_easy) if was],
            "easy": easy_ok,
            "new": greedy(stage, new)[0],
            "loss_end": stage.mastered_loss(mastered),
            "masked": stage.guard_report.get("masked_frac_mean", 0.0),
            "seconds": time.perf_counter() - start,
        }
    return out


def sft_kwargs(args: argparse.Namespace) -> dict:
    """SFT stage settings (the ``sft`` block of ReDistillation / FinalRetrain)."""
    return {
        "prompt": {"template": "Q:{question}\nA:"},
        "optimizer": {"lr": args.lr},
        "max_length": 64,
        "verifier": BoxedInteger(),
        "batch_size": 16,
    }


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return float("nan"), float("nan")
    p, zz = k / n, z * z
    centre, half = p + zz / (2 * n), z * (p * (1 - p) / n + zz / (4 * n * n)) ** 0.5
    return max(0.0, (centre - half) / (1 + zz / n)), min(1.0, (centre + half) / (1 + zz / n))


def paired_diff(
    runs: list[dict], arm: str, ref: str, key: str, draws: int = 2000
) -> tuple[float, float, float]:
    """Mean difference ``arm - ref`` over all problems, with a 95% bootstrap interval.

    Problems are resampled within each seed (the seeds are strata), pairs kept together.
    """
    rng = random.Random(0)
    diffs = [[a - b for a, b in zip(r["arms"][arm][key], r["arms"][ref][key])] for r in runs]
    total = sum(len(d) for d in diffs)
    point = sum(map(sum, diffs)) / total
    stats = sorted(
        sum(sum(rng.choice(d) for _ in d) for d in diffs if d) / total for _ in range(draws)
    )
    return point, stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]


def cell(xs: list[int]) -> str:
    """``mean [Wilson low, high]`` of 0/1 outcomes."""
    low, high = wilson(sum(xs), len(xs))
    return f"{sum(xs) / len(xs):.3f} [{low:.3f}, {high:.3f}]"


def pooled(runs: list[dict], arm: str, key: str) -> list[int]:
    return [x for r in runs for x in r["arms"][arm][key]]


def mean_of(runs: list[dict], arm: str, key: str) -> float:
    return sum(r["arms"][arm][key] for r in runs) / len(runs)


def table(runs: list[dict]) -> str:
    """The results table: pooled accuracies with Wilson intervals, then paired differences."""
    base_easy = [x for r in runs for x in r["base_easy"]]
    base_new = [x for r in runs for x in r["base_new"]]
    loss0 = sum(r["loss_start"] for r in runs) / len(runs)
    lines = [
        f"base (before the stage): easy tier {cell(base_easy)}, new {cell(base_new)}, "
        f"mastered problems {sum(base_easy)}, mastered loss {loss0:.3g}",
        "",
        f"{'arm':<12} {'kept on mastered':<24} {'easy tier':<24} {'new problems':<24} "
        f"{'mastered loss':>13} {'masked':>7} {'stage s':>8}",
    ]
    for arm in ARMS:
        lines.append(
            f"{arm:<12} {cell(pooled(runs, arm, 'kept')):<24} {cell(pooled(runs, arm, 'easy')):<24} "
            f"{cell(pooled(runs, arm, 'new')):<24} {mean_of(runs, arm, 'loss_end'):>13.3g} "
            f"{mean_of(runs, arm, 'masked'):>7.3f} {mean_of(runs, arm, 'seconds'):>8.1f}"
        )
    lines += [
        "(greedy accuracy, all seeds pooled, 95% Wilson; kept on mastered = share of the base's",
        " solved easy problems still solved; mastered loss = token-mean loss on that set after the",
        " stage and masked = share of coordinates frozen per step, means over seeds; stage s =",
        " fit + evaluation seconds of one arm, mean over seeds)",
    ]
    lines += ["", "paired differences (95% bootstrap over problems, stratified by seed):"]
    for arm, ref in PAIRS:
        parts = []
        for key in ("kept", "easy", "new"):
            d, lo, hi = paired_diff(runs, arm, ref, key)
            parts.append(f"{key} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        lines.append(f"{arm + ' - ' + ref:<22} " + "   ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--easy", type=int, default=64, help="two-term problems (easy tier)")
    parser.add_argument("--new", type=int, default=64, help="three-term problems (new)")
    parser.add_argument(
        "--new-solutions", type=int, default=2, help="bank solutions per new problem"
    )
    parser.add_argument("--base-epochs", type=int, default=40)
    parser.add_argument("--stage-epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--refresh-every", type=int, default=1, help="guard_refresh_every")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    parser.add_argument("--out", default=None, help="also append the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    start, runs = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            runs.append(run_seed(seed, args, tmp))
            print(f"seed {seed} done at {time.perf_counter() - start:.0f}s", flush=True)
    header = (
        f"# date: {datetime.date.today()} ({os.cpu_count()} CPU cores, torch threads "
        f"{args.threads}); command: .venv/bin/python {' '.join(sys.argv)}; "
        f"wall time {time.perf_counter() - start:.0f}s\n# settings: {vars(args)}\n"
    )
    text = header + table(runs)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
