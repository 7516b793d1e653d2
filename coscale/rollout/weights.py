"""The full weights of a policy under its Hugging Face names, however it is wrapped or sharded.

An inference engine loads weights by the names of the HF checkpoint (``model.layers.0...``).
A trained policy may sit inside wrappers that rename or shard its parameters: DDP, FSDP1
(``_fsdp_wrapped_module.`` in names, flat sharded storage), FSDP2 (DTensor parameters),
activation checkpointing, ``torch.compile``, or coscale's own LightningModule (``policy.``);
a PEFT LoRA policy is sent merged (:mod:`coscale.models.adapter_weights`).
`gathered_parameters` undoes all of them; `full_tensor` and `buckets` stream the values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from torch import Tensor, nn

from coscale.models.adapter_weights import merged_named_weights
from coscale.models.adapters import has_adapter
from coscale.models.full_state import is_sharded  # noqa: F401  (re-exported)

WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
"""Name parts that wrappers (FSDP1, activation checkpointing, torch.compile) insert."""


def clean_name(name: str) -> str:
    """A parameter name without the parts wrappers insert (`WRAPPER_PARTS`)."""
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def select_weights(named: Sequence[tuple[str, Any]], prefix: str = "") -> list[tuple[str, Any]]:
    """Cleans names, keeps those under `prefix` (dropping it) when any name has it.

    The prefix lets the caller pass a container of the policy (e.g. the FSDP-wrapped
    LightningModule, whose policy parameters are ``policy.*``): other members such as a frozen
    reference model are left out.

    Raises:
        ValueError: When two parameters end up with the same name or none is left.
    """
    cleaned = [(clean_name(n), p) for n, p in named if "_flat_param" not in n]
    if prefix and any(n.startswith(prefix) for n, _ in cleaned):
        cleaned = [(n[len(prefix) :], p) for n, p in cleaned if n.startswith(prefix)]
    names = [n for n, _ in cleaned]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated or not names:
        what = f"repeated names {repeated[:5]}" if repeated else "no parameters"
        raise ValueError(
            f"the model gave {what} to send to the engine (sync.param_prefix={prefix!r})"
        )
    return cleaned


@contextmanager
def gathered_parameters(model: nn.Module, prefix: str = "policy.") -> Iterator[list]:
    """Yields `(hf_name, parameter)` pairs whose values are full while the block runs.

    Call on every rank at once under FSDP (the gather is a collective). DTensor parameters
    (FSDP2) are still sharded here: read them with `full_tensor`.
    """
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if has_adapter(module):  # a LoRA policy: the base's names, the adapter merged in when read
        yield merged_named_weights(module)
        return
    with _summon_full(module):
        yield select_weights(list(module.named_parameters()), prefix)


def _summon_full(module: nn.Module):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if any(isinstance(m, FSDP) for m in module.modules()):
        return FSDP.summon_full_params(module, writeback=False, recurse=True)
    return nullcontext()


def full_tensor(value: Tensor) -> Tensor:
    """The whole tensor of a DTensor (a collective), else the tensor itself; detached."""
    gather = getattr(value, "full_tensor", None)
    return (gather() if callable(gather) else value).detach()


def buckets(named: Sequence[tuple[str, Tensor]], max_bytes: int) -> Iterator[list]:
    """Consecutive groups of `(name, tensor)` of at most `max_bytes` (a bigger tensor alone)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, value in named:
        nbytes = value.numel() * value.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, value))
        size += nbytes
    if bucket:
        yield bucket
