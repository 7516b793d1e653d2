"""A shipped pipeline config's first fit, on CPU stand-ins, up to its second checkpoint save.

Used by tests/test_configs.py. Imported, :func:`first_saves` runs in the test's process (one
CPU device). As a script, ``config_worker.py <config> <stand-in model> <out>`` runs it under the
config's own multi-process strategy on 2 CPU processes over gloo (a multi-GPU FSDP2 config's
``ModelParallelStrategy`` with ``data_parallel_size: 2``); Lightning starts rank 1 by running
this script again, so every process installs the stand-ins (``test_configs.install_stand_ins``),
and rank 0 writes what the saves saw to ``<out>/first_saves.json``.

The run is the config's own (model and data through the stand-ins, its precision, batch sizes,
stages) with three changes: the accelerator is the CPU, a checkpoint follows every step, so
the two saves come after the first optimiser steps, and a measurement before the first fit (the
demo has no warm-up fit) samples at most 32 problems. It stops right after the second save.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

MEASURED = 32  # problems a measurement before the first fit samples (the demo's has 256)


class _TwoSaves(Exception):
    """Stops the run after the first fit's second save."""


def cpu_trainer(path: Path, trainer: dict[str, Any], devices: int) -> dict[str, Any]:
    """The config's trainer settings on ``devices`` CPU processes, its strategy kept."""
    from coscale.pipeline import instantiate

    out = {k: v for k, v in trainer.items() if k != "num_nodes"}
    out |= {"accelerator": "cpu", "devices": devices}
    raw = yaml.safe_load(path.read_text())["pipeline"].get("trainer", {}).get("strategy")
    if isinstance(raw, dict):  # a class_path strategy: its data-parallel size is the processes'
        init = dict(raw.get("init_args", {}))
        if "data_parallel_size" in init:
            init["data_parallel_size"] = devices
        out["strategy"] = instantiate({**raw, "init_args": init})
    return out


def first_saves(path: Path, run_dir: Path, devices: int = 1) -> list[dict[str, Any]]:
    """Runs ``path``'s pipeline until its first fit has saved twice; what each save saw."""
    from test_configs import _pipeline

    from coscale.pipeline import Pipeline
    from coscale.run import checkpoint

    init = _pipeline(path)
    trainer = cpu_trainer(path, init.pipeline.trainer, devices)
    config = replace(
        init.pipeline,
        run_dir=str(run_dir),
        logger="none",
        checkpoint_every_n_steps=1,
        measure_max_problems=min(init.pipeline.measure_max_problems or MEASURED, MEASURED),
        trainer=trainer,
    )
    saves: list[dict[str, Any]] = []
    save = checkpoint.CommitCheckpoint.save

    def counted(self, trainer, what: str) -> None:
        save(self, trainer, what)
        saves.append(
            {
                "stage": self.label,
                "what": what,
                "step": trainer.global_step,
                "strategy": type(trainer.strategy).__name__,
                "world_size": trainer.world_size,
                "precision": str(trainer.precision),
                "checkpoint": self.last(),
            }
        )
        if len(saves) == 2:
            raise _TwoSaves

    checkpoint.CommitCheckpoint.save = counted
    try:
        Pipeline(config, init.data).run()
    except _TwoSaves:
        pass
    finally:
        checkpoint.CommitCheckpoint.save = save
    return saves


def main(config: str, stand_in: str, out: str) -> None:
    import torch
    from test_configs import install_stand_ins

    torch.set_num_threads(1)
    install_stand_ins(stand_in)
    saves = first_saves(Path(config), Path(out) / "run", devices=2)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        with open(os.path.join(out, "first_saves.json"), "w") as f:
            json.dump(saves, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
