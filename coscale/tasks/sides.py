"""Disjoint sides of a problem set, by a hash of each question's text: train, val and test.

One problem in ten is ``val`` (validation: checkpoint selection, keep rules, every config
choice), one in ten ``test`` where the set also supplies the report's held-out problems (the
built-in task), the rest ``train``. The side depends on the text alone, not on a seed or the
order rows come in, so the sides stay disjoint however they are drawn.
"""

from __future__ import annotations

import hashlib

SIDES = ("train", "val", "test")
"""Every side a problem can be on."""


def side_of(question: str, with_test: bool = True) -> str:
    """The side of ``question``; ``with_test=False`` (a set whose test problems come from
    elsewhere) keeps the ``test`` tenth on the ``train`` side."""
    bucket = int(hashlib.sha1(question.encode()).hexdigest(), 16) % 10
    if bucket == 5:
        return "val"
    return "test" if bucket == 0 and with_test else "train"
