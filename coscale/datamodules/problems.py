"""ProblemDataModule: loads problems into a :class:`~coscale.loop.curriculum.Curriculum` and serves it.

The curriculum owns every piece of the loop's state (pools, histories, the open RL tally, N and
groups, bank, replay buffer) and every rule; this class only reads the sources named in its
settings and, as a :class:`CurriculumDataModule`, serves SFT pairs to an SFT module and solvable
problems with their N to an RL module, saving the curriculum in every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from coscale.checks import as_group, at_least, group_errors, one_of
from coscale.datamodules.serving import CurriculumDataModule, serving_errors
from coscale.loop.curriculum import Curriculum, CurriculumSettings, SFTSource
from coscale.loop.solution_sources import SolutionSource
from coscale.renamed import old_names
from coscale.tasks import BAD_ROW_CHOICES, FieldSettings, load_problems
from coscale.tasks.benchmarks import SOURCE_PREFIX, source_rows
from coscale.tasks.builtin import builtin_rows, is_builtin

Source = str | list[dict[str, Any]] | None


@dataclass(frozen=True)
class ReadSettings:
    """How the problem sources are read.

    Attributes:
        split: Split of a HF data set for ``train`` (and ``sft_replay``).
        val_split: Split of a HF data set for ``val``.
        on_bad_row: ``skip`` (warn and go on) or ``raise`` (list every bad row and stop).
        limit: Keep only the first ``limit`` training problems.
    """

    split: str = "train"
    val_split: str = "test"
    on_bad_row: Literal["skip", "raise"] = "skip"
    limit: int | None = None

    def errors(self) -> list[str]:
        errors = one_of(BAD_ROW_CHOICES, on_bad_row=self.on_bad_row)
        return errors + at_least(1, optional=True, limit=self.limit)


class ProblemDataModule(CurriculumDataModule):
    """Problems -> curriculum -> SFT pairs or RL prompts.

    Args:
        train: Training problems: a JSONL / Parquet file, a ``save_to_disk`` folder, a HF
            ``datasets`` name, a ``builtin:`` / ``source:`` spec, or a list of row dicts.
        val: Held-out problems for validation (same kinds as ``train``), optional.
        fields: Column names of question, answer, solutions and id (a FieldSettings or a dict).
        val_fields: Column names in ``val`` when they differ from ``fields``.
        read: Splits, bad-row handling and a limit for the sources.
        bank_solutions: Each problem's own solutions put in the bank when the data loads:
            None all of them, 0 none. ``coscale run`` defaults to 0: the pipeline hands them out
            ``curriculum.solutions_per_round`` at a time to the problems that stay unsolvable.
        batch_size: Problems per RL step.
        sft_batch_size: (question, solution) pairs per SFT step.
        val_batch_size: Problems per validation batch.
        sft_source: Pairs an SFT module is served: ``bank`` (every bank solution),
            ``redistill`` (latest correct RL rollouts) or ``all`` (both: what re-distillation
            and the final retrain train on).
        teacher: Where solutions beyond the data set's own come from (``class_path`` in YAML).
        sft_replay: Earlier (question, solution) data mixed into every SFT set so that what the
            model already knows is not forgotten: a problem source whose rows have solutions
            (its share: ``curriculum.replay_fraction``).
        curriculum: The loop's rules: pool thresholds, budgets, N, set sizes, seed.
    """

    def __init__(
        self,
        train: Source = None,
        val: Source = None,
        fields: FieldSettings | dict[str, str | None] = FieldSettings(),
        val_fields: FieldSettings | dict[str, str | None] | None = None,
        read: ReadSettings = ReadSettings(),
        bank_solutions: int | None = None,
        batch_size: int = 8,
        sft_batch_size: int = 16,
        val_batch_size: int = 16,
        sft_source: SFTSource = "bank",
        teacher: SolutionSource | None = None,
        sft_replay: Source = None,
        curriculum: CurriculumSettings = CurriculumSettings(),
    ) -> None:
        read, settings = as_group(ReadSettings, read), as_group(CurriculumSettings, curriculum)
        errors = group_errors(read=read, curriculum=settings)
        errors += at_least(0, optional=True, bank_solutions=bank_solutions)
        errors += serving_errors(sft_source, batch_size, sft_batch_size, val_batch_size)
        if errors:
            raise ValueError("ProblemDataModule: " + "; ".join(errors))
        loop_state = Curriculum(settings, teacher=teacher)
        super().__init__(loop_state, sft_source, batch_size, sft_batch_size, val_batch_size)
        self.train_source, self.val_source, self.replay_source = train, val, sft_replay
        self.fields, self.val_fields = fields, val_fields or fields
        self.read, self.bank_solutions = read, bank_solutions
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
        cur, r = self.curriculum, self.read
        if self.train_source is not None:
            train = self._read("train", self.train_source, self.fields, r.split, r.limit)
            cur.add_problems(train)
            if self.bank_solutions != 0:
                own = max((len(p.solutions) for p in cur.problems.values()), default=0)
                cur.add_solutions(list(cur.problems), self.bank_solutions or own, own_only=True)
        if self.replay_source is not None and cur.settings.replay_fraction > 0:
            replay = self._read("sft_replay", self.replay_source, self.fields, r.split)
            cur.replay_pairs = [
                {"id": p.id, "question": p.question, "solution": s}
                for p in replay
                for s in p.solutions[:1]
            ]
        if self.val_source is not None:
            self.val_problems = self._read("val", self.val_source, self.val_fields, r.val_split)
        self.loaded = True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load()  # the problems first: the saved state refers to them by id
        super().load_state_dict(state)

    def _read(self, key: str, source: Source, fields: Any, split: str, limit=None) -> list:
        """The problems of setting ``key`` (its errors name it and the source)."""
        name = f"data.{key}={source}" if isinstance(source, str) else f"data.{key} (rows)"
        rows = _rows_of(source)
        return load_problems(rows, fields, split, self.read.on_bad_row, limit, name=name).problems


def _rows_of(source: Any) -> Any:
    """``builtin:`` and ``source:`` specs become rows; anything else goes to the loaders as is."""
    if isinstance(source, str) and source.startswith(SOURCE_PREFIX):
        return source_rows(source)
    return builtin_rows(source) if is_builtin(source) else source


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"ReadOptions": ReadSettings})
