"""The curriculum over time: one table of pools, bank size and N per group, one row per RL
epoch and per stage, growing on the run's logger across the stages' fits."""

from __future__ import annotations

from types import SimpleNamespace

from coscale.loop.curriculum import Curriculum, CurriculumSettings
from coscale.loop.problem import Problem
from coscale.modules.curriculum_table import log_curriculum, log_module_curriculum


class Tables:
    """A logger that takes tables (as W&B's does) and keeps each key's latest."""

    def __init__(self) -> None:
        self.logged: dict[str, tuple[list[str], list[list]]] = {}

    def log_table(self, key, columns, data) -> None:
        self.logged[key] = (list(columns), [list(row) for row in data])


def test_one_row_per_point_on_one_table_that_grows():
    cur = Curriculum(CurriculumSettings())
    cur.add_problems([Problem("p", "1+1?", "2", ("1+1=2",)), Problem("q", "2+2?", "4")])
    logger, plain = Tables(), SimpleNamespace()  # a logger without tables gets nothing
    log_curriculum([logger, plain], cur, "warmup", None)
    module = SimpleNamespace(global_rank=0, loggers=[logger], run_stage="it1/rl", current_epoch=1)
    log_module_curriculum(module, cur)
    log_module_curriculum(SimpleNamespace(global_rank=1, loggers=[logger]), cur)  # rank 0 only
    columns, rows = logger.logged["curriculum"]
    assert columns[:7] == ["stage", "epoch", "unsolvable", "solvable", "solved", "failed", "bank"]
    assert [r[:2] for r in rows] == [["warmup", None], ["it1/rl", 1]]
    assert rows[0][2:7] == [2, 0, 0, 0, cur.bank.total()]
    assert vars(plain) == {}
