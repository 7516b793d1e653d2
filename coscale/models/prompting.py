"""How a problem's question becomes the prompt the policy sees, and how a chat turn ends.

One object decides the prompt text for SFT, GRPO, evaluation and teacher sampling alike, so that
a model is always sampled on exactly the prompts it was trained on. For chat models the tokenizer's
chat template also says where an answer ends: :func:`end_of_turn_id` is the special token it writes
after an assistant message (``<|im_end|>`` in ChatML), which SFT appends to every target and
the rollout backends stop at, whatever the tokenizer's EOS is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from coscale.renamed import old_names


@dataclass(frozen=True)
class PromptSettings:
    """Turns a question, a text or a conversation, into a prompt string.

    A text question is ``template`` filled in, or with ``chat`` that text as a user turn (after
    ``system``) rendered by the tokenizer's chat template. A conversation (TRL's conversational
    format: ``{"role", "content"}`` messages, system and few-shot turns included) is always
    rendered by the chat template, exactly as TRL's ``maybe_apply_chat_template`` renders a
    prompt: the generation prompt added, ``chat_template_kwargs`` passed through. Its last user
    turn's content is filled into ``template``; ``system`` is put first only when the
    conversation has no system message of its own (the row's own wins).

    Attributes:
        template: Python format string with a ``{question}`` field, e.g. ``"Q:{question}\\nA:"``.
        chat: Wrap a text question as a user turn with the tokenizer's chat template and add the
            generation prompt (for instruct models such as Qwen2.5-Instruct). Conversations are
            chat-rendered whatever its value.
        system: Optional system message of chat-rendered prompts (not of plain text ones).
        chat_template_kwargs: Extra arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` (TRL's ``GRPOConfig.chat_template_kwargs``).
    """

    template: str = "{question}"
    chat: bool = False
    system: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if "{question}" not in self.template:
            raise ValueError(f"prompt.template must contain '{{question}}', got {self.template!r}")
        if not isinstance(self.chat_template_kwargs, Mapping):
            raise ValueError(
                "prompt.chat_template_kwargs must be a dict of the chat template's arguments, "
                f"got {self.chat_template_kwargs!r}"
            )
        object.__setattr__(self, "chat_template_kwargs", dict(self.chat_template_kwargs))

    def __call__(self, question: str | Sequence[Mapping[str, Any]], tokenizer: Any = None) -> str:
        """Returns the prompt for ``question``; ``tokenizer`` is needed for a chat prompt."""
        if not self.is_chat(question):
            return self._fill(question)
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "a chat prompt (prompt.chat=true, or a conversational question) needs a "
                "tokenizer with a chat_template; use an instruct model's tokenizer"
                + ("" if isinstance(question, str) else ", or give the question as text")
            )
        return tokenizer.apply_chat_template(
            self.messages(question),
            tokenize=False,
            add_generation_prompt=True,
            **self.chat_template_kwargs,
        )

    def is_chat(self, question: str | Sequence[Mapping[str, Any]]) -> bool:
        """Whether ``question``'s prompt is rendered by the chat template."""
        return self.chat or not isinstance(question, str)

    def messages(self, question: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages a chat prompt is rendered from: ``[system?, user]`` for a text question;
        a conversation with its last user turn filled into ``template`` and ``system`` first
        unless it has a system message."""
        if isinstance(question, str):
            messages = [{"role": "user", "content": self._fill(question)}]
        else:
            messages = [dict(m) for m in question]
            users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
            if users and isinstance(messages[users[-1]].get("content"), str):
                last = messages[users[-1]]
                last["content"] = self._fill(last["content"])
        if self.system and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system})
        return messages

    def conversations(self, questions: Sequence[Any]) -> list[list[dict[str, Any]]] | None:
        """The messages of every prompt (what TRL-style reward functions get as ``prompts``),
        or None when none of ``questions`` is chat-rendered (text prompts)."""
        if not any(self.is_chat(q) for q in questions):
            return None
        return [self.messages(q) for q in questions]

    def _fill(self, text: str) -> str:
        return self.template.replace("{question}", text)


_PROBE = "COSCALE_PROBE_7F3A"
"""Placeholder message text, found again in the rendered template to cut out what surrounds it."""


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message, or None.

    Found by rendering a one-exchange conversation and tokenising what follows the assistant's
    text: ``<|im_end|>`` for ChatML (SmolLM2, Qwen), ``<|eot_id|>`` for Llama 3,
    ``<end_of_turn>`` for Gemma. None without a chat template, or when the template writes no
    special token there (a plain-text turn end cannot stop generation safely).
    """
    conversation = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": _PROBE}]
    text = _render(tokenizer, conversation, add_generation_prompt=False)
    if text is None or _PROBE not in text:
        return None
    tail = text.rpartition(_PROBE)[2].lstrip()
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    return ids[0] if ids and ids[0] in _special_ids(tokenizer) else None


def generation_prompt(tokenizer: Any) -> str:
    """What ``add_generation_prompt`` adds after a user turn (``<|im_start|>assistant\\n`` in
    ChatML); "" without a chat template."""
    turn = [{"role": "user", "content": _PROBE}]
    opened = _render(tokenizer, turn, add_generation_prompt=True)
    closed = _render(tokenizer, turn, add_generation_prompt=False)
    if opened is None or closed is None or not opened.startswith(closed):
        return ""
    return opened[len(closed) :]


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception:  # a template may refuse the probe conversation (jinja raise_exception)
        return None


def _special_ids(tokenizer: Any) -> set[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, tok in added.items() if tok.special}


# Module hyper-parameters (saved in Lightning checkpoints) hold a PromptSettings; allow it in
# torch.load's safe (weights_only) unpickler so checkpoints load without trusting arbitrary code.
torch.serialization.add_safe_globals(
    [PromptSettings, (PromptSettings, "coscale.models.prompting.PromptFormat")]  # its old name
)


def as_prompt_format(value: PromptSettings | dict[str, Any] | str | None) -> PromptSettings:
    """Accepts a PromptSettings, its fields as a dict (from YAML), or a bare template string."""
    if value is None:
        return PromptSettings()
    if isinstance(value, PromptSettings):
        return value
    if isinstance(value, str):
        return PromptSettings(template=value)
    if isinstance(value, dict):
        return PromptSettings(**value)
    raise ValueError(f"prompt must be a PromptSettings, a dict or a template string; got {value!r}")


def prompt_fields(value: PromptSettings | dict[str, Any] | str | None) -> dict[str, Any]:
    """`value` as the dict of its `PromptSettings` fields: how a module's hyperparameters keep it.

    Lightning's loggers write hyperparameters as YAML through ``apply_to_collection``, which
    refuses a frozen dataclass; `as_prompt_format` turns the dict back into the format.
    """
    return dataclasses.asdict(as_prompt_format(value))


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"PromptFormat": PromptSettings})
