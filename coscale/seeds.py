"""Every seed coscale derives, from one rule, and the one way it seeds torch for a block.

A seed that depends on several things (the run's seed, the step, the rank, a measurement's
number) is :func:`derive_seed` of them, a tag first naming what it seeds, so that no two uses
share a stream by accident and no formula with its own primes is written twice. Importable from
every room: it imports only torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def derive_seed(*parts: str | int) -> int:
    """A seed in ``[0, 2**31)`` determined by ``parts`` (a tag, then integers); different
    ``parts`` give unrelated seeds."""
    key = repr(tuple(p if isinstance(p, str) else int(p) for p in parts)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") >> 1


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Runs the block with torch's CPU (and current CUDA device's) generator seeded ``seed``;
    the generators are as they were after it."""
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield
