"""Old log-probs and the parity check of the vLLM backend: trainer vs engine, on any rank layout.

`parity_verdict` holds the engine's log-probs to the trainer's within a tolerance by dtype
(`PARITY_ATOL`); `fill_logprobs` chooses between the two, the same way on every rank, and
`trainer_logprobs` recomputes them with the policy (a sharded model's forward is a collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from coscale.distributed import max_over_ranks
from coscale.rl.logprobs import sequence_logprobs
from coscale.rollout.base import Rollouts
from coscale.rollout.vllm.sync import ParityError
from coscale.rollout.weights import is_sharded

PARITY_ATOL = {"float32": 0.01, "float16": 0.1, "bfloat16": 0.15}
"""Default largest mean |engine - trainer| log-prob difference, by engine dtype. Measured on
vLLM 0.32 (CPU build), SmolLM2-135M-Instruct: float32 3.7e-05 (a 272-tensor sync: 3.8e-05),
bfloat16 0.037-0.050 per probe; an engine that kept its old tied LM head after one optimiser
step: 0.303. So a stale head fails in every dtype and bf16 noise stays 3x under its bound."""


def default_parity_atol(dtype: str) -> float:
    """`PARITY_ATOL` of `dtype` (an unknown or ``auto`` dtype gets the bfloat16 bound)."""
    return PARITY_ATOL.get(dtype, PARITY_ATOL["bfloat16"])


def trainer_parity_atol(policy: nn.Module, atol: float) -> float:
    """`atol`, or the bound of the trainer's autocast dtype where that is looser: under
    ``bf16-mixed`` the trainer scores in bfloat16 while a float32 engine samples (measured on
    SmolLM2-135M, CPU: 0.027 mean)."""
    device = next(policy.parameters()).device.type
    if not torch.is_autocast_enabled(device):
        return atol
    dtype = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    return max(atol, default_parity_atol(dtype))


@dataclass(frozen=True)
class ParityResult:
    """Engine vs trainer log-probs of the same sampled tokens."""

    tokens: int
    mean_abs: float
    max_abs: float
    atol: float

    @property
    def ok(self) -> bool:
        return self.tokens > 0 and self.mean_abs <= self.atol


def parity_verdict(engine: Tensor, trainer: Tensor, mask: Tensor, atol: float) -> ParityResult:
    """Compares `engine` and `trainer` log-probs [R, T] on `mask`; NaN counts as a mismatch."""
    kept = mask.bool()
    diff = (engine.float() - trainer.float()).abs()[kept]  # [K]
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    if diff.numel() == 0:
        return ParityResult(0, math.nan, math.nan, atol)
    return ParityResult(int(diff.numel()), float(diff.mean()), float(diff.max()), atol)


def check_verdict(result: ParityResult, version: int, logprobs_mode: str | None) -> None:
    """Raises `ParityError` explaining a failed parity check after sync number `version`."""
    if result.ok:
        return
    raise ParityError(
        f"vLLM and the trainer disagree after weight sync #{version}: mean "
        f"|logp_engine - logp_trainer| = {result.mean_abs:.4g} > parity.atol={result.atol} "
        f"(max {result.max_abs:.4g} over {result.tokens} tokens). The engine is not sampling "
        "from the policy's weights (names, dtype or sharding of the sync) or reports other "
        f"log-probs (logprobs_mode={logprobs_mode!r}). Raise rollout.options.parity.atol only for dtype noise."
    )


def trainer_logprobs(
    policy: nn.Module, rollouts: Rollouts, temperature: float, batch_size: int
) -> Tensor:
    """[R, T] log-probs of `rollouts` under `policy` (no grad), in chunks of `batch_size`.

    A sharded policy's forward is a collective: then every rank runs as many forward passes
    (padding passes repeat a row and are dropped), so uneven R does not hang.
    """
    device = next(policy.parameters()).device
    r = rollouts.num_rollouts
    chunks = math.ceil(r / batch_size)
    chunks = max_over_ranks(chunks) if is_sharded(policy) else chunks
    pieces = []
    with torch.no_grad():
        for c in range(chunks):
            rows = slice(c * batch_size, min(r, (c + 1) * batch_size))
            padding = rows.start >= r
            rows = slice(0, 1) if padding else rows
            ids = rollouts.input_ids[rows].to(device)  # [m, P+T] -> out: [m, T]
            mask = rollouts.attention_mask[rows].to(device)
            out = sequence_logprobs(policy, ids, mask, rollouts.prompt_length, temperature)
            if not padding:
                pieces.append(out.float().to(rollouts.logprobs.device))
    return torch.cat(pieces)


def fill_logprobs(
    rollouts: Rollouts,
    trusted: bool,
    policy: nn.Module | None,
    temperature: float,
    batch_size: int,
) -> str:
    """Sets `rollouts.logprobs` to the contract's values; returns where they came from.

    The engine's values are kept when `trusted` and complete (no NaN on a kept token), else
    `policy` recomputes them ("trainer"); for a sharded policy the choice is the same on every
    rank (its forward is a collective). Without a policy the engine's values stay, NaN turned
    into 0 ("engine-unchecked": fine for evaluation, which ignores them).
    """
    kept = rollouts.completion_mask.bool()  # [R, T]
    recompute = int(not trusted or bool((torch.isnan(rollouts.logprobs) & kept).any()))
    if policy is not None and is_sharded(policy):
        recompute = max_over_ranks(recompute)
    if recompute and policy is not None:
        values, source = trainer_logprobs(policy, rollouts, temperature, batch_size), "trainer"
    else:
        values = torch.nan_to_num(rollouts.logprobs, nan=0.0)
        source = "engine-unchecked" if recompute else "engine"
    rollouts.logprobs = torch.where(kept, values, torch.zeros_like(values))
    return source
