"""SFTModule and GRPOModule: short CPU fits change the weights, per-problem N, skipped batches."""

from __future__ import annotations

import lightning as L
import torch
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.pools import Pool
from coscale.modules import GRPOModule, SFTModule
from coscale.tasks import arithmetic


class CharCountReward:
    """A reward with spread on a random model: 1.0 when the completion holds a digit."""

    def __call__(self, completions, answers, **_):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]


class ZeroReward:
    def __call__(self, completions, answers, **_):
        return [0.0] * len(completions)


def _trainer(steps: int, **kw) -> L.Trainer:
    return quiet_trainer(steps, devices=1, limit_val_batches=0, **kw)


def _rows(n=8, seed=0):
    return [
        p.to_dict() | {"solutions": arithmetic.solutions_of(p, 3)}
        for p in arithmetic.generate(n, (2, 3), seed, "t")
    ]


def _params(module):
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def _changed(before, module):
    after = module.policy.state_dict()
    return [k for k in before if not torch.equal(before[k], after[k])]


def test_sft_two_steps_change_weights_and_loss_is_finite(tiny_model_dir):
    # an SFTModule (data_kind "sft") is served the bank's pairs: up to 2 own solutions each
    dm = ProblemDataModule(train=_rows(), sft_batch_size=4, bank_solutions=2)
    dm.load()
    bank = dm.curriculum.bank
    assert [bank.count(i) for i, p in dm.problems.items()] == [
        min(2, len(p.solutions)) for p in dm.problems.values()
    ]
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2})
    before = _params(module)
    trainer = _trainer(2)
    trainer.fit(module, datamodule=dm)
    assert len(_changed(before, module)) == len(before)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def _rl_dm(n_per_problem, batch_size=None):
    batch_size = batch_size or len(n_per_problem)
    dm = ProblemDataModule(train=_rows(len(n_per_problem)), batch_size=batch_size)
    dm.load()
    cur = dm.curriculum
    for pid, n in zip(dm.problems, n_per_problem):
        cur.pools.record(pid, 10, 3)  # acc 0.3 -> solvable
        cur.n_per_problem[pid] = n
    return dm


def test_grpo_two_steps_with_different_n_per_problem(tiny_model_dir):
    dm = _rl_dm([2, 5, 3, 4, 1, 6], batch_size=3)  # two batches of three problems in epoch 0
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=CharCountReward(),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
        update={"micro_batch_size": 4},
    )
    seen = []
    original = module.sample

    def spy(batch, n, sampling):
        rollouts, scores = original(batch, n, sampling)
        assert [p["n"] for p in batch] == n
        seen.append((len(batch), rollouts.num_rollouts, sum(n)))
        return rollouts, scores

    module.sample = spy
    before = _params(module)
    trainer = _trainer(2)
    trainer.fit(module, datamodule=dm)
    assert len(seen) == 2 and sum(r for _, r, _ in seen) == 21  # 2+5+3+4+1+6 rollouts in all
    assert all(rollouts == total for _, rollouts, total in seen)  # each problem got its own N
    assert trainer.global_step == 2
    assert len(_changed(before, module)) == len(before)
    assert trainer.callback_metrics["train/skipped"] == 0
    # the epoch's outcomes reached the pools, and the next epoch serves the rebuilt solvable set
    pools = dm.curriculum.pools
    assert all(len(pools.history(pid)) == 2 for pid in dm.problems)
    solvable = pools.members(Pool.SOLVABLE)
    served = [item["id"] for batch in dm.train_dataloader() for item in batch]
    assert sorted(served) == sorted(solvable)


class _EpochProbe(L.Callback):
    """What a callback sees of the open RL tally after each step and at the epoch's end."""

    def __init__(self, dm) -> None:
        self.cur, self.seen = dm.curriculum, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append((trainer.current_epoch, batch_idx, bool(self.cur.tally)))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seen.append((trainer.current_epoch, "end", bool(self.cur.tally)))


class HalfReward:
    """Every other rollout right: each problem's pair scores 1/2 and stays solvable."""

    def __call__(self, completions, answers, **_):
        return [float(i % 2 == 0) for i in range(len(completions))]


def test_grpo_closes_each_epoch_once_in_its_last_step(tiny_model_dir):
    # the module is the one owner of the close: it closes in the step that trains the epoch's
    # last batch, so every callback's epoch-end hook (a measurement) comes after it
    dm = _rl_dm([2, 2, 2, 2, 2, 2], batch_size=3)  # two batches an epoch
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=HalfReward(),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 4},
    )
    calls = []
    close = dm.curriculum.close_epoch
    dm.curriculum.close_epoch = lambda **kw: calls.append(kw) or close(**kw)
    probe = _EpochProbe(dm)
    trainer = _trainer(-1, max_epochs=2, callbacks=[probe])
    trainer.fit(module, datamodule=dm)
    assert probe.seen == [
        (0, 0, True),  # the first batch's outcomes in the open tally
        (0, 1, False),  # the last step closed the epoch
        (0, "end", False),
        (1, 0, True),
        (1, 1, False),
        (1, "end", False),
    ]
    assert calls == [{"lr": 1e-2}] * 2  # once per epoch
    assert trainer.callback_metrics["pool/solvable"] == 6  # logged by the close
    # a fit that max_steps stops mid-epoch leaves that epoch open
    calls.clear()
    _trainer(1).fit(module, datamodule=dm)
    assert calls == [] and dm.curriculum.tally


def test_grpo_batch_without_signal_is_skipped_not_crashed(tiny_model_dir):
    dm = _rl_dm([3, 3])
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=ZeroReward(),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 4},
    )
    before = _params(module)
    trainer = _trainer(2)
    trainer.fit(module, datamodule=dm)
    assert _changed(before, module) == []
    assert trainer.callback_metrics["train/skipped"] == 1
    assert trainer.callback_metrics["train/frac_zero_std"] == 1
    # all-wrong problems fall back to unsolvable after the epoch
    assert dm.curriculum.pools.members(Pool.UNSOLVABLE) == list(dm.problems)


def _fit_with_cut_rollouts(model_dir, mask_truncated: bool, cut: set[int]):
    """One GRPO step on two problems x 2 rollouts scored 1, 0, 1, 0 (HalfReward: signal in each
    group), the backend reporting rollouts `cut` as cut at ``max_new_tokens`` ("length").
    Returns the rows the update kept, the weights it changed and ``train/skipped``."""
    module = GRPOModule(
        model=str(model_dir),
        reward=HalfReward(),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 4},
        update={"mask_truncated": mask_truncated},
    )
    sample, update, kept = module.sample, module.update, []

    def cut_sample(batch, n, sampling):
        rollouts, scores = sample(batch, n, sampling)
        assert rollouts.prompt_index.tolist() == [0, 0, 1, 1]
        assert scores.reward.tolist() == [1, 0, 1, 0]
        rollouts.finish_reasons = ["length" if i in cut else "stop" for i in range(4)]
        return rollouts, scores

    def kept_update(rollouts, advantages, keep):
        kept.append(keep.tolist())
        return update(rollouts, advantages, keep)

    module.sample, module.update = cut_sample, kept_update
    before, trainer = _params(module), _trainer(-1, max_epochs=1)  # one batch: one step
    trainer.fit(module, datamodule=_rl_dm([2, 2]))
    return kept, _changed(before, module), float(trainer.callback_metrics["train/skipped"])


def test_grpo_mask_truncated_leaves_cut_rollouts_out_of_the_loss(tiny_model_dir):
    # TRL's mask_truncated_completions: a rollout cut by the token limit gets no loss
    kept, changed, skipped = _fit_with_cut_rollouts(tiny_model_dir, True, {0, 2})
    assert kept == [[False, True, False, True]] and changed and skipped == 0
    kept, changed, skipped = _fit_with_cut_rollouts(tiny_model_dir, True, {0, 1, 2, 3})
    assert kept == [[False] * 4] and changed == [] and skipped == 1  # nothing left to learn from
    # off (the default): cut rollouts count like finished ones
    kept, changed, skipped = _fit_with_cut_rollouts(tiny_model_dir, False, {0, 1, 2, 3})
    assert kept == [[True] * 4] and changed and skipped == 0


def test_modules_with_the_default_prompt_log_their_hparams_to_csv(tiny_model_dir, tmp_path):
    # Lightning's loggers write hparams as YAML and refuse a frozen dataclass (PromptFormat)
    from lightning.pytorch.loggers import CSVLogger

    dm = ProblemDataModule(train=_rows(), sft_batch_size=4, bank_solutions=2)
    dm.load()
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2})
    assert module.hparams_initial["prompt"] == {"template": "{question}", "chat": False,
                                                "system": None}  # fmt: skip
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=CSVLogger(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(module, datamodule=dm)
    saved = next(tmp_path.rglob("hparams.yaml")).read_text()
    assert "template: '{question}'" in saved
    grpo = GRPOModule(model=str(tiny_model_dir), reward=ZeroReward())
    assert GRPOModule(model=str(tiny_model_dir), reward=ZeroReward(),
                      prompt=grpo.hparams_initial["prompt"]).prompt == grpo.prompt  # fmt: skip
