"""``builtin:`` sources: problems and a base model that coscale makes itself, offline.

``builtin:arithmetic?n=64&terms=2,3&seed=0&solutions=8`` is a generated arithmetic set (see
:mod:`coscale.tasks.arithmetic`); ``builtin:tiny?hidden_size=64&num_layers=2&seed=0`` is a
random character-level Llama written to a folder on first use.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

PREFIX = "builtin:"


def is_builtin(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    name, _, query = spec[len(PREFIX) :].partition("?")
    return name, dict(parse_qsl(query))


def builtin_rows(spec: str) -> list[dict[str, Any]]:
    """Rows (question, answer, id, solutions) of a ``builtin:`` problem set."""
    from coscale.tasks.arithmetic import generate, solutions_of

    name, args = _parse(spec)
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
    rows = []
    for p in generate(n, terms, seed, prefix):
        rows.append(
            {
                "id": p.id,
                "question": p.question,
                "answer": p.answer,
                "solutions": solutions_of(p, k),
            }
        )
    return rows


def _tier_rows(spec: str, args: dict[str, str]) -> list[dict[str, Any]]:
    """``builtin:tiers?T3=128&T3v=128&held_out=0&seed=0&solutions=0``: demo-task rows; with
    ``solutions=k`` each row carries its first k teacher solutions (canonical first)."""
    from coscale.tasks import tiers

    held_out, seed = args.pop("held_out", "0") == "1", int(args.pop("seed", 0))
    k = int(args.pop("solutions", 0))
    unknown = sorted(set(args) - set(tiers.TIERS))
    if unknown:
        raise ValueError(
            f"unknown settings {unknown} in {spec!r}; allowed: tier names "
            f"{sorted(tiers.TIERS)}, held_out, seed, solutions"
        )
    rows = tiers.rows({t: int(n) for t, n in args.items()}, seed, held_out)
    if k:
        for row in rows:
            row["solutions"] = list(itertools.islice(tiers.solutions(row["question"]), k))
    return rows


def builtin_model(spec: str, root: str | os.PathLike) -> str:
    """Folder of a ``builtin:`` model: ``demo`` is shipped in the package; ``tiny`` is built
    under ``root`` on first use."""
    from coscale.tiny import save_tiny

    name, args = _parse(spec)
    if name == "demo":
        return _demo_model()
    if name != "tiny":
        raise ValueError(f"unknown builtin model {name!r} in {spec!r}; choices: demo, tiny")
    sizes = {k: int(v) for k, v in args.items()}
    folder = Path(root) / ("tiny-" + "-".join(f"{k}{v}" for k, v in sorted(sizes.items())))
    if not (folder / "config.json").exists():
        save_tiny(folder, **sizes)
    return str(folder)


def _demo_model() -> str:
    """The demo's base model shipped in ``coscale/assets/demo_model``."""
    folder = Path(__file__).resolve().parents[1] / "assets" / "demo_model"
    if not (folder / "model.safetensors").exists():
        raise FileNotFoundError(
            f"the demo model is missing from {folder}; build it with "
            "`python scripts/build_demo_model.py`"
        )
    return str(folder)
