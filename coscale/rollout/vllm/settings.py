"""The `VLLMBackend` settings: three groups documented once, every bad value named in one error.

In YAML a group is a mapping under the backend's options::

    rollout:
      backend: vllm
      options:
        engine: {gpu_memory_utilization: 0.35, sleep_level: 1, max_model_len: 5120}
        sync: {timeout_s: 300}
        parity: {every: 10}

In Python a group is the dataclass or a plain dict. An error names the flag with its group
(``rollout.options.parity.every must be an int >= 0, got -1``); a key no group has is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from coscale.checks import as_group, at_least, group_errors, is_number, one_of
from coscale.renamed import adopt_earlier_names, earlier_name, field_names, old_names

LOGPROB_SOURCES = ("auto", "engine", "trainer")
STALE_ACTIONS = ("sync", "error", "ignore")
ADAPTER_SYNCS = ("merged", "lora")
OPTIONS = "rollout.options"
"""Where the settings stand in YAML: the prefix of every error."""


@dataclass(frozen=True)
class EngineSettings:
    """How the colocated `vllm.LLM` is built and sized.

    Attributes:
        gpu_memory_utilization: Share of the GPU memory vLLM may use (weights + KV cache).
        kv_cache_gib: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``); None: on CPU
            from the model and ``max_model_len`` (`coscale.rollout.vllm.cpu.default_kv_cache_bytes`), on GPU
            from ``gpu_memory_utilization``.
        dtype: Engine dtype (``auto``, ``bfloat16``, ``float16``, ``float32``); None: the
            trainer's compute dtype in a fit (``bf16-mixed``: ``bfloat16``), else the policy's
            parameter dtype, else ``auto``.
        max_model_len: Longest prompt + completion; None: the model's.
        sleep_level: 0 keeps the engine awake; 1 offloads weights to CPU and frees the KV
            cache between rollouts; 2 drops the weights too (every sampling needs a sync first).
            Refused on vLLM's CPU build, which has no sleep mode.
        seed: Engine seed (each rank adds its rank); parity probes sample with seed + sync number.
        kwargs: Extra `vllm.LLM` arguments (override coscale's defaults, e.g.
            ``enforce_eager``; ``tensor_parallel_size`` must stay 1 under torch.distributed).
    """

    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    sleep_level: int = 0
    seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)

    def errors(self) -> list[str]:
        errors, share = [], self.gpu_memory_utilization
        if not (is_number(share) and 0 < share <= 1):
            errors.append(f"gpu_memory_utilization must be in (0, 1], got {share!r}")
        errors += at_least(0, float, strict=True, optional=True, kv_cache_gib=self.kv_cache_gib)
        errors += at_least(1, optional=True, max_model_len=self.max_model_len)
        if self.sleep_level not in (0, 1, 2):
            errors.append(f"sleep_level must be 0, 1 or 2, got {self.sleep_level!r}")
        if not isinstance(self.kwargs, Mapping):
            errors.append(f"kwargs must be a mapping of vllm.LLM arguments, got {self.kwargs!r}")
        return errors


@dataclass(frozen=True)
class SyncSettings:
    """How the policy's weights reach the engine after every optimiser step.

    Attributes:
        timeout_s: Deadline of the engine-side part of one sync; None: no deadline.
        bucket_mb: Weights sent per load call.
        param_prefix: Prefix of the policy's parameters in a container passed to
            ``update_weights`` (``policy.`` in coscale's LightningModules).
        on_stale: In one process, a policy changed since the last sync is synced before
            sampling (``sync``), refused (``error``) or sampled from as it is (``ignore``).
        adapter: How a PEFT LoRA policy reaches the engine: ``merged`` sends every weight with
            the adapter merged in (the base's names, one tensor at a time; any LoRA);
            ``lora`` sends the adapter alone as a vLLM LoRA request (the engine keeps its base;
            a sync costs the adapter's size; no ``modules_to_save``, unsharded policies;
            `coscale.rollout.vllm.lora`). Ignored without an adapter.
    """

    timeout_s: float | None = 600.0
    bucket_mb: int = 1024
    param_prefix: str = "policy."
    on_stale: str = "sync"
    adapter: str = "merged"

    def errors(self) -> list[str]:
        errors = at_least(0, float, strict=True, optional=True, timeout_s=self.timeout_s)
        errors += at_least(1, bucket_mb=self.bucket_mb)
        errors += one_of(ADAPTER_SYNCS, adapter=self.adapter)
        return errors + one_of(STALE_ACTIONS, on_stale=self.on_stale)


@dataclass(frozen=True)
class ParitySettings:
    """The check that the engine samples from the policy: engine and trainer log-probs of
    freshly sampled tokens (temperature 1) must agree.

    Attributes:
        every: Check after the 1st sync and every this many syncs (0: never).
        prompts: Prompts in a probe (the last call's first ones).
        tokens: Tokens sampled per probe prompt.
        atol: Largest mean |engine - trainer| log-prob difference accepted; None: by the
            engine's dtype (`coscale.rollout.vllm.parity.PARITY_ATOL`: 0.01 float32, 0.1 float16, 0.15 bfloat16
            and ``auto``, which may run a float32 checkpoint in 16 bits), loosened to the
            trainer's autocast dtype's bound while the check runs under autocast.
        recompute_batch_size: Rollouts per forward pass when the trainer computes log-probs
            (for this check, and as old log-probs where the engine's are not used).
        samples: Earlier name of ``prompts`` (a warning names it).
    """

    every: int = 1
    prompts: int = 4
    tokens: int = 16
    atol: float | None = None
    recompute_batch_size: int = 16
    samples: int | None = earlier_name("prompts")

    def __post_init__(self) -> None:
        adopt_earlier_names(self)

    def errors(self) -> list[str]:
        errors = at_least(0, every=self.every)
        errors += at_least(1, prompts=self.prompts, tokens=self.tokens)
        errors += at_least(1, recompute_batch_size=self.recompute_batch_size)
        return errors + at_least(0, float, optional=True, atol=self.atol)


GROUPS = {"engine": EngineSettings, "sync": SyncSettings, "parity": ParitySettings}
"""The settings groups of `VLLMBackend`, by argument name."""


def settings_errors(options: Mapping[str, Any]) -> list[str]:
    """Every bad value among `VLLMBackend` options, each named with its group
    (``parity.every must be ...``): the groups (a mapping or the dataclass; None: defaults),
    their unknown keys, and ``logprobs``. Other options are not looked at."""
    errors = one_of(LOGPROB_SOURCES, logprobs=options.get("logprobs", "auto"))
    for name, cls in GROUPS.items():
        value = options.get(name)
        if isinstance(value, Mapping):
            takes = field_names(cls)
            unknown = sorted(set(value) - {f.name for f in fields(cls)})  # earlier names too
            errors += [
                f"{name}.{k} is not a {name} setting (it takes: {', '.join(takes)})"
                for k in unknown
            ]
            if unknown:
                continue
        elif not (value is None or isinstance(value, cls)):
            errors.append(f"{name} must be a mapping or a {cls.__name__}, got {value!r}")
            continue
        errors += group_errors(**{name: as_group(cls, _plain(value))})
    return errors


def check_settings(**options: Any) -> tuple[EngineSettings, SyncSettings, ParitySettings]:
    """The ``engine``, ``sync`` and ``parity`` groups among ``options`` as dataclasses (defaults
    where absent); raises one ValueError naming every bad value (`settings_errors`)."""
    if errors := settings_errors(options):
        raise ValueError("VLLMBackend: " + "; ".join(f"{OPTIONS}.{e}" for e in errors))
    return tuple(as_group(c, _plain(options.get(n))) or c() for n, c in GROUPS.items())


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


def group_of(key: str) -> str | None:
    """``group.field`` for a flat option name that belongs in a group (``max_model_len`` ->
    ``engine.max_model_len``, ``parity_every`` -> ``parity.every``), else None."""
    for name, cls in GROUPS.items():
        for f in fields(cls):
            if key in (f.name, f"{name}_{f.name}"):
                return f"{name}.{f.name}"
    return None


def with_dtype(options: Mapping[str, Any], dtype: str | None) -> dict[str, Any]:
    """``options`` with ``engine.dtype`` set to `dtype` where it is unset (None keeps them)."""
    engine = options.get("engine")
    if isinstance(engine, EngineSettings):
        unset = engine.dtype is None and dtype is not None
        return {**options, "engine": replace(engine, dtype=dtype)} if unset else dict(options)
    engine = dict(engine or {})
    if dtype is None or engine.get("dtype") is not None:
        return dict(options)
    return {**options, "engine": {**engine, "dtype": dtype}}


# the classes' earlier names, for one release
__getattr__ = old_names(
    __name__, {"Engine": EngineSettings, "Sync": SyncSettings, "Parity": ParitySettings}
)
