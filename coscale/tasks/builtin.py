"""``builtin:`` problem sets: problems that coscale makes itself, offline.

``builtin:arithmetic?n=64&terms=2,3&seed=0&solutions=8`` is a generated arithmetic set (see
:mod:`coscale.tasks.arithmetic`); ``builtin:tiers?T3=128&side=val`` is the demo task (see
:mod:`coscale.tasks.tiers`). Built-in *models* (``builtin:demo``, ``builtin:tiny?...``) are
resolved by `coscale.models.policy.resolve_model_path`: tasks do not depend on model loading.
"""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import parse_qsl

PREFIX = "builtin:"


def is_builtin(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def builtin_rows(spec: str) -> list[dict[str, Any]]:
    """Rows (question, answer, id, solutions) of a ``builtin:`` problem set."""
    from coscale.tasks.arithmetic import generate, solutions_of

    name, _, query = spec[len(PREFIX) :].partition("?")
    args = dict(parse_qsl(query))
    if name == "tiers":
        return _tier_rows(spec, args)
    if name != "arithmetic":
        raise ValueError(
            f"unknown builtin problem set {name!r} in {spec!r}; choices: arithmetic, tiers"
        )
    terms = tuple(int(t) for t in args.pop("terms", "2,3").split(","))
    n, seed = int(args.pop("n", 64)), int(args.pop("seed", 0))
    k, prefix = int(args.pop("solutions", 8)), args.pop("prefix", "arith")
    if args:
        raise ValueError(
            f"unknown settings {sorted(args)} in {spec!r}; allowed: n, terms, seed, solutions, prefix"
        )
    return [
        {"id": p.id, "question": p.question, "answer": p.answer, "solutions": solutions_of(p, k)}
        for p in generate(n, terms, seed, prefix)
    ]


def _tier_rows(spec: str, args: dict[str, str]) -> list[dict[str, Any]]:
    """``builtin:tiers?T3=128&T3v=128&side=train&seed=0&solutions=0``: demo-task rows from one
    side (``train``, ``val`` or ``test``: :data:`coscale.tasks.tiers.SIDES`); with
    ``solutions=k`` each row carries its first k teacher solutions (canonical first)."""
    from coscale.tasks import tiers

    side, seed = args.pop("side", "train"), int(args.pop("seed", 0))
    k = int(args.pop("solutions", 0))
    unknown = sorted(set(args) - set(tiers.TIERS))
    if unknown:
        raise ValueError(
            f"unknown settings {unknown} in {spec!r}; allowed: tier names "
            f"{sorted(tiers.TIERS)}, side, seed, solutions"
        )
    if side not in tiers.SIDES:
        raise ValueError(f"side must be one of {', '.join(tiers.SIDES)} in {spec!r}; got {side!r}")
    rows = tiers.rows({t: int(n) for t, n in args.items()}, seed, side)
    if k:
        for row in rows:
            row["solutions"] = list(itertools.islice(tiers.solutions(row["question"]), k))
    return rows
