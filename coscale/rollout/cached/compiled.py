"""A `torch.compile`d decode step over a static KV cache, for `CachedDecodeBackend(compile=True)`.

Compiling pays when a decode step is overhead-bound: on small models each step launches a few
hundred small kernels, and fusing the element-wise ones saves more than the matmuls cost. It
needs shapes that stay put from step to step, so the step reads HF's `StaticCache` (every
layer's keys/values in [n, H, C, D] buffers filled in place, attention over all C positions
with the padding and the future masked) and gets its position as a tensor, not an int. The
prompt still runs eagerly (once per distinct prompt, as in the eager path); its keys/values
are then copied into the static buffers.

Measured on the 2-core build machine, one torch thread, greedy steps of 32 rows
(`benchmarks/bench_rollout.py --compile`): see `benchmarks/results/bench_rollout.txt`.

Shapes: n rows, H key/value heads, P prompt columns, C = P + T cache columns, D head size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, StaticCache

from coscale.models.capabilities import cache_kwargs, full_attention_only, keep_last_logits


class CompiledDecodeStep:
    """One compiled forward of one new token per row, reading and extending a static cache.

    The compiled function is built once per instance (lazily, on the first step); dynamo
    recompiles when the row count or cache length changes and, after the second shape, marks
    that dimension dynamic, so a run with varying batch sizes compiles a few times, not once per
    call. The weights are read at call time, so optimiser steps need no recompile.

    Args:
        model: An HF causal LM whose layers all use full attention.
    """

    def __init__(self, model: nn.Module) -> None:
        config = model.config.get_text_config(decoder=True)
        if not full_attention_only(config):
            raise ValueError(
                "compile=True needs a model whose layers all use full attention "
                f"(layer_types {getattr(config, 'layer_types', None)}); use compile=False"
            )
        self.model = model
        self._compiled = None

    def static_cache(self, prefilled: Cache, capacity: int) -> StaticCache:
        """A `StaticCache` of `capacity` columns holding the prefilled keys/values (copied)."""
        cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        for source, target in zip(prefilled.layers, cache.layers):
            keys, values = source.keys, source.values  # [n, H, P, D]
            target.lazy_initialization(keys, values)
            target.keys[:, :, : keys.shape[2]] = keys
            target.values[:, :, : values.shape[2]] = values
            target.cumulative_length.fill_(keys.shape[2])
        return cache

    def __call__(
        self, ids: Tensor, mask: Tensor, positions: Tensor, column: Tensor, cache: StaticCache
    ) -> Tensor:
        """Logits [n, V] of the token after `ids` [n, 1], written at cache `column` ([1]).

        `mask` [n, C] is 1 on real prompt tokens and on every new-token column (the future
        ones are masked by causality); `positions` [n, 1] are the rows' position ids.
        """
        if self._compiled is None:
            self._compiled = torch.compile(self._step)
        return self._compiled(ids, mask, positions, column, cache)

    def _step(
        self, ids: Tensor, mask: Tensor, positions: Tensor, column: Tensor, cache: StaticCache
    ) -> Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache_position=column,
            **cache_kwargs(self.model, cache),
            **keep_last_logits(self.model, 1),
        )
        return out.logits[:, -1]
