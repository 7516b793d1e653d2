"""Throughput of `coscale.rewards.MathReward` against calling math-verify directly in one process.

Two answer sets, each a few thousand distinct (completion, gold) pairs, about 2/3 correct:
simple integers, and mixed symbolic answers (square roots, multiples of pi, fractions, decimals).
The baseline is the fastest single-process use of math-verify: `verify(parse(gold), parse(pred))`
on the same parse-ready strings, with math-verify's signal timeouts off (they cost time, and
bound nothing off the main thread). `MathReward` runs with its cache off and warmed-up children,
so the figures are checking speed, not start-up or cache hits (start-up is printed apart).

Run: `.venv/bin/python benchmarks/bench_reward.py [--pairs 3000]`
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from coscale.rewards import MathReward, extract_boxed, wrap_latex


def integer_pairs(n: int) -> tuple[list[str], list[str]]:
    """n completions with a boxed integer (every third one off by one) and their gold answers."""
    completions = [f"Adding up, we get \\boxed{{{i + (i % 3 == 0)}}}." for i in range(n)]
    return completions, [str(i) for i in range(n)]


def symbolic_pairs(n: int) -> tuple[list[str], list[str]]:
    """n mixed symbolic pairs; predictions in an equivalent form, every third one wrong."""
    completions, answers = [], []
    for i in range(n):
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


def direct_rate(completions: list[str], answers: list[str]) -> tuple[float, list[float]]:
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


def reward_rate(completions: list[str], answers: list[str], num_workers: int) -> tuple:
    """Answers/s, scores and start-up seconds of a fresh MathReward with its cache off."""
    with MathReward(num_workers=num_workers, cache_size=0) as reward:
        start = time.perf_counter()
        reward([r"\boxed{1}"], ["1"])  # starts the children
        startup = time.perf_counter() - start
        start = time.perf_counter()
        scores = reward(completions, answers)
        rate = len(scores) / (time.perf_counter() - start)
        assert reward.stats["timeouts"] == 0, reward.stats
    return rate, scores, startup


def bench(name: str, completions: list[str], answers: list[str]) -> None:
    """Prints one block of results for one answer set."""
    base, expected = direct_rate(completions, answers)
    print(f"\n{name}: {len(answers)} pairs, {sum(expected):.0f} correct")
    print(f"  {'math-verify direct, 1 process':<34}{base:8.0f} answers/s   1.00x")
    for workers in (0, 1, 2):
        rate, scores, startup = reward_rate(completions, answers, workers)
        assert scores == expected, f"num_workers={workers} disagrees with math-verify"
        label = f"MathReward(num_workers={workers})"
        note = f"   (start-up {startup:.2f} s)" if workers else "   (in-process)"
        print(f"  {label:<34}{rate:8.0f} answers/s   {rate / base:.2f}x{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3000, help="pairs per answer set")
    args = parser.parse_args()
    print(f"CPU cores available: {len(os.sched_getaffinity(0))}")
    bench("simple integers", *integer_pairs(args.pairs))
    bench("mixed symbolic (sqrt, pi, fractions)", *symbolic_pairs(args.pairs))


if __name__ == "__main__":
    main()
