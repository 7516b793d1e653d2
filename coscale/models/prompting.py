"""How a problem's question becomes the prompt the policy sees.

One object decides the prompt text for SFT, GRPO and evaluation alike, so that a model is
always sampled on exactly the prompts it was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PromptFormat:
    """Turns a question into a prompt string.

    Attributes:
        template: Python format string with a ``{question}`` field, e.g. ``"Q:{question}\\nA:"``.
        chat: Wrap the formatted text as a user turn with the tokenizer's chat template and add the
            generation prompt (for instruct models such as Qwen2.5-Instruct).
        system: Optional system message, only used when ``chat`` is true.
    """

    template: str = "{question}"
    chat: bool = False
    system: str | None = None

    def __post_init__(self) -> None:
        if "{question}" not in self.template:
            raise ValueError(f"prompt.template must contain '{{question}}', got {self.template!r}")

    def __call__(self, question: str, tokenizer: Any = None) -> str:
        """Returns the prompt for ``question``; ``tokenizer`` is needed only when ``chat`` is set."""
        text = self.template.replace("{question}", question)
        if not self.chat:
            return text
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "prompt.chat=true needs a tokenizer with a chat_template; "
                "set prompt.chat=false or use an instruct model's tokenizer"
            )
        messages = [{"role": "user", "content": text}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# Module hyper-parameters (saved in Lightning checkpoints) hold a PromptFormat; allow it in
# torch.load's safe (weights_only) unpickler so checkpoints load without trusting arbitrary code.
torch.serialization.add_safe_globals([PromptFormat])


def as_prompt_format(value: PromptFormat | dict[str, Any] | str | None) -> PromptFormat:
    """Accepts a PromptFormat, its fields as a dict (from YAML), or a bare template string."""
    if value is None:
        return PromptFormat()
    if isinstance(value, PromptFormat):
        return value
    if isinstance(value, str):
        return PromptFormat(template=value)
    if isinstance(value, dict):
        return PromptFormat(**value)
    raise ValueError(f"prompt must be a PromptFormat, a dict or a template string; got {value!r}")
