"""What differs between vLLM versions: what its log-probs mean, and how an engine is stopped.

The engine's log-probs replace a forward pass of the trainer only when they are
``log_softmax(logits / temperature)``. vLLM has ``logprobs_mode`` from 0.10.0, but its
``processed_logprobs`` include the temperature only from 0.10.2: on 0.10.0-0.10.1.1 they are taken
before it, which the parity check (at temperature 1) cannot see. So the version decides:

- >= 0.10.2: ``logprobs: auto`` uses the engine's values where they match (no top-k / top-p).
- older, a pre-release of 0.10.2 (``0.10.2rc1``, ``0.10.2.dev3+g...``: it may predate the fix) or
  an unreadable version (a source build without metadata says ``dev``): the trainer recomputes
  them, and ``logprobs: engine`` is refused.

Versions follow PEP 440 (``packaging``, a dependency of transformers): ``0.11.0rc1`` is above
0.10.2, ``0.10.2.post1`` too.

Stopping an engine has no single API across versions either: `stop_llm` tries each version's
hook, and `release_memory` collects what is left (vLLM freezes its heap since ~0.11.1).
"""

from __future__ import annotations

import gc
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

TEMPERATURE_IN_LOGPROBS = Version("0.10.2")
"""First vLLM release whose ``processed_logprobs`` are taken after the temperature."""


def installed_version(vllm: Any) -> str | None:
    """``vllm.__version__`` of an imported `vllm` module (None where it has none)."""
    version = getattr(vllm, "__version__", None)
    return None if version is None else str(version)


def parse_version(text: str | None) -> Version | None:
    """`text` as a PEP 440 version; None for None or an unreadable string (e.g. ``dev``)."""
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def applies_temperature(version: str | None) -> bool:
    """Whether vLLM `version` returns ``processed_logprobs`` after the temperature (>= 0.10.2)."""
    parsed = parse_version(version)
    return parsed is not None and parsed >= TEMPERATURE_IN_LOGPROBS


def check_logprobs_source(logprobs: str, version: str | None) -> None:
    """Refuses ``logprobs: engine`` on a vLLM whose log-probs leave the temperature out.

    Raises:
        ValueError: Naming the ``logprobs`` option, the version and what to change.
    """
    if logprobs != "engine" or applies_temperature(version):
        return
    shown = "of unknown version" if version is None else repr(version)
    raise ValueError(
        f"rollout.options.logprobs='engine' trusts vLLM's log-probs, but vLLM {shown} may return "
        f"them before the temperature (processed_logprobs include it from "
        f"{TEMPERATURE_IN_LOGPROBS}): set logprobs to 'auto' or 'trainer' (the trainer recomputes "
        f"them), or install vllm>={TEMPERATURE_IN_LOGPROBS}"
    )


def describe(version: str | None) -> str:
    """One line for the log: the version and whether its log-probs can be old log-probs."""
    shown = "of unknown version" if version is None else version
    if applies_temperature(version):
        return f"vLLM {shown}: its processed log-probs include the temperature"
    return (
        f"vLLM {shown}: its log-probs may leave the temperature out (fixed in "
        f"{TEMPERATURE_IN_LOGPROBS}); the trainer recomputes old log-probs (one extra forward pass)"
    )


def stop_llm(llm: Any) -> None:
    """Shuts `llm` down through the first hook its vLLM version has.

    ``LLM.shutdown`` or ``LLMEngine.shutdown`` where they exist; else the V1 engine-core client
    (``llm_engine.engine_core.shutdown``: stops the executor and its worker); else the V0
    executor (``llm_engine.model_executor.shutdown``). Recent versions (0.32 seen) destroy
    vLLM's own process groups there, and the default one too, which under external_launcher
    is the trainer's: call it inside `coscale.rollout.vllm.launch.keep_trainer_group`.
    """
    engine = getattr(llm, "llm_engine", None)
    owners = (llm, engine, getattr(engine, "engine_core", None))
    owners += (getattr(engine, "model_executor", None),)
    hook = next((h for o in owners if callable(h := getattr(o, "shutdown", None))), None)
    if hook is not None:
        hook()


def release_memory() -> None:
    """Collects a dropped engine and returns its cached CUDA blocks to the device.

    vLLM (from about 0.11.1, vllm-project/vllm#27896) calls ``gc.freeze()`` after building an
    in-process engine: its objects then sit where the cycle collector never looks, so they are
    unfrozen before collecting.
    """
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
