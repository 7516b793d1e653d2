"""How long one training step of a model takes in float32 and under bf16 autocast, on the CPU.

``precision: auto`` (:mod:`coscale.run.precision`) decides from this measurement, not from the
CPU's flags. The model is built from its own config with random weights (its shapes are what
matters, not its values), and each step is a forward pass with the labels and a backward pass of
one small batch, the way Lightning runs it: ``32-true`` plainly, ``bf16-mixed`` with the forward
under ``torch.autocast("cpu", dtype=torch.bfloat16)`` and float32 weights. One warm-up step of
each, then the median of up to five, interleaved so that a change of the machine's load falls on
both, within a budget of about two seconds. :func:`time_decode` times the other half of a run's
work the same way: sampling, a KV-cached decode under the same autocast (the in-process engines
sample in the trainer's precision). Other jobs on the machine still disturb the times,
many-fold on a loaded 2-core machine (time a run alone, as any benchmark).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from coscale.models import policy
from coscale.seeds import seeded


@dataclass(frozen=True)
class Timings:
    """Median seconds per forward and backward pass of one batch, in each precision."""

    fp32: float
    """``32-true``: float32 throughout."""
    bf16: float
    """``bf16-mixed``: the forward under bf16 autocast, float32 weights and backward."""
    batch: int
    """Sequences in the batch."""
    tokens: int
    """Tokens per sequence."""


def time_fwd_bwd(
    model: str, batch: int = 4, tokens: int = 64, repeats: int = 5, budget_s: float = 2.0
) -> Timings:
    """Times a training step of ``model``'s architecture in both precisions on the CPU.

    Args:
        model: Anything :func:`coscale.models.policy.resolve_model_path` takes (hub name,
            folder, ``builtin:`` spec); only its config is read.
        batch: Sequences per step.
        tokens: Tokens per sequence (at most the model's ``max_position_embeddings``).
        repeats: At most this many timed steps per precision after the warm-up.
        budget_s: No round of timed steps (one in each precision) starts after the rounds
            before it took this many seconds; the first always runs.

    Returns:
        The median seconds per step in each precision. The global RNG is left as it was.
    """
    with seeded(0):
        net = random_model(model)
        tokens = min(tokens, getattr(net.config, "max_position_embeddings", None) or tokens)
        vocab = net.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (batch, tokens))  # B x T
        fp32, bf16 = _medians(lambda bf16: _step(net, ids, bf16), repeats, budget_s)
    return Timings(fp32, bf16, batch, tokens)


def time_decode(
    model: str, batch: int = 4, tokens: int = 64, repeats: int = 3, budget_s: float = 3.0
) -> Timings:
    """Times sampling with ``model``'s architecture in both precisions on the CPU: ``batch``
    prompts of ``tokens // 2`` random ids, each extended by ``tokens // 2`` sampled tokens with
    the KV cache (``generate``), the forward passes under bf16 autocast for ``bf16-mixed``.
    Warm-up, rounds and budget as :func:`time_fwd_bwd`; the global RNG is left as it was."""
    with seeded(0):
        net = random_model(model).eval()
        tokens = min(tokens, getattr(net.config, "max_position_embeddings", None) or tokens)
        half = max(tokens // 2, 1)
        ids = torch.randint(1, net.get_input_embeddings().num_embeddings, (batch, half))  # B x T
        fp32, bf16 = _medians(lambda bf16: _decode(net, ids, half, bf16), repeats, budget_s)
    return Timings(fp32, bf16, batch, tokens)


def _medians(step: Callable[[bool], float], repeats: int, budget_s: float) -> tuple[float, float]:
    """Median seconds of ``step`` (given ``bf16``) in float32 and in bf16-mixed: one warm-up of
    each (kernels chosen, memory allocated), then rounds of one each, interleaved so that a burst
    of load falls on both, up to ``repeats`` while the rounds before took under ``budget_s``."""
    for bf16 in (False, True):
        step(bf16)
    seen: dict[bool, list[float]] = {False: [], True: []}
    rounds, spent = 0, 0.0
    while rounds < max(repeats, 1) and (rounds == 0 or spent < budget_s):
        for bf16 in (False, True):
            seen[bf16].append(step(bf16))
        rounds, spent = rounds + 1, spent + seen[False][-1] + seen[True][-1]
    return statistics.median(seen[False]), statistics.median(seen[True])


def random_model(model: str) -> Any:
    """``model``'s architecture with random float32 weights, in training mode.

    Raises:
        ValueError: ``model``'s config cannot be read (names ``pipeline.trainer.precision``,
            whose explicit value skips the measurement).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(policy.resolve_model_path(model))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"pipeline.trainer.precision: auto times a training step of the model, but the "
            f"config of {model!r} could not be read ({err}); set pipeline.trainer.precision to "
            "32-true or bf16-mixed to skip the measurement"
        ) from err
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def _step(net: Any, ids: torch.Tensor, bf16: bool) -> float:
    """Seconds of one forward (with the labels) and backward pass of ``ids``."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = net(input_ids=ids, labels=ids).loss
    loss.backward()
    net.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _decode(net: Any, ids: torch.Tensor, new: int, bf16: bool) -> float:
    """Seconds to sample ``new`` tokens after each row of ``ids`` (no early stop)."""
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        net.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
            do_sample=True, pad_token_id=0,
        )  # fmt: skip
    return time.perf_counter() - start
