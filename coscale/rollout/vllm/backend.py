"""Rollouts with vLLM, colocated in the training process, behind the `RolloutBackend` contract.

Chosen with `coscale.rollout.build_backend("vllm", ...)`; without vllm installed that raises
"install coscale[vllm] to use the vLLM rollout backend". Importing this module never imports
vllm. Per training step:

1. ``generate``: wake the engine, run a pending parity check, sample (per-prompt N: see
   `coscale.rollout.vllm.requests`), put the engine back to sleep (``engine.sleep_level`` 1 or 2)
   for the update.
2. ``update_weights(model)`` after the optimiser step, on every rank (FSDP: pass the FSDP root,
   outside any forward pass): gather full weights, load them in buckets, each engine call
   under ``sync.timeout_s``, reset the prefix cache, book the sync
   (`coscale.rollout.vllm.sync.SyncBook`).
   A LoRA policy with ``sync.adapter: lora``: the adapter alone, as a LoRA request
   (`coscale.rollout.vllm.lora`), which every later sampling call names.
3. Parity check after the 1st sync and every ``parity.every``-th one, at the start of the next
   ``generate`` (where the policy's forward pass is allowed under FSDP): engine and trainer
   log-probs of freshly sampled tokens (temperature 1) must agree within ``parity.atol``.

Old log-probs are the engine's where they match the contract (`VLLMEngine.logprobs_match`: a
vLLM >= 0.10.2 applies the temperature to them), else the trainer's policy recomputes them. In
one process, a policy changed since the last sync is synced before sampling (``sync.on_stale``)
or refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from torch import nn

from coscale.clock import timed
from coscale.distributed import world_size
from coscale.log import EVERY_RANK, logger
from coscale.models.adapters import has_adapter
from coscale.rollout.base import (
    RolloutBackend,
    Rollouts,
    SampleCall,
    SamplingParams,
    normalize_n_per_prompt,
)
from coscale.rollout.dtype import engine_dtype
from coscale.rollout.vllm.cpu import (
    check_head_size,
    check_sleep_level,
    cpu_scheduler_args,
    kv_cache_bytes,
)
from coscale.rollout.vllm.engine import (
    build_engine,
    engine_args,
    eos_ids,
    resolve_tokenizer,
    start_engine,
)
from coscale.rollout.vllm.host import seeded_rng_guard
from coscale.rollout.vllm.launch import check_installed
from coscale.rollout.vllm.lora import (
    AdapterSync,
    check_lora_policy,
    lora_engine_kwargs,
    lora_policy,
)
from coscale.rollout.vllm.parity import (
    ParityResult,
    check_verdict,
    default_parity_atol,
    fill_logprobs,
    parity_verdict,
    trainer_logprobs,
    trainer_parity_atol,
)
from coscale.rollout.vllm.requests import assemble_rollouts, build_requests, collect_completions
from coscale.rollout.vllm.settings import (
    EngineSettings,
    ParitySettings,
    SyncSettings,
    check_settings,
)
from coscale.rollout.vllm.sync import (
    SyncBook,
    WeightSyncError,
    call_with_timeout,
    params_fingerprint,
    push_weights,
    remaining,
)
from coscale.seeds import derive_seed

PROBE_TEXT = "1 + 1 ="  # parity probe before any prompt was seen


class VLLMBackend(RolloutBackend):
    """A colocated vLLM engine that samples rollouts and follows the policy's weights.

    Args:
        model: Name or folder the engine loads at start (the policy's initial weights).
        tokenizer: Tokenizer object or name/folder (default: ``model``); prompts are encoded
            with it, so prompt tokens match the HF backend's exactly.
        policy: The trainer's model: parity reference and log-prob recompute. Adopted from the
            first ``update_weights`` call when that passes an HF model.
        engine: How the engine is built and sized (`coscale.rollout.vllm.settings.EngineSettings`:
            memory, KV cache, dtype, length, sleep level, seed, extra `vllm.LLM` arguments).
        sync: How weights reach the engine (`coscale.rollout.vllm.settings.SyncSettings`: deadline,
            bucket size, parameter prefix, what a stale policy does).
        parity: The engine-vs-trainer log-prob check
            (`coscale.rollout.vllm.settings.ParitySettings`: schedule, probe size, tolerance,
            recompute batch size).
        logprobs: ``auto`` (engine's when they match the contract), ``engine`` (refused on vLLM
            < 0.10.2), ``trainer``.
        honor_seed: Reproduce seeded calls exactly (one seeded request per rollout).
        engine_factory: Builds the engine from `vllm.LLM` keyword arguments (tests pass fakes).

    Each group may also be a plain dict (as YAML gives it); every bad value is named in one
    ValueError (``rollout.options.parity.every must be ...``).
    """

    name = "vllm"
    replica = True  # one engine per rank, joined to the trainer's ranks (a server: False)
    _rng_guard = staticmethod(seeded_rng_guard)  # an in-process engine seeds the global RNG

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        policy: nn.Module | None = None,
        engine: EngineSettings = EngineSettings(),
        sync: SyncSettings = SyncSettings(),
        parity: ParitySettings = ParitySettings(),
        logprobs: str = "auto",
        honor_seed: bool = True,
        engine_factory: Callable[..., Any] | None = None,
    ) -> None:
        engine, sync, parity = check_settings(
            engine=engine, sync=sync, parity=parity, logprobs=logprobs
        )
        if engine.dtype is None:  # the trainer's precision, as far as the policy tells
            engine = replace(engine, dtype=engine_dtype(policy=policy))
        self._adapters = None  # sync.adapter=lora: the adapter alone, as a LoRA request
        if sync.adapter == "lora" and policy is not None and has_adapter(policy):
            lora = lora_engine_kwargs(check_lora_policy(policy))
            engine = replace(engine, kwargs={**lora, **engine.kwargs})
            self._adapters = AdapterSync()
        kv_bytes = None if engine.kv_cache_gib is None else int(engine.kv_cache_gib * 2**30)
        platform: dict[str, Any] = {}
        if engine_factory is None:  # fail at choice time, not at the first rollout
            check_installed(logprobs)
            check_sleep_level(engine.sleep_level)
            check_head_size(str(model))
            kv_bytes = kv_cache_bytes(engine, str(model))
            platform = cpu_scheduler_args(engine, str(model))
        self.engine_settings, self.sync_settings, self.parity_settings = engine, sync, parity
        self.tokenizer = resolve_tokenizer(tokenizer, model)
        tok_path = tokenizer if isinstance(tokenizer, str) else None
        self._args = engine_args(str(model), tok_path, engine, kv_bytes, platform, self.replica)
        self.parity_atol = default_parity_atol(engine.dtype) if parity.atol is None else parity.atol
        self._factory, self._engine = engine_factory or build_engine, None
        self.policy, self.model_path, self.sleep_level = policy, str(model), engine.sleep_level
        self.logprobs, self.honor_seed = logprobs, honor_seed
        self.eos_token_ids = eos_ids(policy, self.tokenizer, str(model))
        self.starts, self.start_seconds = 0, 0.0  # engine builds of this backend, their time
        self.book = SyncBook(parity.every)
        self.book.parity_pending = policy is not None and parity.every > 0  # engine vs policy
        self._awake, self._weights_valid = {"weights", "kv_cache"}, True
        self._fingerprint = None if policy is None else params_fingerprint(policy)
        self._probe: list[list[int]] = []
        self.vllm_version: str | None = None  # the engine's, once built
        self.last_logprob_source: str | None = None
        self.last_parity: ParityResult | None = None

    @property
    def engine(self) -> Any:
        """The engine, built on first use (and again after `close`)."""
        if self._engine is None:
            started = time.perf_counter()
            with timed("engine_start"):
                self._engine = start_engine(self._factory, self._args, self.logprobs)
            self.vllm_version = getattr(self._engine, "version", None)
            self.starts += 1
            self.start_seconds += time.perf_counter() - started
            logger.info(
                f"vLLM engine started ({self.model_path}, start {self.starts} of this "
                f"backend, {time.perf_counter() - started:.1f} s)",
                extra=EVERY_RANK,  # each rank's own engine
            )
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
        if self._adapters is not None:
            self._adapters.forget_engine()
        engine.shutdown()

    @property
    def needs_sync(self) -> bool:
        """True when the engine holds no trained weights (after a level-2 sleep or `close`)."""
        return not self._weights_valid

    def generate(
        self, prompts: list[str], n_per_prompt: list[int] | int, sampling: SamplingParams
    ) -> Rollouts:
        """Samples N_i completions for prompt i; see `RolloutBackend.generate`."""
        return self.generate_many([SampleCall(prompts, n_per_prompt, sampling)])[0]

    def generate_many(self, calls: Sequence[SampleCall]) -> list[Rollouts]:
        """Every call's requests in one engine call (continuous batching over all of them); each
        call's rollouts are those `generate` gives it alone (its seeds are its own)."""
        ids, counts = self._prepare(calls)
        batches = self._sample_many(ids, counts, [c.sampling for c in calls])
        self._probe = ids[0][: self.parity_settings.prompts]
        if self.sleep_level:
            self.engine.sleep(self.sleep_level)
            self._awake, self._weights_valid = set(), self.sleep_level == 1
        return [self._fill_logprobs(r, c.sampling) for r, c in zip(batches, calls)]

    def follow(self, model: nn.Module) -> None:
        """Samples for `model` from now on (a new stage's policy, or a model to measure): it is
        the parity reference and log-prob recompute; the engine's weights are stale until the
        next `update_weights(model)`, which every rank makes before sampling."""
        self.policy, self._weights_valid = model, False
        self._fingerprint = None
        self.book.parity_pending = self.parity_settings.every > 0

    def release(self) -> None:
        """Drops the trainer's model (the parity reference); the engine keeps its weights."""
        self.policy, self._fingerprint = None, None

    def update_weights(self, model: nn.Module) -> None:
        """Loads `model`'s weights into the engine (every rank at once under FSDP)."""
        if self.policy is None and hasattr(model, "config"):
            self.policy = model
        timeout, prefix = self.sync_settings.timeout_s, self.sync_settings.param_prefix
        deadline = None if timeout is None else time.monotonic() + timeout
        with timed("weight_sync"):
            self._wake(("weights",), remaining(deadline))
            if self._adapters is not None:
                policy = lora_policy(model, self.policy)
                self._adapters.push(self.engine, policy, self.book, deadline)
            else:
                bucket_bytes = int(self.sync_settings.bucket_mb * 2**20)
                push_weights(self.engine, model, self.book, prefix, bucket_bytes, deadline)
        self._weights_valid = True
        if self.policy is not None:
            self._fingerprint = params_fingerprint(self.policy)

    def check_parity(self) -> ParityResult:
        """Engine vs trainer log-probs of freshly sampled tokens; raises `ParityError`."""
        if self.policy is None:
            raise ValueError("check_parity needs the trainer's model: pass policy=...")
        probe = self._probe or [list(self.tokenizer([PROBE_TEXT])["input_ids"][0])]
        settings = self.parity_settings
        seed = derive_seed("vllm-parity", self.engine_settings.seed, self.book.version)
        sampling = SamplingParams(max_new_tokens=settings.tokens, temperature=1.0, seed=seed)
        rollouts = self._sample(probe, [1] * len(probe), sampling)
        trainer = trainer_logprobs(self.policy, rollouts, 1.0, settings.recompute_batch_size)
        atol = self.parity_atol  # the user's as given, else the dtype's bound, under autocast too
        if settings.atol is None:
            atol = trainer_parity_atol(self.policy, atol)
        result = parity_verdict(rollouts.logprobs, trainer, rollouts.completion_mask, atol)
        self.book.parity_pending, self.last_parity = False, result
        check_verdict(result, self.book.version, self.engine.logprobs_mode)
        return result

    # ----------------------------------------------------------------- internals
    def _prepare(self, calls: Sequence[SampleCall]) -> tuple[list, list]:
        """Each call's prompt ids and N per prompt; then sync if stale or weightless, wake the
        engine, run a pending parity check."""
        if not calls or any(not c.prompts for c in calls):
            raise ValueError("prompts must hold at least one prompt, got []")
        counts = [normalize_n_per_prompt(c.n_per_prompt, len(c.prompts)) for c in calls]
        ids = [[list(x) for x in self.tokenizer(list(c.prompts))["input_ids"]] for c in calls]
        single = world_size() == 1
        on_stale = self.sync_settings.on_stale
        stale = self.policy is not None and single and on_stale != "ignore"
        if stale and params_fingerprint(self.policy) != self._fingerprint:
            if on_stale == "error":
                raise WeightSyncError(
                    "the policy changed since the last weight sync: call "
                    "backend.update_weights(policy) after every optimiser step"
                )
            self.update_weights(self.policy)
        if not self._weights_valid:
            if self.policy is None or not single:
                raise WeightSyncError(
                    "the engine holds no trained weights (engine.sleep_level=2 dropped them, or "
                    "close() rebuilt the engine) and no sync followed: call update_weights(model) "
                    "before generate (every rank), or use engine.sleep_level=1"
                )
            self.update_weights(self.policy)
        self._wake(("weights", "kv_cache"))
        if self.book.parity_pending and self.policy is not None:
            self.check_parity()
        return ids, counts

    def _wake(self, tags: Sequence[str], timeout: float | None = None) -> None:
        missing = [t for t in tags if t not in self._awake]
        if missing:
            call_with_timeout(partial(self.engine.wake_up, missing), timeout, "waking vLLM up")
            self._awake |= set(missing)

    def _sample(
        self, prompt_ids: list[list[int]], counts: list[int], sampling: SamplingParams
    ) -> Rollouts:
        return self._sample_many([prompt_ids], [counts], [sampling])[0]

    def _sample_many(
        self,
        prompt_ids: list[list[list[int]]],
        counts: list[list[int]],
        samplings: list[SamplingParams],
    ) -> list[Rollouts]:
        """One engine call for every (prompts, counts, sampling) -> one `Rollouts` each."""
        eos = self.eos_token_ids
        requests = [
            build_requests(ids, n, s, eos, self.honor_seed)
            for ids, n, s in zip(prompt_ids, counts, samplings)
        ]
        flat = [r for call in requests for r in call]
        with self._rng_guard(samplings[0].seed):  # a seeded call leaves the global RNG alone
            slot = None if self._adapters is None else self._adapters.slot
            lora = {} if slot is None else {"lora": slot}  # the base until the first sync
            outputs = list(self.engine.generate(flat, **lora))
        if len(outputs) != len(flat):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(flat)} requests")
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        pad, batches, start = self.tokenizer.pad_token_id, [], 0
        for ids, call, s in zip(prompt_ids, requests, samplings):
            done = collect_completions(call, outputs[start : start + len(call)])
            start += len(call)
            batches.append(assemble_rollouts(ids, done, pad, eos, s.stop, decode))
        return batches

    def _fill_logprobs(self, rollouts: Rollouts, sampling: SamplingParams) -> Rollouts:
        """Engine log-probs where they match the contract, else the trainer's."""
        if self.logprobs == "trainer" and self.policy is None:
            raise ValueError("logprobs='trainer' needs the trainer's model: pass policy=...")
        trusted = self.logprobs == "engine" or (
            self.logprobs == "auto" and self.engine.logprobs_match(sampling)
        )
        batch_size = self.parity_settings.recompute_batch_size
        source = fill_logprobs(rollouts, trusted, self.policy, sampling.temperature, batch_size)
        self.last_logprob_source = rollouts.logprob_source = source
        return rollouts
