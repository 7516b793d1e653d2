"""Curriculum: the one owner of CoScale-RL's loop state, and every rule that changes it.

It holds the problems, their pools and accuracy histories, the open RL tally, the difficulty
group and Rollout N of each problem with the schedule that sets them, the solution bank and
its replay buffer. Stages, modules and callbacks change it only through the named operations
below, and :meth:`Curriculum.state_dict` is the whole of it. No Lightning here: the DataModule
serves it, the modules report to it, the pipeline's stages call it.

    data scaling:  add_solutions / scale_solutions -> bank -> sft_pairs(source)
    RL:            rl_items (solvable, each with its N) -> record_rollouts -> close_epoch
    measurement:   measure_ids -> record_measurement (relabels the pools, groups new problems)
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coscale.checks import at_least, one_of
from coscale.loop.pools import Pool, PoolSettings, ProblemPools
from coscale.loop.problem import Problem
from coscale.loop.schedule import N_INIT, NSchedule
from coscale.loop.solution_sources import DatasetSolutions, SolutionSource
from coscale.loop.solutions import SolutionBank
from coscale.rl.theory import effective_rollouts
from coscale.seeds import derive_seed

Item = dict[str, Any]
SFTSource = Literal["bank", "redistill", "all"]
SFT_SOURCES = ("bank", "redistill", "all")


@dataclass(frozen=True)
class CurriculumSettings(PoolSettings):
    """The loop's rules: pool thresholds and budgets (:class:`~coscale.loop.pools.PoolSettings`),
    set sizes (``data.curriculum:`` in YAML). Rollout N is the schedule's (``RolloutNSchedule`` in
    a ``Trainer``, ``pipeline.schedule`` in ``coscale run``).

    Attributes:
        solutions_per_round: Solutions added to each unsolvable problem per data-scaling round.
        redistill_per_problem: Latest correct rollouts taken per problem for re-distillation.
        redistill_max_total: Cap on the re-distillation set (a seeded subset beyond it).
        keep_rl_bank: In ``all`` sets, keep the bank solutions of problems RL has handled next to
            their latest correct rollouts. The paper keeps only the rollouts; with few RL epochs
            per problem that drops what the first SFT taught (docs/results.md).
        replay_fraction: Share of replayed pairs (``data.sft_replay``) in an SFT set, in [0, 1).
        rl_unmeasured: Also serve problems never measured yet to RL (a plain GRPO run on a data
            set, without a pass-rate evaluation first). Off for the CoScale-RL pipeline.
        seed: Seed of the per-epoch shuffle and of the re-distillation subset.
    """

    solutions_per_round: int = 4
    redistill_per_problem: int = 1
    redistill_max_total: int | None = None
    keep_rl_bank: bool = False
    replay_fraction: float = 0.0
    rl_unmeasured: bool = False
    seed: int = 0

    def errors(self) -> list[str]:
        """Every bad value, named by its field."""
        errors = at_least(1, solutions_per_round=self.solutions_per_round)
        errors += at_least(1, redistill_per_problem=self.redistill_per_problem)
        errors += at_least(1, optional=True, redistill_max_total=self.redistill_max_total)
        if not 0 <= self.replay_fraction < 1:
            errors.append(f"replay_fraction must be in [0, 1), got {self.replay_fraction}")
        return errors


class Curriculum:
    """Problems -> pools -> SFT pairs and RL prompts, and what the outcomes change.

    Args:
        settings: The rules' thresholds, budgets and sizes.
        teacher: Where solutions beyond a problem's own come from (None: its own only).
        schedule: Rollout N per difficulty group (None: every problem gets ``N_INIT``), or one
            installed later (:meth:`use_schedule`).
        replay_pairs: Earlier ``{"question", "solution"}`` pairs mixed into every SFT set.
    """

    def __init__(
        self,
        settings: CurriculumSettings = CurriculumSettings(),
        teacher: SolutionSource | None = None,
        schedule: NSchedule | None = None,
        replay_pairs: Sequence[Item] = (),
    ) -> None:
        if errors := settings.errors():
            raise ValueError("data: " + "; ".join(errors))
        s = self.settings = settings
        self.teacher, self.replay_pairs = teacher, list(replay_pairs)
        self.schedule = schedule
        self.pools = ProblemPools(s)
        self.bank = SolutionBank()
        self.problems: dict[str, Problem] = {}
        self.group_of: dict[str, int] = {}
        self.n_per_problem: dict[str, int] = {}
        self.tally: dict[str, list[int]] = {}  # id -> [samples, correct] of the open RL epoch
        self.last_epoch_acc: dict[str, float] = {}  # RL accuracy of the last closed epoch
        self.measurements = 0  # measurements recorded (seeds the next one)

    # ---------------------------------------------------------------- problems
    def add_problems(self, problems: Iterable[Problem]) -> None:
        """Registers problems (as unsolvable); ids must be unique."""
        for p in problems:
            if p.id in self.problems:
                raise ValueError(f"duplicate problem id {p.id!r}")
            self.problems[p.id] = p
            self.pools.add(p.id)

    # ----------------------------------------------------- data scaling (SFT)
    def add_solutions(self, ids: Sequence[str], k: int, own_only: bool = False) -> int:
        """Up to ``k`` new solutions for each problem in ``ids``: its own first, then the
        teacher's; returns how many were added. A spent budget moves a problem to failed."""
        requests = [(self.problems[i], k) for i in ids]
        added = self._add_from(DatasetSolutions(), requests)
        if self.teacher is not None and not own_only:
            short = [(self.problems[i], k - got) for i, got in added.items() if got < k]
            for i, got in self._add_from(self.teacher, short).items():
                added[i] += got
            if callable(close := getattr(self.teacher, "close", None)):
                close()  # a teacher model holds no memory between rounds
        for i in ids:
            self.pools.note_solutions(i, self.bank.count(i))
        return sum(added.values())

    def scale_solutions(self, k: int | None = None, pools: Sequence[Pool] = (Pool.UNSOLVABLE,)):
        """One data-scaling round: ``k`` (default ``solutions_per_round``) more solutions for
        every problem in ``pools``; returns how many were added."""
        k = self.settings.solutions_per_round if k is None else k
        return self.add_solutions([i for pool in pools for i in self.pools.members(pool)], k)

    def _add_from(self, source: SolutionSource, requests) -> dict[str, int]:
        found = source.propose(requests, lambda pid: self.bank.take(pid, self.bank.count(pid)))
        return {p.id: self.bank.add_many(p.id, found.get(p.id, [])) for p, _ in requests}

    def sft_pairs(
        self,
        source: SFTSource = "bank",
        per_problem: int | None = None,
        max_total: int | None = None,
    ) -> list[Item]:
        """(question, solution) pairs: ``bank`` (every bank solution), ``redistill`` (latest
        correct RL rollouts, ``per_problem`` each, at most ``max_total``) or ``all`` (both; a
        problem RL has handled gives only its rollouts unless ``keep_rl_bank``), plus replay."""
        if errors := one_of(SFT_SOURCES, sft_source=source):
            raise ValueError(errors[0])
        s = self.settings
        rl_done = set() if s.keep_rl_bank or source == "bank" else set(self.bank.replay_ids())
        items: list[Item] = []
        if source in ("bank", "all"):
            for pid in self.bank.ids():
                if pid not in rl_done:
                    items += [self._pair(pid, t) for t in self.bank.take(pid, self.bank.count(pid))]
        if source in ("redistill", "all"):
            per_problem = per_problem or s.redistill_per_problem
            max_total = max_total if max_total is not None else s.redistill_max_total
            chosen = self.bank.redistill_set(per_problem, max_total, s.seed)
            items += [self._pair(pid, text) for pid, text in chosen]
        return items + self._replay_for(len(items))

    def _replay_for(self, n_new: int) -> list[Item]:
        """Replayed pairs making up ``replay_fraction`` of a set of ``n_new`` new pairs."""
        fraction = self.settings.replay_fraction
        if not self.replay_pairs or not n_new or not fraction:
            return []
        want = round(n_new * fraction / (1 - fraction))
        rng = random.Random(derive_seed("replay", self.settings.seed, n_new))
        return [dict(rng.choice(self.replay_pairs)) for _ in range(want)]

    def _pair(self, pid: str, solution: str) -> Item:
        return {"id": pid, "question": self.problems[pid].question, "solution": solution}

    def mastered(self) -> list[Item]:
        """The mastered set the forgetting guard protects (:mod:`coscale.sft.forgetting`):
        ``{"id", "question", "solution"}`` per solved problem, the solution its latest correct
        RL rollout, else its first bank solution (a solved problem with neither is left out)."""
        solved, bank = self.pools.members(Pool.SOLVED), self.bank
        texts = [bank.latest_correct(p) or next(iter(bank.take(p, 1)), None) for p in solved]
        return [self._pair(pid, text) for pid, text in zip(solved, texts) if text is not None]

    # ------------------------------------------------- computation scaling (RL)
    def use_schedule(self, schedule: NSchedule) -> NSchedule:
        """Installs ``schedule`` unless the curriculum has one (built with it, or installed);
        returns the one in use. The one way a run or a callback attaches Rollout N."""
        if self.schedule is None:
            self.schedule = schedule
        return self.schedule

    def start_rollout_n(self, lr: float | None, afresh: bool) -> dict[str, float]:
        """Where RL starts Rollout N (the run's RL stage and ``RolloutNSchedule``): every N back
        to ``n_init`` when ``afresh``, then the solvable problems grouped (:meth:`assign_groups`);
        returns the ``sched/`` metrics."""
        if afresh and self.schedule is not None:
            self.schedule.reset()
        return self.assign_groups(lr)

    @property
    def start_n(self) -> int:
        """Rollout N of a problem no schedule has grouped: the schedule's ``n_init``, else
        :data:`~coscale.loop.schedule.N_INIT`."""
        return N_INIT if self.schedule is None else self.schedule.n_init

    def n_of(self, pid: str) -> int:
        """Rollout N of a problem (its group's N once the schedule has set one)."""
        return self.n_per_problem.get(pid, self.start_n)

    def rl_items(self, groups: Sequence[int] | None = None) -> list[Item]:
        """Solvable problems (of ``groups`` when given), each with its own N."""
        ids = self.pools.members(Pool.SOLVABLE)
        if self.settings.rl_unmeasured:
            ids += [i for i in self.pools.members(Pool.UNSOLVABLE) if not self.pools.history(i)]
        if groups is not None:
            ids = [i for i in ids if self.group_of.get(i, 0) in groups]
        return [self.rl_item(i) for i in ids]

    def rl_item(self, pid: str) -> Item:
        """Problem ``pid`` as RL serves it: its N, and its other dataset columns in ``meta``
        when it has any (what the reward functions get as ``**columns``)."""
        p = self.problems[pid]
        item = {"id": pid, "question": p.question, "answer": p.answer, "n": self.n_of(pid)}
        return item | ({"meta": dict(p.meta)} if p.meta else {})

    def record_rollouts(self, outcomes: Iterable[tuple[str, str, bool]], step: int) -> None:
        """(problem id, text, correct) of one batch: into the epoch's tally, and correct ones
        into the replay buffer."""
        for pid, text, correct in outcomes:
            row = self.tally.setdefault(pid, [0, 0])
            row[0] += 1
            row[1] += int(correct)
            if correct:
                self.bank.record_rollout(pid, text, True, step)

    def close_epoch(self, lr: float | None = None) -> dict[str, float]:
        """End of an RL epoch: the tally becomes one accuracy per trained problem (an RL round
        spent), the schedule takes a step on the groups' means, N is set; returns the ``sched/``
        metrics. Each call closes one epoch: the RL module calls it once per epoch."""
        accs = {}
        for pid, (n, c) in self.tally.items():
            self.pools.record(pid, n, c, cause="rl_epoch")
            self.pools.note_rl_round(pid)
            accs[pid] = c / n
        self.tally = {}
        if accs:
            self.last_epoch_acc = accs
        rewards = self.group_means(accs)
        if self.schedule is not None:
            self.schedule.step(rewards)
        return self.assign_groups(lr, rewards)

    def assign_groups(
        self, lr: float | None = None, rewards: Sequence[float | None] | None = None
    ) -> dict[str, float]:
        """Groups newly solvable problems and writes each grouped problem's N; returns the
        ``sched/`` metrics (N, reward, N_eff, lr / N_eff per group)."""
        sched = self.schedule
        if sched is None:
            return {}
        pools = self.pools
        for pid in pools.members(Pool.SOLVABLE):
            if not 0 <= self.group_of.get(pid, -1) < sched.num_groups:
                self.group_of[pid] = sched.group_for(pools.accuracy(pid), pools.low, pools.high)
        rewards = rewards or [None] * sched.num_groups
        latest = self.group_means({i: pools.accuracy(i) for i in pools.members(Pool.SOLVABLE)})
        p = [r if r is not None else a for r, a in zip(rewards, latest)]
        sched.fit_to_lr(lr, p)
        for pid, g in self.group_of.items():
            if 0 <= g < sched.num_groups:
                self.n_per_problem[pid] = sched.n[g]
        return _sched_metrics(sched.n, rewards, p, lr)

    def group_means(self, acc: dict[str, float]) -> list[float | None]:
        """Mean of ``acc`` over each group's problems (None for a group without any)."""
        num = self.schedule.num_groups if self.schedule is not None else 0
        values: list[list[float]] = [[] for _ in range(num)]
        for pid, a in acc.items():
            if 0 <= (g := self.group_of.get(pid, -1)) < num:
                values[g].append(a)
        return [sum(v) / len(v) if v else None for v in values]

    def n_per_group(self) -> dict[int, int]:
        """Rollout N of each difficulty group that has problems."""
        out: dict[int, int] = {}
        for pid, group in sorted(self.group_of.items()):
            out.setdefault(group, self.n_of(pid))
        return out

    # ------------------------------------------------------------- measurement
    def measure_ids(
        self, pools: Sequence[str] = ("unsolvable", "solvable", "solved"), max_problems=None
    ) -> list[str]:
        """The problems a measurement samples: those in ``pools`` (registration order), a
        seeded subset of ``max_problems`` when set (a new subset each measurement)."""
        ids = [i for i in self.pools.ids() if self.pools.pool_of(i).value in pools]
        if max_problems is None or len(ids) <= max_problems:
            return ids
        rng = random.Random(derive_seed("measure_ids", self.settings.seed, self.measurements))
        return [ids[i] for i in sorted(rng.sample(range(len(ids)), max_problems))]

    def record_measurement(self, counts: dict[str, tuple[int, int]], lr=None) -> dict[str, str]:
        """(samples, correct) per problem -> relabelled pools, groups for newly solvable
        problems; returns each measured problem's pool."""
        pools = {pid: self.pools.record(pid, n, c).value for pid, (n, c) in counts.items()}
        self.measurements += 1
        self.assign_groups(lr)
        return pools

    # ------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything above that changes, JSON-serialisable."""
        return {
            "pools": self.pools.state_dict(),
            "bank": self.bank.state_dict(),
            "group_of": dict(self.group_of),
            "n_per_problem": dict(self.n_per_problem),
            "schedule": None if self.schedule is None else self.schedule.state_dict(),
            "tally": {k: list(v) for k, v in self.tally.items()},
            "last_epoch_acc": dict(self.last_epoch_acc),
            "measurements": self.measurements,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pools.load_state_dict(state["pools"])
        self.bank.load_state_dict(state["bank"])
        self.group_of = {k: int(v) for k, v in state["group_of"].items()}
        self.n_per_problem = {k: int(v) for k, v in state["n_per_problem"].items()}
        if self.schedule is not None and state["schedule"] is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.tally = {k: list(v) for k, v in state["tally"].items()}
        self.last_epoch_acc = dict(state["last_epoch_acc"])
        self.measurements = int(state["measurements"])


def _sched_metrics(n, rewards, p, lr) -> dict[str, float]:
    metrics = {f"sched/n_group{g}": float(n_g) for g, n_g in enumerate(n)}
    metrics |= {f"sched/reward_group{g}": r for g, r in enumerate(rewards) if r is not None}
    for g, p_g in enumerate(p):
        if p_g is None:
            continue
        n_eff = effective_rollouts(p_g, n[g])
        metrics[f"sched/n_eff_group{g}"] = n_eff
        if n_eff > 0 and isinstance(lr, (int, float)):
            metrics[f"sched/lr_over_n_eff_group{g}"] = lr / n_eff
    return metrics
