"""Per-token log-probabilities of completions under a causal LM.

One definition shared by the rollout backends (old log-probs at sampling time) and the GRPO
update (new log-probs of the policy): `log_softmax(logits / temperature)` over the full
vocabulary, before any top-k / top-p truncation, gathered at the sampled token.
Temperature 0 means greedy decoding; its log-probs use temperature 1.

Shapes: R rollouts, P prompt tokens (left-padded), T completion tokens (right-padded), V vocab.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn


def effective_temperature(temperature: float) -> float:
    """Returns the temperature that divides the logits (1.0 for greedy, temperature 0).

    Raises:
        ValueError: If `temperature` is negative.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    return 1.0 if temperature == 0 else float(temperature)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probabilities of `tokens` under `logits / temperature`, in float32.

    Args:
        logits: [..., V] raw model logits (any float dtype).
        tokens: [...] token ids, same leading shape as `logits`.
        temperature: Sampling temperature; 0 (greedy) counts as 1.

    Returns:
        [...] float32 log-probabilities.
    """
    scaled = logits.float() / effective_temperature(temperature)  # [..., V]
    picked = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [...]
    return picked - torch.logsumexp(scaled, dim=-1)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids as HF `generate` computes them for a left-padded batch.

    Args:
        attention_mask: [R, L] 1 on real tokens, 0 on padding.

    Returns:
        [R, L] long: 0, 1, 2, ... over real tokens; 0 on left padding.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    temperature: float = 1.0,
) -> Tensor:
    """Teacher-forced log-probs of the completion tokens of left-padded sequences.

    One forward pass with the positions `generate` used, so it reproduces the log-probs seen
    at sampling time. Gradients flow if enabled; train/eval mode is left as it is.

    Args:
        model: A causal LM returning `.logits` (an HF `*ForCausalLM`).
        input_ids: [R, P+T] left-padded prompt then right-padded completion.
        attention_mask: [R, P+T] 1 on prompt and kept completion tokens, 0 elsewhere.
        prompt_length: P, the number of prompt columns.
        temperature: Sampling temperature of the completions; 0 (greedy) counts as 1.

    Returns:
        [R, T] float32 log-probs; 0 where `attention_mask[:, P:]` is 0.

    Raises:
        ValueError: If `prompt_length` is not in [1, P+T-1].
    """
    total = input_ids.shape[1]
    if not 1 <= prompt_length < total:
        raise ValueError(f"prompt_length must be in [1, {total - 1}], got {prompt_length}")
    num_completion = total - prompt_length
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **_keep_last_logits(model, num_completion + 1),
    )
    logits = out.logits[:, -(num_completion + 1) : -1]  # [R, T, V]; position t predicts token t+1
    logprobs = token_logprobs(logits, input_ids[:, prompt_length:], temperature)  # [R, T]
    keep = attention_mask[:, prompt_length:].bool()  # [R, T]
    return torch.where(keep, logprobs, torch.zeros_like(logprobs))


def _keep_last_logits(model: nn.Module, count: int) -> dict[str, int]:
    """`logits_to_keep=count` when `model.forward` takes it (skips the prompt's logits)."""
    try:
        accepted = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepted = False
    return {"logits_to_keep": count} if accepted else {}
