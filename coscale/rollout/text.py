"""Text helpers every rollout backend shares: which tokens end a completion, and where a stop
string cuts one, so that HF ``generate``, the cached decode and vLLM end completions alike."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from transformers import PreTrainedTokenizerBase

from coscale.models.prompting import end_of_turn_id


def eos_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's EOS, any EOS ids in the model's generation
    config, and the chat template's end-of-turn token (``<|im_end|>``), which a chat model emits
    to close its answer even where its EOS is another token (``<|endoftext|>``)."""
    ids = [tokenizer.eos_token_id, end_of_turn_id(tokenizer)]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += configured if isinstance(configured, list) else [configured]
    found = tuple(dict.fromkeys(i for i in ids if i is not None))
    if not found:
        raise ValueError(
            "no EOS token id: set tokenizer.eos_token or generation_config.eos_token_id"
        )
    return found


def stop_cut(
    ids: list[int], stop: tuple[str, ...], decode: Callable[[list[int]], str]
) -> int | None:
    """Shortest prefix length of `ids` whose text holds a stop string; None if none does.

    Binary search over prefixes: a prefix's text contains a stop string once any shorter
    one does, so O(log T) decodes instead of one per token.
    """
    if not stop or not any(s in decode(ids) for s in stop):
        return None
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        if any(s in decode(ids[:mid]) for s in stop):
            high = mid
        else:
            low = mid + 1
    return low
