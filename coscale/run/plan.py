"""The stages of one run, planned once from its settings (each a :class:`Stage` record), and
the run's settings and stage names as its state file holds them.

The pipeline runs the plan in order and takes what a stage is (its kind, its iteration) from its
record, never from its name: the name is only its folder and its key in the state file.

    warmup
    for each iteration k:  it<k>/scale, it<k>/sft, it<k>/measure, it<k>/rl[, it<k>/redistill]
    final/retrain[, final/measure, final/rl], final        (with ``final.retrain``)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Literal

from coscale.models.adapters import config_fields

Kind = Literal["warmup", "scale", "sft", "measure", "rl", "redistill", "retrain", "final"]
LOOP_KINDS: tuple[Kind, ...] = ("scale", "sft", "measure", "rl")
RENAMED = {"eval": "measure"}
"""Stage kinds (the last part of a stage's name) as earlier releases named them -> now."""


@dataclass(frozen=True)
class Stage:
    """One stage of the run."""

    name: str
    """Its folder under ``run_dir`` and its key in ``pipeline_state.json`` (``it1/rl``)."""
    kind: Kind
    """What it runs."""
    iteration: int | None
    """Its outer iteration, 1 to ``iterations``; 0 for the warm-up; None after the loop."""


def plan(cfg: Any) -> dict[str, Stage]:
    """The stages ``cfg`` (a ``PipelineSettings``) runs, in order, by name."""
    stages = [Stage("warmup", "warmup", 0)]
    for it in range(1, cfg.iterations + 1):
        stages += [Stage(f"it{it}/{kind}", kind, it) for kind in LOOP_KINDS]
        # the last iteration's re-distillation is the final retrain when there is one
        last = it == cfg.iterations
        if (cfg.redistill_each_iteration or last) and not (last and cfg.final.retrain):
            stages.append(Stage(f"it{it}/redistill", "redistill", it))
    if cfg.final.retrain:
        stages.append(Stage("final/retrain", "retrain", None))
        if cfg.final.rl:  # the retrain gets its own RL, as every iteration's SFT does
            stages += [Stage("final/measure", "measure", None), Stage("final/rl", "rl", None)]
        stages.append(Stage("final", "final", None))
    return {stage.name: stage for stage in stages}


def upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """A ``pipeline_state.json`` of an earlier release with its stage names as now
    (:data:`RENAMED`: ``it1/eval`` is ``it1/measure``), so that the same run resumes."""

    def now(name: str) -> str:
        head, _, kind = name.rpartition("/")
        return f"{head}/{RENAMED[kind]}" if head and kind in RENAMED else name

    def keys(mapping: dict[str, Any]) -> dict[str, Any]:
        return {now(k): v for k, v in mapping.items()}

    out = dict(state, done=[now(n) for n in state["done"]], models=keys(state["models"]))
    out["results"] = keys(state["results"])
    if isinstance(out["results"].get("spend"), dict):
        out["results"]["spend"] = keys(out["results"]["spend"])
    for part in ("seconds", "timing"):
        out[part] = keys(state.get(part, {}))
    return out


def state_config(cfg: Any) -> dict[str, Any]:
    """A run's ``PipelineSettings`` for the state file: its groups as mappings, other fields as
    they are (JSON writes objects such as a strategy by their str). No ``asdict`` of the whole:
    it would deep-copy a strategy that holds a sharded model, which FSDP2 refuses."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    if cfg.peft is not None:  # a dataclass too, with sets: PEFT's own plain form
        values["peft"] = config_fields(cfg.peft)
    return {k: asdict(v) if is_dataclass(v) else v for k, v in values.items()}
