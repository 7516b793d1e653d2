"""Resume: N steps uninterrupted == N/2 steps, restart from the checkpoint, N/2 more.

The restart is a fresh module and DataModule in the same process, loading only what the
checkpoint holds: weights, optimiser, the curriculum (pools, bank, replay buffer, N per problem,
open RL tally), the loader's position (the fit cursor), the run's RNG state and its spend.
"""

from __future__ import annotations

from typing import ClassVar

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from reward_examples import HasDigit

from coscale.callbacks import PassRateMeasurement
from coscale.datamodules import ProblemDataModule
from coscale.loop import budget
from coscale.loop.checkpoint_store import last_checkpoint
from coscale.modules import GRPOModule
from coscale.run.checkpoint import CommitCheckpoint, RunState
from coscale.tasks import arithmetic


def _setup(model_dir):
    rows = [p.to_dict() for p in arithmetic.generate(6, (2,), 3, "r")]
    dm = ProblemDataModule(train=rows, batch_size=2, curriculum={"seed": 7})
    dm.load()
    cur = dm.curriculum
    for i, pid in enumerate(dm.problems):
        cur.pools.record(pid, 10, 4)
        cur.n_per_problem[pid] = 2 + i % 3
    module = GRPOModule(
        model=str(model_dir),
        reward=HasDigit(),
        optimizer={"lr": 0.005},
        sampling={"max_new_tokens": 6, "temperature": 1.0, "seed": 3},
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
    # split=1: a fit that max_steps stops mid-epoch must not close that epoch (GRPOModule closes
    # only in the step that trains an epoch's last batch), else CommitCheckpoint's epoch-end save
    # holds a half epoch closed and the rest is served anew.
    full_module, full_dm = _setup(tiny_model_dir)
    full_spent = _fit(full_module, full_dm, tmp_path / "full", max_steps=5)

    first_module, first_dm = _setup(tiny_model_dir)
    _fit(first_module, first_dm, tmp_path / "part", max_steps=split)
    resumed_module, resumed_dm = _setup(tiny_model_dir)  # a new process would start like this
    last = last_checkpoint(str(tmp_path / "part"))
    spent = _fit(resumed_module, resumed_dm, tmp_path / "part", ckpt_path=last, max_steps=5)

    assert spent == full_spent and full_spent["rollouts"] > 0
    _assert_same_run(resumed_module, resumed_dm, full_module, full_dm, tiny_model_dir)


def test_no_step_checkpoint_between_an_epochs_last_step_and_its_end(tiny_model_dir, tmp_path):
    # Lightning 2.6 resumes a checkpoint saved there in the next epoch without the end hooks
    # (and fails when that epoch's loader is empty): the epoch-end checkpoint, after the end
    # work, is the last step's
    from coscale.modules.fit_data import epoch_finished

    class Saves(CommitCheckpoint):
        seen: ClassVar[list[tuple[str, bool]]] = []

        def save(self, trainer, what):
            self.seen.append((what, epoch_finished(trainer)))
            super().save(trainer, what)

    module, dm = _setup(tiny_model_dir)
    callbacks = [RunState(), Saves(str(tmp_path / "ckpt"))]
    _fit(module, dm, tmp_path / "ckpt", callbacks=callbacks, max_epochs=2)
    steps = [finished for what, finished in Saves.seen if what.startswith("step")]
    ends = [what for what, finished in Saves.seen if finished and not what.startswith("step")]
    assert steps and not any(steps)  # each step checkpoint inside its epoch
    assert [what.split(",")[0] for what in ends] == ["epoch 0 end", "epoch 1 end"]


def test_checkpoint_after_an_epochs_last_step_resumes_closed_and_measures_it_once(
    tiny_model_dir, tmp_path
):
    # Lightning's ModelCheckpoint saves last.ckpt after the epoch's last step and then skips its
    # epoch-end save (same step). GRPOModule closes the epoch in that step, so the checkpoint
    # holds epoch 0 closed; PassRateMeasurement's measurement of epoch 0 comes after it, in the
    # epoch-end hooks, so the checkpoint lacks it. A fit resumed from it must not close epoch 0
    # again and must measure it, once, before epoch 1's first batch (in on_train_start: FSDP2
    # restores the checkpoint after on_fit_start).
    full_module, full_dm = _setup(tiny_model_dir)
    full_probe = _EpochStart(full_dm, epoch=1)
    callbacks = [RunState(), CommitCheckpoint(str(tmp_path / "full")), _measure(), full_probe]
    full_spent = _fit(full_module, full_dm, tmp_path / "full", callbacks=callbacks, max_epochs=2)

    first_module, first_dm = _setup(tiny_model_dir)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "part", every_n_train_steps=1, save_last=True)
    callbacks = [RunState(), ckpt, _measure()]
    _fit(first_module, first_dm, tmp_path / "part", callbacks=callbacks, max_epochs=1)
    saved = torch.load(tmp_path / "part" / "last.ckpt", weights_only=False)
    state = saved["ProblemDataModule"]["curriculum"]
    assert state["tally"] == {} and state["last_epoch_acc"]  # epoch 0 closed in its last step
    assert state["measurements"] == 0  # its measurement not taken yet
    before = _lengths(state["pools"])
    (position,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert position == {"epoch": 0, "consumed": 3}  # the fit's cursor: the loader's state

    resumed_module, resumed_dm = _setup(tiny_model_dir)
    probe = _EpochStart(resumed_dm, epoch=1)
    last = tmp_path / "part" / "last.ckpt"
    spent = _fit(
        resumed_module,
        resumed_dm,
        tmp_path / "resumed",
        ckpt_path=last,
        callbacks=[RunState(), _measure(), probe],
        max_epochs=2,
    )
    assert spent == full_spent
    # before epoch 1's first batch: one measurement (one more entry for every problem), no
    # second close (it would add another to each problem epoch 0 trained), as uninterrupted
    assert probe.measurements == full_probe.measurements == 1
    assert _lengths(probe.pools) == {pid: n + 1 for pid, n in before.items()}
    assert probe.pools == full_probe.pools
    _assert_same_run(resumed_module, resumed_dm, full_module, full_dm, tiny_model_dir)


def _measure() -> PassRateMeasurement:
    return PassRateMeasurement(samples=2, log_table=False)


class _EpochStart(L.Callback):
    """Keeps the pools' state when the first batch of ``epoch`` starts."""

    def __init__(self, dm, epoch: int) -> None:
        self.dm, self.epoch, self.pools, self.measurements = dm, epoch, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and self.pools is None:
            self.pools = self.dm.curriculum.pools.state_dict()
            self.measurements = self.dm.curriculum.measurements


def _lengths(pools):
    return {p["id"]: len(p["history"]) for p in pools["problems"]}
