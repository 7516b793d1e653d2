"""A table that grows on a logger: rows are added to the ones logged before under the same key
and the whole table is logged again (W&B shows one table per key, its latest version).

The rows live on the logger object, so every fit that logs to it (each stage of a ``coscale
run`` is a fresh ``Trainer`` and module with the run's one logger) adds to the same table. Only
a logger that can take a table (W&B's ``log_table``) gets it; others get nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table_loggers(loggers: Sequence[Any]) -> list[Any]:
    """The loggers that take tables."""
    return [lg for lg in loggers if hasattr(lg, "log_table")]


def add_rows(
    logger: Any,
    key: str,
    rows: list[dict[str, Any]],
    first: Sequence[str] = (),
    keep: int | None = None,
) -> None:
    """Adds ``rows`` (column -> value) to ``logger``'s table ``key`` and logs it whole: columns
    ``first``, then every other column the rows have, in the order first seen; a row without a
    column has None there. ``keep``: the latest rows kept (None: all)."""
    tables = logger.__dict__.setdefault("_coscale_tables", {})
    table = tables.setdefault(key, [])
    table.extend(rows)
    if keep is not None:
        del table[:-keep]
    columns = list(dict.fromkeys([*first, *(k for row in table for k in row)]))
    logger.log_table(key=key, columns=columns, data=[[r.get(c) for c in columns] for r in table])
