"""The settings of ``coscale run`` / ``coscale demo``: a ``pipeline`` and a ``data`` section.

Parsing checks every key and type (jsonargparse against the typed signatures) and every value
range (``PipelineSettings`` and the DataModule check theirs when built), before any work starts.
"""

from __future__ import annotations

from typing import Any

RUN_DESCRIPTION = (
    "The whole CoScale-RL pipeline: a warm-up SFT and a measure, then per iteration data"
    " scaling, SFT from the initial model, GRPO with one Rollout N per difficulty group and"
    " re-distillation, then the final retrain. Settings: a YAML with pipeline and data sections"
    " (--config); every flag below overrides one."
)


MAPPINGS = ("pipeline.trainer",)
"""The dict-typed settings that several ``--config`` files merge rather than replace (the module
settings are groups of typed arguments: a later file sets only the keys it names)."""


def _set_by_the_run(group: str) -> tuple[set[str], list[str]]:
    """``pipeline.<group>``'s arguments and group fields that the run sets itself
    (:data:`coscale.run.settings.SET_BY_RUN`): whole arguments, left out of the parser,
    and ``<group>.<arg>.<field>`` keys, left unset (None) and refused when a config sets them."""
    from coscale.run.settings import set_by_run

    keys = set_by_run(group)
    whole = {k for k in keys if "." not in k}
    return whole, [f"{group}.{k}" for k in keys if "." in k]


def pipeline_parser(prog: str = "coscale run", description: str = RUN_DESCRIPTION):
    """The parser of ``coscale run`` (and, named and described as such, ``coscale demo``).
    ``data.bank_solutions`` defaults to 0 here: the pipeline hands a problem's own solutions
    out ``solutions_per_round`` at a time."""
    from coscale.app.config_files import merging_config_file
    from coscale.app.run_parser import RunParser
    from coscale.datamodules import ProblemDataModule
    from coscale.loop.schedule import NSchedule
    from coscale.modules import GRPOModule, SFTModule
    from coscale.pipeline import PipelineSettings

    parser = RunParser(prog=prog, parser_mode="omegaconf", description=description)
    parser.add_argument(
        "--config",
        action=merging_config_file(MAPPINGS),
        help="YAML with pipeline and data sections; a later file's mappings add to an earlier's",
    )
    # PipelineSettings fields that are groups of a class's typed arguments in the parser
    groups = {"sft": SFTModule, "grpo": GRPOModule, "schedule": NSchedule}
    parser.add_class_arguments(PipelineSettings, "pipeline", skip=set(groups))
    unset = []
    for key, cls in groups.items():
        skip, fields = _set_by_the_run(key)
        parser.add_class_arguments(cls, f"pipeline.{key}", skip=skip, instantiate=False)
        unset += fields
    parser.add_class_arguments(ProblemDataModule, "data")
    parser.set_defaults({"data.bank_solutions": 0})
    parser.set_defaults({f"pipeline.{key}": None for key in unset})
    return parser


def build_run(argv: list[str]) -> tuple[Any, Any]:
    """Parses ``argv`` and builds (PipelineSettings, ProblemDataModule), loading the data, so
    that a bad setting or an unreadable source is refused before the first stage."""
    config, data, _ = resolved_run(argv)
    return config, data


def resolved_run(argv: list[str]) -> tuple[Any, Any, str]:
    """:func:`build_run`, and the whole resolved config (every setting, defaults included) as
    YAML: what ``<run_dir>/config.yaml`` and the W&B run's config hold."""
    parser = pipeline_parser()
    namespace = parser.parse_args(argv)
    init = parser.instantiate(namespace)
    init.data.load()
    return init.pipeline, init.data, parser.dump(namespace)


def keep_config(text: str, run_dir: str) -> dict[str, Any]:
    """Writes the resolved config ``text`` to ``<run_dir>/config.yaml`` (a resumed run whose
    settings differ from the saved ones says which, then keeps its own); returns it as a dict."""
    import os

    import yaml
    from lightning.pytorch.utilities import rank_zero_only

    from coscale.loop.commit import write_text

    path, now = os.path.join(run_dir, "config.yaml"), yaml.safe_load(text)
    if rank_zero_only.rank != 0:  # every rank parses the same command; rank 0 keeps it
        return now
    if os.path.exists(path):
        with open(path) as f:
            before = yaml.safe_load(f)
        if changed := sorted(_differences(before, now)):
            print(f"[coscale] {path}: this run's settings differ from the saved run's: "
                  f"{', '.join(changed)} (the new ones are saved)", flush=True)  # fmt: skip
    write_text(path, text)
    return now


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys where two nested mappings differ."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [prefix] if a != b else []
    keys = set(a) | set(b)
    return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{prefix}.{k}".lstrip("."))]
