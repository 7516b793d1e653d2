"""Where coscale touches vLLM's API: building a colocated `vllm.LLM`, driving it, stopping it.

`VLLMEngine` wraps `vllm.LLM` behind a few small methods (generate, load_weights, sleep,
wake_up, reset_prefix_cache, logprobs_mode, version, shutdown). `VLLMBackend` talks only to
those, so a test can hand it a fake engine, and an API change of vLLM is fixed here (or in
`vllm_versions`, for what differs between versions). vLLM is imported when an engine is built,
never when coscale is imported.

Choices (vLLM's API as of 0.10.2-0.33; every default can be overridden through `engine_kwargs`):
- The engine runs in the training process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set unless
  the user set it), so ``LLM.apply_model`` hands the live model to ``load_weights`` without
  copying tensors across processes.
- Under torch.distributed with several ranks, each rank drives its own engine on its own
  prompts: ``distributed_executor_backend="external_launcher"`` (vLLM's torchrun support), with
  the engine seed offset by the rank so that replicas sample differently. That executor reads
  ``RANK`` and ``LOCAL_RANK`` from the environment; torchrun sets them, Lightning's own launcher
  sets only ``LOCAL_RANK`` and SLURM neither, so `launcher_env` fills them from torch.distributed
  and the rank's CUDA device. Tensor parallelism is refused there: vLLM then needs every rank
  of a group to send the same prompts, and coscale's ranks each sample their own.
- ``generation_config="vllm"``: the checkpoint's sampling defaults are ignored, as in the HF
  backend; only coscale's `SamplingParams` shape the distribution.
- ``logprobs_mode="processed_logprobs"`` where vLLM knows the option (>= 0.10.0): log-probs
  after temperature from 0.10.2 (`vllm_versions`), which match the trainer's whenever top-k /
  top-p are off. Older versions reject the option; the engine is then built without it.
- `VLLMEngine.shutdown` stops the engine and frees its memory: an engine left to the garbage
  collector may never be freed (recent vLLM freezes its startup heap out of the collector's
  reach), and the next stage's engine would not fit.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from coscale.rollout.hf import _eos_token_ids
from coscale.rollout.vllm_requests import Request
from coscale.rollout.vllm_versions import installed_version, release_memory, stop_llm

LOGPROB_SOURCES = ("auto", "engine", "trainer")
STALE_ACTIONS = ("sync", "error", "ignore")
INSTALL_HINT = "install coscale[vllm] to use the vLLM rollout backend (pip install 'coscale[vllm]')"


def require_vllm() -> Any:
    """Imports and returns the `vllm` module, or raises ImportError with `INSTALL_HINT`."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(INSTALL_HINT)
    try:
        return importlib.import_module("vllm")
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT}; importing vllm failed: {err}") from err


def engine_args(
    model: str,
    tokenizer: str | None = None,
    dtype: str = "auto",
    gpu_memory_utilization: float = 0.3,
    max_model_len: int | None = None,
    sleep_level: int = 0,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for a colocated engine (see the module docstring)."""
    args: dict[str, Any] = {
        "model": model,
        "tokenizer": tokenizer or model,
        "dtype": dtype,
        "gpu_memory_utilization": gpu_memory_utilization,
        "seed": seed,
        "enable_sleep_mode": sleep_level > 0,
        "generation_config": "vllm",
        "logprobs_mode": "processed_logprobs",
    }
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    args.update(extra or {})
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        args.setdefault("distributed_executor_backend", "external_launcher")
        args["seed"] = int(args["seed"]) + dist.get_rank()
    tp = int(args.get("tensor_parallel_size", 1))
    if tp != 1 and args.get("distributed_executor_backend") == "external_launcher":
        raise ValueError(
            f"rollout_options.engine_kwargs.tensor_parallel_size must be 1 under "
            f"torch.distributed, got {tp}: each rank samples its own prompts with its own "
            "seeds, while vLLM's external_launcher needs every rank of a tensor-parallel group "
            "to send the same ones. Use one engine per rank (a model that fits one GPU), or "
            "tensor parallelism in a single process"
        )
    return args


def build_engine(**kwargs: Any) -> VLLMEngine:
    """A `VLLMEngine` over `vllm.LLM(**kwargs)`, in this process.

    Raises:
        ImportError: Without vllm installed (`INSTALL_HINT`).
        RuntimeError: Under ``external_launcher`` when `launcher_env` cannot tell the ranks.
    """
    vllm = require_vllm()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if kwargs.get("distributed_executor_backend") == "external_launcher":
        os.environ.update(launcher_env(os.environ, *rank_layout()))
    try:
        llm = vllm.LLM(**kwargs)
    except TypeError as err:  # vLLM < 0.10.0 has no logprobs_mode
        if "logprobs_mode" not in str(err) or "logprobs_mode" not in kwargs:
            raise
        llm = vllm.LLM(**{k: v for k, v in kwargs.items() if k != "logprobs_mode"})
    return VLLMEngine(llm, vllm.SamplingParams, installed_version(vllm))


def rank_layout() -> tuple[int, int, int | None]:
    """(global rank, world size, CUDA device index or None) of this process.

    Raises:
        RuntimeError: Without an initialised torch.distributed, which external_launcher joins.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "distributed_executor_backend='external_launcher' joins an existing "
            "torch.distributed process group and none is initialised: launch with torchrun, or "
            "build the backend inside a Lightning fit with several devices"
        )
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    return dist.get_rank(), dist.get_world_size(), device


def launcher_env(
    environ: Mapping[str, str], rank: int, world_size: int, device: int | None
) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` for vLLM's external launcher.

    The executor reads ``RANK`` and ``LOCAL_RANK`` and puts its engine on ``cuda:LOCAL_RANK``;
    ``MASTER_ADDR`` / ``MASTER_PORT`` matter only when it has to create the process group, which
    the trainer already did. Values already set are kept when they agree with torch.distributed;
    a missing ``LOCAL_RANK`` is this rank's CUDA device (else ``SLURM_LOCALID``).

    Raises:
        RuntimeError: When a set value disagrees, or the local rank cannot be told.
    """
    problems = []
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size)):
        if environ.get(name, str(value)) != str(value):
            problems.append(f"{name}={environ[name]} but torch.distributed says {value}")
    local = environ.get("LOCAL_RANK")
    if local is None:
        local = str(device) if device is not None else environ.get("SLURM_LOCALID")
    if local is None:
        problems.append(
            "no LOCAL_RANK, SLURM_LOCALID or CUDA device tells this rank's local rank: launch "
            "with torchrun (it sets RANK, LOCAL_RANK, WORLD_SIZE) or set LOCAL_RANK"
        )
    elif device is not None and local != str(device):
        problems.append(
            f"LOCAL_RANK={local} but this rank trains on cuda:{device}, and vLLM would put its "
            "engine on cuda:LOCAL_RANK: give each node's ranks devices 0..N-1 (choose GPUs with "
            "CUDA_VISIBLE_DEVICES, not Trainer(devices=[...]))"
        )
    if problems:
        raise RuntimeError(
            "vLLM's external_launcher under torch.distributed: " + "; ".join(problems)
        )
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local)}


class VLLMEngine:
    """`vllm.LLM` seen through the calls the backend needs.

    Args:
        llm: A `vllm.LLM` (or anything with its methods).
        sampling_params_cls: `vllm.SamplingParams` (built from each request's dict).
        version: ``vllm.__version__`` (None: unknown, so its log-probs are never trusted).
    """

    def __init__(self, llm: Any, sampling_params_cls: Any, version: str | None = None) -> None:
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.version = version  # vllm.__version__; decides what its log-probs mean

    def generate(self, requests: Sequence[Request]) -> list[Any]:
        """One `RequestOutput` per request, in request order."""
        prompts = [{"prompt_token_ids": list(r.token_ids)} for r in requests]
        params = [self.sampling_params_cls(**r.params) for r in requests]
        return list(self.llm.generate(prompts, params, use_tqdm=False))

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> list[int | None]:
        """Loads `(hf_name, tensor)` pairs into the model of every worker.

        Returns:
            Per worker, how many tensors the model says it loaded (None where its
            ``load_weights`` returns nothing, as in older vLLM versions).
        """
        weights = list(weights)

        def load(model: Any) -> int | None:
            loaded = model.load_weights(weights)
            return None if loaded is None else len(loaded)

        return list(self.llm.apply_model(load))

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

    def shutdown(self) -> None:
        """Stops the engine (`stop_llm`), drops it and frees its memory; idempotent."""
        llm, self.llm = self.llm, None
        if llm is not None:
            stop_llm(llm)
            del llm
            release_memory()


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
    return _eos_token_ids(policy, tokenizer)


def check_settings(**args: Any) -> None:
    """Collects every bad `VLLMBackend` setting and raises one ValueError naming each."""
    errors = []
    if not 0 < args["gpu_memory_utilization"] <= 1:
        value = args["gpu_memory_utilization"]
        errors.append(f"gpu_memory_utilization must be in (0, 1], got {value}")
    for name, allowed in (("logprobs", LOGPROB_SOURCES), ("on_stale", STALE_ACTIONS)):
        if args[name] not in allowed:
            errors.append(f"{name} must be one of {', '.join(allowed)}; got {args[name]!r}")
    if args["sleep_level"] not in (0, 1, 2):
        errors.append(f"sleep_level must be 0, 1 or 2, got {args['sleep_level']}")
    for name in ("sync_bucket_mb", "parity_samples", "parity_tokens", "recompute_batch_size"):
        if args[name] < 1:
            errors.append(f"{name} must be >= 1, got {args[name]}")
    if args["parity_every"] < 0:
        errors.append(f"parity_every must be >= 0 (0 = never), got {args['parity_every']}")
    if not (math.isfinite(args["parity_atol"]) and args["parity_atol"] >= 0):
        errors.append(f"parity_atol must be a number >= 0, got {args['parity_atol']}")
    timeout = args["sync_timeout_s"]
    if timeout is not None and timeout <= 0:
        errors.append(f"sync_timeout_s must be > 0 or None, got {timeout}")
    if errors:
        raise ValueError("VLLMBackend: " + "; ".join(errors))
