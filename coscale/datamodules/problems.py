"""ProblemDataModule: the problems, their pools, the solution bank, and what each stage trains on.

It owns the state that changes training (pools, bank with its replay buffer, N and difficulty
group per problem, the RL tally of the current epoch) and saves all of it in every Lightning
checkpoint. In ``mode="rl"`` it serves the *solvable* problems, each with its own Rollout N,
rebuilt every epoch; in ``mode="sft"`` it serves (question, solution) pairs from the bank and
the replay buffer.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from coscale.datamodules.batches import Item, epoch_loader
from coscale.pools import Pool, ProblemPools
from coscale.solution_sources import DatasetSolutions, SolutionSource
from coscale.solutions import SolutionBank
from coscale.tasks import FieldMap, Problem, load_problems
from coscale.tasks.benchmarks import SOURCE_PREFIX, source_rows
from coscale.tasks.builtin import builtin_rows, is_builtin

Mode = Literal["rl", "sft"]
SFTSource = Literal["bank", "redistill", "all"]


class ProblemDataModule(L.LightningDataModule):
    """Problems -> pools -> SFT pairs or RL prompts.

    Args:
        train: Training problems: a JSONL / Parquet file, a ``save_to_disk`` folder, a HF
            ``datasets`` name, or a list of row dicts.
        val: Held-out problems for validation (same kinds as ``train``), optional.
        fields: Column names of question, answer, solutions and id.
        val_fields: Column names in ``val`` when they differ from ``fields``.
        split: Split of a HF data set for ``train``.
        val_split: Split of a HF data set for ``val``.
        on_bad_row: ``skip`` (warn and go on) or ``raise`` (list every bad row and stop).
        limit: Keep only the first ``limit`` training problems.
        mode: ``rl`` serves solvable problems with their N; ``sft`` serves solution pairs.
        batch_size: Problems per RL step.
        sft_batch_size: (question, solution) pairs per SFT step.
        val_batch_size: Problems per validation batch.
        rollout_n: Default Rollout N of a problem that no schedule has set.
        solutions_per_round: Solutions added to each unsolvable problem per data-scaling round.
        sft_source: ``bank`` (bank of the problems RL has not handled), ``redistill`` (latest
            correct rollout per RL problem) or ``all`` (both; re-distillation and final retrain).
        redistill_per_problem: Latest correct rollouts taken per problem for re-distillation.
        redistill_max_total: Cap on the re-distillation set (a seeded subset beyond it).
        sft_keep_rl_bank: With ``sft_source=all``, keep the bank solutions of problems RL has
            handled too, next to their latest correct rollouts. The paper keeps only the
            rollouts; with few RL epochs per problem that drops what the first SFT taught (the
            built-in demo measured it: re-distilled pass@1 fell back to the base's).
        low: Accuracy at which a problem becomes solvable.
        high: Accuracy at which a problem counts as solved.
        max_solutions: Solution budget of a problem before it is marked failed.
        max_rl_rounds: RL epochs a problem may take before it is marked failed.
        teacher: Where solutions beyond the data set's own come from (``class_path`` in YAML).
        sft_replay: Earlier (question, solution) data mixed into every SFT set so that what the
            model already knows is not forgotten: a problem source whose rows have solutions.
        sft_replay_fraction: Share of replayed pairs in an SFT set, in [0, 1).
        rl_unmeasured: Also serve problems never measured yet to RL (a plain GRPO run on a data
            set, without a pass-rate evaluation first). Off for the CoScale-RL pipeline.
        seed: Seed of the per-epoch shuffle and of the re-distillation subset.
    """

    def __init__(
        self,
        train: str | list[dict[str, Any]] | None = None,
        val: str | list[dict[str, Any]] | None = None,
        fields: FieldMap = FieldMap(),
        val_fields: FieldMap | None = None,
        split: str = "train",
        val_split: str = "test",
        on_bad_row: Literal["skip", "raise"] = "skip",
        limit: int | None = None,
        mode: Mode = "rl",
        batch_size: int = 8,
        sft_batch_size: int = 16,
        val_batch_size: int = 16,
        rollout_n: int = 8,
        solutions_per_round: int = 4,
        sft_source: SFTSource = "bank",
        redistill_per_problem: int = 1,
        redistill_max_total: int | None = None,
        sft_keep_rl_bank: bool = False,
        low: float = 0.05,
        high: float = 0.70,
        max_solutions: int = 64,
        max_rl_rounds: int = 8,
        teacher: SolutionSource | None = None,
        sft_replay: str | list[dict[str, Any]] | None = None,
        sft_replay_fraction: float = 0.0,
        rl_unmeasured: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check_settings(
            mode=mode,
            sft_source=sft_source,
            on_bad_row=on_bad_row,
            batch_size=batch_size,
            sft_batch_size=sft_batch_size,
            val_batch_size=val_batch_size,
            rollout_n=rollout_n,
            solutions_per_round=solutions_per_round,
            redistill_per_problem=redistill_per_problem,
            limit=limit,
        )
        self.train_source, self.val_source = train, val
        self.fields, self.split, self.val_split = fields, split, val_split
        self.val_fields = val_fields or fields
        self.on_bad_row, self.limit = on_bad_row, limit
        self.mode, self.sft_source = mode, sft_source
        self.batch_size, self.sft_batch_size, self.val_batch_size = (
            batch_size,
            sft_batch_size,
            val_batch_size,
        )
        self.rollout_n, self.solutions_per_round = rollout_n, solutions_per_round
        self.redistill_per_problem, self.redistill_max_total = (
            redistill_per_problem,
            redistill_max_total,
        )
        self.teacher, self.seed, self.rl_unmeasured = teacher, seed, rl_unmeasured
        self.sft_keep_rl_bank = sft_keep_rl_bank
        if not 0 <= sft_replay_fraction < 1:
            raise ValueError(f"sft_replay_fraction must be in [0, 1), got {sft_replay_fraction}")
        self.sft_replay, self.sft_replay_fraction = sft_replay, sft_replay_fraction
        self.replay_pairs: list[Item] = []
        self.pools = ProblemPools(
            low=low, high=high, max_solutions=max_solutions, max_rl_rounds=max_rl_rounds
        )
        self.bank = SolutionBank()
        self.problems: dict[str, Problem] = {}
        self.val_problems: list[Problem] = []
        self.n_per_problem: dict[str, int] = {}
        self.group_of: dict[str, int] = {}
        self.rl_groups: list[int] | None = None
        self.tally: dict[str, list[int]] = {}  # id -> [samples, correct] of the open RL epoch
        self.tally_epoch: int | None = None  # the epoch the open tally belongs to
        self.last_epoch_acc: dict[str, float] = {}
        self.progress = {"epoch": -1, "consumed": 0}
        self._resume: dict[str, int] | None = None

    # ----------------------------------------------------------------- loading
    def setup(self, stage: str | None = None) -> None:
        self.load()
        trainer = self.trainer
        if trainer is not None and trainer.reload_dataloaders_every_n_epochs != 1:
            rank_zero_info(
                "ProblemDataModule: reloading the train loader every epoch (pools change)"
            )
            trainer.reload_dataloaders_every_n_epochs = 1

    def load(self) -> None:
        """Reads the problems once and registers them all (as unsolvable) in the pools."""
        if not self.problems and self.train_source is not None:
            result = load_problems(
                _rows_of(self.train_source), self.fields, self.split, self.on_bad_row, self.limit
            )
            self.add_problems(result.problems)
        if not self.replay_pairs and self.sft_replay is not None and self.sft_replay_fraction > 0:
            replay = load_problems(
                _rows_of(self.sft_replay), self.fields, self.split, self.on_bad_row
            )
            self.replay_pairs = [
                {"id": p.id, "question": p.question, "solution": s}
                for p in replay.problems
                for s in p.solutions[:1]
            ]
        if not self.val_problems and self.val_source is not None:
            result = load_problems(
                _rows_of(self.val_source), self.val_fields, self.val_split, self.on_bad_row
            )
            self.val_problems = result.problems

    def add_problems(self, problems: Iterable[Problem]) -> None:
        """Adds problems from code (the plug-in path); ids must be unique."""
        for p in problems:
            if p.id in self.problems:
                raise ValueError(f"duplicate problem id {p.id!r}")
            self.problems[p.id] = p
            self.pools.add(p.id)

    # ------------------------------------------------------- data scaling (SFT)
    def scale_solutions(
        self, k: int | None = None, pools: Sequence[Pool] = (Pool.UNSOLVABLE,)
    ) -> int:
        """Adds up to ``k`` new solutions to every problem in ``pools``; returns how many were added.

        The data set's own solutions come first, then ``teacher``. A problem whose budget is spent
        is marked failed by the pools.
        """
        k = self.solutions_per_round if k is None else k
        return self.add_solutions([i for pool in pools for i in self.pools.members(pool)], k)

    def add_solutions(self, ids: Sequence[str], k: int) -> int:
        """Adds up to ``k`` new solutions to each problem in ``ids``; returns how many were added."""
        requests = [(self.problems[i], k) for i in ids]
        added = self._add_from(DatasetSolutions(), requests)
        if self.teacher is not None:
            short = [(self.problems[i], k - got) for i, got in added.items() if got < k]
            for i, got in self._add_from(self.teacher, short).items():
                added[i] += got
        for i in ids:
            self.pools.note_solutions(i, self.bank.count(i))
        return sum(added.values())

    def _add_from(self, source: SolutionSource, requests) -> dict[str, int]:
        found = source.propose(requests, lambda pid: self.bank.take(pid, self.bank.count(pid)))
        return {p.id: sum(self.bank.add(p.id, s) for s in found.get(p.id, [])) for p, _ in requests}

    def sft_items(self) -> list[Item]:
        """(question, solution) pairs of the current ``sft_source``."""
        rl_done = set() if self.sft_keep_rl_bank else set(self.bank.replay_ids())
        items: list[Item] = []
        if self.sft_source in ("bank", "all"):
            for pid in self.bank.ids():
                if self.sft_source == "bank" or pid not in rl_done:
                    items += [self._pair(pid, s) for s in self.bank.take(pid, self.bank.count(pid))]
        if self.sft_source in ("redistill", "all"):
            chosen = self.bank.redistill_set(
                self.redistill_per_problem, self.redistill_max_total, self.seed
            )
            items += [self._pair(pid, text) for pid, text in chosen]
        return items + self._replay_for(len(items))

    def _replay_for(self, n_new: int) -> list[Item]:
        """Replayed pairs making up ``sft_replay_fraction`` of an SFT set of ``n_new`` new pairs."""
        if not self.replay_pairs or not n_new:
            return []
        want = round(n_new * self.sft_replay_fraction / (1 - self.sft_replay_fraction))
        rng = random.Random(self.seed + n_new)
        return [dict(rng.choice(self.replay_pairs)) for _ in range(want)]

    def _pair(self, pid: str, solution: str) -> Item:
        return {"id": pid, "question": self.problems[pid].question, "solution": solution}

    # ------------------------------------------------------ computation scaling (RL)
    def n_of(self, problem_id: str) -> int:
        """Rollout N of a problem (its group's N once a schedule has set one)."""
        return self.n_per_problem.get(problem_id, self.rollout_n)

    def rl_items(self) -> list[Item]:
        """Solvable problems (of ``rl_groups`` when set), each with its own N."""
        ids = self.pools.members(Pool.SOLVABLE)
        if self.rl_unmeasured:
            ids += [i for i in self.pools.members(Pool.UNSOLVABLE) if not self.pools.history(i)]
        if self.rl_groups is not None:
            ids = [i for i in ids if self.group_of.get(i, 0) in self.rl_groups]
        return [self.rl_item(i) for i in ids]

    def rl_item(self, pid: str) -> Item:
        p = self.problems[pid]
        return {"id": pid, "question": p.question, "answer": p.answer, "n": self.n_of(pid)}

    def tally_rl(self, problem_id: str, n_samples: int, n_correct: int) -> None:
        """Counts one RL group's outcome towards the problem's accuracy of this epoch."""
        self.tally_epoch = self.progress["epoch"]
        row = self.tally.setdefault(problem_id, [0, 0])
        row[0] += n_samples
        row[1] += n_correct

    def close_rl_epoch(self) -> dict[str, float]:
        """Records the epoch's RL accuracy of every trained problem in the pools (idempotent).

        Returns the accuracy per problem that was recorded.
        """
        accs = {}
        for pid, (n, c) in self.tally.items():
            self.pools.record(pid, n, c)
            self.pools.note_rl_round(pid)
            accs[pid] = c / n
        if accs:
            self.last_epoch_acc = accs
        self.tally, self.tally_epoch = {}, None
        return accs

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self):
        epoch = (
            self.trainer.current_epoch if self.trainer is not None else self.progress["epoch"] + 1
        )
        resume, self._resume = self._resume, None
        skip = resume["consumed"] if resume and resume["epoch"] == epoch else 0
        self.progress = {"epoch": epoch, "consumed": skip}  # skip: batches done before a restart
        if self.mode == "rl":
            if self.tally_epoch is not None and self.tally_epoch < epoch:
                self.close_rl_epoch()  # restored from a checkpoint taken at that epoch's end
            return epoch_loader(self.rl_items, self.batch_size, self.seed, epoch, skip)
        return epoch_loader(self.sft_items, self.sft_batch_size, self.seed, epoch, skip)

    def val_dataloader(self):
        rows = [{"id": p.id, "question": p.question, "answer": p.answer} for p in self.val_problems]
        if not rows:
            return []
        return epoch_loader(lambda: rows, self.val_batch_size, seed=0, epoch=-1, pad=False)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training:
            self.progress["consumed"] += 1
        return batch

    # -------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "pools": self.pools.state_dict(),
            "bank": self.bank.state_dict(),
            "n_per_problem": dict(self.n_per_problem),
            "group_of": dict(self.group_of),
            "rl_groups": self.rl_groups,
            "tally": {k: list(v) for k, v in self.tally.items()},
            "tally_epoch": self.tally_epoch,
            "last_epoch_acc": dict(self.last_epoch_acc),
            "progress": dict(self.progress),
            "mode": self.mode,
            "sft_source": self.sft_source,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load()
        self.pools.load_state_dict(state["pools"])
        self.bank.load_state_dict(state["bank"])
        self.n_per_problem = dict(state["n_per_problem"])
        self.group_of = {k: int(v) for k, v in state["group_of"].items()}
        self.rl_groups = state["rl_groups"]
        self.tally = {k: list(v) for k, v in state["tally"].items()}
        self.tally_epoch = state["tally_epoch"]
        self.last_epoch_acc = dict(state["last_epoch_acc"])
        self.progress = dict(state["progress"])
        self._resume = dict(state["progress"])
        self.mode, self.sft_source = state["mode"], state["sft_source"]


def _rows_of(source: Any) -> Any:
    """``builtin:`` and ``source:`` specs become rows; anything else goes to the loaders as is."""
    if isinstance(source, str) and source.startswith(SOURCE_PREFIX):
        return source_rows(source)
    return builtin_rows(source) if is_builtin(source) else source


def _check_settings(**settings: Any) -> None:
    """Collects every bad setting and raises once, naming each flag."""
    errors = []
    choices = {
        "mode": ("rl", "sft"),
        "sft_source": ("bank", "redistill", "all"),
        "on_bad_row": ("skip", "raise"),
    }
    for name, allowed in choices.items():
        if (value := settings.pop(name)) not in allowed:
            errors.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    for name, value in settings.items():
        if value is not None and value < 1:
            errors.append(f"{name} must be >= 1, got {value}")
    if errors:
        raise ValueError("ProblemDataModule: " + "; ".join(errors))
