"""SFT from the initial weights inside a running fit, on Lightning Fabric with the fit's strategy.

Re-distillation and the final retrain train a fresh :class:`~coscale.modules.SFTModule` while the
user's fit is still running (its ``on_train_end`` / ``on_fit_end``), where no second
``Trainer.fit`` can start. :func:`sft_in_fit` runs the module's own ``training_step``, optimiser,
forgetting guard and checkpoint selection on a :class:`lightning.Fabric` built from the running
trainer (:func:`fabric_for`): the same strategy kind (one device, DDP, FSDP2 through
``ModelParallelStrategy``), the same precision, on the process group the fit already holds. Its
batches are those a pipeline SFT stage is served: the pairs shuffled with the curriculum's seed for
each epoch and dealt to the ranks (:func:`~coscale.datamodules.batches.shard_batches`), so a
:class:`~coscale.callbacks.ReDistillation` in a user's own Trainer trains what the pipeline's
re-distillation stage trains (``tests/test_sft_in_fit.py``).

Order per optimiser step, as Lightning's: ``training_step`` -> backward -> the guard's
``on_before_optimizer_step`` -> gradient clipping -> ``optimizer.step`` -> the guard puts frozen
coordinates back -> the learning-rate scheduler.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L

from coscale.checks import at_least
from coscale.datamodules.batches import shard_batches
from coscale.measure.selection import SelectOnProblems
from coscale.models.full_state import full_state_dict, load_full_state_dict
from coscale.modules.policy_mixin import shard_policy
from coscale.modules.sft import SFTModule
from coscale.renamed import old_names
from coscale.seeds import seeded


@dataclass(frozen=True)
class SFTLoopSettings:
    """How long an in-fit SFT trains, and its batches.

    Attributes:
        max_epochs: Passes over the set.
        max_steps: Stop after this many optimiser steps (None: the epochs decide).
        batch_size: (question, solution) pairs per optimiser step, all ranks together.
        gradient_clip_val: Clip the gradient norm to this (None: no clipping).
    """

    max_epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 16
    gradient_clip_val: float | None = None

    def errors(self) -> list[str]:
        """Every out-of-range setting, named."""
        errors = at_least(1, max_epochs=self.max_epochs, batch_size=self.batch_size)
        errors += at_least(1, optional=True, max_steps=self.max_steps)
        if self.gradient_clip_val is not None and not self.gradient_clip_val > 0:
            errors.append(f"gradient_clip_val must be > 0 or None, got {self.gradient_clip_val!r}")
        return errors


LOOP_KEYS = ("max_epochs", "max_steps", "gradient_clip_val")
"""The ``trainer`` keys a callback's in-fit SFT takes; strategy and precision are the fit's own."""


def loop_from(
    trainer_kwargs: Mapping[str, Any], batch_size: int
) -> tuple[SFTLoopSettings, list[str]]:
    """A callback's ``trainer`` dict and ``sft.batch_size`` as an :class:`SFTLoopSettings`, and
    every key it cannot take, named."""
    errors = [
        f"trainer.{key} is not an in-fit SFT setting (it takes {', '.join(LOOP_KEYS)}; strategy "
        "and precision are those of the running Trainer)"
        for key in sorted(set(trainer_kwargs) - set(LOOP_KEYS))
    ]
    loop = SFTLoopSettings(
        batch_size=batch_size, **{k: v for k, v in trainer_kwargs.items() if k in LOOP_KEYS}
    )
    return loop, errors + loop.errors()


def fabric_for(trainer: Any | None, precision: str = "32-true") -> L.Fabric:
    """A launched Fabric on ``trainer``'s accelerator, devices, strategy and precision, joined to
    the process group the trainer holds (no trainer, or one without a strategy: one device of
    this machine in ``precision``).

    Raises:
        ValueError: For a strategy with no counterpart here (naming it).
    """
    if (strategy := getattr(trainer, "strategy", None)) is None:
        fabric = L.Fabric(accelerator="auto", devices=1, precision=precision)
    else:
        fabric = L.Fabric(
            accelerator=strategy.root_device.type,
            devices=trainer.num_devices,
            num_nodes=trainer.num_nodes,
            strategy=_fabric_strategy(strategy),
            precision=trainer.precision,
        )
        if not _joins(fabric):  # it would start processes of its own
            raise ValueError(
                f"in-fit SFT: the running {type(strategy).__name__} started its processes in a "
                "way Fabric cannot join (e.g. ddp_spawn); use strategy: ddp, or torchrun / SLURM"
            )
    fabric.launch()  # processes exist already: this only sets the device (and the mesh)
    return fabric


def _joins(fabric: L.Fabric) -> bool:
    """Whether ``fabric.launch()`` only joins the processes that run already (no launcher, or a
    script launcher whose cluster environment created them: Lightning's own, torchrun, SLURM)."""
    from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    launcher = fabric.strategy.launcher
    if launcher is None:
        return True
    env = getattr(fabric.strategy, "cluster_environment", None)
    return isinstance(launcher, _SubprocessScriptLauncher) and env.creates_processes_externally


def _fabric_strategy(strategy: Any) -> Any:
    """Fabric's counterpart of the running Lightning strategy."""
    from lightning.fabric import strategies as fs
    from lightning.pytorch import strategies as ps

    backend = getattr(strategy, "_process_group_backend", None)
    if isinstance(strategy, ps.ModelParallelStrategy):
        mesh = strategy.device_mesh
        out = fs.ModelParallelStrategy(
            parallelize_fn=_shard,
            data_parallel_size=mesh["data_parallel"].size(),
            tensor_parallel_size=mesh["tensor_parallel"].size(),
            process_group_backend=backend,
        )
        out.cluster_environment = strategy.cluster_environment
        return out
    if isinstance(strategy, ps.DDPStrategy):
        return fs.DDPStrategy(
            cluster_environment=strategy.cluster_environment,
            parallel_devices=strategy.parallel_devices,
            process_group_backend=backend,
        )
    if isinstance(strategy, ps.SingleDeviceStrategy):
        return "auto"
    raise ValueError(
        f"in-fit SFT: no Fabric counterpart for the running strategy {type(strategy).__name__}; "
        "it follows one device, DDPStrategy and ModelParallelStrategy (FSDP2)"
    )


def _shard(module: SFTModule, mesh: Any) -> SFTModule:
    """Fabric's ``parallelize_fn``: the policy sharded as the Trainer's ``configure_model`` does."""
    shard_policy(module.policy, mesh)
    return module


def sft_in_fit(
    fabric: L.Fabric,
    module: SFTModule,
    items: Sequence[Mapping[str, str]],
    loop: SFTLoopSettings,
    seed: int,
    select: SelectOnProblems | None = None,
) -> SFTModule:
    """Trains ``module`` on ``items`` for ``loop`` on ``fabric``; returns it (with the selected
    weights when ``select`` is given). Every rank calls it with the same ``items``."""
    wrapped = fabric.setup_module(module)  # sharded under FSDP2, wrapped under DDP
    per_epoch = len(shard_batches(list(items), loop.batch_size, seed, 0))
    module.planned_steps = min(loop.max_steps or math.inf, per_epoch * loop.max_epochs)
    conf = module.configure_optimizers()  # after sharding: the optimiser holds the shards
    opt = fabric.setup_optimizers(conf["optimizer"])
    sched = conf.get("lr_scheduler", {}).get("scheduler")
    module.on_train_start()  # the forgetting guard's mastered set and its first loss
    done = False
    for epoch in range(loop.max_epochs):
        for index, batch in enumerate(shard_batches(list(items), loop.batch_size, seed, epoch)):
            _step(fabric, wrapped, module, opt, sched, batch, index, loop)
            module.loop_steps += 1
            if select is not None and module.loop_steps % select.every_n_steps == 0:
                select.score(fabric, module, module.loop_steps)
            done = loop.max_steps is not None and module.loop_steps >= loop.max_steps
            if done:
                break
        if done:
            break
    module.on_train_end()
    if select is not None:
        _keep_selected(fabric, module, select)
    return module


def _step(fabric, wrapped, module, opt, sched, batch, index: int, loop: SFTLoopSettings) -> None:
    loss = wrapped.training_step(batch, index)  # under the precision's autocast
    fabric.backward(loss)
    module.on_before_optimizer_step(opt)
    if loop.gradient_clip_val is not None:
        fabric.clip_gradients(wrapped, opt, max_norm=loop.gradient_clip_val)
    opt.step()
    module.after_optimizer_step()
    opt.zero_grad(set_to_none=True)
    if sched is not None:
        sched.step()


def _keep_selected(fabric: L.Fabric, module: SFTModule, select: SelectOnProblems) -> None:
    """The fit's last scoring, then the best-scoring weights back into the policy."""
    if module.loop_steps not in select.scores:
        select.score(fabric, module, module.loop_steps)
    select.finish()
    if select.best_step != module.loop_steps and (best := select.best_model()) is not None:
        fresh = SFTModule(model=best, load=module.load_settings)
        load_full_state_dict(module.policy, full_state_dict(fresh.policy))


def copy_weights(src_module: Any, dst_module: Any) -> None:
    """Loads ``src_module``'s policy weights into ``dst_module``'s policy, in place.

    Either may be a module with a ``policy`` or a bare ``torch.nn.Module``, sharded (FSDP2) or
    not; under DDP or FSDP2 every rank calls it and rank 0's weights win. A rollout backend
    of ``dst_module`` is pointed at the updated policy (an engine like vLLM holds a copy).
    """
    src = getattr(src_module, "policy", src_module)
    dst = getattr(dst_module, "policy", dst_module)
    load_full_state_dict(dst, full_state_dict(src))  # gathered / broadcast when sharded
    if hasattr(type(dst_module), "backend"):
        dst_module.backend.update_weights(dst)


def run_sft(
    initial_model: str | os.PathLike | Any,
    items: Sequence[Mapping[str, str]],
    sft_kwargs: Mapping[str, Any],
    trainer_kwargs: Mapping[str, Any],
    seed: int = 0,
    precision: str = "32-true",
) -> SFTModule:
    """The in-fit SFT outside any fit, on one device: :class:`~coscale.modules.SFTModule`
    arguments plus ``batch_size`` (default 16) in ``sft_kwargs``, :data:`LOOP_KEYS` in
    ``trainer_kwargs``; returns the trained module.

    Raises:
        ValueError: When ``items`` is empty or a setting is out of range (each named).
    """
    kwargs = dict(sft_kwargs)
    loop, errors = loop_from(trainer_kwargs, kwargs.pop("batch_size", 16))
    if not items:
        errors.append("items must hold at least one {'question', 'solution'} dict")
    if errors:
        raise ValueError("run_sft: " + "; ".join(errors))
    with seeded(seed):
        module = SFTModule(model=initial_model, **kwargs)
        return sft_in_fit(fabric_for(None, precision), module, items, loop, seed)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"SFTLoop": SFTLoopSettings})
