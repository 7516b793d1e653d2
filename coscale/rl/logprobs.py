"""Per-token log-probabilities of completions under a causal LM.

One definition shared by the rollout backends (old log-probs at sampling time) and the GRPO
update (new log-probs of the policy): `log_softmax(logits / temperature)` over the full
vocabulary, before any top-k / top-p truncation, gathered at the sampled token.
Temperature 0 means greedy decoding; its log-probs use temperature 1.

Shapes: R rollouts, P prompt tokens (left-padded), T completion tokens (right-padded), V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache

from coscale.models.capabilities import cache_kwargs, keep_last_logits, recomputes_activations


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


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the distribution `softmax(logits / temperature)` at each position, in float32.

    Args:
        logits: [..., V] raw model logits (any float dtype).
        temperature: Sampling temperature; 0 (greedy) counts as 1.

    Returns:
        [...] float32 entropies in nats, `logsumexp(z) - sum(softmax(z) * z)` for `z` the
        scaled logits.
    """
    if logits.dim() > 1 and logits.shape[:-1].numel() > ENTROPY_ROWS:  # bound the float copies
        flat = logits.reshape(-1, logits.shape[-1])  # [N, V]
        parts = [token_entropy(c, temperature) for c in flat.split(ENTROPY_ROWS)]
        return torch.cat(parts).reshape(logits.shape[:-1])  # [...]
    scaled = logits.float() / effective_temperature(temperature)  # [..., V]
    probs = torch.softmax(scaled, dim=-1)  # [..., V]
    return torch.logsumexp(scaled, dim=-1) - (probs * scaled).sum(-1)  # [...]


ENTROPY_ROWS = 1024
"""Positions per chunk in :func:`token_entropy`: its float32 copies of the logits (scaled and
softmax, [chunk, V] each) stay bounded whatever the micro-batch (1024 x a 152k vocabulary: 0.6
GB each) instead of growing to two more [R, T, V] tensors."""


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
    trim_padding: bool = True,
    prompt_index: Tensor | None = None,
    entropy: bool = False,
    entropy_grad: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Teacher-forced log-probs of the completion tokens of left-padded sequences.

    A forward pass with the positions `generate` used, so it reproduces the log-probs seen
    at sampling time. Gradients flow if enabled; train/eval mode is left as it is.

    Args:
        model: A causal LM returning `.logits` (an HF `*ForCausalLM`).
        input_ids: [R, P+T] left-padded prompt then right-padded completion.
        attention_mask: [R, P+T] 1 on prompt and kept completion tokens, 0 elsewhere.
        prompt_length: P, the number of prompt columns.
        temperature: Sampling temperature of the completions; 0 (greedy) counts as 1.
        trim_padding: Skip the columns that are padding in every row (leading prompt padding,
            trailing completion padding). Masked columns add nothing to the attention, so
            this changes only the float rounding (~1e-7), not what is computed.
        prompt_index: [R], the prompt each row answers (rows of one prompt have the same
            prompt columns, as in `Rollouts`). When given and some prompt has several rows,
            each distinct prompt runs through the model once and its KV cache (gathered per
            row, so gradients flow back into it) feeds the completions' pass: the same
            log-probs for fewer FLOPs. Ignored under gradient checkpointing (no cache then).
        entropy: Also return each completion position's token entropy (`token_entropy`),
            computed from the same logits: no extra forward pass.
        entropy_grad: Let gradients flow into the entropies (for an entropy bonus); off, they
            are computed without autograd, which keeps no [R, T, V] tensor for the backward.

    Returns:
        [R, T] float32 log-probs; 0 where `attention_mask[:, P:]` is 0. With `entropy`, a pair:
        the log-probs and the [R, T] float32 entropies, 0 there too.

    Raises:
        ValueError: If `prompt_length` is not in [1, P+T-1].
    """
    total = input_ids.shape[1]
    if not 1 <= prompt_length < total:
        raise ValueError(f"prompt_length must be in [1, {total - 1}], got {prompt_length}")
    start, stop = _used_columns(attention_mask, prompt_length) if trim_padding else (0, total)
    ids, mask = input_ids[:, start:stop], attention_mask[:, start:stop]  # [R, P'+T']
    prompt_length = prompt_length - start
    logits = None
    if prompt_index is not None:
        logits = _shared_prompt_logits(model, ids, mask, prompt_length, prompt_index)
    if logits is None:
        logits = _completion_logits(model, ids, mask, prompt_length)  # [R, T', V]
    logprobs = token_logprobs(logits, ids[:, prompt_length:], temperature)  # [R, T']
    keep = mask[:, prompt_length:].bool()  # [R, T']
    logprobs = F.pad(torch.where(keep, logprobs, 0), (0, total - stop))  # [R, T]
    if not entropy:
        return logprobs
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
        entropies = token_entropy(logits, temperature)  # [R, T']
    return logprobs, F.pad(torch.where(keep, entropies, 0), (0, total - stop))  # [R, T] each


def _completion_logits(model: nn.Module, ids: Tensor, mask: Tensor, prompt_length: int) -> Tensor:
    """One pass over prompt + completion -> [R, T, V] logits; column t predicts token t."""
    num_completion = ids.shape[1] - prompt_length
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        use_cache=False,
        **keep_last_logits(model, num_completion + 1),
    )
    return out.logits[:, -(num_completion + 1) : -1]  # position t predicts t+1


def _shared_prompt_logits(
    model: nn.Module, ids: Tensor, mask: Tensor, prompt_length: int, prompt_index: Tensor
) -> Tensor | None:
    """[R, T, V] logits like `_completion_logits`, each distinct prompt run once; None when
    no prompt has two rows or the model recomputes activations (gradient checkpointing)."""
    distinct, row_prompt = torch.unique(prompt_index, return_inverse=True)  # [U], [R]
    if len(distinct) == len(prompt_index) or recomputes_activations(model):
        return None
    rows = torch.arange(len(row_prompt), device=ids.device)
    first = torch.zeros_like(distinct).scatter_(0, row_prompt, rows)  # [U] a row per prompt
    p_ids, p_mask = ids[first, :prompt_length], mask[first, :prompt_length]  # [U, P]
    cache = DynamicCache()
    kwargs = {**cache_kwargs(model, cache), **keep_last_logits(model, 1)}
    out = model(
        input_ids=p_ids,
        attention_mask=p_mask,
        position_ids=position_ids_from_mask(p_mask),
        **kwargs,
    )
    head = out.logits[:, -1:][row_prompt]  # [R, 1, V] predicts completion token 0
    if ids.shape[1] - prompt_length == 1:
        return head
    cache.batch_select_indices(row_prompt)  # [U, ...] -> [R, ...], differentiable gather
    fed = ids[:, prompt_length:-1]  # [R, T-1] the last token is only a target
    positions = position_ids_from_mask(mask)[:, prompt_length:-1]  # [R, T-1]
    out = model(
        input_ids=fed,
        attention_mask=mask[:, :-1],
        position_ids=positions,
        **cache_kwargs(model, cache),
    )
    return torch.cat([head, out.logits], dim=1)  # [R, T, V]


def _used_columns(attention_mask: Tensor, prompt_length: int) -> tuple[int, int]:
    """[start, stop) of the columns some row attends to, keeping >= 1 prompt and completion
    column (so an all-padding batch still has a valid layout)."""
    used = attention_mask.bool().any(0).nonzero().squeeze(1)  # [L'] columns in use
    if len(used) == 0:
        return prompt_length - 1, prompt_length + 1
    start = min(int(used[0]), prompt_length - 1)
    stop = max(int(used[-1]) + 1, prompt_length + 1)
    return start, stop
