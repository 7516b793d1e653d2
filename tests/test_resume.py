"""Resume: N steps uninterrupted == N/2 steps, restart from the checkpoint, N/2 more.

The restart is a fresh module and DataModule in the same process, loading only what the
checkpoint holds: weights, optimiser, pools, bank, replay buffer, N per problem, loader position.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule
from coscale.tasks import arithmetic


class DigitReward:
    def __call__(self, completions, answers, **_):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]


def _setup(model_dir):
    rows = [p.to_dict() for p in arithmetic.generate(6, (2,), 3, "r")]
    dm = ProblemDataModule(train=rows, batch_size=2, seed=7)
    dm.load()
    for i, pid in enumerate(dm.problems):
        dm.pools.record(pid, 10, 4)
        dm.n_per_problem[pid] = 2 + i % 3
    module = GRPOModule(
        model=str(model_dir),
        reward=DigitReward(),
        lr=5e-3,
        max_new_tokens=6,
        temperature=1.0,
        seed=3,
    )
    return module, dm


def _fit(module, dm, steps, ckpt_dir, ckpt_path=None):
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=1)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        callbacks=[ckpt],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("split", [1, 2])
def test_interrupted_and_resumed_equals_uninterrupted(tiny_model_dir, tmp_path, split):
    # 6 problems, batch 2 -> 3 batches in epoch 0; with this seed the first batch has no signal
    # (no optimiser step), so step 1 ends mid-epoch and step 2 ends on the epoch's last batch
    full_module, full_dm = _setup(tiny_model_dir)
    _fit(full_module, full_dm, 5, tmp_path / "full")

    first_module, first_dm = _setup(tiny_model_dir)
    _fit(first_module, first_dm, split, tmp_path / "part")
    resumed_module, resumed_dm = _setup(tiny_model_dir)  # a new process would start like this
    _fit(
        resumed_module, resumed_dm, 5, tmp_path / "part", ckpt_path=tmp_path / "part" / "last.ckpt"
    )

    assert resumed_dm.state_dict()["pools"] == full_dm.state_dict()["pools"]
    assert resumed_dm.state_dict()["bank"] == full_dm.state_dict()["bank"]
    assert resumed_dm.n_per_problem == full_dm.n_per_problem
    full, resumed = full_module.policy.state_dict(), resumed_module.policy.state_dict()
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], rtol=0, atol=1e-6, msg=name)
    # and training did happen: the weights moved away from the initial model
    initial, _ = _setup(tiny_model_dir)
    moved = [n for n in full if not torch.equal(full[n], initial.policy.state_dict()[n])]
    assert moved
