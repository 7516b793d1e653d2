"""The dtype an engine with its own copy of the weights (vLLM) computes in, decided here only.

The engine samples what the trainer scores: its dtype is the trainer's compute dtype (Lightning's
precision, ``bf16-mixed``: ``bfloat16``), else the policy's parameter dtype (vLLM's ``auto``
may run a float32 checkpoint in 16 bits, which on a CPU without native bf16 is also slow), else
``auto``. An ``engine.dtype`` the user sets wins over both (`coscale.rollout.factory`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from coscale.models.capabilities import dtype_name


def precision_dtype(precision: Any) -> str | None:
    """A Lightning precision as a vLLM ``dtype`` (``bf16-mixed``: ``bfloat16``, ``16-mixed``:
    ``float16``, ``32-true``: ``float32``); None where it names none (no trainer, ``auto``)."""
    text = str(precision or "")
    for prefix, dtype in (("bf16", "bfloat16"), ("16", "float16"), ("32", "float32")):
        if text.startswith(prefix):
            return dtype
    return None


def policy_dtype(policy: nn.Module) -> str:
    """The policy's parameter dtype as a vLLM ``dtype`` (``auto`` for any other)."""
    return dtype_name(next(policy.parameters()).dtype) or "auto"


def engine_dtype(precision: Any = None, policy: nn.Module | None = None) -> str:
    """The engine's dtype: ``precision``'s (a Lightning precision), else ``policy``'s, else
    ``auto``."""
    dtype = precision_dtype(precision)
    if dtype is None and policy is not None:
        dtype = policy_dtype(policy)
    return dtype or "auto"
