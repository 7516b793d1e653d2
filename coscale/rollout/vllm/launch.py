"""Starting vLLM in the trainer's processes: what must hold before ``vllm.LLM(...)`` runs.

- vllm is importable (`require_vllm`, else "install coscale[vllm] ..."), at a version that gives
  the log-prob source asked for (`check_installed`), checked when the backend is chosen.
  Importing vllm sets variables in ``os.environ`` (``TORCHINDUCTOR_COMPILE_THREADS=1``, ...)
  that would also change the trainer's own ``torch.compile``: `require_vllm` takes them back
  out and keeps them in `IMPORT_ENVIRONMENT`; `prepare_environment` sets them for an engine's
  lifetime (`coscale.rollout.vllm.host` removes them after its shutdown).
- The engine runs in the training process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set unless
  the user set it, `prepare_environment`), so ``LLM.apply_model`` hands the live model to
  ``load_weights`` without copying tensors across processes.
- Under torch.distributed with several ranks, each rank drives its own engine on its own
  prompts: ``distributed_executor_backend="external_launcher"`` (vLLM's torchrun support), with
  the engine seed offset by the rank so that replicas sample differently (`replica_args`). That
  executor joins the trainer's process group and reads ``RANK`` and ``LOCAL_RANK`` from the
  environment; torchrun sets them, Lightning's own launcher sets only ``LOCAL_RANK`` and SLURM
  neither, so `prepare_environment` fills them from torch.distributed and the rank's CUDA
  device (`launcher_env`). Tensor parallelism is refused there: vLLM then needs every rank of a
  group to send the same prompts, and coscale's ranks each sample their own.
- Shutting an in-process engine down ends in vLLM's ``cleanup_dist_env_and_memory``, which
  destroys the default process group: under ``external_launcher`` that is the trainer's, and
  the fit would die at its next collective. `keep_trainer_group` keeps it through the shutdown
  (vLLM's own groups are still destroyed).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from coscale.distributed import distributed
from coscale.rollout.vllm.versions import check_logprobs_source, installed_version

IMPORT_ENVIRONMENT: dict[str, str] = {}
"""The variables the first ``import vllm`` of this process set (see the module docstring)."""

LAZY_PREFIXES, LAZY_NAMES = ("VLLM_", "AITER_"), ("LD_LIBRARY_PATH",)
"""Variables that modules vLLM imports on first use set at any later time (its AITER kernels'
flags; OpenCV, through its multimodal code, prepends to ``LD_LIBRARY_PATH``)."""
_TRAINER_LAZY: dict[str, str] | None = None  # those variables before the first import of vllm


def _lazy(name: str) -> bool:
    return name.startswith(LAZY_PREFIXES) or name in LAZY_NAMES


def restore_lazy_environment() -> None:
    """The :data:`LAZY_NAMES` / :data:`LAZY_PREFIXES` variables back to what the trainer had
    before its first ``import vllm`` (after an engine's shutdown)."""
    if _TRAINER_LAZY is None:
        return
    for name in [n for n in os.environ if _lazy(n) and n not in _TRAINER_LAZY]:
        del os.environ[name]
    os.environ.update(_TRAINER_LAZY)


INSTALL_HINT = "install coscale[vllm] to use the vLLM rollout backend (pip install 'coscale[vllm]')"
EXTERNAL_LAUNCHER = "external_launcher"
"""vLLM's executor for engines started by an outside launcher (torchrun, Lightning, SLURM)."""


def require_vllm() -> Any:
    """Imports and returns the `vllm` module, or raises ImportError with `INSTALL_HINT`."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(INSTALL_HINT)
    global _TRAINER_LAZY
    first, before = "vllm" not in sys.modules, dict(os.environ)
    if _TRAINER_LAZY is None:
        _TRAINER_LAZY = {n: v for n, v in before.items() if _lazy(n)}
    try:
        module = importlib.import_module("vllm")
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT}; importing vllm failed: {err}") from err
    if first:
        IMPORT_ENVIRONMENT.update({k: v for k, v in os.environ.items() if before.get(k) != v})
        for name in IMPORT_ENVIRONMENT:
            if name in before:
                os.environ[name] = before[name]
            else:
                del os.environ[name]
    return module


def check_installed(logprobs: str) -> None:
    """Checks that vllm is installed and that its version gives the `logprobs` source asked for.

    Raises:
        ImportError: Without vllm installed (`INSTALL_HINT`).
        ValueError: For ``logprobs="engine"`` on a vLLM too old for it (`check_logprobs_source`).
    """
    check_logprobs_source(logprobs, installed_version(require_vllm()))


def replica_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments `args` for this rank's own engine.

    In one process they are kept. Under torch.distributed with several ranks the executor
    defaults to ``external_launcher`` and the seed is offset by the rank.

    Raises:
        ValueError: For ``tensor_parallel_size`` other than 1 under ``external_launcher``.
    """
    args = dict(args)
    if distributed():
        args.setdefault("distributed_executor_backend", EXTERNAL_LAUNCHER)
        args["seed"] = int(args.get("seed", 0)) + dist.get_rank()
    check_tensor_parallel(args)
    return args


def check_tensor_parallel(args: Mapping[str, Any]) -> None:
    """Refuses ``tensor_parallel_size`` != 1 with ``external_launcher`` (module docstring).

    Raises:
        ValueError: Naming ``rollout.options.engine.kwargs.tensor_parallel_size``.
    """
    tp = int(args.get("tensor_parallel_size", 1))
    if tp != 1 and args.get("distributed_executor_backend") == EXTERNAL_LAUNCHER:
        raise ValueError(
            f"rollout.options.engine.kwargs.tensor_parallel_size must be 1 under "
            f"torch.distributed, got {tp}: each rank samples its own prompts with its own "
            "seeds, while vLLM's external_launcher needs every rank of a tensor-parallel group "
            "to send the same ones. Use one engine per rank (a model that fits one GPU), or "
            "tensor parallelism in a single process"
        )


@contextlib.contextmanager
def keep_trainer_group() -> Iterator[None]:
    """While it runs, ``torch.distributed.destroy_process_group()`` without a group does nothing
    (see the module docstring); with a group it destroys that group as usual."""
    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    destroy = dist.destroy_process_group

    def destroy_all_but_the_default(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    dist.destroy_process_group = destroy_all_but_the_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


def prepare_environment(args: Mapping[str, Any]) -> None:
    """Sets what vLLM reads from ``os.environ`` for an engine built from `args` (`vllm.LLM`
    keyword arguments): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and `IMPORT_ENVIRONMENT` unless
    set, and with ``external_launcher`` ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (`launcher_env`).

    Raises:
        RuntimeError: Under ``external_launcher`` without a process group to join, or when
            `launcher_env` cannot tell the ranks.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, value in IMPORT_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if args.get("distributed_executor_backend") == EXTERNAL_LAUNCHER:
        os.environ.update(launcher_env(os.environ, *rank_layout()))


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
