"""Loading new weights into a live vLLM model in place, on every platform vLLM runs on.

A plain ``model.load_weights(...)`` through ``LLM.apply_model`` is not enough everywhere: vLLM's
CPU build re-packs each linear layer's weight after start-up (oneDNN / sgl-kernel layouts) and
puts an empty Parameter without a ``weight_loader`` in its place, so the second load fails
(``'Parameter' object has no attribute 'weight_loader'``). vLLM's own weight-transfer engines
(``vllm/distributed/weight_transfer/ipc_engine.py``) load a new checkpoint in three steps, which
this module runs on each worker through ``LLM.collective_rpc``:

1. `start_load`: ``initialize_layerwise_reload(model)`` puts every layer back in its
   checkpoint layout and buffers what is loaded into it;
2. `load_bucket`: ``model.load_weights(bucket)`` per bucket of ``(hf_name, tensor)`` (HF names,
   as in a checkpoint); a layer is re-processed (re-packed) as soon as all its weights came;
3. `finish_load`: ``finalize_layerwise_reload(model, model_config)`` finishes the layers left,
   then `refresh_tied_layers`.

Tied heads: with ``tie_word_embeddings`` the LM head shares the embedding's Parameter and no
checkpoint name loads it, so the reload leaves its processed copy as it was (vLLM logs
``ParallelLMHead: Failed to load weights``). On CPU that copy is a packed matrix made from the
old values, and the engine would sample from a stale head while the embedding is new.
`refresh_tied_layers` re-runs the processing of every layer whose weight is another layer's.
On GPU that processing does nothing for unquantized layers.

vLLM logs ``<layer>: Failed to load weights`` for every layer no checkpoint name reached at
each sync: the tied head (refreshed here) and rotary embeddings (no weights, their tables
stay). `quiet_expected_warnings` drops those two lines, no other.

vLLM releases without the reload package (it came after the 0.10 series) keep each layer's
``weight_loader``: there `start_load` and `finish_load` do nothing and `load_bucket` is the plain
``model.load_weights``. `reload_api` tells which one an engine has.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor, nn

EXPECTED_UNLOADED = ("ParallelLMHead", "RotaryEmbedding")
"""Layers no checkpoint name reaches in a reload, by design (see the module docstring)."""
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _ExpectedUnloaded(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else None
        expected = isinstance(layer, str) and layer.endswith(EXPECTED_UNLOADED)
        return not (expected and "Failed to load weights" in str(record.msg))


def quiet_expected_warnings() -> None:
    """Installs the filter of the expected "Failed to load weights" lines (once a process)."""
    logger = logging.getLogger(LAYERWISE_LOGGER)
    if not any(isinstance(f, _ExpectedUnloaded) for f in logger.filters):
        logger.addFilter(_ExpectedUnloaded())


def reload_api() -> tuple[Any, Any] | None:
    """vLLM's ``(initialize_layerwise_reload, finalize_layerwise_reload)``; None if absent."""
    try:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError:
        return None
    return initialize_layerwise_reload, finalize_layerwise_reload


@contextlib.contextmanager
def worker_config(worker: Any) -> Iterator[None]:
    """vLLM's current config set to `worker`'s (layers read it while they are re-processed)."""
    config = getattr(worker, "vllm_config", None)
    try:
        from vllm.config import set_current_vllm_config
    except ImportError:
        config = None
    if config is None:
        yield
        return
    with set_current_vllm_config(config):
        yield


def start_load(worker: Any) -> bool:
    """Step 1 on one worker; returns whether the layerwise reload is in use."""
    api = reload_api()
    if api is None:
        return False
    with worker_config(worker):
        api[0](worker.get_model())
    return True


def load_bucket(worker: Any, weights: Sequence[tuple[str, Tensor]]) -> int | None:
    """Step 2 on one worker: how many parameters the model says it loaded (None: it does not
    say, as in older vLLM versions)."""
    with worker_config(worker):
        loaded = worker.get_model().load_weights(weights)
    return None if loaded is None else len(loaded)


def finish_load(worker: Any) -> int:
    """Step 3 on one worker; returns how many tied layers were re-processed."""
    api = reload_api()
    model = worker.get_model()
    with worker_config(worker):
        if api is not None:
            api[1](model, worker.model_config)
        return refresh_tied_layers(model)


def tied_layers(model: nn.Module) -> list[nn.Module]:
    """Unquantized layers whose ``weight`` is the same Parameter as another layer's.

    Quantized ones are left alone: their processing may transform the weight in place, and
    running it twice would do so twice.
    """
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.numel() > 0:
            owners.setdefault(id(weight), []).append(module)
    shared = [m for group in owners.values() if len(group) > 1 for m in group]
    methods = ((m, getattr(m, "quant_method", None)) for m in shared)
    return [m for m, q in methods if q is not None and type(q).__name__.startswith("Unquantized")]


def refresh_tied_layers(model: nn.Module) -> int:
    """Re-runs ``quant_method.process_weights_after_loading`` on each of `tied_layers`."""
    layers = tied_layers(model)
    for layer in layers:
        layer.quant_method.process_weights_after_loading(layer)
    return len(layers)
