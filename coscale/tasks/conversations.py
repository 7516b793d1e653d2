"""TRL's conversational rows read as problems: a prompt of messages, a completion of messages.

TRL's data sets hold a prompt either as text (its *standard* format) or as a list of
``{"role", "content"}`` messages (its *conversational* format: system and few-shot turns
included). A conversation mapped as the question is read whole; when it ends with an assistant
turn (TRL's ``messages`` format, a whole conversation), that last turn is a worked solution and
the messages before it are the question. A completion of messages (TRL's prompt-completion
format) is one assistant message, whose content is the solution.

The checks raise ``ValueError`` with the row's first fault; the loader reports it as a bad row
with its file and line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROMPT_ENDS = ("user", "tool")
"""Roles a conversational question may end with: the turn the policy answers."""


def is_conversation(value: Any) -> bool:
    """Whether ``value`` is a list of messages (TRL's ``is_conversational`` test: a list whose
    first item is a mapping with a ``role``)."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) > 0
        and isinstance(value[0], Mapping)
        and "role" in value[0]
    )


def split_conversation(value: Sequence[Any], name: str) -> tuple[tuple[dict, ...], str | None]:
    """A conversation as (the question's messages, the solution of a last assistant turn).

    Args:
        value: The column's messages.
        name: The column's name, for the messages.

    Raises:
        ValueError: A message that is not ``{"role": str, "content": str}``, or a question that
            does not end with a user (or tool) turn.
    """
    messages = _messages(value, name)
    solution = None
    if messages[-1]["role"] == "assistant":
        solution, messages = messages[-1]["content"], messages[:-1]
        if not solution.strip():
            raise ValueError(f"empty last assistant turn (field {name!r})")
    if not messages or messages[-1]["role"] not in PROMPT_ENDS:
        last = messages[-1]["role"] if messages else "nothing"
        raise ValueError(
            f"question (field {name!r}) must end with a {' or '.join(PROMPT_ENDS)} turn "
            f"(before a last assistant turn, the solution), got {last}"
        )
    return messages, solution


def completion_text(value: Sequence[Any], name: str) -> str:
    """The solution a conversational completion holds: its one assistant message's content.

    Raises:
        ValueError: Anything but one non-empty assistant message.
    """
    messages = _messages(value, name)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        roles = [m["role"] for m in messages]
        raise ValueError(
            f"a completion of messages (field {name!r}) must be one assistant message, "
            f"got roles {roles}"
        )
    if not messages[0]["content"].strip():
        raise ValueError(f"empty completion (field {name!r})")
    return messages[0]["content"]


def _messages(value: Sequence[Any], name: str) -> tuple[dict, ...]:
    """``value`` checked: each message a mapping with a role and a text content."""
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} (field {name!r}) must be an object, got {message!r}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role.strip():
            raise ValueError(f"message {i} (field {name!r}) needs a role (str), got {role!r}")
        if not isinstance(content, str):
            raise ValueError(
                f"message {i} (field {name!r}) needs a text content (str; multimodal parts are "
                f"not read), got {type(content).__name__}"
            )
    return tuple(dict(message) for message in value)
