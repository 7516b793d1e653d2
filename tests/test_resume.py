"""Resume: N steps uninterrupted == N/2 steps, restart from the checkpoint, N/2 more.

The restart is a fresh module and DataModule in the same process, loading only what the
checkpoint holds: weights, optimiser, the curriculum (pools, bank, replay buffer, N per problem,
open RL tally, fit cursor) and the run's RNG state.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from coscale.datamodules import ProblemDataModule
from coscale.loop import budget
from coscale.loop.checkpoint_store import last_checkpoint
from coscale.modules import GRPOModule
from coscale.stages.checkpoint import CommitCheckpoint, RunState
from coscale.tasks import arithmetic


class DigitReward:
    def __call__(self, completions, answers, **_):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]


def _setup(model_dir):
    rows = [p.to_dict() for p in arithmetic.generate(6, (2,), 3, "r")]
    dm = ProblemDataModule(train=rows, batch_size=2, seed=7)
    dm.load()
    cur = dm.curriculum
    for i, pid in enumerate(dm.problems):
        cur.pools.record(pid, 10, 4)
        cur.n_per_problem[pid] = 2 + i % 3
    module = GRPOModule(
        model=str(model_dir),
        reward=DigitReward(),
        lr=5e-3,
        max_new_tokens=6,
        temperature=1.0,
        seed=3,
    )
    return module, dm


def _fit(module, dm, ckpt_dir, ckpt_path=None, callbacks=None, **limits):
    if callbacks is None:
        callbacks = [RunState(), CommitCheckpoint(str(ckpt_dir), every_n_steps=1)]
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=ckpt_dir,
        **limits,
    )
    before = budget.snapshot()
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    # the one count: RunState put back the part before the restart in place of what was redone
    return budget.since(before)


def _assert_same_run(resumed_module, resumed_dm, full_module, full_dm, model_dir):
    got, want = resumed_dm.curriculum.state_dict(), full_dm.curriculum.state_dict()
    assert got["pools"] == want["pools"]
    assert got["bank"] == want["bank"]
    assert got["tally"] == want["tally"]
    assert resumed_dm.curriculum.n_per_problem == full_dm.curriculum.n_per_problem
    full, resumed = full_module.policy.state_dict(), resumed_module.policy.state_dict()
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], rtol=0, atol=1e-6, msg=name)
    # and training did happen: the weights moved away from the initial model
    initial, _ = _setup(model_dir)
    moved = [n for n in full if not torch.equal(full[n], initial.policy.state_dict()[n])]
    assert moved


@pytest.mark.parametrize("split", [1, 3])
def test_interrupted_and_resumed_equals_uninterrupted(tiny_model_dir, tmp_path, split):
    # 6 problems, batch 2 -> 3 batches per epoch, one optimiser step each with this seed: step 1
    # ends mid-epoch, step 3 on the epoch's last batch (its end-of-epoch work done and saved).
    # split=1 needs the fix reported with this migration: a fit that max_steps stops mid-epoch
    # must not close that epoch (GRPOModule / PassRateEvaluation.on_train_epoch_end), else
    # CommitCheckpoint's epoch-end save holds a half epoch closed and the rest is served anew.
    full_module, full_dm = _setup(tiny_model_dir)
    full_spent = _fit(full_module, full_dm, tmp_path / "full", max_steps=5)

    first_module, first_dm = _setup(tiny_model_dir)
    _fit(first_module, first_dm, tmp_path / "part", max_steps=split)
    resumed_module, resumed_dm = _setup(tiny_model_dir)  # a new process would start like this
    last = last_checkpoint(str(tmp_path / "part"))
    spent = _fit(resumed_module, resumed_dm, tmp_path / "part", ckpt_path=last, max_steps=5)

    assert spent == full_spent and full_spent["rollouts"] > 0
    _assert_same_run(resumed_module, resumed_dm, full_module, full_dm, tiny_model_dir)


def test_checkpoint_before_the_epoch_end_work_closes_that_epoch_first(tiny_model_dir, tmp_path):
    # Lightning's ModelCheckpoint saves last.ckpt after the epoch's last step and then skips its
    # epoch-end save (same step): the checkpoint holds epoch 0's open RL tally, not its close.
    # A fit resumed from it must close epoch 0 before it trains epoch 1. Needs the fix reported
    # with this migration: GRPOModule.on_train_start does that work through end_epoch, which calls
    # self.log_dict, refused there (log to the loggers instead). on_train_start, not
    # on_fit_start: FSDP2 (ModelParallelStrategy) restores the checkpoint after on_fit_start.
    full_module, full_dm = _setup(tiny_model_dir)
    full_probe = _EpochStart(full_dm, epoch=1)
    callbacks = [RunState(), CommitCheckpoint(str(tmp_path / "full")), full_probe]
    full_spent = _fit(full_module, full_dm, tmp_path / "full", callbacks=callbacks, max_epochs=2)

    first_module, first_dm = _setup(tiny_model_dir)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "part", every_n_train_steps=1, save_last=True)
    _fit(first_module, first_dm, tmp_path / "part", callbacks=[RunState(), ckpt], max_epochs=1)
    saved = torch.load(tmp_path / "part" / "last.ckpt", weights_only=False)
    state = saved["ProblemDataModule"]["curriculum"]
    trained = sorted(state["tally"])
    assert trained and state["cursor"]["closed"] == -1  # saved before epoch 0 was closed
    before = _lengths(state["pools"])

    resumed_module, resumed_dm = _setup(tiny_model_dir)
    probe = _EpochStart(resumed_dm, epoch=1)
    last = tmp_path / "part" / "last.ckpt"
    spent = _fit(
        resumed_module,
        resumed_dm,
        tmp_path / "resumed",
        ckpt_path=last,
        callbacks=[RunState(), probe],
        max_epochs=2,
    )
    assert spent == full_spent
    # epoch 0 closed once, before epoch 1's first batch: one more entry per problem it trained,
    # the pools then as the uninterrupted run's at that point
    assert _lengths(probe.pools) == {pid: before[pid] + (pid in trained) for pid in before}
    assert probe.pools == full_probe.pools
    _assert_same_run(resumed_module, resumed_dm, full_module, full_dm, tiny_model_dir)


class _EpochStart(L.Callback):
    """Keeps the pools' state when the first batch of ``epoch`` starts."""

    def __init__(self, dm, epoch: int) -> None:
        self.dm, self.epoch, self.pools = dm, epoch, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and self.pools is None:
            self.pools = self.dm.curriculum.pools.state_dict()


def _lengths(pools):
    return {p["id"]: len(p["history"]) for p in pools["problems"]}
