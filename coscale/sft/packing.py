"""Padding-free SFT batches: every row's real tokens end to end, attention kept per row.

A right-padded batch [B, L] spends the linear layers' FLOPs on its padding too (about a quarter
of the tokens in `bench_sft.py`'s batches). :func:`pack` lays the real tokens out as one row
[1, S] (S = the sum of the row lengths) with position ids restarting at 0 in each row, so the
embeddings, MLPs, projections and norms see S tokens, not B * L. Attention must still see one
row at a time: :func:`varlen_sdpa`, registered with transformers' attention interface as
``ATTENTION``, scatters q/k/v of the packed row back to [B, H, L_max, D], runs causal SDPA
(right padding needs no mask: a real query never sees a later column) and gathers the real
positions back. The output head runs only at the positions whose next token is a label.

Same loss and gradient as the padded batch up to float rounding (tests/test_packing.py). Used
when :func:`can_pack` says the packed forward computes what the padded one does; any other
model takes the padded path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface

from coscale.models.capabilities import (
    accepts,
    full_attention_only,
    recomputes_activations,
    unwrapped,
)
from coscale.sft.token_loss import token_mean_ce

ATTENTION = "coscale_varlen_sdpa"
"""The attention implementation name a packed forward runs under."""

_calls = [0]  # varlen_sdpa calls, so a model that bypasses the interface is caught


@dataclass
class PackedBatch:
    """A padding-free batch (B rows, S real tokens in all, K labelled next tokens)."""

    input_ids: Tensor  # [1, S] every row's real tokens, end to end
    position_ids: Tensor  # [1, S] 0..len-1 within each row
    cu_seq_lens: Tensor  # [B+1] where each row starts in S, then S
    max_length: int  # the longest row
    logit_index: Tensor  # [K] positions whose next token is a label
    targets: Tensor  # [K] those next tokens


def pack(enc: dict[str, Tensor], ignore_index: int = -100) -> PackedBatch:
    """The padding-free form of a ``tokenize_pairs`` batch (``input_ids``, ``attention_mask``,
    ``labels``, each [B, L]). A row's first label is never a target (nothing precedes it), as in
    the padded loss; so the last token of one row never predicts the first of the next."""
    real = enc["attention_mask"].bool()  # [B, L]
    lengths = real.sum(1)  # [B]
    labels = enc["labels"].clone()  # [B, L]
    labels[:, 0] = ignore_index
    flat_labels = labels[real]  # [S]
    next_labels = flat_labels[1:]  # [S-1] the label of the token after each position
    logit_index = (next_labels != ignore_index).nonzero().squeeze(1)  # [K]
    return PackedBatch(
        input_ids=enc["input_ids"][real].unsqueeze(0),
        position_ids=(real.cumsum(1) - 1)[real].unsqueeze(0),
        cu_seq_lens=F.pad(lengths.cumsum(0), (1, 0)),
        max_length=int(lengths.max()),
        logit_index=logit_index,
        targets=next_labels[logit_index],
    )


def can_pack(model: nn.Module, longest: int | None = None) -> bool:
    """Whether a packed forward of `model` gives the padded forward's result:
    - HF SDPA attention, looked up through transformers' attention interface
      (``is_backend_compatible``; Falcon and StableLM are not);
    - every layer sees its whole row: full attention, or a sliding window of at least
      `longest` tokens (the batch's longest row; None: no sliding window allowed);
    - no attention-logit soft-capping;
    - no activation checkpointing, HF's or torch's ``checkpoint_wrapper``: its recomputation
      would run outside :func:`packed_attention`;
    - ``position_ids`` and ``logits_to_keep`` inputs.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return False
    text = config.get_text_config(decoder=True)
    compatible = getattr(type(unwrapped(model)), "is_backend_compatible", None)
    return (
        config._attn_implementation == "sdpa"
        and text is config
        and compatible is not None
        and bool(compatible())
        and _sees_whole_rows(text, longest)
        and getattr(text, "attn_logit_softcapping", None) is None
        and not recomputes_activations(model)
        and accepts(model, "position_ids")
        and accepts(model, "logits_to_keep")
    )


def _sees_whole_rows(config: object, longest: int | None) -> bool:
    """Full attention everywhere, or sliding windows no shorter than the longest row."""
    if full_attention_only(config):
        return True
    kinds = set(getattr(config, "layer_types", None) or ["sliding_attention"])
    window = getattr(config, "sliding_window", None)
    return (
        kinds <= {"full_attention", "sliding_attention"}
        and longest is not None
        and window is not None
        and window >= longest
        and hasattr(config, "num_hidden_layers")
    )


def varlen_sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: Tensor | None = None,
    max_length_q: int | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """Causal SDPA within each row of a packed batch. q: [1, H, S, D]; k, v: [1, Hkv, S, D]
    -> ([1, S, H, D], None), the layout HF attention functions return.

    Raises:
        ValueError: If the layer asks for what this does not compute (no packing keywords, a
            window shorter than a row, non-causal attention, soft-capping, biases or sinks).
    """
    _check_layer_arguments(cu_seq_lens_q, max_length_q, sliding_window, is_causal, kwargs)
    _calls[0] += 1
    slots = _slots(cu_seq_lens_q, int(max_length_q), query.size(2))  # [S] index in [B * L_max]
    rows = len(cu_seq_lens_q) - 1
    q, k, v = (_unpack(x, slots, rows, int(max_length_q)) for x in (query, key, value))
    out = F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=q.size(1) != k.size(1)
    )  # [B, H, L_max, D]
    out = out.transpose(1, 2).reshape(-1, out.size(1), out.size(3))  # [B * L_max, H, D]
    return out.index_select(0, slots).unsqueeze(0), None


def _check_layer_arguments(cu_seq_lens, max_length, sliding_window, is_causal, extra) -> None:
    hint = "; set padding_free: false for this model"
    if cu_seq_lens is None or max_length is None:
        raise ValueError(f"{ATTENTION} got no cu_seq_lens_q / max_length_q (the model's layers "
                         f"do not pass the forward's keywords to attention){hint}")  # fmt: skip
    if sliding_window is not None and sliding_window < int(max_length):
        raise ValueError(f"{ATTENTION}: sliding window {sliding_window} is shorter than a "
                         f"{max_length}-token row{hint}")  # fmt: skip
    unsupported = [
        k for k in ("softcap", "position_bias", "s_aux", "sinks") if extra.get(k) is not None
    ]
    if is_causal is False or unsupported:
        raise ValueError(f"{ATTENTION} computes causal attention without "
                         f"{', '.join(unsupported) or 'is_causal=False'}{hint}")  # fmt: skip


def _slots(cu_seq_lens: Tensor, width: int, total: int) -> Tensor:
    """[S] position of each packed token (S = `total`) in a right-padded [B, width] layout,
    flattened."""
    lengths = cu_seq_lens.diff()  # [B]
    shift = torch.arange(len(lengths), device=cu_seq_lens.device) * width - cu_seq_lens[:-1]
    spread = torch.repeat_interleave(shift, lengths, output_size=total)  # [S]
    return spread + torch.arange(total, device=shift.device)


def _unpack(x: Tensor, slots: Tensor, rows: int, width: int) -> Tensor:
    """[1, H, S, D] -> [rows, H, width, D], zeros in the padding."""
    heads, dim = x.size(1), x.size(3)
    padded = x.new_zeros(rows * width, heads, dim).index_copy(0, slots, x[0].transpose(0, 1))
    return padded.view(rows, width, heads, dim).transpose(1, 2)


# No mask function is registered: transformers then builds no mask for this name (and does not
# scan the position ids for packed rows), and varlen_sdpa keeps the rows apart itself.
AttentionInterface.register(ATTENTION, varlen_sdpa)


@contextmanager
def packed_attention(model: nn.Module) -> Iterator[None]:
    """Runs `model`'s attention as :func:`varlen_sdpa` inside the block, then restores it.

    Raises:
        RuntimeError: If the forward inside never called it (the model does not look its
            attention up through transformers' interface), since the rows would have mixed.
    """
    config = model.config
    before, calls = config._attn_implementation, _calls[0]
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before
    if _calls[0] == calls:
        raise RuntimeError(
            f"{type(model).__name__} does not take its attention from transformers' "
            "AttentionInterface, so a packed batch would mix rows; set padding_free: false"
        )


def packed_logits(model: nn.Module, batch: PackedBatch) -> Tensor:
    """[K, V] float logits of a packed batch at the positions whose next token is a label."""
    kwargs = {"cu_seq_lens_q": batch.cu_seq_lens, "cu_seq_lens_k": batch.cu_seq_lens}
    kwargs |= {"max_length_q": batch.max_length, "max_length_k": batch.max_length}
    with packed_attention(model):
        out = model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=batch.logit_index,
            **kwargs,
        )
    return out.logits[0].float()  # [K, V]


def packed_loss(model: nn.Module, batch: PackedBatch) -> tuple[Tensor, int]:
    """Mean cross-entropy over the labelled next tokens of a packed batch, and their count."""
    return token_mean_ce(packed_logits(model, batch), batch.targets, len(batch.targets))  # [K, V]
