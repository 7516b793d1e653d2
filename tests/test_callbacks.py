"""The four callbacks: their effect on the curriculum (pools, N per group) and on weights.

Unit tests drive the hooks with a stand-in trainer (a namespace with the attributes the
callbacks read) and a stand-in policy whose ``count_correct`` returns chosen counts; the policy
reaches the fit's curriculum through ``policy._trainer.datamodule.curriculum``, as a module does
(``coscale.modules.fit_data.curriculum_of``). The tiny offline model covers the SFT stage and one
plain ``Trainer.fit`` with all four callbacks.
"""

from __future__ import annotations

import copy
import json
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from counting import each_chunk, real_counts
from lightning.pytorch.loggers import Logger
from trainers import quiet_trainer

from coscale.callbacks import (
    FinalRetrain,
    PassRateMeasurement,
    ReDistillation,
    RolloutNSchedule,
    SelectionSettings,
    copy_weights,
    run_sft,
)
from coscale.datamodules import ProblemDataModule
from coscale.loop.curriculum import CurriculumSettings
from coscale.loop.pools import Pool
from coscale.loop.schedule import NSchedule
from coscale.measure import pass_rates
from coscale.modules import GRPOModule, SFTModule
from coscale.rollout.base import SamplingParams
from coscale.seeds import derive_seed


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

    _trainer = None  # set by ``_trainer(..., policy=...)``, as Lightning attaches a module

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


def _trainer(dm=None, policy=None, epoch=0, step=0):
    trainer = SimpleNamespace(
        datamodule=dm,
        current_epoch=epoch,
        global_step=step,
        is_global_zero=True,
        loggers=[RecordingLogger()],
    )
    if policy is not None:
        policy._trainer = trainer
    return trainer


def _dm(ids, answer="x", val=None, **kwargs) -> ProblemDataModule:
    rows = [{"id": i, "question": f"q {i}", "answer": answer} for i in ids]
    dm = ProblemDataModule(train=rows, val=val, **kwargs)
    dm.load()
    return dm


def _outcomes(pid: str, n: int, c: int) -> list[tuple[str, str, bool]]:
    """``n`` rollouts of ``pid``, the first ``c`` correct, as a module reports them."""
    return [(pid, f"{pid} rollout {i}", i < c) for i in range(n)]


# ----------------------------------------------------------------------------- pass rate
class _Kept(PassRateMeasurement):
    """Keeps what its last evaluation returned (the epoch-end hooks return nothing)."""

    def evaluate(self, *args, **kwargs) -> dict:
        self.results = super().evaluate(*args, **kwargs)
        return self.results


def _measured(restored: bool = False):
    """Four problems measured with k=4 at the end of RL epoch 0 (step 7): counts 0, 2, 4, 1;
    b had 1 of 4 rollouts correct in that epoch, which the module closed in its last step.
    ``restored``: that measurement taken at the start of a fit restored from the checkpoint of
    that step (Lightning resumes in epoch 1 without epoch 0's end hooks)."""
    dm = _dm(["a", "b", "c", "d"])
    cur = dm.curriculum
    cur.record_rollouts(_outcomes("b", 4, 1), step=6)
    cur.close_epoch(lr=1e-3)  # GRPOModule, in the step that trains the epoch's last batch
    policy = StubPolicy({"a": 0, "b": 2, "c": 4, "d": 1})
    cb = _Kept(k=4, batch_size=3, temperature=0.5, max_new_tokens=7)
    trainer = _trainer(dm, policy, epoch=int(restored), step=7)
    cb.setup(trainer, policy, "fit")
    if restored:
        cb.load_state_dict({"measured": -1})  # saved before epoch 0's end
        cb.on_train_start(trainer, policy)
    else:
        cb.on_train_epoch_end(trainer, policy)
    return dm, policy, trainer, cb


@pytest.mark.parametrize("restored", [False, True])
def test_pass_rate_records_fresh_counts_and_moves_problems_between_pools(restored):
    dm, policy, _, cb = _measured(restored)
    cur = dm.curriculum
    pools = {pid: r["pool"] for pid, r in cb.results.items()}
    assert pools == {"a": "unsolvable", "b": "solvable", "c": "solved", "d": "solvable"}
    assert [(r["samples"], r["correct"]) for r in cb.results.values()] == [
        (4, 0),
        (4, 2),
        (4, 4),
        (4, 1),
    ]
    assert cur.pools.history("b") == [0.25, 0.5]  # the module's close of the epoch, then this
    assert cb.state_dict() == {"measured": 0}
    # each epoch is measured once: a second end of epoch 0, or a fit restored after it, is a no-op
    cb.on_train_epoch_end(_trainer(dm, policy, epoch=0), policy)
    cb.on_train_start(_trainer(dm, policy, epoch=1), policy)
    assert cur.measurements == 1 and len(policy.calls) == 2
    # chunks of <= 3 problems, sampled with the overrides, chunk j with seed base + j
    assert [(ids, n) for ids, n, _ in policy.calls] == [(["a", "b", "c"], 4), (["d"], 4)]
    s0, s1 = policy.calls[0][2], policy.calls[1][2]
    assert (s0.temperature, s0.max_new_tokens, s1.seed - s0.seed) == (0.5, 7, 1)
    # only the solvable pool, re-measured: b becomes solved, d falls back to unsolvable
    policy.correct.update(b=3, d=0)
    again = PassRateMeasurement(samples=4, pools=("solvable",)).evaluate(
        _trainer(dm, policy), policy
    )
    assert {k: v["pool"] for k, v in again.items()} == {"b": "solved", "d": "unsolvable"}
    assert cur.pools.members(Pool.SOLVED) == ["b", "c"]


def test_pass_rate_closes_no_epoch_and_a_fresh_fit_measures_its_epochs_again():
    dm = _dm(["a", "b"])
    cur = dm.curriculum
    policy = StubPolicy({"a": 1, "b": 0})
    cur.record_rollouts(_outcomes("b", 4, 1), step=0)  # an open tally: the module's to close
    cb = PassRateMeasurement(samples=2)
    trainer = _trainer(dm, policy, epoch=0)
    cb.setup(trainer, policy, "fit")
    cb.on_train_epoch_end(trainer, policy)
    assert cur.tally == {"b": [4, 1]} and cur.pools.history("b") == [0.0]  # measured only
    cb.setup(trainer, policy, "fit")  # the same callback in a new fit: epoch 0 is new again
    cb.on_train_epoch_end(trainer, policy)
    assert cur.measurements == 2 and cur.tally == {"b": [4, 1]}


@pytest.mark.parametrize("restored", [False, True])
def test_pass_rate_logs_pool_sizes_pass_at_k_and_a_table(restored):
    _, policy, trainer, cb = _measured(restored)
    counts = {"pool/unsolvable": 1.0, "pool/solvable": 2.0, "pool/solved": 1.0, "pool/failed": 0.0}
    # pass@1 = mean(0, .5, 1, .25) = .4375; pass@4 = 3/4 (every problem with a correct sample)
    expected = counts | {"pool/pass@1": 0.4375, "pool/pass@4": 0.75}
    assert cb.last_metrics == expected
    if restored:  # outside the training loop: straight to the loggers, at the fit's step
        assert trainer.loggers[0].metrics == [(7, expected)] and policy.logged == {}
    else:  # at an epoch's end: through the module's log_dict (-> callback_metrics, loggers)
        assert trainer.loggers[0].metrics == [] and policy.logged == expected
    columns, rows = trainer.loggers[0].tables["pool/problems"]  # one table, rows tagged
    assert columns == ["stage", "measurement", "id", "pool", "acc", "evaluations"]
    assert rows == [  # no stage outside coscale run (module.run_stage)
        [None, "epoch_0", "a", "unsolvable", 0.0, 1],
        [None, "epoch_0", "b", "solvable", 0.5, 2],
        [None, "epoch_0", "c", "solved", 1.0, 1],
        [None, "epoch_0", "d", "solvable", 0.25, 1],
    ]


def test_pass_rate_runs_at_chosen_epochs_and_at_a_fresh_fit_start():
    dm = _dm(["a", "b"])
    policy = StubPolicy({"a": 1, "b": 0})
    cb = PassRateMeasurement(samples=2, every_n_epochs=2, on_fit_start=True)
    cb.on_fit_start(_trainer(dm, policy, step=3), policy)  # a resumed fit: no evaluation
    cb.on_train_epoch_end(_trainer(dm, policy, epoch=0), policy)
    assert policy.calls == []
    cb.on_fit_start(_trainer(dm, policy), policy)
    cb.on_train_epoch_end(_trainer(dm, policy, epoch=1), policy)
    assert len(policy.calls) == 2 and dm.curriculum.measurements == 2
    assert policy.logged["pool/pass@1"] == 0.25 and policy.logged["pool/solvable"] == 1.0


def test_measure_without_a_fit_records_in_the_curriculum():
    # what the pipeline's measure stage calls (the callback's `datamodule=` is gone): no trainer
    dm, policy = _dm(["a", "b"]), StubPolicy({"a": 2, "b": 0})
    results, metrics = pass_rates.measure(policy, dm.curriculum, samples=2)
    assert {k: v["pool"] for k, v in results.items()} == {"a": "solved", "b": "unsolvable"}
    assert metrics["pool/pass@1"] == 0.5 and metrics["pool/solved"] == 1.0
    assert dm.curriculum.measurements == 1


def test_pass_rate_subset_and_seeds_follow_the_curriculum():
    ids = [f"p{i}" for i in range(6)]
    dms = [_dm(ids) for _ in range(2)]
    policy = StubPolicy(dict.fromkeys(ids, 1))
    cb = PassRateMeasurement(samples=2, max_problems=2, seed=5)
    first = [set(cb.evaluate(_trainer(dm, policy), policy)) for dm in dms]
    assert len(first[0]) == 2 and first[0] == first[1]  # seeded: the same subset from one state
    # samples seeded with derive_seed("measure", seed, measurements) (+ the chunk's index)
    assert [s.seed for *_, s in policy.calls] == [derive_seed("measure", 5, 0)] * 2
    later = [set(cb.evaluate(_trainer(dms[0], policy), policy)) for _ in range(2)]
    assert len({frozenset(x) for x in [first[0], *later]}) > 1  # a new subset each measurement
    # the count is the curriculum's, saved with it: a restored one carries on where it was
    restored = _dm(ids)
    restored.load_state_dict(json.loads(json.dumps(dms[0].state_dict())))
    policy.calls.clear()
    picked = [set(cb.evaluate(_trainer(dm, policy), policy)) for dm in (dms[0], restored)]
    assert picked[0] == picked[1] and restored.curriculum.measurements == 4
    assert [s.seed for *_, s in policy.calls] == [derive_seed("measure", 5, 3)] * 2
    with pytest.raises(ValueError, match=r"samples must be an int >= 1, got 0.*pools must be"):
        PassRateMeasurement(samples=0, pools=("bogus",))
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1 or None"):
        PassRateMeasurement(max_new_tokens=0)


def test_callbacks_without_a_curriculum_do_nothing_and_each_warns_once():
    policy = StubPolicy({})
    trainer = _trainer(SimpleNamespace(), policy)  # a fit on some other loader
    cb = PassRateMeasurement(on_fit_start=True)
    with pytest.warns(UserWarning, match="PassRateMeasurement: the trainer has no ProblemData"):
        assert cb.evaluate(trainer, policy) == {}
    sched = RolloutNSchedule()
    with pytest.warns(UserWarning, match="RolloutNSchedule: the trainer has no ProblemDataModule"):
        sched.setup(trainer, policy, "fit")
        sched.on_fit_start(trainer, policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once each
        cb.on_fit_start(trainer, policy)
        cb.on_train_start(trainer, policy)
        cb.on_train_epoch_end(trainer, policy)
        sched.on_fit_start(trainer, policy)
    assert policy.calls == [] and sched.schedule.n == [8, 8, 8] and trainer.loggers[0].metrics == []
    redistill, final = ReDistillation(), FinalRetrain()
    with pytest.warns(UserWarning, match="ReDistillation: the trainer has no ProblemDataModule"):
        assert redistill.run(trainer, policy) == 0
    with pytest.warns(UserWarning, match="FinalRetrain: the trainer has no ProblemDataModule"):
        assert final.run(trainer, policy) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert redistill.run(trainer, policy) == 0 and final.run(trainer, policy) == {}


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

    monkeypatch.setattr(pass_rates, "rank_world", lambda: (1, 2))
    monkeypatch.setattr(pass_rates, "all_gather_objects", rank1_gather)
    with pytest.raises(_Stop):
        pass_rates.sample_counts(policy, problems, 3, sampling, 2)
    monkeypatch.setattr(pass_rates, "rank_world", lambda: (0, 2))
    monkeypatch.setattr(pass_rates, "all_gather_objects", lambda mine: mine + parts[1])
    counts = pass_rates.sample_counts(policy, problems, 3, sampling, 2)
    assert counts == [0, 1, 2, 0, 1, 2, 0]
    assert [j for j, _ in parts[1]] == [1, 3]  # rank 1 sampled chunks 1 and 3 only
    assert [(ids, s.seed) for ids, _, s in policy.calls] == [
        (["p2", "p3"], 101),
        (["p6"], 103),
        (["p0", "p1"], 100),
        (["p4", "p5"], 102),
    ]


# ----------------------------------------------------------------------------- N schedule
def _scheduled(policy, **schedule):
    """a-d measured 0.1, 0.2, 0.6, 0.4 (all solvable), e never measured; a RolloutNSchedule
    installed in the curriculum at setup, the solvable problems grouped at fit start."""
    dm = _dm(["a", "b", "c", "d", "e"])
    cur = dm.curriculum
    for pid, c in {"a": 1, "b": 2, "c": 6, "d": 4}.items():
        cur.pools.record(pid, 10, c)
    sched = RolloutNSchedule(**schedule)
    trainer = _trainer(dm, policy)
    sched.setup(trainer, policy, "fit")
    sched.on_fit_start(trainer, policy)
    return cur, sched, trainer


def _epoch(cur, policy, epoch, tally):
    """One RL epoch as GRPOModule runs it: its rollouts reported, then the epoch closed (the
    schedule's step); returns the ``sched/`` metrics the module logs."""
    for pid, (n, c) in tally.items():
        cur.record_rollouts(_outcomes(pid, n, c), step=epoch)
    return cur.close_epoch(lr=policy.lr)


def test_schedule_groups_by_difficulty_and_raises_n_of_a_stalled_group_only():
    policy = StubPolicy({}, lr=1e-3)
    schedule = dict(num_groups=3, n_init=8, factor=2.0, n_max=20, patience=1)
    cur, sched, trainer = _scheduled(policy, **schedule)
    assert cur.schedule is sched.schedule
    # bins of width 0.65 / 3 over [0.05, 0.7): 0.1, 0.2 -> 0; 0.4 -> 1; 0.6 -> 2
    assert cur.group_of == {"a": 0, "b": 0, "c": 2, "d": 1}
    assert cur.n_per_problem == dict.fromkeys("abcd", 8)
    assert trainer.loggers[0].last("sched/n_group0") == 8.0
    _epoch(cur, policy, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    assert sched.schedule.n == [8, 8, 8] and sched.schedule.best == [0.125, 0.375, 0.625]
    cur.pools.record("e", 10, 3)  # newly solvable (0.3 -> group 1), gets its group's N
    _epoch(cur, policy, 1, {"a": (8, 1), "b": (8, 1), "c": (8, 6)})  # g0 flat, g2 up, g1 idle
    assert sched.schedule.n == [16, 8, 8] and sched.schedule.stalled == [0, 0, 0]
    assert cur.group_of["e"] == 1
    assert cur.n_per_problem == {"a": 16, "b": 16, "c": 8, "d": 8, "e": 8}
    assert [i["n"] for i in cur.rl_items()] == [16, 16, 8, 8]  # c is solved (0.75) now
    _epoch(cur, policy, 2, {"a": (8, 1), "b": (8, 1)})
    assert sched.schedule.n[0] == 20  # 32 capped at n_max
    metrics = _epoch(cur, policy, 3, {"a": (8, 1), "b": (8, 1)})
    assert sched.schedule.n == [20, 8, 8] and cur.n_per_problem["a"] == 20
    # N_eff(0.125, 20) = 20 * (1 - 0.125**20 - 0.875**20)
    n_eff = 20 * (1 - 0.125**20 - 0.875**20)
    assert metrics["sched/n_group0"] == 20.0 and metrics["sched/reward_group0"] == 0.125
    assert metrics["sched/n_eff_group0"] == pytest.approx(n_eff, rel=1e-12)
    assert metrics["sched/lr_over_n_eff_group0"] == pytest.approx(1e-3 / n_eff, rel=1e-12)


def test_schedule_patience_and_min_delta():
    policy = StubPolicy({})
    schedule = dict(num_groups=3, n_init=4, factor=1.5, patience=2, min_delta=0.05)
    cur, sched, _ = _scheduled(policy, **schedule)
    _epoch(cur, policy, 0, {"a": (8, 1)})  # best 0.125
    _epoch(cur, policy, 1, {"a": (8, 1)})  # 1 bad epoch: patience 2 not reached
    assert sched.schedule.n[0] == 4 and sched.schedule.stalled[0] == 1
    _epoch(cur, policy, 2, {"a": (100, 16)})  # 0.16 < 0.125 + 0.05: still no progress
    assert sched.schedule.n[0] == 6 and sched.schedule.stalled[0] == 0  # round(4 * 1.5) = 6
    _epoch(cur, policy, 3, {"a": (100, 18)})  # 0.18 > 0.175: progress
    assert sched.schedule.n[0] == 6 and sched.schedule.best[0] == 0.18


def test_schedule_lr_ratio_picks_n_from_theory():
    policy = StubPolicy({}, lr=1e-3)
    schedule = dict(num_groups=3, mode="lr_ratio", target_lr_over_n_eff=1e-4, n_max=64)
    cur, sched, trainer = _scheduled(policy, **schedule)
    _epoch(cur, policy, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    # smallest N with 1e-3 / N_eff(p, N) <= 1e-4, i.e. N_eff >= 10:
    # p = .125: N_eff(12) = 12 * (1 - .875**12 - .125**12) = 9.583, N_eff(13) = 10.709 -> 13
    # p = .625 (and .375, the same by symmetry): N_eff(10) = 9.909, N_eff(11) = 10.937 -> 11
    assert sched.schedule.n == [13, 11, 11]
    assert cur.n_per_problem == {"a": 13, "b": 13, "c": 11, "d": 11}
    with pytest.raises(ValueError, match="target_lr_over_n_eff must be a number > 0"):
        RolloutNSchedule(mode="lr_ratio")
    no_lr = SimpleNamespace(lr=None, _trainer=trainer)
    with pytest.raises(ValueError, match=r"needs the policy's learning rate: lr must be a number"):
        sched.on_fit_start(trainer, no_lr)


def test_schedule_arguments_and_its_state_saved_once_by_the_curriculum():
    with pytest.raises(ValueError, match=r"num_groups must be an int >= 1, got 0"):
        RolloutNSchedule(num_groups=0)
    with pytest.raises(ValueError, match=r"n_max must be an int >= 8, got 4"):
        RolloutNSchedule(n_max=4)
    with pytest.raises(ValueError, match="mode must be one of plateau, lr_ratio; got 'fast'"):
        RolloutNSchedule(mode="fast")
    policy = StubPolicy({})
    sched, dm = RolloutNSchedule(num_groups=2), _dm(["a"])
    sched.setup(_trainer(dm, policy), policy, "fit")
    assert dm.curriculum.schedule is sched.schedule and sched.state_dict() == {}  # Lightning's
    sched.schedule.n, sched.schedule.best, sched.schedule.stalled = [16, 8], [0.25, None], [0, 1]
    state = {"n": [16, 8], "best": [0.25, None], "stalled": [0, 1]}
    old = NSchedule(num_groups=2)  # a state saved by an earlier release names stalled "bad"
    old.load_state_dict({"n": [16, 8], "best": [0.25, None], "bad": [0, 1]})
    assert old.state_dict() == state
    # restored: Lightning's order, the callback's setup, then the DataModule's state
    fresh, restored = RolloutNSchedule(num_groups=2), _dm(["a"])
    fresh.setup(_trainer(restored, policy), policy, "fit")
    restored.load_state_dict(json.loads(json.dumps(dm.state_dict())))
    assert restored.curriculum.schedule.state_dict() == state
    with pytest.raises(ValueError, match="num_groups=3"):
        NSchedule(num_groups=3).load_state_dict(state)
    again = RolloutNSchedule(num_groups=2)
    again.setup(_trainer(restored, policy), policy, "fit")
    assert restored.curriculum.schedule is fresh.schedule  # it had one: not replaced


def test_renamed_classes_keep_their_old_names_for_one_release():
    import coscale.callbacks
    import coscale.rollout.factory

    with pytest.warns(FutureWarning, match="is now PassRateMeasurement"):
        assert coscale.callbacks.PassRateEvaluation is PassRateMeasurement
    with pytest.warns(FutureWarning, match="Rollout is now RolloutSettings"):
        assert coscale.rollout.factory.Rollout is coscale.rollout.factory.RolloutSettings
    with pytest.raises(AttributeError, match="PassRateEval"):
        coscale.callbacks.PassRateEval  # noqa: B018


# ----------------------------------------------------------------------------- SFT stages
class ToyReward:
    """1.0 for a non-blank completion of a ``yes`` problem; every other one of ``half``."""

    def __call__(self, completions, answers, **_):
        return [
            float(bool(t.strip()) and (a == "yes" or (a == "half" and i % 2 == 0)))
            for i, (t, a) in enumerate(zip(completions, answers))
        ]


SFT = {"optimizer": {"lr": 1e-2}, "batch_size": 2, "max_length": 32}


def _weights(module):
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_redistillation_equals_sft_from_the_initial_model_on_its_set(tiny_model_dir, tmp_path):
    rl = SFTModule(model=str(tiny_model_dir), verifier=ToyReward())  # stands in for the RL policy
    with torch.no_grad():
        for p in rl.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    rl_weights = _weights(rl)
    dm = _dm(["a", "b", "c"], curriculum={"seed": 3})
    bank = dm.curriculum.bank
    bank.add("c", "c solved")  # not handled by RL: its bank solution joins the set
    bank.record_rollout("a", "a old", True, step=1)
    bank.record_rollout("a", "a new", True, step=2)
    bank.record_rollout("b", "b rl", True, step=2)
    trainer = _trainer(dm)
    cb = ReDistillation(sft=SFT, trainer={"max_epochs": 2}, export_dir=str(tmp_path / "out"))
    assert cb.run(trainer, rl) == 3
    # the set is asked of the curriculum: what the datamodule serves is left as it was
    assert dm.sft_source == "bank" and dm.curriculum.settings == CurriculumSettings(seed=3)
    assert trainer.loggers[0].metrics == [(0, {"pool/redistill_examples": 3.0})]
    assert cb.state_dict() == {"runs": 1, "last_size": 3}
    # the same SFT run by hand from the initial weights on the same set
    items = dm.curriculum.sft_pairs("all")
    expected = run_sft(
        str(tiny_model_dir),
        items,
        {"prompt": rl.prompt, "tokenizer": rl.tokenizer, "verifier": rl.verifier, **SFT},
        {"max_epochs": 2},
        seed=3,
    )
    assert sorted(i["solution"] for i in items) == ["a new", "b rl", "c solved"]
    assert _same(_weights(expected), _weights(rl)) and not _same(rl_weights, _weights(rl))
    initial = SFTModule(model=str(tiny_model_dir), verifier=ToyReward())
    assert not _same(_weights(initial), _weights(rl))
    assert (tmp_path / "out" / "config.json").exists()


def test_redistillation_with_an_empty_set_leaves_the_policy(
    tiny_model_dir, tiny_model, char_tokenizer
):
    rl = SFTModule(model=str(tiny_model_dir), verifier=ToyReward())
    before = _weights(rl)
    cb = ReDistillation(sft=SFT)
    with pytest.warns(UserWarning, match="empty re-distillation set"):
        assert cb.run(_trainer(_dm(["a"])), rl) == 0
    assert _same(before, _weights(rl)) and cb.state_dict() == {"runs": 0, "last_size": 0}
    in_memory = SFTModule(
        model=copy.deepcopy(tiny_model), tokenizer=char_tokenizer, verifier=ToyReward()
    )
    with pytest.raises(ValueError, match="set initial_model"):
        cb.setup(_trainer(), in_memory, "fit")
    with pytest.raises(ValueError, match="sft must not set 'model'"):
        ReDistillation(sft={"model": "x"})


def test_copy_weights_loads_in_place(tiny_model_dir):
    src, dst = (SFTModule(model=str(tiny_model_dir), verifier=ToyReward()) for _ in range(2))
    with torch.no_grad():
        next(src.policy.parameters()).add_(1.0)
    target = next(dst.policy.parameters())
    copy_weights(src, dst)
    assert target is next(dst.policy.parameters()) and _same(_weights(src), _weights(dst))


def test_final_retrain_measures_the_val_set_before_and_after_retraining(tiny_model_dir):
    val = [{"id": f"v{i}", "question": f"v{i}?", "answer": "yes"} for i in range(3)]
    dm = _dm(["a", "b"], val=val)
    dm.curriculum.bank.add("a", "a solved")
    dm.curriculum.bank.record_rollout("b", "b rl", True, step=0)
    policy = SFTModule(
        model=str(tiny_model_dir), verifier=ToyReward(), validation={"max_new_tokens": 8}
    )
    measured, count_correct = [], real_counts(policy)

    def spy(problems, n, sampling):
        measured.append([p["id"] for p in problems])
        return count_correct(problems, n, sampling)

    each_chunk(policy, spy)
    before, trainer = _weights(policy), _trainer(dm, step=5)
    cb = FinalRetrain(sft=SFT, judge_samples=2)
    results = cb.run(trainer, policy)
    assert measured == [["v0", "v1", "v2"]] * 2  # before, then after, on the val problems
    # ToyReward: every non-blank sample of a "yes" problem is correct
    judged = {f"val/final_{w}_pass@{k}": 1.0 for w in ("before", "after") for k in (1, 2)}
    assert results == judged | {"val/final_kept_retrained": 1.0}  # as the pipeline's final
    assert trainer.loggers[0].metrics == [(5, results)] and not _same(before, _weights(policy))
    state = json.loads(json.dumps(cb.state_dict()))
    fresh = FinalRetrain()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == {"runs": 1, "results": results}
    with pytest.raises(ValueError, match=r"judge_samples must be an int >= 1, got 0"):
        FinalRetrain(judge_samples=0)


@pytest.mark.parametrize("after_correct", [False, True])
def test_final_retrain_keep_better_restores_the_fit_weights_when_the_retrain_is_worse(
    tiny_model_dir, after_correct
):
    val = [{"id": f"v{i}", "question": f"v{i}?", "answer": "yes"} for i in range(3)]
    dm = _dm(["a"], val=val)
    dm.curriculum.bank.add("a", "a solved")
    policy = SFTModule(
        model=str(tiny_model_dir), verifier=ToyReward(), validation={"max_new_tokens": 8}
    )
    calls, count_correct = [], real_counts(policy)

    def spy(problems, n, sampling):  # before: the real counts (all correct); after: as set
        calls.append(len(problems))
        if len(calls) == 1 or after_correct:
            return count_correct(problems, n, sampling)
        return [0] * len(problems)

    each_chunk(policy, spy)
    fit_end = _weights(policy)
    cb = FinalRetrain(sft=SFT, judge_samples=2, keep="better")
    results = cb.run(_trainer(dm, step=1), policy)
    assert results["val/final_kept_retrained"] == float(after_correct)
    assert _same(fit_end, _weights(policy)) == (not after_correct)
    with pytest.raises(ValueError, match="keep must be one of"):
        FinalRetrain(keep="best")


def test_final_retrain_source_leaves_the_rollouts_out(tiny_model_dir, monkeypatch):
    dm = _dm(["a", "b"])
    dm.curriculum.bank.add("a", "a bank")
    dm.curriculum.bank.record_rollout("b", "b rollout", True, 0)
    policy = SFTModule(
        model=str(tiny_model_dir), verifier=ToyReward(), validation={"max_new_tokens": 8}
    )
    trained = []
    monkeypatch.setattr(
        "coscale.callbacks.final_retrain.retrain_from_initial",
        lambda cb, trainer, module, items, cur: (
            trained.append(sorted(i["solution"] for i in items)) or {}
        ),
    )
    for source in ("all", "bank"):
        FinalRetrain(sft=SFT, judge_samples=1, source=source).run(_trainer(dm), policy)
    assert trained == [["a bank", "b rollout"], ["a bank"]]
    with pytest.raises(ValueError, match="source must be one of bank, redistill, all"):
        FinalRetrain(source="rollouts")


def _fit_with_all_callbacks(model_dir, ids):
    rows = [{"id": i, "question": f"{i}?", "answer": a} for i, a in ids.items()]
    dm = ProblemDataModule(train=rows, batch_size=2)  # N: the schedule's n_init
    module = GRPOModule(
        model=str(model_dir),
        reward=ToyReward(),
        optimizer={"lr": 0.001},
        sampling={"max_new_tokens": 8},
        update={"micro_batch_size": 8},
        validation={"samples": 2},
    )
    stage = {"sft": SFT}
    callbacks = [
        PassRateMeasurement(samples=4, on_fit_start=True, max_new_tokens=8),
        RolloutNSchedule(num_groups=2, n_init=4, n_max=8),
        ReDistillation(**stage),
        FinalRetrain(judge_samples=2, **stage),
    ]
    logger = RecordingLogger()
    trainer = quiet_trainer(-1, max_epochs=1, devices=1, logger=logger, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    return dm, callbacks, logger


def test_one_fit_with_all_four_callbacks(tiny_model_dir):
    ids = {"y1": "yes", "y2": "yes", "h1": "half", "h2": "half", "n1": "no"}
    dm, callbacks, logger = _fit_with_all_callbacks(tiny_model_dir, ids)
    # fit start: K=4 samples; ToyReward gives yes 4/4, half 2/4, no 0/4 (non-blank samples)
    cur = dm.curriculum
    first = {pid: cur.pools.history(pid)[0] for pid in ids}
    assert first == {"y1": 1.0, "y2": 1.0, "h1": 0.5, "h2": 0.5, "n1": 0.0}
    # only h1, h2 went to RL: grouped (0.5 -> group 1 of 2), trained with N = n_init
    assert cur.group_of == {"h1": 1, "h2": 1} and cur.n_per_problem == {"h1": 4, "h2": 4}
    assert [len(cur.pools.history(pid)) for pid in ids] == [2, 2, 3, 3, 2]  # + RL + epoch end
    assert cur.measurements == 2 and cur.tally == {}  # epoch 0 closed once, then measured
    assert callbacks[2].state_dict() == {"runs": 1, "last_size": 2}  # latest correct of h1, h2
    final = callbacks[3].results
    judged = {f"val/final_{w}_pass@{k}" for w in ("before", "after") for k in (1, 2)}
    assert set(final) == judged | {"val/final_kept_retrained"}
    assert all(logger.last(key) == value for key, value in final.items())
    logged = {k for _, metrics in logger.metrics for k in metrics}
    assert {"pool/pass@4", "pool/solvable", "sched/n_group1", "pool/redistill_examples"} <= logged
    # the schedule's step at epoch 0's close (h1, h2: mean RL accuracy of group 1) is logged by
    # the module, which closes the epoch; the measurement after it logs the pools' last word
    assert "sched/reward_group1" in logged
    _, rows = logger.tables["pool/problems"]  # one table growing across measurements
    assert {"fit_start", "epoch_0"} <= {row[1] for row in rows}


def test_redistillation_starts_no_fit_inside_the_running_one(tiny_model_dir, monkeypatch):
    rl = SFTModule(model=str(tiny_model_dir), verifier=ToyReward())
    dm = _dm(["a", "b"], curriculum={"seed": 3})
    dm.curriculum.bank.record_rollout("a", "a rl", True, step=1)

    def no_fit(*args, **kwargs):
        raise AssertionError("Trainer.fit called inside the running fit")

    monkeypatch.setattr(L.Trainer, "fit", no_fit)
    before = _weights(rl)
    cb = ReDistillation(sft=SFT, trainer={"max_epochs": 1, "max_steps": 1})
    assert cb.run(_trainer(dm), rl) == 1 and not _same(before, _weights(rl))


def test_in_fit_sft_names_each_setting_it_does_not_take_before_training():
    with pytest.raises(ValueError) as err:
        ReDistillation(
            sft={"batch_size": 0, "model": "x"},
            trainer={"gradient_clip_val": 0.0, "precision": "16-mixed", "max_steps": 0},
            selection=SelectionSettings(problems=2, every=0),
        )
    msg = str(err.value)
    assert "sft must not set 'model'" in msg
    assert "trainer.precision is not an in-fit SFT setting" in msg
    assert "strategy and precision are those of the running Trainer" in msg
    assert "batch_size must be an int >= 1, got 0" in msg
    assert "max_steps must be an int >= 1 or None, got 0" in msg
    assert "gradient_clip_val must be > 0 or None, got 0.0" in msg
    assert "every must be an int >= 1, got 0" in msg
    with pytest.raises(ValueError, match="keep must be one of retrained, better; got 'best'"):
        FinalRetrain(keep="best")
    guard = {"forgetting_guard": {"mode": "parameter"}}
    FinalRetrain(sft=guard, trainer={"max_epochs": 2, "max_steps": 5})


def test_the_guard_under_a_sharded_strategy_is_refused_at_setup(tiny_model_dir):
    sharded = type("ModelParallelStrategy", (), {})()  # Lightning's FSDP2 strategy, by name
    trainer = SimpleNamespace(strategy=sharded)
    module = SFTModule(model=str(tiny_model_dir), verifier=ToyReward())
    for cb in (
        ReDistillation(sft={"forgetting_guard": {"mode": "neuron"}}),
        FinalRetrain(sft={"forgetting_guard": {"mode": "parameter"}}),
    ):
        with pytest.raises(ValueError, match=r"forgetting_guard=.* not with ModelParallelStrategy"):
            cb.setup(trainer, module, "fit")
    ReDistillation().setup(trainer, module, "fit")  # without the guard: fine
