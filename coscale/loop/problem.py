"""The ``Problem`` record: one training or evaluation problem, as every loader returns it.

A problem is identified by ``id`` (the key of the pools and the solution bank), asks
``question``, is checked against the reference ``answer`` and may come with worked
``solutions`` from the data set (the first solutions given to an unsolvable problem).
Anything else the source row held travels in ``meta`` (e.g. a difficulty level).

A question is a text, or a conversation (TRL's conversational format): a tuple of
``{"role", "content"}`` messages, system and few-shot turns included, ending with the user turn
the policy answers. :class:`~coscale.models.prompting.PromptSettings` renders either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Question = str | tuple[dict[str, Any], ...]
"""A question: a text, or a conversation as ``{"role", "content"}`` messages."""


@dataclass(frozen=True)
class Problem:
    """One problem with its reference answer.

    ``meta`` and ``question`` are left out of the hash (a dict, or a conversation of dicts), so
    problems can still be put in sets; equality compares every field.
    """

    id: str
    """Unique key of the problem (pools, solution bank, logs)."""
    question: Question = field(hash=False)
    """The problem statement shown to the model: a text, or a conversation (a list given is
    kept as a tuple of message dicts)."""
    answer: str
    """Reference answer the reward checks completions against (``""``: none, a prompt-only
    row)."""
    solutions: tuple[str, ...] = ()
    """Worked solutions that come with the data set (may be empty)."""
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Other fields of the source row, kept as they were (the answer's field too, by its own
    name, when that name is not ``answer``: reward functions get every column by name)."""

    def __post_init__(self) -> None:
        # A list is the natural input (JSON, datasets); a tuple keeps the record immutable.
        if not isinstance(self.solutions, tuple):
            object.__setattr__(self, "solutions", tuple(self.solutions))
        if not isinstance(self.question, str):  # a conversation: its own copy of each message
            object.__setattr__(self, "question", tuple(dict(m) for m in self.question))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; ``Problem(**problem.to_dict())`` is an equal problem."""
        return {
            "id": self.id,
            "question": self.question if isinstance(self.question, str) else list(self.question),
            "answer": self.answer,
            "solutions": list(self.solutions),
            "meta": dict(self.meta),
        }
