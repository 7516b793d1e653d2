"""How far apart two runs' pool measurements are, problem by problem.

Two runs of ``real_model_pipeline.py`` that differ only in their rollout backend sample the same
problems with the same seeds but different kernels, so their counts differ by sampling noise
alone (and by the models, which diverge after the first measurement because the training that
follows it sees other pools). For each measurement both runs made (``<out>/pass_rates/*.json``):
how many problems got the same pool, the pool counts of each, and the mean absolute difference of
the correct counts.

Run: python benchmarks/pool_agreement.py <out_a> <out_b>
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def load(out: str) -> dict[str, dict]:
    """Measurement stage -> ``{problem id: {samples, correct, pool}}`` of one run (runs before
    the rename wrote ``n`` and ``c``)."""
    return {
        p.stem: json.loads(p.read_text()) for p in sorted(Path(out, "pass_rates").glob("*.json"))
    }


def _correct(row: dict) -> int:
    return row["correct"] if "correct" in row else row["c"]


def compare(a: dict[str, dict], b: dict[str, dict]) -> dict[str, float | str]:
    """Same-pool share, mean |correct_a - correct_b| and each run's pool counts."""
    ids = sorted(set(a) & set(b))
    same = sum(a[i]["pool"] == b[i]["pool"] for i in ids)
    gap = sum(abs(_correct(a[i]) - _correct(b[i])) for i in ids) / max(len(ids), 1)
    counts = [dict(sorted(Counter(run[i]["pool"] for i in ids).items())) for run in (a, b)]
    return {
        "problems": len(ids),
        "same_pool": same / max(len(ids), 1),
        "mean_abs_gap": gap,
        "pools_a": str(counts[0]),
        "pools_b": str(counts[1]),
    }


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    runs = [load(out) for out in argv]
    print(
        f"| measurement | problems | same pool | mean abs gap in correct | {argv[0]} | {argv[1]} |"
    )
    print("|---|---|---|---|---|---|")
    for stage in sorted(set(runs[0]) & set(runs[1])):
        r = compare(runs[0][stage], runs[1][stage])
        print(
            f"| {stage} | {r['problems']} | {r['same_pool']:.1%} | {r['mean_abs_gap']:.2f} "
            f"| {r['pools_a']} | {r['pools_b']} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
