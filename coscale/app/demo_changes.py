"""Where a run leaves the paper's loop, and the measured figure behind each change.

The paper's loop (docs/method.md): the pools re-measured after each RL epoch, a re-distillation
into the initial model after each iteration, the final retrain from the initial model on the bank
and RL's latest correct rollouts, kept as the final model, no RL after it. The demo's report
lists every setting of the run that differs from it (:func:`changes`), each with the validation
figure that made it ship (:data:`FIGURES`), or says that none is on record; and every setting the
paper leaves open whose value differs from the one the demo was measured against (:data:`CHOSEN`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAPER_LOOP: dict[str, Any] = {
    "pipeline.rl_measure_every": 1,
    "pipeline.redistill_each_iteration": True,
    "pipeline.final.retrain": True,
    "pipeline.final.source": "all",
    "pipeline.final.rl": False,
    "pipeline.final.keep": "retrained",
}
"""The paper's value of every setting that decides the loop's shape (dotted from the config's
top, as the flags spell them)."""

STUDY = "benchmarks/results/study_2026-12-06/study-full.md"
"""The study of the whole demo on the SFT recipe of 2026-12-06 (5e-4 constant, 4 passes per
iteration, 15 in the final retrain; 32-true, 128 validation problems x 8 samples)."""

TODAY_STUDY = "benchmarks/results/study/study-full.md"
"""The same study on the SFT recipe shipped since 2026-12-07 (the ``full`` step of
``benchmarks/study.py``)."""

FIGURES: dict[str, str] = {
    "pipeline.redistill_each_iteration": (
        "the re-distilled model feeds no later stage (iteration k+1's SFT starts from the initial "
        "model on its set plus that iteration's new solutions), so leaving the fit out changes "
        "no later model: seed 0's iteration models were the same files in both arms; it saves "
        f"one SFT fit per iteration (248 s of seed 0's run; {STUDY})"
    ),
    "pipeline.final.source": (
        "the final retrain scored the same on validation on the bank alone as on the bank and "
        f"RL's rollouts (24.0 vs 23.9 pass@1, 3 seeds; {STUDY}) and trains on a third fewer "
        "examples"
    ),
    "pipeline.final.rl": (
        "the final retrain's own RL stage: on the paper's loop it scores 44.2 against 39.6 pass@1 "
        "on validation (3 seeds, every seed ahead: +5.2, +4.6, +4.0; paired 95% [3.2, 6.0]) for "
        f"39,120 rollouts in all against 27,808 ({TODAY_STUDY}, 2026-12-07)"
    ),
    "pipeline.final.keep": (
        "with final.rl the candidates are the final RL model and the last iteration's RL model; "
        f"the better on validation is kept (every seed kept the final RL model; {STUDY})"
    ),
}
"""Each change's validation figure and the study it comes from."""


@dataclass(frozen=True)
class Choice:
    """Settings the paper leaves open, chosen together on validation."""

    chosen: dict[str, Any]  # dotted setting -> the value the demo ships
    before: dict[str, Any]  # the same settings -> the values measured against
    figure: str  # the validation figure and its study


CHOSEN: list[Choice] = [
    Choice(
        {"pipeline.iterations": 1, "data.curriculum.solutions_per_round": 11},
        {"pipeline.iterations": 2, "data.curriculum.solutions_per_round": 6},
        "one iteration whose scaling gives each unsolvable problem 11 teacher solutions "
        "(two iterations of 6 gave a bank as large) scored "
        "44.0 against 44.2 pass@1 on validation for two iterations, both with final.rl (3 seeds: "
        "-4.8, -1.5, +5.7; paired 95% [-3.1, 2.8]: level) for 27,331 rollouts and 48,883 SFT "
        f"examples against 39,120 and 62,988, and a faster demo ({TODAY_STUDY}, 2026-12-07)",
    ),
]
"""The demo's choices among the settings the paper leaves open, each listed in the report with
its figure when the run has the values chosen, with none on record for any other values."""


TODAY = (
    "On the SFT recipe shipped since 2026-12-07 (2e-3 cosine, 2 passes per iteration, 8 in the "
    "final retrain) the demo's changes until that day together (no re-distillation fit, the final "
    "retrain on the bank alone with its own RL stage, the better model kept) scored level with "
    "the paper's loop: 40.3 against 39.6 pass@1 on validation, 3 seeds, paired 95% [-1.7, 3.2] "
    f"({TODAY_STUDY}); of them only final.rl, measured alone on the paper's loop, won"
)
"""The changes of before against the paper's loop on the current recipe, 2026-12-07."""


NONE_ON_RECORD = "no validation figure on record for this change"


def setting(cfg: Any, dotted: str) -> Any:
    """The value of ``dotted`` (``pipeline.final.rl``) in the parsed config."""
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def changes(cfg: Any) -> list[str]:
    """One markdown line per setting of ``cfg`` (the parsed config: ``cfg.pipeline``,
    ``cfg.data``) that leaves the paper's loop or the demo's measured choices, with its figure."""
    lines = []
    for name, paper in PAPER_LOOP.items():
        value = setting(cfg, name)
        if value == paper:
            continue
        why = FIGURES.get(name, NONE_ON_RECORD)
        lines.append(f"- `{name}: {_yaml(value)}` (the paper: `{_yaml(paper)}`): {why}.")
    for choice in CHOSEN:
        values = {name: setting(cfg, name) for name in choice.before}
        if values != choice.before:
            why = choice.figure if values == choice.chosen else NONE_ON_RECORD
            lines.append(
                f"- {_pairs(values)} (the paper sets none; measured against "
                f"{_pairs(choice.before)}): {why}."
            )
    return lines


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"`{name}: {_yaml(value)}`" for name, value in values.items())


def section(cfg: Any) -> str:
    """The report's section on the loop: the changes, or that the run is the paper's loop."""
    found = changes(cfg)
    if not found:
        return f"The loop: the paper's (docs/method.md), no setting changed. {TODAY}."
    head = "The loop: the paper's (docs/method.md) with these changes, each with its figure:"
    return "\n".join([head, *found, f"{TODAY}."])


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
