"""A sequence-classification model as one reward function, scored as TRL's ``GRPOTrainer`` does.

TRL takes a reward model in its reward list (a folder or hub id, loaded as
``AutoModelForSequenceClassification`` with ``num_labels=1``, with its own tokenizer). A
completion's score is the model's first logit on the prompt + completion text:

* conversational prompt (message lists): the prompt's messages and the completion as an
  assistant message, rendered by the reward model's own chat template, ``chat_template_kwargs``
  passed through (no generation prompt: the conversation is complete);
* standard prompt (text): the prompt text followed by the completion text.

Texts are tokenised without special tokens (the template wrote them) and right-padded; the model
reads the last token that is not padding, so its config's ``pad_token_id`` is set to the
tokenizer's (EOS when it has no pad token), as TRL does. Here the texts go through the model
``batch_size`` at a time, on the policy's device: :class:`~coscale.scoring.reward_set.RewardSet`
calls :meth:`RewardModel.to_device` with the device of the step it scores for.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from coscale.checks import at_least, one_of
from coscale.models.capabilities import DTYPES

HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
"""A hub id: ``owner/name``."""


def is_model_spec(value: Any) -> bool:
    """A reward model's folder (one that exists) or hub id (``owner/name``), or a
    ``transformers`` model object. Other strings are not: a mistyped dotted path of a function
    is then refused as such, not loaded as a model."""
    if isinstance(value, str):
        return os.path.isdir(value) or HUB_ID.fullmatch(value) is not None
    return isinstance(value, torch.nn.Module) and hasattr(value, "config")


def as_reward(value: Any) -> Any:
    """``value`` as a reward function: a reward model's folder or hub id, or a ``transformers``
    sequence-classification model, becomes a :class:`RewardModel` (with the model's own
    tokenizer, as TRL loads it); anything else is returned as it is."""
    return RewardModel(value) if is_model_spec(value) else value


class RewardModel:
    """A sequence-classification model's first logit as the reward of each completion.

    Args:
        model: The model's folder or hub id, or the model itself.
        tokenizer: Its tokenizer, or the tokenizer's folder or hub id (None: loaded from where
            the model was, as TRL does).
        batch_size: Texts per forward pass.
        chat_template_kwargs: Extra arguments of the chat template for conversational prompts
            (e.g. ``{"enable_thinking": False}``; TRL's ``chat_template_kwargs``).
        dtype: Dtype the model is loaded in (``float32``, ``bfloat16`` or ``float16``); a model
            object keeps its own.
        trust_remote_code: Allow custom model code shipped with the model.
        name: Its name in ``train/rewards/<name>`` (None: the last part of the model's id, as TRL
            names it).

    Raises:
        ValueError: Naming every bad argument, or a model or tokenizer that does not load.
    """

    needs_answer = False  # it scores prompt and completion (scoring.answers)

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | Any | None = None,
        batch_size: int = 16,
        chat_template_kwargs: dict[str, Any] | None = None,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        name: str | None = None,
    ) -> None:
        errors = _errors(model, batch_size, dtype, chat_template_kwargs)
        if errors:
            raise ValueError("RewardModel: " + "; ".join(errors))
        self.model = _load_model(model, dtype, trust_remote_code).eval()
        source = getattr(self.model.config, "_name_or_path", "") or ""
        self.tokenizer = _load_tokenizer(tokenizer, source, trust_remote_code)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.get_text_config().pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.chat_template_kwargs = batch_size, dict(chat_template_kwargs or {})
        self.__name__ = name or source.rstrip("/").split("/")[-1] or "reward_model"

    def to_device(self, device: torch.device | str) -> None:
        """Moves the model to ``device`` (a no-op where it already is)."""
        if next(self.model.parameters()).device != torch.device(device):
            self.model.to(device)

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The text the model scores for each (prompt, completion): both TRL's formats."""
        if not prompts or not isinstance(prompts[0], (list, tuple)):
            return [p + c for p, c in zip(prompts, completions)]  # standard: plain text
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"RewardModel {self.__name__!r}: conversational prompts need a tokenizer with a "
                "chat_template; give RewardModel(tokenizer=...) one that has it"
            )
        return [
            self.tokenizer.apply_chat_template(
                [*p, *c], tokenize=False, **self.chat_template_kwargs
            )
            for p, c in zip(prompts, completions)
        ]

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **unused: Any
    ) -> list[float]:
        """One score per completion: the model's first logit on its text (TRL-style call)."""
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                text=texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            )  # [b, L] each
            with torch.inference_mode():
                logits = self.model(**{k: v.to(device) for k, v in batch.items()}).logits
            scores += logits[:, 0].float().tolist()  # [b] the first label's logit
        return scores


def _errors(model: Any, batch_size: Any, dtype: Any, chat_template_kwargs: Any) -> list[str]:
    errors = []
    if not is_model_spec(model):
        errors.append(
            "model must be an existing folder, a hub id (owner/name) or a transformers model, "
            f"got {model!r}"
        )
    errors += at_least(1, batch_size=batch_size) + one_of(tuple(DTYPES), dtype=dtype)
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        errors.append(f"chat_template_kwargs must be a mapping, got {chat_template_kwargs!r}")
    return errors


def _load_model(model: str | Any, dtype: str, trust_remote_code: bool) -> Any:
    if not isinstance(model, str):
        return model
    from transformers import AutoModelForSequenceClassification

    try:
        return AutoModelForSequenceClassification.from_pretrained(
            model, num_labels=1, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ValueError(
            f"RewardModel: model={model!r} does not load as a sequence-classification model "
            f"(a folder or hub id): {err}"
        ) from None


def _load_tokenizer(tokenizer: str | Any | None, source: str, trust_remote_code: bool) -> Any:
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    name = tokenizer or source
    if not name:
        raise ValueError(
            "RewardModel: the model object says nowhere it was loaded from; give tokenizer="
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(f"RewardModel: tokenizer {name!r} does not load: {err}") from None
