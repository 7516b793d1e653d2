"""The `VLLMBackend` settings checked at once: every bad value named in one error."""

from __future__ import annotations

import math
from typing import Any

LOGPROB_SOURCES = ("auto", "engine", "trainer")
STALE_ACTIONS = ("sync", "error", "ignore")


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
    atol = args["parity_atol"]
    if atol is not None and not (math.isfinite(atol) and atol >= 0):
        errors.append(f"parity_atol must be a number >= 0 or None (by dtype), got {atol}")
    kv = args["kv_cache_gib"]
    if kv is not None and not (math.isfinite(kv) and kv > 0):
        errors.append(f"kv_cache_gib must be > 0 or None (the default size), got {kv}")
    timeout = args["sync_timeout_s"]
    if timeout is not None and timeout <= 0:
        errors.append(f"sync_timeout_s must be > 0 or None, got {timeout}")
    if errors:
        raise ValueError("VLLMBackend: " + "; ".join(errors))
