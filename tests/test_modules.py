"""SFTModule and GRPOModule: short CPU fits change the weights, per-problem N, skipped batches;
the GRPO update's old log-probs, mismatch correction, entropy and DDP padding pass."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision
from reward_examples import HasDigit
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.pools import Pool
from coscale.modules import GRPOModule, SFTModule
from coscale.rl.losses import GRPOLoss, GSPOLoss, MismatchSettings
from coscale.rollout import CachedDecodeBackend, SamplingParams
from coscale.tasks import arithmetic


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
        reward=HasDigit(),  # spread on a random model
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
    # Lightning's loggers write hparams as YAML and refuse a frozen dataclass (PromptSettings)
    from lightning.pytorch.loggers import CSVLogger

    dm = ProblemDataModule(train=_rows(), sft_batch_size=4, bank_solutions=2)
    dm.load()
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2})
    assert module.hparams_initial["prompt"] == {"template": "{question}", "chat": False,
                                                "system": None, "chat_template_kwargs": {}}  # fmt: skip
    trainer = quiet_trainer(1, logger=CSVLogger(tmp_path))
    trainer.fit(module, datamodule=dm)
    saved = next(tmp_path.rglob("hparams.yaml")).read_text()
    assert "template: '{question}'" in saved
    grpo = GRPOModule(model=str(tiny_model_dir), reward=ZeroReward())
    assert GRPOModule(model=str(tiny_model_dir), reward=ZeroReward(),
                      prompt=grpo.hparams_initial["prompt"]).prompt == grpo.prompt  # fmt: skip


def test_grpo_fit_with_gspo_and_two_rewards_logs_entropy_every_step_to_csv(
    tiny_model_dir, tmp_path
):
    from lightning.pytorch.loggers import CSVLogger
    from reward_examples import format_bonus

    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=[HalfReward(), format_bonus],  # coscale-style and TRL-style, weighted
        reward_weights=[1.0, 0.5],
        verifier=HalfReward(),
        loss=GSPOLoss(entropy_coef=0.01),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
    )
    before = _params(module)
    trainer = quiet_trainer(2, logger=CSVLogger(tmp_path), log_every_n_steps=1)
    trainer.fit(module, datamodule=_rl_dm([2, 2, 2, 2], batch_size=2))
    assert len(_changed(before, module)) == len(before)
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/entropy")]
    vocab = module.policy.config.vocab_size
    entropies = [float(r["train/entropy"]) for r in rows]
    # one value a step; a random model's token entropy: above 0, at most log(vocab)
    assert len(entropies) == 2 and all(0 < h <= math.log(vocab) for h in entropies), entropies
    assert "train/is_ratio_mean" not in rows[0]  # the policy sampled: nothing to correct
    # each function's mean: HalfReward 1/2; format_bonus 1.0 on odd rows, 4 rollouts a step: 1/2
    assert [float(r["train/rewards/HalfReward"]) for r in rows] == [0.5, 0.5]
    assert [float(r["train/rewards/format_bonus"]) for r in rows] == [0.5, 0.5]
    # the weighted sum, 1.0 * 1/2 + 0.5 * 1/2 on average
    assert [float(r["train/reward"]) for r in rows] == [0.75, 0.75]


class _EngineRollouts(CachedDecodeBackend):
    """The cached backend's rollouts reported as an engine's (as vLLM's with ``logprobs: auto``),
    its log-probs off the trainer's by log 2: below them on even rows (ratio pi_old / pi_engine
    = 2), above on odd rows (1/2)."""

    def generate(self, prompts, n, sampling):
        ro = super().generate(prompts, n, sampling)
        sign = 1.0 - 2 * (torch.arange(ro.num_rollouts) % 2)  # [R] +1, -1, +1, ...
        shifted = ro.logprobs - sign[:, None] * math.log(2.0)  # [R, T]
        ro.logprobs = torch.where(ro.completion_mask.bool(), shifted, 0)
        ro.logprob_source, self.last = "engine", ro
        return ro


def _engine_fit(model_dir, mismatch: MismatchSettings, iterations: int):
    """One GRPO step on two problems x 2 rollouts from `_EngineRollouts`, micro-batches of 2:
    the engine's rollouts, each loss call's (log-probs, old log-probs, engine log-probs, mask)
    and the logged metrics."""
    module = GRPOModule(
        model=str(model_dir),
        reward=HalfReward(),
        loss=GRPOLoss(mismatch=mismatch),
        optimizer={"lr": 0.05},
        sampling={"max_new_tokens": 4, "temperature": 1.0},
        update={"num_iterations": iterations, "micro_batch_size": 2},
    )
    module.backend = _EngineRollouts(module.policy, module.tokenizer)
    calls, forward = [], module.loss_fn.forward

    def spy(logp, old, adv, mask, *args, sampling_logprobs=None, **kw):
        engine = None if sampling_logprobs is None else sampling_logprobs.clone()
        calls.append((logp.detach().clone(), old.clone(), engine, mask.bool()))
        return forward(logp, old, adv, mask, *args, sampling_logprobs=sampling_logprobs, **kw)

    module.loss_fn.forward = spy
    trainer = _trainer(-1, max_epochs=1)  # one batch: one step
    trainer.fit(module, datamodule=_rl_dm([2, 2]))
    return module.backend.last, calls, trainer.callback_metrics


def test_grpo_corrects_engine_logprobs_against_the_trainers_old_logprobs(tiny_model_dir):
    cap = 1.5  # token truncate: weight min(2, 1.5) = 1.5 on even rows, 0.5 on odd rows
    ro, calls, metrics = _engine_fit(tiny_model_dir, MismatchSettings("truncate", "token", cap), 2)
    assert len(calls) == 4  # 2 iterations x 2 micro-batches
    for logp, old, engine, mask in calls[:2]:
        # first iteration: no step taken yet, the pass's own log-probs are the trainer's old ones
        assert torch.equal(old, logp)
        gap = (old - engine)[mask].abs()  # the engine's are the shifted ones
        torch.testing.assert_close(gap, torch.full_like(gap, math.log(2.0)), rtol=0, atol=1e-4)
    for (logp, old, engine, mask), first in zip(calls[2:], calls[:2]):
        # second iteration: the first's log-probs are still the old ones, the policy has moved
        assert torch.equal(old, first[0]) and torch.equal(engine, first[2])
        assert not torch.allclose(logp[mask], old[mask], atol=1e-4)
    even = float(ro.lengths[0::2].sum())
    total = float(ro.lengths.sum())
    want = (cap * even + 0.5 * (total - even)) / total  # token-weighted mean weight
    assert abs(float(metrics["train/is_ratio_mean"]) - want) < 1e-4
    assert abs(float(metrics["train/is_capped"]) - even / total) < 1e-6


def test_grpo_without_correction_takes_the_engine_logprobs_as_old(tiny_model_dir):
    ro, calls, metrics = _engine_fit(tiny_model_dir, MismatchSettings(mode="none"), 1)
    for logp, old, engine, mask in calls:
        assert engine is None  # nothing to weight
        gap = (logp - old)[mask].abs()  # the old log-probs are the engine's, off by log 2
        torch.testing.assert_close(gap, torch.full_like(gap, math.log(2.0)), rtol=0, atol=1e-4)
    assert "train/is_ratio_mean" not in metrics
    even, total = float(ro.lengths[0::2].sum()), float(ro.lengths.sum())
    want = (2 * even + 0.5 * (total - even)) / total  # pi / pi_engine: 2 on even rows, 1/2 odd
    assert abs(float(metrics["train/ratio_mean"]) - want) < 1e-4


def test_grpo_padding_pass_adds_nothing_to_the_loss(tiny_model_dir):
    # Under DDP a rank with fewer micro-batches runs padding passes on row 0, so every rank runs
    # as many backward calls. With the KL on, that pass must not count row 0's KL again.
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=HalfReward(),
        loss=GRPOLoss(beta=0.5, entropy_coef=0.1),
        sampling={"max_new_tokens": 4, "temperature": 1.0},
    )
    with torch.no_grad():  # a reference the policy has moved away from: KL > 0
        gen = torch.Generator().manual_seed(0)
        for p in module.ref_policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ro = module.backend.generate(["Q:1+1\nA:", "Q:2+3\nA:"], 2, SamplingParams(4, seed=0))
    module.manual_backward = lambda loss: loss.backward()  # no Trainer here
    mask, adv, rows = ro.completion_mask.float(), torch.ones(4), torch.arange(4)
    ref, totals = module._ref_logprobs(ro, rows), (4, int(mask.sum()))
    stats, tokens = module._micro_step(ro, adv, mask, ref, rows[:0], totals, ro.logprobs, False)
    assert tokens == 0 and stats["loss"] == 0.0
    assert all(p.grad is None or not p.grad.any() for p in module.policy.parameters())
    # the same pass on row 0 as a real micro-batch does count its KL
    stats, tokens = module._micro_step(ro, adv, mask, ref, rows[:1], totals, ro.logprobs, False)
    assert tokens == float(mask[0].sum()) > 0 and stats["kl"] > 1e-4 and stats["loss"] != 0.0


def test_grpo_kl_reference_is_read_without_dropout_and_leaves_no_module_in_eval_mode(
    tiny_model_dir,
):
    # Lightning warns when a fit starts with modules in eval mode (one left in eval mode while
    # it trains is a bug): the frozen reference is in train mode between calls, like the policy,
    # and each call reads it in eval mode, so dropout never touches the reference.
    from coscale.rl.logprobs import sequence_logprobs

    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=HalfReward(),
        loss=GRPOLoss(beta=0.5),
        sampling={"max_new_tokens": 4, "temperature": 1.0},
    )
    for layer in module.ref_policy.model.layers:  # dropout where the tiny Llama has it
        layer.self_attn.attention_dropout = 0.5
    assert [name for name, m in module.named_modules() if not m.training] == []
    ro = module.backend.generate(["Q:1+1\nA:", "Q:2+3\nA:"], 2, SamplingParams(4, seed=0))
    rows = torch.arange(ro.num_rollouts)
    first, second = module._ref_logprobs(ro, rows), module._ref_logprobs(ro, rows)  # [R, T]
    torch.testing.assert_close(first, second, rtol=0, atol=0)  # no dropout: the same each call
    assert all(m.training for m in module.ref_policy.modules())  # back in train mode
    with torch.no_grad():  # the same read in train mode differs: the dropout is real
        args = (ro.input_ids, ro.attention_mask, ro.prompt_length)
        dropped = sequence_logprobs(module.ref_policy, *args)  # [R, T]
    assert not torch.allclose(dropped, first)


def _fp16_scaled() -> list:
    """fp16 autocast with a GradScaler, as ``16-mixed`` runs on a GPU (Lightning turns
    ``precision="16-mixed"`` on CPU into bf16; the plugin itself runs here)."""
    return [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]


@pytest.mark.parametrize("plugins", [None, _fp16_scaled()], ids=["plain", "grad_scaler"])
def test_grpo_batches_without_signal_count_as_steps_so_max_steps_ends(tiny_model_dir, plugins):
    """A Trainer(max_steps) over batches that never carry signal (as over a learnt set) ends at
    max_steps, as TRL's would, with no weight and no optimiser state changed; the LR schedule
    advances with the steps (warm-up: 1/10 of the peak per step). A GradScaler, which refuses a
    step with no gradient, does not crash it."""
    rows = [{"id": f"p{i}", "question": "1+1", "answer": "2", "n": 2} for i in range(2)]
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=list)
    module = GRPOModule(
        model=str(tiny_model_dir),
        reward=ZeroReward(),
        optimizer={"lr": 0.01, "weight_decay": 0.1, "warmup_steps": 10},
        sampling={"max_new_tokens": 4},
    )
    before = _params(module)
    trainer = _trainer(3, max_epochs=10, plugins=plugins)  # before: 10 epochs, step 0
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 3 and trainer.current_epoch == 3
    assert _changed(before, module) == []
    opt = module.optimizers().optimizer
    assert opt.state == {} and math.isclose(opt.param_groups[0]["lr"], 0.01 * 4 / 10)
