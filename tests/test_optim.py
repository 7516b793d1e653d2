"""The learning-rate schedule: a linear warm-up, then constant, linear or cosine decay to 0 at the
fit's last optimiser step (Hugging Face's schedule shapes), in a Lightning fit of either module
and in the in-fit SFT loop of the retrain callbacks."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from reward_examples import HasDigit
from trainers import quiet_trainer
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from coscale.callbacks.sft_in_fit import SFTLoopSettings, sft_in_fit
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule, SFTModule
from coscale.modules.optim import LRFactor, adamw_with_warmup
from coscale.modules.settings import AdamWSettings
from coscale.tasks import arithmetic

HF = {"linear": get_linear_schedule_with_warmup, "cosine": get_cosine_schedule_with_warmup}


class LRs(L.Callback):
    """The learning rate each optimiser step ran with."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.seen.append(optimizer.param_groups[0]["lr"])


def _rows(n: int) -> list[dict]:
    problems = arithmetic.generate(n, (2,), 5, "o")
    return [p.to_dict() | {"solutions": arithmetic.solutions_of(p, 2)} for p in problems]


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_after_the_warm_up_the_factor_is_hugging_faces_schedule(decay):
    warmup, total = 3, 11
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = HF[decay](opt, warmup, total)
    factor = LRFactor(warmup, decay, total)
    for step in range(total):
        if step >= warmup:  # the ramp differs: coscale's first step runs at 1 / warmup, not 0
            assert factor(step) == pytest.approx(opt.param_groups[0]["lr"]), step
        opt.step()
        reference.step()
    assert [factor(s) for s in range(warmup)] == [1 / 3, 2 / 3, 1.0]
    assert LRFactor(warmup, "constant", total)(total + 5) == 1.0
    assert factor(total + 5) == 0.0  # past the planned end the rate stays at 0


def test_a_decay_needs_the_fits_length_and_names_the_setting():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"optimizer.decay='cosine' needs the fit's number"):
        adamw_with_warmup(model, AdamWSettings(decay="cosine"), total_steps=None)
    assert "lr_scheduler" not in adamw_with_warmup(model, AdamWSettings())  # constant, no warm-up
    with pytest.raises(ValueError, match=r"optimizer\.decay must be one of constant, linear"):
        SFTModule(model="unused", optimizer={"decay": "step"})


def test_an_sft_fit_decays_to_zero_at_its_last_step(tiny_model_dir):
    dm = ProblemDataModule(train=_rows(6), sft_batch_size=4, bank_solutions=2)
    module = SFTModule(model=tiny_model_dir, optimizer={"lr": 0.01, "warmup_steps": 2,
                                                        "decay": "linear"})  # fmt: skip
    lrs = LRs()
    trainer = quiet_trainer(-1, max_epochs=2, limit_val_batches=0, callbacks=[lrs])
    trainer.fit(module, datamodule=dm)
    total = trainer.global_step  # 12 pairs, batch 4: 3 steps an epoch
    assert total == 6 and len(lrs.seen) == total
    expected = [0.01 * LRFactor(2, "linear", total)(s) for s in range(total)]
    assert lrs.seen == pytest.approx(expected)
    assert lrs.seen[-1] == pytest.approx(0.01 / 4)  # the last step: (6 - 5) / (6 - 2)


def test_grpo_counts_each_of_its_updates_per_batch(tiny_model_dir):
    dm = ProblemDataModule(train=_rows(4), batch_size=2)
    dm.load()
    for pid in dm.problems:
        dm.curriculum.pools.record(pid, 10, 3)  # solvable: RL serves it
        dm.curriculum.n_per_problem[pid] = 3
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=HasDigit(),
        optimizer={"lr": 0.01, "decay": "cosine"},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
        update={"num_iterations": 2},
    )
    trainer = quiet_trainer(-1, max_epochs=1, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    (scheduler,) = trainer.lr_scheduler_configs
    assert scheduler.scheduler.lr_lambdas[0].total == 4  # 2 batches x 2 updates
    assert module.optimizer_steps() == 4


def test_the_in_fit_sft_loop_plans_its_steps(tiny_model_dir):
    items = [{"question": r["question"], "solution": s} for r in _rows(5) for s in r["solutions"]]
    module = SFTModule(model=tiny_model_dir, optimizer={"lr": 0.01, "decay": "linear"})
    fabric = L.Fabric(accelerator="cpu", devices=1)
    sft_in_fit(fabric, module, items, SFTLoopSettings(max_epochs=3, batch_size=4), seed=0)
    assert module.planned_steps == math.ceil(len(items) / 4) * 3 > 4
    sft_in_fit(
        fabric, module, items, SFTLoopSettings(max_epochs=3, max_steps=4, batch_size=4), seed=0
    )
    assert module.planned_steps == 4
