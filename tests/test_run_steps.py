"""One step axis for a run: each stage's fit logs at its own step plus the steps of the stages
before it, with the stage's number beside every row."""

from __future__ import annotations

import csv

from coscale.modules.loggers import make_logger
from coscale.modules.run_steps import RunCSVLogger, at_stage


def test_stages_follow_one_another_on_the_run_s_axis(tmp_path):
    logger = make_logger("csv", str(tmp_path), "axis")
    assert isinstance(logger, RunCSVLogger)
    for index, (offset, steps) in enumerate([(0, 3), (3, 0), (3, 2)]):  # sft, measure, rl
        at_stage(logger, offset, index)
        logger.log_metrics({"pool/solvable": 5.0}, step=0)  # measured before the fit
        for step in range(1, steps + 1):  # the fit's own global_step
            logger.log_metrics({"train/loss": 1.0 / step}, step=step)
    logger.save()
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    assert steps == [0, 1, 2, 3, 3, 3, 4, 5]
    assert [r["run/stage"] for r in rows] == ["0.0"] * 4 + ["1.0"] + ["2.0"] * 3
    at_stage(False, 10, 1)  # no logger: nothing to move
