"""KV caches for the hand-written decode loop of `coscale.rollout.cached`.

HF `DynamicCache` grows with `torch.cat`, which copies every layer's whole cache on every new
token; on a CPU that copy cost more than the matmuls of a small model's decode step. A
`PreallocatedLayer` allocates its buffers once for the longest sequence of the call and writes
new positions in place; attention reads a view of the filled part.

Shapes: n rows, H key/value heads, L positions (capacity C), D head size.
"""

from __future__ import annotations

from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from coscale.models.capabilities import full_attention_only


class PreallocatedLayer(DynamicLayer):
    """One layer's keys/values in [n, H, C, D] buffers; `keys`/`values` are [n, H, L, D] views.

    Args:
        capacity: C, the most positions (prompt + new tokens) the layer will hold.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self._k: Tensor | None = None
        self._v: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        n, heads, _, _ = key_states.shape
        self.device = key_states.device
        self._k = key_states.new_empty(n, heads, self.capacity, key_states.shape[-1])
        self._v = value_states.new_empty(
            n, value_states.shape[1], self.capacity, value_states.shape[-1]
        )
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        """Writes the new positions in place -> (keys, values) [n, H, L, D] views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded: {end} positions")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keeps (or repeats) the rows `indices` of the buffers, in that order.

        Fewer rows (finished rows dropped) are gathered into the front of the same buffers, so
        no second cache is allocated; more rows (a prompt's cache copied to its N rollouts)
        get new buffers. Only the filled positions are copied either way.
        """
        if not self.is_initialized:
            return
        gather = _gather_front if len(indices) <= self._k.shape[0] else _gather_new
        self._k, self._v = (gather(buf, indices, self.length) for buf in (self._k, self._v))
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


def _gather_front(buf: Tensor, indices: Tensor, length: int) -> Tensor:
    """Rows `indices` of `buf`'s first `length` positions, written to its first rows -> a view."""
    buf[: len(indices), :, :length] = buf[indices, :, :length]  # the gather copies first
    return buf[: len(indices)]


def _gather_new(buf: Tensor, indices: Tensor, length: int) -> Tensor:
    """A new [len(indices), H, C, D] buffer holding rows `indices` of `buf` up to `length`."""
    out = buf.new_empty(len(indices), *buf.shape[1:])
    out[:, :, :length] = buf[indices, :, :length]
    return out


def new_cache(model: nn.Module, capacity: int, preallocate: bool = True) -> Cache:
    """An empty cache for `model`: preallocated layers when every layer is full attention.

    Args:
        model: An HF causal LM.
        capacity: Most positions per row (prompt + new tokens).
        preallocate: False gives HF's `DynamicCache` (the reference path).

    Returns:
        A cache to pass to the model's forward; `batch_select_indices` drops or repeats rows.
    """
    config = model.config.get_text_config(decoder=True)
    if preallocate and full_attention_only(config):
        layers = [PreallocatedLayer(capacity) for _ in range(config.num_hidden_layers)]
        return Cache(layers=layers)
    return DynamicCache(config=config)
