"""Rollouts with vLLM, colocated in the training process, behind the `RolloutBackend` contract.

Chosen with `coscale.rollout.build_backend("vllm", ...)`; without vllm installed that raises
"install coscale[vllm] to use the vLLM rollout backend". Importing this module never imports
vllm. Per training step:

1. ``generate``: wake the engine, run a pending parity check, sample (per-prompt N: see
   `vllm_requests`), put the engine back to sleep (``sleep_level`` 1 or 2) for the update.
2. ``update_weights(model)`` after the optimiser step, on every rank (FSDP: pass the FSDP root,
   outside any forward pass): gather full weights, load them in buckets, each engine call
   under ``sync_timeout_s``, reset the prefix cache, book the sync (`vllm_sync.SyncBook`).
3. Parity check after the 1st sync and every ``parity_every``-th one, at the start of the next
   ``generate`` (where the policy's forward pass is allowed under FSDP): engine and trainer
   log-probs of freshly sampled tokens (temperature 1) must agree within ``parity_atol``.

Old log-probs are the engine's where they match the contract (`VLLMEngine.logprobs_match`: a
vLLM >= 0.10.2 applies the temperature to them), else the trainer's policy recomputes them. In
one process, a policy changed since the last sync is synced before sampling (``on_stale="sync"``)
or refused (``"error"``). ``close()`` shuts the engine down and frees its GPU memory (at the end
of each RL stage); the next call builds a new one and syncs it first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from torch import nn

from coscale.rollout.base import RolloutBackend, Rollouts, SamplingParams, normalize_n_per_prompt
from coscale.rollout.vllm_cpu import check_head_size, check_sleep_level, kv_cache_bytes
from coscale.rollout.vllm_engine import (
    build_engine,
    engine_args,
    eos_ids,
    resolve_tokenizer,
    start_engine,
)
from coscale.rollout.vllm_host import seeded_rng_guard
from coscale.rollout.vllm_launch import check_installed
from coscale.rollout.vllm_parity import (
    ParityResult,
    check_verdict,
    default_parity_atol,
    fill_logprobs,
    parity_verdict,
    trainer_logprobs,
    trainer_parity_atol,
    world_size,
)
from coscale.rollout.vllm_requests import assemble_rollouts, build_requests, collect_completions
from coscale.rollout.vllm_settings import check_settings
from coscale.rollout.vllm_sync import (
    SyncBook,
    WeightSyncError,
    call_with_timeout,
    params_fingerprint,
    push_weights,
    remaining,
)

PROBE_TEXT = "1 + 1 ="  # parity probe before any prompt was seen


class VLLMBackend(RolloutBackend):
    """A colocated vLLM engine that samples rollouts and follows the policy's weights.

    Args:
        model: Name or folder the engine loads at start (the policy's initial weights).
        tokenizer: Tokenizer object or name/folder (default: ``model``); prompts are encoded
            with it, so prompt tokens match the HF backend's exactly.
        policy: The trainer's model: parity reference and log-prob recompute. Adopted from the
            first ``update_weights`` call when that passes an HF model.
        gpu_memory_utilization: Share of the GPU memory vLLM may use (weights + KV cache).
        kv_cache_gib: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``); None: on CPU
            from the model and ``max_model_len`` (`vllm_cpu.default_kv_cache_bytes`), on GPU
            from ``gpu_memory_utilization``.
        dtype: Engine dtype (``auto``, ``bfloat16``, ``float16``, ``float32``).
        max_model_len: Longest prompt + completion; None: the model's.
        sleep_level: 0 keeps the engine awake; 1 offloads weights to CPU and frees the KV
            cache between rollouts; 2 drops the weights too (every sampling needs a sync first).
            Refused on vLLM's CPU build, which has no sleep mode.
        logprobs: ``auto`` (engine's when they match the contract), ``engine`` (refused on vLLM
            < 0.10.2), ``trainer``.
        sync_timeout_s: Deadline of the engine-side part of one sync; None: no deadline.
        sync_bucket_mb: Weights sent per load call.
        param_prefix: Prefix of the policy's parameters in a container passed to
            ``update_weights`` (``policy.`` in coscale's LightningModules).
        parity_every: Check parity after the 1st sync and every this many syncs (0: never).
        parity_samples: Prompts in a parity probe.
        parity_tokens: Tokens sampled per probe prompt.
        parity_atol: Largest mean |engine - trainer| log-prob difference accepted; None: by
            ``dtype`` (`vllm_parity.PARITY_ATOL`: 0.01 float32, 0.1 float16, 0.15 bfloat16 and
            ``auto``, which may run a float32 checkpoint in 16 bits), loosened to the trainer's
            autocast dtype's bound while the check runs under autocast (``bf16-mixed``).
        recompute_batch_size: Rollouts per forward pass when recomputing log-probs.
        honor_seed: Reproduce seeded calls exactly (one seeded request per rollout).
        on_stale: ``sync``, ``error`` or ``ignore`` a policy changed since the last sync.
        seed: Engine seed.
        engine_kwargs: Extra `vllm.LLM` arguments (override the defaults;
            ``tensor_parallel_size`` must stay 1 under torch.distributed).
        engine_factory: Builds the engine from `vllm.LLM` keyword arguments (tests pass fakes).
    """

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        policy: nn.Module | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_gib: float | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        sleep_level: int = 0,
        logprobs: str = "auto",
        sync_timeout_s: float | None = 600.0,
        sync_bucket_mb: int = 1024,
        param_prefix: str = "policy.",
        parity_every: int = 1,
        parity_samples: int = 4,
        parity_tokens: int = 16,
        parity_atol: float | None = None,
        recompute_batch_size: int = 16,
        honor_seed: bool = True,
        on_stale: str = "sync",
        seed: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
        engine_factory: Callable[..., Any] | None = None,
    ) -> None:
        check_settings(**{k: v for k, v in locals().items() if k != "self"})
        kv_bytes = None if kv_cache_gib is None else int(kv_cache_gib * 2**30)
        if engine_factory is None:  # fail at choice time, not at the first rollout
            check_installed(logprobs)
            check_sleep_level(sleep_level)
            check_head_size(str(model))
            kv_bytes = kv_cache_bytes(kv_cache_gib, str(model), dtype, max_model_len)
        self.tokenizer = resolve_tokenizer(tokenizer, model)
        tok_path = tokenizer if isinstance(tokenizer, str) else None
        args = (dtype, gpu_memory_utilization, max_model_len, sleep_level, seed, engine_kwargs)
        self._args = engine_args(str(model), tok_path, *args, kv_cache_bytes=kv_bytes)
        self._atol_given = parity_atol is not None
        parity_atol = default_parity_atol(dtype) if parity_atol is None else parity_atol
        self._factory, self._engine = engine_factory or build_engine, None
        self.policy, self.model_path, self.sleep_level = policy, str(model), sleep_level
        self.logprobs, self.on_stale, self.honor_seed = logprobs, on_stale, honor_seed
        self.sync_timeout_s, self.param_prefix = sync_timeout_s, param_prefix
        self.bucket_bytes, self.seed = int(sync_bucket_mb * 2**20), seed
        self.parity_samples, self.parity_tokens = parity_samples, parity_tokens
        self.parity_atol, self.recompute_batch_size = parity_atol, recompute_batch_size
        self.eos_token_ids = eos_ids(policy, self.tokenizer, str(model))
        self._init_state(parity_every)

    def _init_state(self, parity_every: int) -> None:
        """Sync bookkeeping, sleep state, parity probe and the last call's diagnostics."""
        self.book = SyncBook(parity_every)
        self.book.parity_pending = self.policy is not None and parity_every > 0  # engine vs policy
        self._awake, self._weights_valid = {"weights", "kv_cache"}, True
        self._fingerprint = None if self.policy is None else params_fingerprint(self.policy)
        self._probe: list[list[int]] = []
        self.vllm_version: str | None = None  # the engine's, once built
        self.last_logprob_source: str | None = None
        self.last_parity: ParityResult | None = None

    @property
    def engine(self) -> Any:
        """The engine, built on first use (and again after `close`)."""
        if self._engine is None:
            self._engine = start_engine(self._factory, self._args, self.logprobs)
            self.vllm_version = getattr(self._engine, "version", None)
        return self._engine

    def close(self) -> None:
        """Shuts the engine down and frees its GPU memory; does nothing without one.

        Under torch.distributed every rank calls it at the same point (e.g. the end of a
        fit): building the next engine is collective. The backend stays usable: the next call
        builds a new engine from ``model``, which holds no trained weights, so it is synced
        from the policy first (`needs_sync`).
        """
        engine, self._engine = self._engine, None
        if engine is None:
            return
        self._awake, self._weights_valid = {"weights", "kv_cache"}, self.policy is None
        engine.shutdown()

    @property
    def needs_sync(self) -> bool:
        """True when the engine holds no trained weights (after a level-2 sleep or `close`)."""
        return not self._weights_valid

    def generate(
        self, prompts: list[str], n_per_prompt: list[int] | int, sampling: SamplingParams
    ) -> Rollouts:
        """Samples N_i completions for prompt i; see `RolloutBackend.generate`."""
        if not prompts:
            raise ValueError("prompts must hold at least one prompt, got []")
        counts = normalize_n_per_prompt(n_per_prompt, len(prompts))
        prompt_ids = [list(ids) for ids in self.tokenizer(list(prompts))["input_ids"]]
        self._prepare()
        rollouts = self._sample(prompt_ids, counts, sampling)
        self._probe = prompt_ids[: self.parity_samples]
        if self.sleep_level:
            self.engine.sleep(self.sleep_level)
            self._awake, self._weights_valid = set(), self.sleep_level == 1
        return self._fill_logprobs(rollouts, sampling)

    def update_weights(self, model: nn.Module) -> None:
        """Loads `model`'s weights into the engine (every rank at once under FSDP)."""
        if self.policy is None and hasattr(model, "config"):
            self.policy = model
        deadline = None if self.sync_timeout_s is None else time.monotonic() + self.sync_timeout_s
        self._wake(("weights",), remaining(deadline))
        push_weights(self.engine, model, self.book, self.param_prefix, self.bucket_bytes, deadline)
        self._weights_valid = True
        if self.policy is not None:
            self._fingerprint = params_fingerprint(self.policy)

    def check_parity(self) -> ParityResult:
        """Engine vs trainer log-probs of freshly sampled tokens; raises `ParityError`."""
        if self.policy is None:
            raise ValueError("check_parity needs the trainer's model: pass policy=...")
        probe = self._probe or [list(self.tokenizer([PROBE_TEXT])["input_ids"][0])]
        seed = self.seed + self.book.version
        sampling = SamplingParams(max_new_tokens=self.parity_tokens, temperature=1.0, seed=seed)
        rollouts = self._sample(probe, [1] * len(probe), sampling)
        trainer = trainer_logprobs(self.policy, rollouts, 1.0, self.recompute_batch_size)
        mask = rollouts.completion_mask
        atol = (
            self.parity_atol
            if self._atol_given
            else trainer_parity_atol(self.policy, self.parity_atol)
        )
        result = parity_verdict(rollouts.logprobs, trainer, mask, atol)
        self.book.parity_pending, self.last_parity = False, result
        check_verdict(result, self.book.version, self.engine.logprobs_mode)
        return result

    # ----------------------------------------------------------------- internals
    def _prepare(self) -> None:
        """Sync if stale or weightless, wake the engine, run a pending parity check."""
        single = world_size() == 1
        stale = self.policy is not None and single and self.on_stale != "ignore"
        if stale and params_fingerprint(self.policy) != self._fingerprint:
            if self.on_stale == "error":
                raise WeightSyncError(
                    "the policy changed since the last weight sync: call "
                    "backend.update_weights(policy) after every optimiser step"
                )
            self.update_weights(self.policy)
        if not self._weights_valid:
            if self.policy is None or not single:
                raise WeightSyncError(
                    "the engine holds no trained weights (sleep_level=2 dropped them, or close() "
                    "rebuilt the engine) and no sync followed: call update_weights(model) before "
                    "generate (every rank), or use sleep_level=1"
                )
            self.update_weights(self.policy)
        self._wake(("weights", "kv_cache"))
        if self.book.parity_pending and self.policy is not None:
            self.check_parity()

    def _wake(self, tags: Sequence[str], timeout: float | None = None) -> None:
        missing = [t for t in tags if t not in self._awake]
        if missing:
            call_with_timeout(partial(self.engine.wake_up, missing), timeout, "waking vLLM up")
            self._awake |= set(missing)

    def _sample(
        self, prompt_ids: list[list[int]], counts: list[int], sampling: SamplingParams
    ) -> Rollouts:
        requests = build_requests(prompt_ids, counts, sampling, self.eos_token_ids, self.honor_seed)
        with seeded_rng_guard(sampling.seed):  # a seeded call leaves the global RNG alone
            completions = collect_completions(requests, self.engine.generate(requests))
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        pad, eos = self.tokenizer.pad_token_id, self.eos_token_ids
        return assemble_rollouts(prompt_ids, completions, pad, eos, sampling.stop, decode)

    def _fill_logprobs(self, rollouts: Rollouts, sampling: SamplingParams) -> Rollouts:
        """Engine log-probs where they match the contract, else the trainer's."""
        if self.logprobs == "trainer" and self.policy is None:
            raise ValueError("logprobs='trainer' needs the trainer's model: pass policy=...")
        trusted = self.logprobs == "engine" or (
            self.logprobs == "auto" and self.engine.logprobs_match(sampling)
        )
        self.last_logprob_source = fill_logprobs(
            rollouts, trusted, self.policy, sampling.temperature, self.recompute_batch_size
        )
        return rollouts
