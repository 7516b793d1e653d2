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
def kept_rng(device: torch.device | str | None = None) -> Iterator[None]:
    """Torch's CPU generator and ``device``'s (None: the current CUDA device once CUDA is in use,
    never starting it; a CPU device: the CPU's only) are as they were after the block, whatever
    it draws or seeds."""
    kind, index = "cuda", None
    if device is None:
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    elif (device := torch.device(device)).type != "cpu":
        kind, index = device.type, device.index
        if index is None:
            index = torch.cuda.current_device() if kind == "cuda" else 0
    with torch.random.fork_rng(devices=[] if index is None else [index], device_type=kind):
        yield


@contextmanager
def seeded(seed: int, device: torch.device | str | None = None) -> Iterator[None]:
    """Runs the block with torch seeded ``seed``; the generators :func:`kept_rng` keeps are as
    they were after it (``torch.manual_seed`` seeds every device: one device per process)."""
    with kept_rng(device):
        torch.manual_seed(seed)
        yield
