"""Run by tests/test_vllm_server.py as a script: asynchronous GRPO (``update.max_staleness: 1``)
on a vLLM server attached by URL, in a Lightning fit of one's own (a checkpoint every step, 2
epochs of 4 batches), run to its end, SIGKILLed after a step's checkpoint, or resumed.

    python tests/vllm_server_kill_worker.py URL MODEL_DIR OUT MODE

MODE ``full``: to the end. ``kill``: SIGKILLed at the commit point after step 2's checkpoint,
while the request for the next batch is out (`coscale.loop.commit`). ``resume``: from OUT's
last checkpoint to the end. Each step appends what was out and the
batch's staleness to ``OUT/steps.jsonl``; the end writes ``OUT/result.json`` (spend, curriculum)
and ``OUT/weights.pt``.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from ddp_worker import loaded_data, mark_solvable
from reward_examples import HasDigit

from coscale.loop import budget
from coscale.loop.checkpoint_store import last_checkpoint
from coscale.modules import GRPOModule
from coscale.run.checkpoint import CommitCheckpoint, RunState

KILL_AT = "fit ckpt step 2"


class Steps(L.Callback):
    """Before each step's checkpoint: the requests out for batches ahead, and the staleness."""

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, "steps.jsonl")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        row = {
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "batch": batch_idx,
            "out": len(module.prefetched),
            "staleness": float(trainer.callback_metrics["train/staleness"]),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def main(url: str, model_dir: str, out: str, mode: str) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    if mode == "kill":
        os.environ["COSCALE_KILL_AT"] = KILL_AT
    dm = loaded_data(8)  # 4 batches of 2 problems
    mark_solvable(dm)
    rollout = {"backend": "vllm-server", "options": {"server": {"url": url}}}
    module = GRPOModule(
        model=model_dir, reward=HasDigit(), optimizer={"lr": 0.005}, rollout=rollout,
        sampling={"max_new_tokens": 6, "temperature": 1.0},
        update={"micro_batch_size": 4, "max_staleness": 1},
    )  # fmt: skip
    ckpt = os.path.join(out, "ckpt")
    callbacks = [
        Steps(out),
        RunState(),
        CommitCheckpoint(ckpt, every_n_steps=1, label="fit"),
    ]
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, callbacks=callbacks, limit_val_batches=0,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
    )  # fmt: skip
    before = budget.snapshot()
    resume = last_checkpoint(ckpt) if mode == "resume" else None
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    state = dm.curriculum.state_dict()
    result = {"spend": budget.since(before), "curriculum": state, "n": dm.curriculum.n_per_problem}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, default=str, sort_keys=True)
    torch.save(module.policy.state_dict(), os.path.join(out, "weights.pt"))
    module.backend.close()


if __name__ == "__main__":
    main(*sys.argv[1:5])
