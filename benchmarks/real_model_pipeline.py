"""CoScale-RL on a real pretrained chat model, measured: ``configs/run/smollm2-135m/pipeline_cpu.yaml``.

Runs the pipeline (or reuses a finished run folder), then measures the base model, the model of
every iteration and the final model on held-out problems of the training patterns (disjoint
from the training problems by construction, :mod:`coscale.tasks.tiers`) and on the easy tier,
with the config's own chat prompt: pass@1 and pass@k with 95% bootstrap intervals. Writes
``results.md`` / ``results.json`` (and the stage times, pools and spend of the run) into
``--out``.

Run: .venv/bin/python benchmarks/real_model_pipeline.py [--n_test 32] [--samples 4] [--reuse]
A second ``--config`` is laid over the first as ``coscale run`` does, e.g. the LoRA overlay:
``--config configs/run/smollm2-135m/pipeline_cpu.yaml --config configs/overlays/lora.yaml``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time

from paired import cpu_line

from coscale.app.cli import pipeline_parser
from coscale.app.demo import evaluate_model, stage_models
from coscale.pipeline import Pipeline
from coscale.run.precision import resolve_precision
from coscale.tasks import tiers

CONFIG = "configs/run/smollm2-135m/pipeline_cpu.yaml"
HELD_OUT = ("T2", "T3", "T3x")  # patterns the run trains on; disjoint problems
EASY = tiers.EASY  # a+b: never trained on


def run_pipeline(configs: list[str], overrides: list[str], reuse: bool):
    """The pipeline's config and results; runs it unless ``reuse`` finds it finished."""
    parser = pipeline_parser()
    files = [arg for config in configs for arg in ("--config", config)]
    init = parser.instantiate(parser.parse_args([*files, *overrides]))
    state = os.path.join(init.pipeline.run_dir, "pipeline_state.json")
    start = time.perf_counter()
    resumed = os.path.exists(state)  # a wall time of this call would not be the run's
    if not (reuse and resumed):
        Pipeline(init.pipeline, init.data).run()
    wall = None if resumed else time.perf_counter() - start
    with open(state) as f:
        saved = json.load(f)
    return init.pipeline, saved, wall


def measure_models(cfg, results, n_test: int, k: int) -> dict:
    """pass@1 / pass@k of every stage's model on every set, prompted as the run was."""
    fmt, tokens = cfg.sampling.prompt, cfg.sampling.max_new_tokens  # the run's, as it sampled
    sets = {name: tiers.problems(name, n_test, seed=1, side="test") for name in HELD_OUT}
    sets[EASY] = tiers.problems(EASY, n_test, seed=1, side="test")
    report: dict = {}
    for label, path in stage_models(cfg, results).items():
        start = time.perf_counter()
        report[label] = {n: evaluate_model(path, p, k, fmt, tokens) for n, p in sets.items()}
        row = ", ".join(f"{n} {v['pass@1'].mean * 100:.1f}" for n, v in report[label].items())
        print(f"[bench] {label} ({time.perf_counter() - start:.0f} s): {row}", flush=True)
    return report


PARTS = ("sampling", "engine_start", "weight_sync", "other")


def stage_table(saved: dict) -> str:
    """Markdown: each stage's wall time and its parts (`coscale.clock`), engine starts."""
    timing = saved.get("timing", {})
    lines = ["| stage | s | " + " | ".join(PARTS) + " | engine starts |", "|---" * 7 + "|"]
    for name, seconds in saved["seconds"].items():
        parts = timing.get(name, {})
        cells = " | ".join(f"{parts[p]:.0f}" if p in parts else "-" for p in PARTS)
        lines.append(f"| {name} | {seconds:.0f} | {cells} | {parts.get('engine_starts', '-')} |")
    total = [sum(t.get(p, 0) for t in timing.values()) for p in PARTS]
    starts = sum(t.get("engine_starts", 0) for t in timing.values())
    cells = " | ".join(f"{v:.0f}" for v in total)
    lines.append(f"| all | {sum(saved['seconds'].values()):.0f} | {cells} | {starts} |")
    return "\n".join(lines)


def table(report: dict, k: int) -> str:
    """Markdown: one row per model, pass@1 and pass@k [95% CI] per set, held-out average."""
    names = [*HELD_OUT, EASY]
    head = "| model | " + " | ".join(f"{n} pass@1 | {n} pass@{k}" for n in names)
    lines = [head + " | held-out avg pass@1 |", "|" + "---|" * (2 * len(names) + 2)]
    for label, row in report.items():
        cells = " | ".join(f"{row[n]['pass@1'].fmt()} | {row[n][f'pass@{k}'].fmt()}" for n in names)
        avg = sum(row[n]["pass@1"].mean for n in HELD_OUT) / len(HELD_OUT)
        lines.append(f"| {label} | {cells} | {avg * 100:.1f} |")
    return "\n".join(lines)


def held_out(report: dict, args: argparse.Namespace) -> str:
    """The held-out section: what was measured, and the table."""
    return (
        f"pass@1 / pass@{args.k} in %, {args.n_test} held-out problems per set, {args.k} samples "
        f"each at temperature 1.0, 95% bootstrap intervals. {', '.join(HELD_OUT)}: the training "
        f"patterns, disjoint problems; {EASY}: the easy tier (a+b), never trained on.\n\n"
        f"{table(report, args.k)}\n\n"
    )


def write(out: str, text: str, payload: dict, run_dir: str) -> None:
    """results.md, results.json and each measurement's per-problem counts (pass_rates/)."""
    os.makedirs(out, exist_ok=True)
    for stage in payload["seconds"]:
        measured = os.path.join(run_dir, stage, "pass_rates.json")
        if os.path.exists(measured):
            os.makedirs(os.path.join(out, "pass_rates"), exist_ok=True)
            shutil.copy(
                measured, os.path.join(out, "pass_rates", stage.replace("/", "_") + ".json")
            )
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(payload, f, indent=1, default=lambda o: vars(o))
    print(text, flush=True)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", help=f"default: {CONFIG}; may be repeated")
    ap.add_argument("--out", default="benchmarks/results/smollm2_pipeline")
    ap.add_argument("--n_test", type=int, default=32, help="0: no held-out measurement")
    ap.add_argument("--samples", "--k", dest="k", type=int, default=4)
    ap.add_argument("--reuse", action="store_true", help="measure a finished run, do not rerun")
    args, overrides = ap.parse_known_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    configs = args.config or [CONFIG]
    cfg, saved, wall = run_pipeline(configs, overrides, args.reuse)
    results = saved["results"]
    report = measure_models(cfg, results, args.n_test, args.k) if args.n_test else {}
    precision, why = resolve_precision(dict(cfg.trainer), cfg.model, cfg.run_dir)
    total = (
        f"{wall / 60:.1f} min" if wall is not None else "resumed or reused run, see the stage times"
    )
    text = (
        f"# {cfg.model} through `{' + '.join(configs)}`\n\n"
        f"Measured {started}: `python benchmarks/real_model_pipeline.py {' '.join(argv)}`; "
        f"{cpu_line()}; {os.cpu_count()} cores; precision {precision.get('precision')} ({why}).\n\n"
        f"Pipeline wall time: {total}.\n\n"
        + (held_out(report, args) if report else "")
        + f"## Stage times (s)\n\n{stage_table(saved)}\n\n"
        f"## Pools after each measurement\n\n```\n"
        + "\n".join(f"{n}: {r}" for n, r in results.items() if isinstance(r, dict))
        + "\n```\n"
    )
    payload = {"report": report, "pipeline": results, "seconds": saved["seconds"]}
    write(args.out, text, payload | {"timing": saved.get("timing", {})}, cfg.run_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
