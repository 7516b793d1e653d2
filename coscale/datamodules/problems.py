"""ProblemDataModule: loads problems into a :class:`~coscale.loop.curriculum.Curriculum` and serves it.

The curriculum owns every piece of the loop's state (pools, histories, the open RL tally, N and
groups, bank, replay buffer) and every rule; this class only reads the sources named in its
settings and, as a :class:`CurriculumDataModule`, serves SFT pairs to an SFT module and solvable
problems with their N to an RL module, saving the curriculum in every checkpoint.
"""

from __future__ import annotations

from typing import Any, Literal

from coscale.checks import at_least, one_of
from coscale.datamodules.serving import CurriculumDataModule, serving_errors
from coscale.loop.curriculum import Curriculum, CurriculumSettings, SFTSource
from coscale.loop.schedule import NSchedule
from coscale.loop.solution_sources import SolutionSource
from coscale.tasks import BAD_ROW_CHOICES, FieldMap, load_problems
from coscale.tasks.benchmarks import SOURCE_PREFIX, source_rows
from coscale.tasks.builtin import builtin_rows, is_builtin

Source = str | list[dict[str, Any]] | None


class ProblemDataModule(CurriculumDataModule):
    """Problems -> curriculum -> SFT pairs or RL prompts.

    Args:
        train: Training problems: a JSONL / Parquet file, a ``save_to_disk`` folder, a HF
            ``datasets`` name, a ``builtin:`` / ``source:`` spec, or a list of row dicts.
        val: Held-out problems for validation (same kinds as ``train``), optional.
        fields: Column names of question, answer, solutions and id (a FieldMap or a dict).
        val_fields: Column names in ``val`` when they differ from ``fields``.
        split: Split of a HF data set for ``train``.
        val_split: Split of a HF data set for ``val``.
        on_bad_row: ``skip`` (warn and go on) or ``raise`` (list every bad row and stop).
        limit: Keep only the first ``limit`` training problems.
        bank_solutions: Each problem's own solutions put in the bank when the data loads:
            None all of them, 0 none. ``coscale run`` defaults to 0: the pipeline hands them out
            ``solutions_per_round`` at a time to the problems that stay unsolvable.
        batch_size: Problems per RL step.
        sft_batch_size: (question, solution) pairs per SFT step.
        val_batch_size: Problems per validation batch.
        rollout_n: Rollout N of a problem that no schedule has set.
        solutions_per_round: Solutions added to each unsolvable problem per data-scaling round.
        sft_source: Pairs an SFT module is served: ``bank`` (every bank solution),
            ``redistill`` (latest correct RL rollouts) or ``all`` (both: what re-distillation
            and the final retrain train on).
        redistill_per_problem: Latest correct rollouts taken per problem for re-distillation.
        redistill_max_total: Cap on the re-distillation set (a seeded subset beyond it).
        sft_keep_rl_bank: In ``all`` sets, keep the bank solutions of problems RL has handled
            next to their latest correct rollouts. The paper keeps only the rollouts; with few
            RL epochs per problem that drops what the first SFT taught (the built-in demo
            measured it: re-distilled pass@1 fell back to the base's; docs/results.md).
        low: Accuracy at which a problem becomes solvable.
        high: Accuracy at which a problem counts as solved.
        max_solutions: Solution budget of a problem before it is marked failed.
        max_rl_rounds: RL epochs a problem may take before it is marked failed.
        teacher: Where solutions beyond the data set's own come from (``class_path`` in YAML).
        schedule: Rollout N per difficulty group (``RolloutNSchedule`` sets one too).
        sft_replay: Earlier (question, solution) data mixed into every SFT set so that what the
            model already knows is not forgotten: a problem source whose rows have solutions.
        sft_replay_fraction: Share of replayed pairs in an SFT set, in [0, 1).
        rl_unmeasured: Also serve problems never measured yet to RL (a plain GRPO run on a data
            set, without a pass-rate evaluation first). Off for the CoScale-RL pipeline.
        seed: Seed of the per-epoch shuffle and of the re-distillation subset.
    """

    def __init__(
        self,
        train: Source = None,
        val: Source = None,
        fields: FieldMap | dict[str, str | None] = FieldMap(),
        val_fields: FieldMap | dict[str, str | None] | None = None,
        split: str = "train",
        val_split: str = "test",
        on_bad_row: Literal["skip", "raise"] = "skip",
        limit: int | None = None,
        bank_solutions: int | None = None,
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
        schedule: NSchedule | None = None,
        sft_replay: Source = None,
        sft_replay_fraction: float = 0.0,
        rl_unmeasured: bool = False,
        seed: int = 0,
    ) -> None:
        errors = one_of(BAD_ROW_CHOICES, on_bad_row=on_bad_row)
        errors += at_least(1, optional=True, limit=limit) + at_least(
            0, optional=True, bank_solutions=bank_solutions
        )
        settings = CurriculumSettings(
            low=low,
            high=high,
            max_solutions=max_solutions,
            max_rl_rounds=max_rl_rounds,
            rollout_n=rollout_n,
            solutions_per_round=solutions_per_round,
            redistill_per_problem=redistill_per_problem,
            redistill_max_total=redistill_max_total,
            keep_rl_bank=sft_keep_rl_bank,
            replay_fraction=sft_replay_fraction,
            rl_unmeasured=rl_unmeasured,
            seed=seed,
        )
        errors += serving_errors(sft_source, batch_size, sft_batch_size, val_batch_size)
        if errors := errors + settings.errors():
            raise ValueError("ProblemDataModule: " + "; ".join(errors))
        curriculum = Curriculum(settings, teacher=teacher, schedule=schedule)
        super().__init__(curriculum, sft_source, batch_size, sft_batch_size, val_batch_size)
        self.train_source, self.val_source, self.replay_source = train, val, sft_replay
        self.fields, self.val_fields = fields, val_fields or fields
        self.split, self.val_split = split, val_split
        self.on_bad_row, self.limit, self.bank_solutions = on_bad_row, limit, bank_solutions
        self.loaded = False

    @property
    def problems(self):
        """The training problems by id (the curriculum's)."""
        return self.curriculum.problems

    def setup(self, stage: str | None = None) -> None:
        self.load()
        super().setup(stage)

    def load(self) -> None:
        """Reads every source once: training problems into the curriculum (with their own
        solutions in the bank per ``bank_solutions``), replay pairs and held-out problems."""
        if self.loaded:
            return
        cur = self.curriculum
        if self.train_source is not None:
            train = self._read("train", self.train_source, self.fields, self.split, self.limit)
            cur.add_problems(train)
            if self.bank_solutions != 0:
                own = max((len(p.solutions) for p in cur.problems.values()), default=0)
                cur.add_solutions(list(cur.problems), self.bank_solutions or own, own_only=True)
        if self.replay_source is not None and cur.settings.replay_fraction > 0:
            replay = self._read("sft_replay", self.replay_source, self.fields, self.split)
            cur.replay_pairs = [
                {"id": p.id, "question": p.question, "solution": s}
                for p in replay
                for s in p.solutions[:1]
            ]
        if self.val_source is not None:
            self.val_problems = self._read("val", self.val_source, self.val_fields, self.val_split)
        self.loaded = True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load()  # the problems first: the saved state refers to them by id
        super().load_state_dict(state)

    def _read(self, key: str, source: Source, fields: Any, split: str, limit=None) -> list:
        """The problems of setting ``key`` (its errors name it and the source)."""
        name = f"data.{key}={source}" if isinstance(source, str) else f"data.{key} (rows)"
        rows = _rows_of(source)
        return load_problems(rows, fields, split, self.on_bad_row, limit, name=name).problems


def _rows_of(source: Any) -> Any:
    """``builtin:`` and ``source:`` specs become rows; anything else goes to the loaders as is."""
    if isinstance(source, str) and source.startswith(SOURCE_PREFIX):
        return source_rows(source)
    return builtin_rows(source) if is_builtin(source) else source
