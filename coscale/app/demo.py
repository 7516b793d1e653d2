"""``coscale demo``: CoScale-RL on the built-in task and the shipped base model, end to end.

Runs the pipeline of ``coscale/configs/demo.yaml``, then measures the base model, the model of
every iteration and the final model on the four held-out sets (and the easy tier, to show
nothing learned earlier is lost), and writes a table with 95% intervals, PNG plots and a W&B
(offline) run into the run folder.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

from coscale.app import demo_changes
from coscale.app.report_engine import ReportEngine
from coscale.distributed import is_writer
from coscale.models.prompting import PromptSettings
from coscale.modules.artifacts import log_files
from coscale.rollout.base import SamplingParams
from coscale.run.precision import cpu_line
from coscale.scoring.stats import Estimate, mean_of_sets, paired_difference, pass_at_k_estimate
from coscale.tasks import tiers

QUICK = [
    "--pipeline.iterations",
    "1",
    "--pipeline.rl_epochs",
    "1",
    "--pipeline.sft_epochs",
    "1",
    "--pipeline.final.epochs",
    "1",
    "--pipeline.measure_samples",
    "8",
    "--data.train",
    "builtin:tiers?T3=4&T3v=4&T3w=4&T3x=4",
    "--data.val",
    "builtin:tiers?T3=4&T3v=4&T3w=4&T3x=4&side=val",
]
SETS = (*tiers.BENCHMARKS, tiers.EASY)
TEST_SEED = 1
"""Seed of the test sets (test side): no setting of the run draws from it."""


def test_sets(n_test: int) -> dict[str, list]:
    """The report's test sets: ``n_test`` test-side problems of each of :data:`SETS`."""
    return {name: tiers.problems(name, n_test, TEST_SEED, "test") for name in SETS}


def sets_line(val_source: object, n_test: int) -> str:
    """Which problems chose and which scored: the validation source, the test sets."""
    val = f"`{val_source}`" if isinstance(val_source, str) else "none (the training problems)"
    return (
        f"Validation (checkpoint selection, final keep rule): {val}. Test (scored once, here): "
        f"{n_test} test-side problems of each of {', '.join(SETS)}, seed {TEST_SEED}."
    )


def demo_config() -> str:
    return str(resources.files("coscale") / "configs" / "demo.yaml")


def demo_parser():
    """The parser of ``coscale demo``: ``coscale run``'s settings, on top of ``demo.yaml``."""
    from coscale.app.run_config import pipeline_parser

    parser = pipeline_parser(
        prog="coscale demo",
        description=(
            "CoScale-RL on the built-in task and the shipped base model, then pass@k of every"
            " stage on the held-out sets (table, plots, W&B offline run in the run folder)."
            " Settings come from coscale/configs/demo.yaml; every flag below overrides one."
        ),
    )
    parser.add_argument(
        "--quick", action="store_true", help="one short iteration, 16 held-out problems a set"
    )
    return parser


def run_demo(rest: list[str]) -> dict[str, Any]:
    """Parses ``coscale demo [--quick] [overrides]`` and runs it."""
    from coscale.pipeline import Pipeline

    quick = "--quick" in rest
    n_test = 16 if quick else 128
    parser = demo_parser()
    cfg = parser.parse_args(["--config", demo_config(), *(QUICK if quick else []), *rest])
    init = parser.instantiate(cfg)
    pipeline = Pipeline(init.pipeline, init.data)
    try:
        results = pipeline.run(close_logger=False)
        report = evaluate_stages(init.pipeline, results, n_test, samples=8)
        report["sets"] = sets_line(init.data.val_source, n_test)
        report["loop"] = demo_changes.section(cfg)
        precision = pipeline.ctx.trainer_args.get("precision", "32-true")
        report["machine"] = f"Measured on: {cpu_line()}; precision {precision}."
        if is_writer():  # under DDP every rank sampled its share of the report; rank 0 writes it
            write_report(init.pipeline.run_dir, results, report)
            log_to_wandb(pipeline.logger, init.pipeline.run_dir, report)
    finally:
        pipeline.close_logger()  # a W&B run left open would leak into the next one
    return {"pipeline": results, "report": report}


def stage_models(cfg: Any, results: dict[str, Any]) -> dict[str, str]:
    """Base, each iteration's exported model, and the final model, in order."""
    from coscale.models.policy import resolve_model_path

    models = {"base": resolve_model_path(cfg.model)}
    for it in range(1, cfg.iterations + 1):
        # re-distilled, else RL, else SFT model (RL is skipped when nothing is solvable)
        for stage in ("redistill", "rl", "sft"):
            folder = os.path.join(cfg.run_dir, f"it{it}", stage, "model")
            if os.path.exists(folder):
                models[f"iteration {it}"] = folder
                break
    final = os.path.join(cfg.run_dir, "final", "model")
    if os.path.exists(final):
        models["final"] = final
    return models


def evaluate_stages(cfg: Any, results: dict[str, Any], n_test: int, samples: int) -> dict[str, Any]:
    """The table: base and final model, pass@1 and pass@<samples> with intervals on every set.
    The curve: pass@1 of every stage's model (intermediate ones on half the problems and half
    the samples)."""
    sets = test_sets(n_test)
    halves = {name: probs[: n_test // 2] for name, probs in sets.items()}
    engine = ReportEngine(cfg)  # the run's engine kind and sampling definition
    report: dict[str, Any] = {"k": samples, "n_test": n_test, "models": {}, "curve": {}}
    report["temperature"] = engine.temperature
    try:
        for label, path in stage_models(cfg, results).items():
            full = label in ("base", "final")
            kk, use = (samples, sets) if full else (max(1, samples // 2), halves)
            row = {n: evaluate_model(path, probs, kk, engine=engine) for n, probs in use.items()}
            if full:
                report["models"][label] = row
            report["curve"][label] = {name: est["pass@1"] for name, est in row.items()}
            if is_writer():
                print(
                    f"[coscale] evaluated {label}: "
                    + ", ".join(f"{n} {v['pass@1'].mean * 100:.1f}" for n, v in row.items()),
                    flush=True,
                )
    finally:
        engine.close()
    return report


def evaluate_model(
    path: str,
    problems: list,
    samples: int,
    fmt: PromptSettings | None = None,
    max_new_tokens: int | None = None,
    engine: ReportEngine | None = None,
) -> dict[str, Estimate]:
    """pass@1 and pass@<samples> of the model at ``path`` on ``problems`` (a set the report
    shows), from :func:`count_correct`'s ``samples`` per problem."""
    correct = count_correct(
        path, problems, samples, fmt=fmt, max_new_tokens=max_new_tokens, engine=engine
    )
    return {f"pass@{m}": pass_at_k_estimate(samples, correct, m) for m in (1, samples)}


def count_correct(
    path: str,
    problems: list,
    samples: int,
    seed: int = 0,
    fmt: PromptSettings | None = None,
    max_new_tokens: int | None = None,
    engine: ReportEngine | None = None,
) -> list[int]:
    """Correct samples out of ``samples`` of the model at ``path`` per problem, sampled with
    ``engine`` (default: ``ReportEngine()``, the demo task's); ``fmt`` and ``max_new_tokens``
    override its prompt and limit (a chat format uses the model's own chat template)."""
    from coscale.app.benchmark_eval import evaluate
    from coscale.scoring.rewards import MathReward

    own = engine is None
    engine = engine or ReportEngine()
    fmt, limit = fmt or engine.fmt, max_new_tokens or engine.max_new_tokens
    sampling = SamplingParams(max_new_tokens=limit, temperature=engine.temperature, seed=seed)
    try:
        backend, tok = engine.backend_for(path)

        def prompts(questions: list[str]) -> list[str]:
            return [fmt(q, tok) for q in questions]

        with MathReward() as reward:
            (result,) = evaluate(
                backend, prompts, {"": problems}, reward, samples, [1], sampling, 64
            )
    finally:
        if own:
            engine.close()
    return result.correct


def average(report: dict[str, Any], label: str, metric: str = "pass@1") -> float:
    """Mean over the four held-out sets of one model's ``metric``."""
    row = report["models"][label]
    return sum(row[name][metric].mean for name in tiers.BENCHMARKS) / len(tiers.BENCHMARKS)


def average_cell(report: dict[str, Any], label: str, metric: str = "pass@1") -> str:
    """The four-set mean of one model's ``metric`` in %, with its 95% interval (problems
    resampled within each set) where the per-problem values were kept."""
    row = report["models"][label]
    values = [row[name][metric].values for name in tiers.BENCHMARKS]
    if not all(values):
        return f"{average(report, label, metric) * 100:.1f}"
    return mean_of_sets(values).fmt()


def lead_cell(report: dict[str, Any], label: str, other: str, metric: str = "pass@1") -> str:
    """How far ``label``'s four-set mean is ahead of ``other``'s, in points, with the paired 95%
    interval (both measured on the same held-out problems); "" where the values were not kept."""
    first, second = ([report["models"][m][s][metric].values for s in tiers.BENCHMARKS]
                     for m in (label, other))  # fmt: skip
    if not all(first) or not all(second):
        return ""
    return paired_difference(first, second).fmt()


def table(report: dict[str, Any], base: str = "base") -> str:
    """Markdown table: per set pass@1 and pass@k [95% CI] of every model, plus averages and
    each average's lead over that of the model labelled ``base``, in points."""
    k = report["k"]
    head = (
        "| model | "
        + " | ".join(f"{s} pass@1 | {s} pass@{k}" for s in SETS)
        + f" | avg pass@1 (4 sets) | vs {base} (points) |"
    )
    lines = [head, "|" + "---|" * (2 * len(SETS) + 3)]
    reference = average(report, base)
    for label, row in report["models"].items():
        cells = " | ".join(f"{row[s]['pass@1'].fmt()} | {row[s][f'pass@{k}'].fmt()}" for s in SETS)
        lead = (average(report, label) - reference) * 100
        lines.append(f"| {label} | {cells} | {average_cell(report, label)} | {lead:+.1f} |")
    return "\n".join(lines)


def write_report(run_dir: str, results: dict[str, Any], report: dict[str, Any]) -> None:
    """``results.md``, ``results.json`` and the PNG plots in ``run_dir``."""
    from coscale.app.demo_plots import plot_all

    text = table(report)
    with open(os.path.join(run_dir, "results.md"), "w") as f:
        f.write(
            f"pass@1 / pass@{report['k']} in %, {report['n_test']} test problems per set, "
            f"{report['k']} samples each at temperature {report.get('temperature', 1.0)}, 95% "
            f"bootstrap intervals.\n{report.get('sets', '')}\n{report.get('machine', '')}\n\n"
            f"{text}\n\n"
            f"{report.get('loop', '')}\n"
        )
    plain = {
        label: {s: {m: e.plain() for m, e in row.items()} for s, row in rows.items()}
        for label, rows in report["models"].items()
    }
    plain["curve"] = {
        label: {s: e.plain() for s, e in row.items()} for label, row in report["curve"].items()
    }
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump({"report": plain, "pipeline": results}, f, indent=1, default=str)
    plot_all(run_dir, results, report)
    print("\n" + text + "\n", flush=True)


def log_to_wandb(logger: Any, run_dir: str, report: dict[str, Any]) -> None:
    """The table and plots into the pipeline's W&B run (offline without an API key), and the
    report's files (``results.md``, ``results.json``, the plots) as its ``demo-report``
    artifact."""
    if not logger or not hasattr(logger, "log_table"):
        return
    import wandb

    k = report["k"]
    rows = [
        [label, s, row[s]["pass@1"].mean, row[s][f"pass@{k}"].mean]
        for label, row in report["models"].items()
        for s in SETS
    ]
    logger.log_table(
        key="val/demo_results", columns=["model", "set", "pass@1", f"pass@{k}"], data=rows
    )
    plots = sorted(name for name in os.listdir(run_dir) if name.endswith(".png"))
    logger.experiment.log({f"val/{n[:-4]}": wandb.Image(os.path.join(run_dir, n)) for n in plots})
    report_files = ["results.md", "results.json", *plots]
    log_files(logger, [os.path.join(run_dir, n) for n in report_files], "demo-report")
