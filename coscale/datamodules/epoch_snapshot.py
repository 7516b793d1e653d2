"""What an epoch's loader served, saved with each checkpoint so that a resumed epoch serves it again.

An epoch's items are a snapshot of the pools taken when its loader is built; the pools may change
before the epoch ends (the RL module closes the epoch in the step that trains its last batch, and
a step checkpoint follows). Rebuilt from the restored pools, a resumed epoch's loader would hold
other problems, other N or none at all (and Lightning then skips the whole rest of the fit). So
the snapshot travels in the DataModule's state: RL items as they were served (the solvable
problems with their N: small); SFT pairs as a count and a digest only (the bank does not change
during an SFT fit and its pairs can be large), checked when the resumed epoch rebuilds them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

Item = dict[str, Any]


def digest(items: list[Item]) -> str:
    """A fingerprint of ``items`` in their order (sha256 of their JSON)."""
    text = json.dumps(items, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class EpochSnapshot:
    """The items one epoch of a fit was served (unshuffled; the shuffle is seeded by the epoch)."""

    epoch: int
    kind: str  # "rl" or "sft" (coscale.datamodules.serving.DATA_KINDS)
    items: list[Item]
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = digest(self.items)

    def state_dict(self) -> dict[str, Any]:
        state = {"epoch": self.epoch, "kind": self.kind, "count": len(self.items)}
        state["digest"] = self.fingerprint
        return state | ({"items": self.items} if self.kind == "rl" else {})


def resumed_items(
    saved: dict[str, Any] | None, kind: str, epoch: int, build: Callable[[], list[Item]]
) -> list[Item]:
    """The items of ``epoch``: those ``saved`` from the same epoch before a resume, else built.

    A saved RL epoch is served as it was. A saved SFT epoch is built again and checked against
    its digest; pairs that differ (the data changed between the runs) are served with a warning
    naming the epoch, as the resumed epoch cannot be the one that was cut.
    """
    if not saved or saved["epoch"] != epoch or saved["kind"] != kind:
        return build()
    if "items" in saved:
        return [dict(item) for item in saved["items"]]
    items = build()
    if digest(items) != saved["digest"]:
        rank_zero_warn(
            f"the resumed fit's epoch {epoch} builds {len(items)} SFT pairs that differ from the "
            f"{saved['count']} it was served before the checkpoint (the bank or the data "
            f"settings changed since): the epoch goes on with the new pairs"
        )
    return items
