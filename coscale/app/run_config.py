"""The settings of ``coscale run`` / ``coscale demo``: a ``pipeline`` and a ``data`` section.

Parsing checks every key and type (jsonargparse against the typed signatures) and every value
range (``PipelineConfig`` and the DataModule check theirs when built), before any work starts.
"""

from __future__ import annotations

from typing import Any

RUN_DESCRIPTION = (
    "The whole CoScale-RL pipeline: a warm-up SFT and a measure, then per iteration data"
    " scaling, SFT from the initial model, GRPO with one Rollout N per difficulty group and"
    " re-distillation, then the final retrain. Settings: a YAML with pipeline and data sections"
    " (--config); every flag below overrides one."
)


def pipeline_parser(prog: str = "coscale run", description: str = RUN_DESCRIPTION):
    """The parser of ``coscale run`` (and, named and described as such, ``coscale demo``).
    ``data.bank_solutions`` defaults to 0 here: the pipeline hands a problem's own solutions
    out ``solutions_per_round`` at a time."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import PipelineConfig

    parser = ArgumentParser(
        prog=prog,
        parser_mode="omegaconf",
        description=description,
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML with pipeline and data sections"
    )
    parser.add_class_arguments(PipelineConfig, "pipeline")
    parser.add_class_arguments(ProblemDataModule, "data")
    parser.set_defaults({"data.bank_solutions": 0})
    return parser


def build_run(argv: list[str]) -> tuple[Any, Any]:
    """Parses ``argv`` and builds (PipelineConfig, ProblemDataModule), loading the data, so
    that a bad setting or an unreadable source is refused before the first stage."""
    parser = pipeline_parser()
    init = parser.instantiate(parser.parse_args(argv))
    init.data.load()
    return init.pipeline, init.data
