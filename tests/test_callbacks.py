"""The four callbacks: their effect on pools, N per group and weights, and their state.

Unit tests drive the hooks with a stand-in trainer (a namespace with the attributes the
callbacks read) and a stand-in policy whose ``count_correct`` returns chosen counts; the tiny
offline model covers the SFT stage and one plain ``Trainer.fit`` with all four callbacks.
"""

from __future__ import annotations

import copy
import json
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger

from coscale.callbacks import (
    FinalRetrain,
    PassRateEvaluation,
    ReDistillation,
    RolloutNSchedule,
    copy_weights,
    run_sft,
    sft_stage,
)
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule, SFTModule
from coscale.pools import Pool
from coscale.rollout.base import SamplingParams


# ----------------------------------------------------------------------------- stand-ins
class RecordingLogger(Logger):
    """Keeps every metric and table it is given (``log_table`` like the W&B logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int | None, dict[str, float]]] = []
        self.tables: dict[str, tuple[list[str], list[list]]] = {}

    name, version = "recording", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_table(self, key, columns, data) -> None:
        self.tables[key] = (list(columns), [list(row) for row in data])

    def last(self, key: str) -> float:
        return [m[key] for _, m in self.metrics if key in m][-1]


class StubPolicy:
    """``count_correct`` returns ``correct[id]``; every call is recorded; ``log_dict`` too."""

    def __init__(self, correct: dict[str, int], lr: float = 1e-3) -> None:
        self.correct, self.lr = correct, lr
        self.val_sampling = SamplingParams(max_new_tokens=99, temperature=1.0)
        self.calls: list[tuple[list[str], int, SamplingParams]] = []
        self.logged: dict[str, float] = {}

    def count_correct(self, problems, n, sampling):
        self.calls.append(([p["id"] for p in problems], n, sampling))
        return [self.correct[p["id"]] for p in problems]

    def log_dict(self, metrics, **kwargs) -> None:
        self.logged.update(metrics)


def _trainer(dm=None, rank=0, world=1, epoch=0, step=0):
    return SimpleNamespace(
        datamodule=dm,
        global_rank=rank,
        world_size=world,
        current_epoch=epoch,
        global_step=step,
        is_global_zero=rank == 0,
        loggers=[RecordingLogger()],
    )


def _dm(ids, answer="x", val=None, **kwargs) -> ProblemDataModule:
    rows = [{"id": i, "question": f"q {i}", "answer": answer} for i in ids]
    dm = ProblemDataModule(train=rows, val=val, **kwargs)
    dm.load()
    return dm


# ----------------------------------------------------------------------------- pass rate
def _measured():
    """Four problems measured once with k=4: counts 0, 2, 4, 1 (b had an open RL epoch first)."""
    dm = _dm(["a", "b", "c", "d"])
    dm.tally_rl("b", 4, 1)
    policy = StubPolicy({"a": 0, "b": 2, "c": 4, "d": 1})
    trainer = _trainer(dm, step=7)
    cb = PassRateEvaluation(k=4, batch_size=3, temperature=0.5, max_new_tokens=7)
    return dm, policy, trainer, cb.evaluate(trainer, policy)


def test_pass_rate_records_fresh_counts_and_moves_problems_between_pools():
    dm, policy, _, results = _measured()
    pools = {pid: r["pool"] for pid, r in results.items()}
    assert pools == {"a": "unsolvable", "b": "solvable", "c": "solved", "d": "solvable"}
    assert [(r["n"], r["c"]) for r in results.values()] == [(4, 0), (4, 2), (4, 4), (4, 1)]
    assert dm.pools.history("b") == [0.25, 0.5] and dm.tally == {}  # RL tally first, then this
    # chunks of <= 3 problems, sampled with the overrides, chunk j with seed base + j
    assert [(ids, n) for ids, n, _ in policy.calls] == [(["a", "b", "c"], 4), (["d"], 4)]
    s0, s1 = policy.calls[0][2], policy.calls[1][2]
    assert (s0.temperature, s0.max_new_tokens, s1.seed - s0.seed) == (0.5, 7, 1)
    # only the solvable pool, re-measured: b becomes solved, d falls back to unsolvable
    policy.correct.update(b=3, d=0)
    again = PassRateEvaluation(k=4, pools=("solvable",)).evaluate(_trainer(dm), policy)
    assert {k: v["pool"] for k, v in again.items()} == {"b": "solved", "d": "unsolvable"}
    assert dm.pools.members(Pool.SOLVED) == ["b", "c"]


def test_pass_rate_logs_pool_sizes_pass_at_k_and_a_table():
    *_, trainer, _ = _measured()
    [(step, metrics)] = trainer.loggers[0].metrics
    counts = {"pool/unsolvable": 1.0, "pool/solvable": 2.0, "pool/solved": 1.0, "pool/failed": 0.0}
    # pass@1 = mean(0, .5, 1, .25) = .4375; pass@4 = 3/4 (every problem with a correct sample)
    assert step == 7 and metrics == counts | {"pool/pass@1": 0.4375, "pool/pass@4": 0.75}
    columns, rows = trainer.loggers[0].tables["pool/problems_eval_1"]
    assert columns == ["id", "pool", "acc", "evaluations"]
    assert rows == [
        ["a", "unsolvable", 0.0, 1],
        ["b", "solvable", 0.5, 2],
        ["c", "solved", 1.0, 1],
        ["d", "solvable", 0.25, 1],
    ]


def test_pass_rate_runs_at_chosen_epochs_and_at_a_fresh_fit_start():
    dm = _dm(["a", "b"])
    policy = StubPolicy({"a": 1, "b": 0})
    cb = PassRateEvaluation(k=2, every_n_epochs=2, on_fit_start=True)
    cb.on_fit_start(_trainer(dm, step=3), policy)  # a resumed fit: no evaluation
    cb.on_train_epoch_end(_trainer(dm, epoch=0), policy)
    assert policy.calls == []
    cb.on_fit_start(_trainer(dm), policy)
    cb.on_train_epoch_end(_trainer(dm, epoch=1), policy)
    assert len(policy.calls) == 2 and cb.evaluations == 2
    assert policy.logged["pool/pass@1"] == 0.25 and policy.logged["pool/solvable"] == 1.0


def test_pass_rate_called_directly_with_an_unfitted_trainer():
    dm, policy, logger = _dm(["a", "b"]), StubPolicy({"a": 2, "b": 0}), RecordingLogger()
    trainer = L.Trainer(accelerator="cpu", logger=logger, enable_progress_bar=False)
    assert trainer.datamodule is None  # only fit attaches one: the pipeline passes it
    results = PassRateEvaluation(k=2).evaluate(trainer, policy, tag="measure", datamodule=dm)
    assert {k: v["pool"] for k, v in results.items()} == {"a": "solved", "b": "unsolvable"}
    assert logger.last("pool/pass@1") == 0.5 and "pool/problems_measure" in logger.tables


def test_pass_rate_subset_arguments_and_state():
    dm = _dm([f"p{i}" for i in range(6)])
    policy = StubPolicy(dict.fromkeys(dm.problems, 1))
    picked = [
        set(PassRateEvaluation(k=2, max_problems=2).evaluate(_trainer(dm), policy))
        for _ in range(2)
    ]
    assert len(picked[0]) == 2 and picked[0] == picked[1]  # seeded: the same subset each time
    cb = PassRateEvaluation()
    cb.load_state_dict(json.loads(json.dumps({"evaluations": 3})))
    assert cb.state_dict() == {"evaluations": 3}
    with pytest.raises(ValueError, match=r"k must be an int >= 1, got 0.*pools must be"):
        PassRateEvaluation(k=0, pools=("bogus",))
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1 or None"):
        PassRateEvaluation(max_new_tokens=0)


def test_callbacks_warn_once_without_a_problem_datamodule():
    cb, policy = PassRateEvaluation(), StubPolicy({})
    with pytest.warns(UserWarning, match="no ProblemDataModule"):
        assert cb.evaluate(_trainer(), policy) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb.on_train_epoch_end(_trainer(), policy)  # warned once already
    sched = RolloutNSchedule()
    with pytest.warns(UserWarning, match="RolloutNSchedule"):
        sched.on_train_epoch_end(_trainer(), policy)
    assert policy.calls == [] and sched.n == [8, 8, 8]


class _Stop(Exception):
    pass


def test_sample_counts_deals_chunks_to_ranks_and_gathers(monkeypatch):
    problems = [{"id": f"p{i}"} for i in range(7)]  # 4 chunks of <= 2
    policy = StubPolicy({f"p{i}": i % 3 for i in range(7)})
    sampling = SamplingParams(seed=100)
    parts = {}

    def rank1_gather(mine):
        parts[1] = mine
        raise _Stop

    monkeypatch.setattr(sft_stage, "all_gather_objects", rank1_gather)
    with pytest.raises(_Stop):
        sft_stage.sample_counts(_trainer(rank=1, world=2), policy, problems, 3, sampling, 2)
    monkeypatch.setattr(sft_stage, "all_gather_objects", lambda mine: mine + parts[1])
    counts = sft_stage.sample_counts(_trainer(rank=0, world=2), policy, problems, 3, sampling, 2)
    assert counts == [0, 1, 2, 0, 1, 2, 0]
    assert [j for j, _ in parts[1]] == [1, 3]  # rank 1 sampled chunks 1 and 3 only
    assert [(ids, s.seed) for ids, _, s in policy.calls] == [
        (["p2", "p3"], 101),
        (["p6"], 103),
        (["p0", "p1"], 100),
        (["p4", "p5"], 102),
    ]


# ----------------------------------------------------------------------------- N schedule
def _scheduled_dm() -> ProblemDataModule:
    dm = _dm(["a", "b", "c", "d"])
    for pid, c in {"a": 1, "b": 2, "c": 6, "d": 4}.items():
        dm.pools.record(pid, 10, c)  # 0.1, 0.2, 0.6, 0.4: all solvable
    return dm


def _epoch(sched, dm, policy, epoch, tally):
    for pid, (n, c) in tally.items():
        dm.tally_rl(pid, n, c)
    sched.on_train_epoch_end(_trainer(dm, epoch=epoch), policy)


def test_schedule_groups_by_difficulty_and_raises_n_of_a_stalled_group_only():
    dm, policy = _scheduled_dm(), StubPolicy({}, lr=1e-3)
    sched = RolloutNSchedule(num_groups=3, n_init=8, factor=2.0, n_max=20, patience=1)
    sched.on_train_start(_trainer(dm), policy)
    # bins of width 0.65 / 3 over [0.05, 0.7): 0.1, 0.2 -> 0; 0.4 -> 1; 0.6 -> 2
    assert dm.group_of == {"a": 0, "b": 0, "c": 2, "d": 1}
    assert dm.n_per_problem == dict.fromkeys("abcd", 8)
    _epoch(sched, dm, policy, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    assert sched.n == [8, 8, 8] and sched.best == [0.125, 0.375, 0.625]
    dm.pools.record("e", 10, 3)  # newly solvable (0.3 -> group 1), gets its group's N
    _epoch(sched, dm, policy, 1, {"a": (8, 1), "b": (8, 1), "c": (8, 6)})  # g0 flat, g2 up, g1 idle
    assert sched.n == [16, 8, 8] and sched.bad == [0, 0, 0]
    assert dm.group_of["e"] == 1
    assert dm.n_per_problem == {"a": 16, "b": 16, "c": 8, "d": 8, "e": 8}
    _epoch(sched, dm, policy, 2, {"a": (8, 1), "b": (8, 1)})
    assert sched.n[0] == 20  # 32 capped at n_max
    _epoch(sched, dm, policy, 3, {"a": (8, 1), "b": (8, 1)})
    assert sched.n == [20, 8, 8] and dm.n_per_problem["a"] == 20
    # N_eff(0.125, 20) = 20 * (1 - 0.125**20 - 0.875**20)
    n_eff = 20 * (1 - 0.125**20 - 0.875**20)
    assert policy.logged["sched/n_group0"] == 20.0 and policy.logged["sched/reward_group0"] == 0.125
    assert policy.logged["sched/n_eff_group0"] == pytest.approx(n_eff, rel=1e-12)
    assert policy.logged["sched/lr_over_n_eff_group0"] == pytest.approx(1e-3 / n_eff, rel=1e-12)


def test_schedule_patience_and_min_delta():
    dm, policy = _scheduled_dm(), StubPolicy({})
    sched = RolloutNSchedule(num_groups=3, n_init=4, factor=1.5, patience=2, min_delta=0.05)
    sched.on_train_start(_trainer(dm), policy)
    _epoch(sched, dm, policy, 0, {"a": (8, 1)})  # best 0.125
    _epoch(sched, dm, policy, 1, {"a": (8, 1)})  # 1 bad epoch: patience 2 not reached
    assert sched.n[0] == 4 and sched.bad[0] == 1
    _epoch(sched, dm, policy, 2, {"a": (100, 16)})  # 0.16 < 0.125 + 0.05: still no progress
    assert sched.n[0] == 6 and sched.bad[0] == 0  # round(4 * 1.5) = 6
    _epoch(sched, dm, policy, 3, {"a": (100, 18)})  # 0.18 > 0.175: progress
    assert sched.n[0] == 6 and sched.best[0] == 0.18


def test_schedule_lr_ratio_picks_n_from_theory():
    dm, policy = _scheduled_dm(), StubPolicy({}, lr=1e-3)
    sched = RolloutNSchedule(num_groups=3, mode="lr_ratio", target_lr_over_n_eff=1e-4, n_max=64)
    sched.on_train_start(_trainer(dm), policy)
    _epoch(sched, dm, policy, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    # smallest N with 1e-3 / N_eff(p, N) <= 1e-4, i.e. N_eff >= 10:
    # p = .125: N_eff(12) = 12 * (1 - .875**12 - .125**12) = 9.583, N_eff(13) = 10.709 -> 13
    # p = .625 (and .375, the same by symmetry): N_eff(10) = 9.909, N_eff(11) = 10.937 -> 11
    assert sched.n == [13, 11, 11]
    assert dm.n_per_problem == {"a": 13, "b": 13, "c": 11, "d": 11}
    with pytest.raises(ValueError, match="target_lr_over_n_eff must be a number > 0"):
        RolloutNSchedule(mode="lr_ratio")
    with pytest.raises(ValueError, match=r"pl_module.lr must be a number > 0"):
        sched.on_train_start(_trainer(dm), SimpleNamespace(lr=None))


def test_schedule_arguments_and_state_round_trip():
    with pytest.raises(ValueError, match=r"num_groups must be an int >= 1, got 0"):
        RolloutNSchedule(num_groups=0)
    with pytest.raises(ValueError, match=r"n_max must be an int >= 8, got 4"):
        RolloutNSchedule(n_max=4)
    with pytest.raises(ValueError, match="mode must be 'plateau' or 'lr_ratio'"):
        RolloutNSchedule(mode="fast")
    sched = RolloutNSchedule(num_groups=2)
    sched.n, sched.best, sched.bad = [16, 8], [0.25, None], [0, 1]
    fresh = RolloutNSchedule(num_groups=2)
    fresh.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    assert fresh.state_dict() == {"n": [16, 8], "best": [0.25, None], "bad": [0, 1]}
    with pytest.raises(ValueError, match="num_groups=3"):
        RolloutNSchedule(num_groups=3).load_state_dict(sched.state_dict())


# ----------------------------------------------------------------------------- SFT stages
class ToyReward:
    """1.0 for a non-blank completion of a ``yes`` problem; every other one of ``half``."""

    def __call__(self, completions, answers, **_):
        return [
            float(bool(t.strip()) and (a == "yes" or (a == "half" and i % 2 == 0)))
            for i, (t, a) in enumerate(zip(completions, answers))
        ]


SFT = {"lr": 1e-2, "batch_size": 2, "max_length": 32}
QUIET = {"enable_progress_bar": False}


def _weights(module):
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_redistillation_equals_sft_from_the_initial_model_on_its_set(tiny_model_dir, tmp_path):
    rl = SFTModule(model=str(tiny_model_dir), reward=ToyReward())  # stands in for the RL policy
    with torch.no_grad():
        for p in rl.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    rl_weights = _weights(rl)
    dm = _dm(["a", "b", "c"], seed=3)
    dm.bank.add("c", "c solved")  # not handled by RL: its bank solution joins the set
    dm.bank.record_rollout("a", "a old", True, step=1)
    dm.bank.record_rollout("a", "a new", True, step=2)
    dm.bank.record_rollout("b", "b rl", True, step=2)
    trainer = _trainer(dm)
    cb = ReDistillation(
        sft=SFT, trainer={"max_epochs": 2, **QUIET}, export_dir=str(tmp_path / "out")
    )
    assert cb.run(trainer, rl) == 3
    assert (dm.sft_source, dm.redistill_per_problem, dm.redistill_max_total) == ("bank", 1, None)
    assert trainer.loggers[0].metrics == [(0, {"pool/redistill_examples": 3.0})]
    assert cb.state_dict() == {"runs": 1, "last_size": 3}
    # the same SFT run by hand from the initial weights on the same set
    dm.sft_source = "all"
    expected = run_sft(
        str(tiny_model_dir),
        dm.sft_items(),
        {"prompt": rl.prompt, "tokenizer": rl.tokenizer, "reward": rl.reward, **SFT},
        {"accelerator": "cpu", "max_epochs": 2, **QUIET},
        seed=3,
    )
    assert sorted(i["solution"] for i in dm.sft_items()) == ["a new", "b rl", "c solved"]
    assert _same(_weights(expected), _weights(rl)) and not _same(rl_weights, _weights(rl))
    initial = SFTModule(model=str(tiny_model_dir), reward=ToyReward())
    assert not _same(_weights(initial), _weights(rl))
    assert (tmp_path / "out" / "config.json").exists()


def test_redistillation_with_an_empty_set_leaves_the_policy(
    tiny_model_dir, tiny_model, char_tokenizer
):
    rl = SFTModule(model=str(tiny_model_dir), reward=ToyReward())
    before = _weights(rl)
    cb = ReDistillation(sft=SFT, trainer=QUIET)
    with pytest.warns(UserWarning, match="empty re-distillation set"):
        assert cb.run(_trainer(_dm(["a"])), rl) == 0
    assert _same(before, _weights(rl)) and cb.state_dict() == {"runs": 0, "last_size": 0}
    in_memory = SFTModule(
        model=copy.deepcopy(tiny_model), tokenizer=char_tokenizer, reward=ToyReward()
    )
    with pytest.raises(ValueError, match="set initial_model"):
        cb.setup(_trainer(), in_memory, "fit")
    with pytest.raises(ValueError, match="sft must not set 'model'"):
        ReDistillation(sft={"model": "x"})


def test_copy_weights_loads_in_place(tiny_model_dir):
    src, dst = (SFTModule(model=str(tiny_model_dir), reward=ToyReward()) for _ in range(2))
    with torch.no_grad():
        next(src.policy.parameters()).add_(1.0)
    target = next(dst.policy.parameters())
    copy_weights(src, dst)
    assert target is next(dst.policy.parameters()) and _same(_weights(src), _weights(dst))


def test_final_retrain_measures_the_val_set_before_and_after_retraining(tiny_model_dir):
    val = [{"id": f"v{i}", "question": f"v{i}?", "answer": "yes"} for i in range(3)]
    dm = _dm(["a", "b"], val=val)
    dm.bank.add("a", "a solved")
    dm.bank.record_rollout("b", "b rl", True, step=0)
    policy = SFTModule(model=str(tiny_model_dir), reward=ToyReward(), val_max_new_tokens=8)
    measured, count_correct = [], policy.count_correct

    def spy(problems, n, sampling):
        measured.append([p["id"] for p in problems])
        return count_correct(problems, n, sampling)

    policy.count_correct = spy
    before, trainer = _weights(policy), _trainer(dm, step=5)
    cb = FinalRetrain(sft=SFT, trainer=QUIET, eval_k=2, batch_size=2)
    results = cb.run(trainer, policy)
    assert measured == [["v0", "v1"], ["v2"]] * 2  # before, then after, on the val problems
    # ToyReward: every non-blank sample of a "yes" problem is correct
    assert results == {f"val/final_{w}_pass@{k}": 1.0 for w in ("before", "after") for k in (1, 2)}
    assert trainer.loggers[0].metrics == [(5, results)] and not _same(before, _weights(policy))
    state = json.loads(json.dumps(cb.state_dict()))
    fresh = FinalRetrain()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == {"runs": 1, "results": results}
    with pytest.raises(ValueError, match=r"eval_k must be an int >= 1, got 0"):
        FinalRetrain(eval_k=0)


@pytest.mark.parametrize("after_correct", [False, True])
def test_final_retrain_keep_better_restores_the_fit_weights_when_the_retrain_is_worse(
    tiny_model_dir, after_correct
):
    val = [{"id": f"v{i}", "question": f"v{i}?", "answer": "yes"} for i in range(3)]
    dm = _dm(["a"], val=val)
    dm.bank.add("a", "a solved")
    policy = SFTModule(model=str(tiny_model_dir), reward=ToyReward(), val_max_new_tokens=8)
    calls, count_correct = [], policy.count_correct

    def spy(problems, n, sampling):  # before: the real counts (all correct); after: as set
        calls.append(len(problems))
        if len(calls) == 1 or after_correct:
            return count_correct(problems, n, sampling)
        return [0] * len(problems)

    policy.count_correct = spy
    fit_end = _weights(policy)
    cb = FinalRetrain(sft=SFT, trainer=QUIET, eval_k=2, batch_size=3, keep="better")
    results = cb.run(_trainer(dm, step=1), policy)
    assert results["val/final_kept_retrained"] == float(after_correct)
    assert _same(fit_end, _weights(policy)) == (not after_correct)
    with pytest.raises(ValueError, match="keep must be one of"):
        FinalRetrain(keep="best")


def _fit_with_all_callbacks(model_dir, ids):
    rows = [{"id": i, "question": f"{i}?", "answer": a} for i, a in ids.items()]
    dm = ProblemDataModule(train=rows, batch_size=2, rollout_n=4)
    module = GRPOModule(
        model=str(model_dir),
        reward=ToyReward(),
        lr=1e-3,
        max_new_tokens=8,
        micro_batch_size=8,
        val_samples=2,
    )
    stage = {"sft": SFT, "trainer": QUIET}
    callbacks = [
        PassRateEvaluation(k=4, on_fit_start=True, max_new_tokens=8),
        RolloutNSchedule(num_groups=2, n_init=4, n_max=8),
        ReDistillation(**stage),
        FinalRetrain(eval_k=2, **stage),
    ]
    logger = RecordingLogger()
    off = dict(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = L.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=logger, callbacks=callbacks, **off
    )
    trainer.fit(module, datamodule=dm)
    return dm, callbacks, logger


def test_one_fit_with_all_four_callbacks(tiny_model_dir):
    ids = {"y1": "yes", "y2": "yes", "h1": "half", "h2": "half", "n1": "no"}
    dm, callbacks, logger = _fit_with_all_callbacks(tiny_model_dir, ids)
    # fit start: K=4 samples; ToyReward gives yes 4/4, half 2/4, no 0/4 (non-blank samples)
    first = {pid: dm.pools.history(pid)[0] for pid in ids}
    assert first == {"y1": 1.0, "y2": 1.0, "h1": 0.5, "h2": 0.5, "n1": 0.0}
    # only h1, h2 went to RL: grouped (0.5 -> group 1 of 2), trained with N = n_init
    assert dm.group_of == {"h1": 1, "h2": 1} and dm.n_per_problem == {"h1": 4, "h2": 4}
    assert [len(dm.pools.history(pid)) for pid in ids] == [2, 2, 3, 3, 2]  # + RL + epoch end
    assert callbacks[2].state_dict() == {"runs": 1, "last_size": 2}  # latest correct of h1, h2
    final = callbacks[3].results
    assert set(final) == {f"val/final_{w}_pass@{k}" for w in ("before", "after") for k in (1, 2)}
    assert all(logger.last(key) == value for key, value in final.items())
    logged = {k for _, metrics in logger.metrics for k in metrics}
    assert {"pool/pass@4", "pool/solvable", "sched/n_group1", "pool/redistill_examples"} <= logged
    assert {"pool/problems_fit_start", "pool/problems_epoch_0"} <= set(logger.tables)
