"""The ``coscale`` logger: every message the library writes goes through it, none through print.

A message shows as ``[coscale] <message>``: INFO and below on stdout, WARNING and above on
stderr, each stream looked up when the message is written (so a redirection, or pytest's
``capsys``, sees it). In a multi-process run a message shows on rank 0 only, unless it is logged
with ``extra=EVERY_RANK``: what each rank does on its own (starting its own engine).

Silencing and routing are Python's: ``COSCALE_LOG_LEVEL=WARNING`` (any level name) before the
import, or ``logging.getLogger("coscale").setLevel(...)``. The console handler is
``logging.getLogger("coscale").handlers[0]`` (named ``coscale``); a program that routes logging
itself removes it and sets ``propagate = True`` to send the messages to its own handlers.

Use: ``from coscale.log import logger`` then ``logger.info("it1/sft: stage skipped")``; a module
may take its own child, ``get_logger(__name__)``, to be filtered on its own.
"""

from __future__ import annotations

import logging
import os
import sys

from coscale.distributed import is_rank_zero

NAME = "coscale"
LEVEL_ENV = "COSCALE_LOG_LEVEL"
"""The environment variable that sets the logger's level (``INFO`` when unset)."""
EVERY_RANK = {"every_rank": True}
"""``extra=`` of a message that each rank of a multi-process run shows."""


class ConsoleHandler(logging.Handler):
    """Writes INFO and below to the current ``sys.stdout``, WARNING and above to ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's rule: a failed write is reported, never raised
            self.handleError(record)


def shown_on_this_rank(record: logging.LogRecord) -> bool:
    """Rank 0 shows every message; another rank only those logged with ``EVERY_RANK``."""
    return getattr(record, "every_rank", False) or is_rank_zero()


def level_from_env() -> int:
    """The level ``COSCALE_LOG_LEVEL`` names; an unknown name is refused naming the variable."""
    name = os.environ.get(LEVEL_ENV, "INFO").strip().upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        known = "DEBUG, INFO, WARNING, ERROR, CRITICAL"
        raise ValueError(f"{LEVEL_ENV}={name!r} is not a logging level (one of {known})")
    return level


def _configure() -> logging.Logger:
    out = logging.getLogger(NAME)
    if not any(h.get_name() == NAME for h in out.handlers):
        handler = ConsoleHandler()
        handler.set_name(NAME)
        handler.setFormatter(logging.Formatter("[coscale] %(message)s"))
        handler.addFilter(shown_on_this_rank)
        out.addHandler(handler)
        out.setLevel(level_from_env())
        out.propagate = False  # shown once, by its own handler (as transformers' logger is)
    return out


logger = _configure()


def get_logger(name: str) -> logging.Logger:
    """A child of the ``coscale`` logger (``coscale.rollout.vllm.backend`` for ``__name__``)."""
    return logger.getChild(name.removeprefix(f"{NAME}."))
