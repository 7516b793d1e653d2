"""Throughput of `coscale.scoring.rewards.MathReward` against calling math-verify directly in one process.

Two answer sets, each a few thousand distinct (completion, gold) pairs, about 2/3 correct:
simple integers, and mixed symbolic answers (square roots, multiples of pi, fractions, decimals).
The baseline is the fastest single-process use of math-verify: `verify(parse(gold), parse(pred))`
on the same parse-ready strings, with math-verify's signal timeouts off (they cost time, and
bound nothing off the main thread). `MathReward` runs with its cache off and its children
already started, so the figures are checking speed, not start-up (~1 s) or cache hits.
Each runner also returns its scores, and all must agree.

Run: `.venv/bin/python benchmarks/bench_reward.py [--pairs 2000] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from functools import partial

from coscale.scoring.rewards import MathReward, extract_boxed, wrap_latex


def integer_pairs(n: int, offset: int = 0) -> tuple[list[str], list[str]]:
    """n completions with a boxed integer (every third one off by one) and their gold answers."""
    ints = range(offset, offset + n)
    completions = [f"Adding up, we get \\boxed{{{i + (i % 3 == 0)}}}." for i in ints]
    return completions, [str(i) for i in ints]


def symbolic_pairs(n: int, offset: int = 0) -> tuple[list[str], list[str]]:
    """n mixed symbolic pairs; predictions in an equivalent form, every third one wrong."""
    completions, answers = [], []
    for i in range(offset, offset + n):
        k, wrong = i // 4 + 2, i % 3 == 0
        gold, pred = [
            (f"\\sqrt{{{k}}}", f"\\sqrt{{{k + wrong}}}"),
            (f"{k}\\pi", f"\\pi \\cdot {k + wrong}"),
            (f"\\frac{{{k}}}{{{k + 1}}}", f"\\dfrac{{{2 * k + wrong}}}{{{2 * k + 2}}}"),
            (f"\\frac{{{k}}}{{4}}", f"{k / 4 + wrong}"),
        ][i % 4]
        completions.append(f"So the answer is \\boxed{{{pred}}}.")
        answers.append(gold)
    return completions, answers


def direct(completions: list[str], answers: list[str]) -> tuple[float, list[float]]:
    """Answers/s and scores of math-verify called in this process, one pair after the other."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    parse("$1$", parsing_timeout=None)  # import and warm up outside the clock
    start = time.perf_counter()
    scores = []
    for completion, answer in zip(completions, answers):
        gold = parse(wrap_latex(answer), parsing_timeout=None)
        pred = parse(extract_boxed(completion), parsing_timeout=None)
        scores.append(float(verify(gold, pred, timeout_seconds=None)))
    return len(scores) / (time.perf_counter() - start), scores


def pooled(completions: list[str], answers: list[str], num_workers: int) -> tuple[float, list]:
    """Answers/s and scores of a fresh MathReward (cache off, children started off the clock)."""
    with MathReward(num_workers=num_workers, cache_size=0) as reward:
        reward([r"\boxed{1}"], ["1"])  # starts the children
        start = time.perf_counter()
        scores = reward(completions, answers)
        rate = len(scores) / (time.perf_counter() - start)
        assert reward.stats["timeouts"] == 0, reward.stats
    return rate, scores


def bench(name: str, make_pairs, n: int, repeats: int) -> None:
    """Prints the median of `repeats` rates per runner, interleaved, on fresh strings each repeat.

    Fresh strings keep math-verify's own parse caches cold in every run; interleaving spreads
    other load on a shared machine over all runners alike.
    """
    runners = {"math-verify direct, 1 process": direct}
    for workers in (1, 2):
        runners[f"MathReward(num_workers={workers})"] = partial(pooled, num_workers=workers)
    rates: dict[str, list[float]] = {label: [] for label in runners}
    for rep in range(repeats):
        completions, answers = make_pairs(n, offset=rep * n)
        expected = None
        for label, runner in runners.items():
            rate, scores = runner(completions, answers)
            assert expected is None or scores == expected, f"{label} disagrees with math-verify"
            expected = scores
            rates[label].append(rate)
    print(f"\n{name}: {n} pairs x {repeats} repeats, ~{sum(expected) / n:.0%} correct")
    base = statistics.median(rates["math-verify direct, 1 process"])
    for label, values in rates.items():
        spread = f"(runs: {', '.join(f'{v:.0f}' for v in values)})"
        mid = statistics.median(values)
        print(f"  {label:<31}{mid:7.0f} answers/s  {mid / base:5.2f}x  {spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per answer set and run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per runner; the median is shown"
    )
    args = parser.parse_args()
    print(f"CPU cores available: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()}")
    bench("simple integers", integer_pairs, args.pairs, args.repeats)
    bench("mixed symbolic (sqrt, pi, fractions)", symbolic_pairs, args.pairs, args.repeats)


if __name__ == "__main__":
    main()
