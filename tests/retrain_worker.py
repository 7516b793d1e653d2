"""Run by tests/test_sft_in_fit.py as a script: the retrain callbacks in a user's plain Trainer.

``<strategy> <guard> <model_dir> <out>``, ``strategy`` one of ``single``, ``ddp``, ``fsdp2`` (2 CPU
processes over gloo for the last two; Lightning launches rank 1 by running this script again):

1. one GRPO fit with ``ReDistillation`` and ``FinalRetrain`` (both on ``source: all`` with the
   same SFT settings, the forgetting guard as ``guard`` says) under that strategy;
2. then, as the pipeline's re-distillation stage would, a plain ``Trainer.fit`` of an SFTModule
   from the initial model on the curriculum's ``all`` pairs under the same strategy.

Rank 0 saves the gathered weights of the re-distilled export, of the policy after FinalRetrain
and of the stage-like fit (``<out>/{redistilled,final,stage}.pt``); each rank writes what it saw
to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from ddp_worker import _trainer as quiet_trainer
from ddp_worker import loaded_data
from reward_examples import HasDigit

from coscale.callbacks import FinalRetrain, ReDistillation
from coscale.datamodules.serving import CurriculumDataModule
from coscale.models.full_state import full_state_dict
from coscale.models.policy import load_policy
from coscale.modules import GRPOModule, SFTModule

SFT = {"optimizer": {"lr": 1e-2}, "batch_size": 4}
LOOP = {"max_epochs": 2}


def _trainer(strategy: str, **kw) -> L.Trainer:
    from lightning.pytorch.strategies import ModelParallelStrategy

    if strategy == "fsdp2":
        chosen = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    else:
        chosen = "ddp" if strategy == "ddp" else "auto"
    return quiet_trainer(chosen, devices=1 if strategy == "single" else 2, **kw)


def _save(state: dict, path: str) -> None:
    if state:  # rank 0 only receives the gathered weights
        torch.save(state, path)


def main(strategy: str, guard: str, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dm = loaded_data(8)
    cur = dm.curriculum
    for i, pid in enumerate(dm.problems):  # solvable ones for RL, solved ones for the guard
        cur.pools.record(pid, 10, (2, 5, 10)[i % 3])
    sft = SFT | {"forgetting_guard": {"mode": guard}}
    redistill = ReDistillation(
        max_total=None, sft=sft, trainer=LOOP, export_dir=os.path.join(out, "redistilled")
    )
    final = FinalRetrain(sft=sft, trainer=LOOP, judge_samples=2)
    grpo = GRPOModule(
        model=model_dir,
        reward=HasDigit(),
        optimizer={"lr": 0.005},
        sampling={"max_new_tokens": 6},
        update={"micro_batch_size": 3},
    )
    _trainer(strategy, max_epochs=1, callbacks=[redistill, final]).fit(grpo, datamodule=dm)
    _save(full_state_dict(grpo.policy), os.path.join(out, "final.pt"))
    args = {k: v for k, v in sft.items() if k != "batch_size"}
    stage = SFTModule(model=model_dir, verifier=HasDigit(), **args)
    view = CurriculumDataModule(cur, "all", sft_batch_size=SFT["batch_size"])
    _trainer(strategy, **LOOP).fit(stage, datamodule=view)
    _save(full_state_dict(stage.policy), os.path.join(out, "stage.pt"))
    redistilled, _ = load_policy(os.path.join(out, "redistilled"))
    _save(redistilled.state_dict() if stage.global_rank == 0 else {}, f"{out}/redistilled.pt")
    rank = int(os.environ.get("LOCAL_RANK", 0))
    seen = {
        "redistill_runs": redistill.runs,
        "redistill_size": redistill.last_size,
        "redistill_guard": redistill.guard_report,
        "stage_guard": stage.guard_report,
        "final_runs": final.runs,
        "final_results": final.results,
        "items": len(cur.sft_pairs("all")),
        "sharded": type(next(grpo.policy.parameters())).__name__,
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
