"""The rollout interface: sampling settings, the rollout batch, and the backend contract.

Every generation engine (HF `generate`, vLLM, ...) implements `RolloutBackend.generate`
and returns a `Rollouts` batch with the same layout, so the GRPO update never knows which
engine sampled. Shapes: B prompts, R rollouts (R = sum of the per-prompt N),
P prompt tokens (left-padded), T completion tokens (right-padded).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from coscale.checks import at_least, is_number

FINISH_REASONS: tuple[str, ...] = ("stop", "length")
"""`"stop"`: an end token (EOS or the chat template's end-of-turn token, e.g. `<|im_end|>`) or a
stop string ended the completion; `"length"`: max_new_tokens did."""

LOGPROB_SOURCES: tuple[str, ...] = ("trainer", "engine", "engine-unchecked")
"""Where `Rollouts.logprobs` came from: `"trainer"`, the trainer's own model (the HF and cached
backends share it; vLLM recomputing them); `"engine"`, an engine with its own copy of the weights
(vLLM's log-probs where they match the contract); `"engine-unchecked"`, an engine's, incomplete
ones zero-filled, with no trainer's model to recompute them (evaluation only)."""

_TENSOR_FIELDS = ("prompt_index", "input_ids", "attention_mask", "completion_mask", "logprobs")


def sampling_errors(
    max_new_tokens: Any, temperature: Any, top_p: Any, top_k: Any, unset: bool = False
) -> list[str]:
    """Every bad sampling setting, named: the one check of every settings group that holds them
    (these parameters, ``pipeline.sampling``, ``GRPOModule``'s ``sampling``); with ``unset``,
    None passes (a field the run fills in)."""
    errors = at_least(1, optional=unset, max_new_tokens=max_new_tokens)
    errors += at_least(0, optional=unset, top_k=top_k)
    errors += at_least(0, float, optional=unset, temperature=temperature)
    if not ((unset and top_p is None) or (is_number(top_p) and 0 < top_p <= 1)):
        errors.append(f"top_p must be in (0, 1], got {top_p!r}")
    return errors


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling settings, defined once with one set of defaults: the backends' and
    ``GRPOModule``'s :class:`SamplingParams` and the run's ``pipeline.sampling``
    (:class:`~coscale.run.settings.RunSamplingSettings`) extend it, so a module in a user's
    ``Trainer`` samples as ``coscale run`` does with the same settings.

    Attributes:
        max_new_tokens: Most tokens generated per completion (>= 1).
        temperature: Softmax temperature (>= 0); 0 means greedy decoding.
        top_p: Nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens (>= 0); 0 disables it.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def errors(self, unset: bool = False) -> list[str]:
        """Every bad setting, named (``unset``: None passes)."""
        fields = (self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        return sampling_errors(*fields, unset=unset)

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0


@dataclass(frozen=True)
class SamplingParams(SamplingSettings):
    """How completions are sampled: :class:`SamplingSettings` with a seed and stop strings (a
    backend call's, and ``GRPOModule``'s ``sampling``).

    Attributes:
        seed: Makes sampling reproducible for the same call (same prompts, N and backend
            settings); None uses the ambient RNG. ``GRPOModule``'s is the base of every step's
            seed (``derive_seed("step", seed, step, rank)``; None: 0).
        stop: Extra stop strings; the completion ends with the token that completes the
            first one found (that token is kept). A list is turned into a tuple.
    """

    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        numbers = (self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        # all four None: a group whose values the run writes in (coscale run's parser builds it
        # so); the run checks them then
        if problems := self.errors(unset=all(v is None for v in numbers)):
            raise ValueError("sampling: " + "; ".join(problems))

    def errors(self, unset: bool = False) -> list[str]:
        errors = super().errors(unset) + at_least(0, optional=True, seed=self.seed)
        if any(not isinstance(s, str) or not s for s in self.stop):
            errors.append(f"stop must hold non-empty strings, got {self.stop!r}")
        return errors


def normalize_n_per_prompt(n_per_prompt: int | Sequence[int], num_prompts: int) -> list[int]:
    """Turns `n_per_prompt` into one rollout count per prompt.

    Args:
        n_per_prompt: One count for every prompt, or a count per prompt.
        num_prompts: B, the number of prompts.

    Returns:
        B counts, each >= 1.

    Raises:
        ValueError: If a count is below 1 or not an int, or the list length is not B.
    """
    if isinstance(n_per_prompt, int):
        counts = [n_per_prompt] * num_prompts
    else:
        counts = list(n_per_prompt)
        if len(counts) != num_prompts:
            raise ValueError(
                f"n_per_prompt must have one entry per prompt ({num_prompts}), got {len(counts)}"
            )
    bad = [n for n in counts if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ValueError(f"n_per_prompt entries must be ints >= 1, got {bad}")
    return counts


@dataclass
class Rollouts:
    """A batch of completions, R = sum of the per-prompt N; checked on construction.

    Attributes:
        prompt_index: [R] long, the prompt (0..B-1) each rollout answers; rollouts of one
            prompt form one group.
        input_ids: [R, P+T] long, left-padded prompt then completion right-padded with pad.
        attention_mask: [R, P+T] long, 1 on prompt tokens and kept completion tokens.
        completion_mask: [R, T] float, 1 on kept generated tokens (incl. the end token), 0 after.
        logprobs: [R, T] float32, log-prob of each sampled token under the sampling
            policy (logits / temperature, full vocab, before top-k/top-p); 0 where masked.
        texts: R decoded completions (kept tokens only, without the end token or any other
            special token).
        finish_reasons: R of "stop" (end token or stop string) | "length".
        prompt_length: P.
        logprob_source: Where `logprobs` came from, one of `LOGPROB_SOURCES`; the GRPO update
            corrects the engine/trainer mismatch only for an engine's (`from_engine`).
    """

    prompt_index: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    logprobs: Tensor
    texts: list[str]
    finish_reasons: list[str]
    prompt_length: int
    logprob_source: str = "trainer"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_rollouts(self) -> int:
        """R."""
        return int(self.prompt_index.shape[0])

    @property
    def completion_ids(self) -> Tensor:
        """[R, T] generated token ids (pad after the end)."""
        return self.input_ids[:, self.prompt_length :]

    def kept_completion_ids(self) -> list[list[int]]:
        """R lists of the kept completion token ids (the end token included, no padding)."""
        mask = self.completion_mask.cpu() > 0  # [R, T]
        return [row[keep].tolist() for row, keep in zip(self.completion_ids.cpu(), mask)]

    @property
    def prompt_ids(self) -> Tensor:
        """[R, P] left-padded prompt ids."""
        return self.input_ids[:, : self.prompt_length]

    @property
    def from_engine(self) -> bool:
        """Whether `logprobs` are an engine's rather than the trainer's model's."""
        return self.logprob_source != "trainer"

    @property
    def lengths(self) -> Tensor:
        """[R] long, number of kept completion tokens."""
        return self.completion_mask.sum(-1).long()

    def to(self, device: torch.device | str) -> Rollouts:
        """Returns a copy with every tensor on `device`."""
        moved = {name: getattr(self, name).to(device) for name in _TENSOR_FIELDS}
        return replace(self, **moved)

    def validate(self) -> None:
        """Checks shapes and lengths agree.

        Raises:
            ValueError: Listing every mismatch found.
        """
        r, p = self.num_rollouts, self.prompt_length
        problems = []
        if self.prompt_index.dim() != 1:
            problems.append(f"prompt_index must be [R], got {tuple(self.prompt_index.shape)}")
        if self.input_ids.dim() != 2 or self.input_ids.shape[0] != r:
            problems.append(f"input_ids must be [R={r}, P+T], got {tuple(self.input_ids.shape)}")
        full = tuple(self.input_ids.shape)
        if tuple(self.attention_mask.shape) != full:
            problems.append(
                f"attention_mask must be {full}, got {tuple(self.attention_mask.shape)}"
            )
        if not 0 <= p <= full[-1]:
            problems.append(f"prompt_length must be in [0, {full[-1]}], got {p}")
        comp = (r, full[-1] - p)
        for name in ("completion_mask", "logprobs"):
            if tuple(getattr(self, name).shape) != comp:
                problems.append(f"{name} must be {comp}, got {tuple(getattr(self, name).shape)}")
        for name in ("texts", "finish_reasons"):
            if len(getattr(self, name)) != r:
                problems.append(f"{name} must have R={r} entries, got {len(getattr(self, name))}")
        odd = sorted(set(self.finish_reasons) - set(FINISH_REASONS))
        if odd:
            problems.append(f"finish_reasons must be in {FINISH_REASONS}, got {odd}")
        if self.logprob_source not in LOGPROB_SOURCES:
            problems.append(
                f"logprob_source must be one of {LOGPROB_SOURCES}, got {self.logprob_source!r}"
            )
        if problems:
            raise ValueError("Rollouts: " + "; ".join(problems))


@dataclass(frozen=True)
class SampleCall:
    """One `RolloutBackend.generate` call's arguments, for `RolloutBackend.generate_many`."""

    prompts: list[str]
    n_per_prompt: list[int] | int
    sampling: SamplingParams


class RolloutBackend(ABC):
    """A generation engine that turns prompts into `Rollouts`."""

    name: str = "custom"
    """The backend's name in the run's spend (``rollouts_on_<name>``)."""

    @abstractmethod
    def generate(
        self,
        prompts: list[str],
        n_per_prompt: list[int] | int,
        sampling: SamplingParams,
    ) -> Rollouts:
        """Samples `n_per_prompt` completions for each prompt.

        Args:
            prompts: B prompt texts (already chat-formatted if the model needs it).
            n_per_prompt: N for every prompt, or one N (>= 1) per prompt.
            sampling: How to sample.

        Returns:
            R = sum(N) rollouts, grouped by prompt in prompt order.
        """

    def generate_many(self, calls: Sequence[SampleCall]) -> list[Rollouts]:
        """Several `generate` calls at once, each with its own prompts, N and sampling (seed).

        The results are those of the calls made one by one, in order; an engine with continuous
        batching (vLLM) overrides this to submit every call's requests together, so that a
        measurement of thousands of problems x K fills the engine instead of arriving in slices.
        """
        return [self.generate(c.prompts, c.n_per_prompt, c.sampling) for c in calls]

    @abstractmethod
    def update_weights(self, model: nn.Module) -> None:
        """Makes the engine sample from `model`'s current weights."""

    def follow(self, model: nn.Module) -> None:
        """Makes `model` the policy the backend samples for from now on (a new stage's model).

        A backend that samples on the model itself (HF ``generate``, the cached decode) points
        at it; an engine with its own copy of the weights (vLLM) holds no valid weights until
        the next `update_weights`, which the caller makes on every rank before sampling.
        """
        self.update_weights(model)

    def release(self) -> None:
        """Drops the backend's hold on the model it sampled for (its stage is over), so that
        the model's memory can be freed before the next stage's; `follow` gives it the next."""
        if hasattr(self, "model"):
            self.model = None

    def close(self) -> None:  # noqa: B027  (concrete: most backends hold nothing)
        """Frees what the backend holds outside Python's reach; nothing by default.

        Engines that own memory or processes (a vLLM engine's GPU memory) override it. Callers
        close a backend when they are done with it (the end of a stage, of an evaluation); it
        may be called again, and a closed backend may be used again where the engine says so.
        """
