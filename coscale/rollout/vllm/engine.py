"""Where coscale touches vLLM's API: building a colocated `vllm.LLM`, driving it, stopping it.

`VLLMEngine` wraps `vllm.LLM` behind a few small methods; `VLLMBackend` talks only to those
(and `start_engine` builds one), so a test can hand it a fake engine, and an API change of vLLM
is fixed here (or in `coscale.rollout.vllm.versions`, for what differs between versions).
vLLM is imported when an engine is built, never when coscale is imported.

Choices (vLLM's API as of 0.10.2-0.33; every default can be overridden through ``engine.kwargs``):
- The engine runs in the training process, one per rank under torch.distributed (vLLM's
  ``external_launcher``); `coscale.rollout.vllm.launch` prepares the process for it.
- ``generation_config="vllm"``: the checkpoint's sampling defaults are ignored, as in the HF
  backend; only coscale's `SamplingParams` shape the distribution.
- ``logprobs_mode="processed_logprobs"`` where vLLM knows the option (>= 0.10.0): log-probs
  after temperature from 0.10.2 (`coscale.rollout.vllm.versions`), which match the trainer's whenever top-k /
  top-p are off. Older versions reject the option; the engine is then built without it.
- `VLLMEngine.shutdown` stops the engine and frees its memory: an engine left to the garbage
  collector may never be freed (recent vLLM freezes its startup heap out of the collector's
  reach), and the next stage's engine would not fit.
- Weights are loaded in place through vLLM's layerwise reload where it has one
  (`coscale.rollout.vllm.reload`), the same code on CPU and GPU.
- The engine leaves the trainer's process as it found it (`coscale.rollout.vllm.host`): RNG states, torch
  threads and CPU affinity after the start, the environment after shutdown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from coscale.log import get_logger
from coscale.rollout.base import SamplingParams
from coscale.rollout.text import eos_token_ids
from coscale.rollout.vllm.cpu import cpu_environment, on_cpu
from coscale.rollout.vllm.host import HostState
from coscale.rollout.vllm.launch import (
    keep_trainer_group,
    prepare_environment,
    replica_args,
    require_vllm,
    restore_lazy_environment,
)
from coscale.rollout.vllm.reload import (
    finish_load,
    load_bucket,
    quiet_expected_warnings,
    reload_api,
    start_load,
)
from coscale.rollout.vllm.requests import Request, logprobs_trusted
from coscale.rollout.vllm.settings import EngineSettings
from coscale.rollout.vllm.versions import (
    applies_temperature,
    check_logprobs_source,
    describe,
    installed_version,
    release_memory,
    stop_llm,
)

log = get_logger(__name__)


def start_engine(factory: Callable[..., Any], args: Mapping[str, Any], logprobs: str) -> Any:
    """``factory(**args)``, with its vLLM version logged and checked against `logprobs`.

    Raises:
        ValueError: When that version cannot give the `logprobs` source asked for; the engine is
            shut down first, never left holding GPU memory.
    """
    engine = factory(**args)
    version = getattr(engine, "version", None)
    log.debug(describe(version))
    try:
        check_logprobs_source(logprobs, version)
    except ValueError:
        engine.shutdown()
        raise
    return engine


def engine_args(
    model: str,
    tokenizer: str | None = None,
    engine: EngineSettings = EngineSettings(),
    kv_cache_bytes: int | None = None,
    platform: dict[str, Any] | None = None,
    replica: bool = True,
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for a colocated engine (see the module docstring) with
    `engine`'s settings (a dtype left None: ``auto``); `kv_cache_bytes` sizes its KV cache
    (`coscale.rollout.vllm.cpu.kv_cache_bytes`); `platform` adds what the platform needs
    (`coscale.rollout.vllm.cpu.cpu_scheduler_args`), under ``engine.kwargs``. With `replica`
    each rank's engine joins the trainer's ranks (`replica_args`); a server's does not."""
    args: dict[str, Any] = {
        "model": model,
        "tokenizer": tokenizer or model,
        "dtype": engine.dtype or "auto",
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "seed": engine.seed,
        "enable_sleep_mode": engine.sleep_level > 0,
        "generation_config": "vllm",
        "logprobs_mode": "processed_logprobs",
    }
    if engine.max_model_len is not None:
        args["max_model_len"] = engine.max_model_len
    if kv_cache_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_cache_bytes
    args.update(platform or {})
    args.update(engine.kwargs)
    return replica_args(args) if replica else args


def build_engine(**kwargs: Any) -> VLLMEngine:
    """A `VLLMEngine` over `vllm.LLM(**kwargs)`, in this process.

    Raises:
        ImportError: Without vllm installed (`coscale.rollout.vllm.launch.INSTALL_HINT`).
        RuntimeError: Under ``external_launcher`` when the ranks cannot be told
            (`coscale.rollout.vllm.launch.prepare_environment`).
    """
    vllm = require_vllm()
    host = HostState.capture()
    prepare_environment(kwargs)
    if on_cpu():
        for name, value in cpu_environment().items():
            os.environ.setdefault(name, value)
    try:
        llm = _start(vllm, kwargs)
    finally:
        host.restore()
    version, layerwise = installed_version(vllm), reload_api() is not None
    if layerwise:
        quiet_expected_warnings()
    return VLLMEngine(llm, vllm.SamplingParams, version, layerwise=layerwise, host=host)


def _start(vllm: Any, kwargs: dict[str, Any]) -> Any:
    try:
        return vllm.LLM(**kwargs)
    except TypeError as err:  # vLLM < 0.10.0 has no logprobs_mode
        if "logprobs_mode" not in str(err) or "logprobs_mode" not in kwargs:
            raise
        return vllm.LLM(**{k: v for k, v in kwargs.items() if k != "logprobs_mode"})


class VLLMEngine:
    """`vllm.LLM` seen through the calls the backend needs.

    Args:
        llm: A `vllm.LLM` (or anything with its methods).
        sampling_params_cls: `vllm.SamplingParams` (built from each request's dict).
        version: ``vllm.__version__`` (None: unknown, so its log-probs are never trusted).
        layerwise: Load weights through vLLM's layerwise reload (`coscale.rollout.vllm.reload`); False: plain
            ``model.load_weights`` (vLLM versions without it, and fakes).
        host: The trainer's process state from before the start, put back at `shutdown`.
    """

    def __init__(
        self,
        llm: Any,
        sampling_params_cls: Any,
        version: str | None = None,
        layerwise: bool = False,
        host: HostState | None = None,
    ) -> None:
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.version = version  # vllm.__version__; decides what its log-probs mean
        self.layerwise, self.host = layerwise, host

    def generate(self, requests: Sequence[Request], lora: Any = None) -> list[Any]:
        """One `RequestOutput` per request, in request order; ``lora`` (a `coscale.rollout.vllm.lora.LoraSlot`
        added with `add_lora`) samples with that adapter on the base."""
        prompts = [{"prompt_token_ids": list(r.token_ids)} for r in requests]
        params = [self.sampling_params_cls(**r.params) for r in requests]
        extra = {} if lora is None else {"lora_request": _lora_request(lora)}
        return list(self.llm.generate(prompts, params, use_tqdm=False, **extra))

    def add_lora(self, slot: Any) -> bool:
        """Loads the adapter saved at ``slot.path`` under ``slot.id`` (an engine started with
        ``enable_lora``)."""
        return bool(self.llm.llm_engine.add_lora(_lora_request(slot)))

    def remove_lora(self, lora_id: int) -> bool:
        """Drops adapter ``lora_id`` (False when the engine had dropped it already)."""
        return bool(self.llm.llm_engine.remove_lora(lora_id))

    def begin_load(self) -> None:
        """Opens a weight load on every worker (`coscale.rollout.vllm.reload.start_load`)."""
        if self.layerwise:
            self.llm.collective_rpc(start_load)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> list[int | None]:
        """Loads `(hf_name, tensor)` pairs into the model of every worker.

        Returns:
            Per worker, how many parameters the model says it loaded (None where its
            ``load_weights`` returns nothing, as in older vLLM versions).
        """
        return list(self.llm.collective_rpc(load_bucket, args=(list(weights),)))

    def end_load(self) -> None:
        """Closes the load: layers left are processed, tied heads refreshed (`finish_load`)."""
        if self.layerwise:
            self.llm.collective_rpc(finish_load)

    def sleep(self, level: int) -> None:
        """Frees the KV cache and offloads (1) or drops (2) the weights."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: Sequence[str]) -> None:
        """Re-allocates the memory of `tags` ("weights", "kv_cache")."""
        try:
            self.llm.wake_up(tags=list(tags))
        except TypeError:  # versions without tags wake everything
            self.llm.wake_up()

    def reset_prefix_cache(self) -> None:
        """Drops cached prompt KV: it was computed with the old weights."""
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()

    @property
    def logprobs_mode(self) -> str | None:
        """What the engine's log-probs are (`raw_logprobs`, ...); None if it does not say."""
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        mode = getattr(config, "logprobs_mode", None)
        return None if mode is None else str(getattr(mode, "value", mode))

    def logprobs_match(self, sampling: SamplingParams) -> bool:
        """Whether its log-probs are the `Rollouts.logprobs` contract's for `sampling`: after the
        temperature (vLLM >= 0.10.2, `applies_temperature`), with top-k / top-p off and a
        processed mode (`logprobs_trusted`)."""
        return applies_temperature(self.version) and logprobs_trusted(self.logprobs_mode, sampling)

    def shutdown(self) -> None:
        """Stops the engine (`stop_llm`), drops it and frees its memory; idempotent."""
        llm, self.llm = self.llm, None
        if llm is not None:
            with keep_trainer_group():
                stop_llm(llm)
            del llm
            release_memory()
        host, self.host = self.host, None
        if host is not None:
            host.restore_threads()  # not the RNGs: the trainer drew from them since
            host.restore_environment()
        restore_lazy_environment()


def _lora_request(slot: Any) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(slot.name, slot.id, slot.path)


def resolve_tokenizer(tokenizer: Any, model: str) -> Any:
    """A tokenizer object from an object, a name/folder, or None (the model's)."""
    if tokenizer is None or isinstance(tokenizer, str):
        from coscale.models.policy import load_tokenizer

        return load_tokenizer(tokenizer or model)
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has no pad token: set tokenizer.pad_token (e.g. to eos)")
    return tokenizer


def eos_ids(policy: Any, tokenizer: Any, model: str) -> tuple[int, ...]:
    """EOS ids of the tokenizer and of the policy's (or the checkpoint's) generation config."""
    if policy is None:
        try:
            from transformers import GenerationConfig

            policy = SimpleNamespace(generation_config=GenerationConfig.from_pretrained(model))
        except (OSError, ValueError):
            policy = None
    return eos_token_ids(policy, tokenizer)
