"""Does each iteration add, on validation? Arms x seeds of the demo's pipeline, scored on validation.

Each arm is the demo's config (``coscale/configs/demo.yaml``) with a few overrides (:data:`ARMS`);
each seed sets the run's seed and the curriculum's (the same problems for every seed). Every run
is a ``coscale run`` in its own folder under ``--out``: a run that stopped resumes from its
checkpoints, a scored run is skipped, so the study can be stopped and started again. Each
stage's model (the base, every iteration's, the final one when there is one) is scored on the
validation problems (``data.val`` of ``demo.yaml``), ``--samples`` samples each, with the same seeded
samples for every model; nothing here reads the test side.

Writes ``<out>/study.json`` (every run's per-problem scores and pool moves) and ``<out>/study.md``:
per arm and stage, validation pass@1 over the seeds (mean, sd, each seed), and each stage's lead
over the stage before it, seed by seed.

Run: .venv/bin/python benchmarks/loop_study.py --arms measure_each_epoch,rollouts_relabel --seeds 0,1,2
     [--variant iterations] [--out runs/loop_study]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

from paired import code_commit, cpu_line

from coscale.app.demo import QUICK, count_correct, demo_config, stage_models
from coscale.app.report_engine import ReportEngine
from coscale.app.run_config import pipeline_parser
from coscale.scoring.stats import paired_difference

CHANGES_1207 = [
    "--pipeline.redistill_each_iteration", "false",
    "--pipeline.final.source", "bank",
    "--pipeline.final.rl", "true",
    "--pipeline.final.keep", "better",
]  # fmt: skip
"""The demo's changes to the paper's loop until 2026-12-07 (``demo.yaml`` runs the paper's loop
since): the arms measured on that config carry them, so their records keep their meaning."""

NO_REDISTILL = ["--pipeline.redistill_each_iteration", "false"]

PAPER_FINAL_RL = [
    "--pipeline.rl_measure_every", "1",
    "--pipeline.redistill_each_iteration", "true",
    "--pipeline.final.source", "all",
    "--pipeline.final.keep", "retrained",
    "--pipeline.final.rl", "true",
]  # fmt: skip
"""``demo.yaml`` as it ships since 2026-12-07 (the paper's loop with ``final.rl``), spelled out."""

ONE_ITERATION = [
    *PAPER_FINAL_RL,
    "--pipeline.iterations", "1",
    "--data.curriculum.solutions_per_round", "11",
]  # fmt: skip
"""``demo.yaml`` as it ships since 2026-12-07 (afternoon): one iteration of 11 solutions a round."""

ARMS: dict[str, list[str]] = {
    "paper_loop": [
        "--pipeline.rl_measure_every", "1",
        "--pipeline.redistill_each_iteration", "true",
        "--pipeline.final.source", "all",
        "--pipeline.final.rl", "false",
        "--pipeline.final.keep", "retrained",
    ],
    "changes_1207": CHANGES_1207,
    "measure_each_epoch": ["--pipeline.rl_measure_every", "1", *NO_REDISTILL],
    "rollouts_relabel": ["--pipeline.rl_measure_every", "0", *NO_REDISTILL],
    "paper_loop_final_rl": PAPER_FINAL_RL,
    "changes_1207_source_all": [*CHANGES_1207, "--pipeline.final.source", "all"],
    "final_rl_rl2": [*PAPER_FINAL_RL, "--pipeline.rl_epochs", "2"],
    "final_rl_one_iteration": ONE_ITERATION,
    "one_iteration_final5": [*ONE_ITERATION, "--pipeline.final.epochs", "5"],
    "one_iteration_final4": [*ONE_ITERATION, "--pipeline.final.epochs", "4"],
    "one_iteration_replay25": [*ONE_ITERATION, "--data.curriculum.replay_fraction", "0.25"],
    "one_iteration_replay10": [*ONE_ITERATION, "--data.curriculum.replay_fraction", "0.1"],
    "one_iteration_half_batch": [
        *ONE_ITERATION,
        "--data.sft_batch_size", "16", "--pipeline.sft_epochs", "1", "--pipeline.final.epochs", "4",
    ],
    "fixed_n": ["--pipeline.schedule.factor", "1.0", *NO_REDISTILL],
    "redistill": ["--pipeline.redistill_each_iteration", "true"],
    "sft4_rl4": [*CHANGES_1207, "--pipeline.sft_epochs", "4", "--pipeline.rl_epochs", "4"],
    "small128": [
        *CHANGES_1207,
        "--data.train", "builtin:tiers?T3=32&T3v=32&T3w=32&T3x=32&seed=0",
        "--pipeline.sft_epochs", "4", "--pipeline.rl_epochs", "4",
    ],
    "small128_short": [
        *CHANGES_1207,
        "--data.train", "builtin:tiers?T3=32&T3v=32&T3w=32&T3x=32&seed=0",
        "--pipeline.sft_epochs", "3", "--pipeline.final.epochs", "6",
    ],
    "recipe_2026_12_06": [
        *CHANGES_1207,
        "--pipeline.sft_epochs", "4", "--pipeline.rl_epochs", "4", "--pipeline.final.epochs", "15",
        "--pipeline.sft.optimizer.lr", "5.0e-4", "--pipeline.sft.optimizer.decay", "constant",
    ],
}  # fmt: skip
"""Each arm's overrides of ``demo.yaml``. ``paper_loop`` is ``demo.yaml`` as it ships since
2026-12-07 (its overrides spelled out, so the arm stays the paper's loop); ``changes_1207`` is
the demo as it shipped until that day. ``paper_loop_final_rl`` and ``changes_1207_source_all``
change one setting each, to tell which of those changes carried their lead; ``fixed_n`` (Rollout
N stays at ``n_init``: about the schedule's rollouts on this task, where it raises N for few
groups late) and ``redistill`` (a re-distillation fit after each iteration's RL) each turn one
technique off or on, against ``measure_each_epoch`` in the ``iterations`` variant.
``sft4_rl4`` gives the iterations the passes and RL epochs they had before 2026-12-07;
``small128`` and ``small128_short`` train on half the problems; ``recipe_2026_12_06`` is the
demo's SFT recipe before 2026-12-07 (5e-4 constant, 4 passes per iteration, 15 in the final
retrain, 4 RL epochs). The study of 2026-12-06 (``benchmarks/results/study_2026-12-06/``) ran
its arms on that recipe (``demo.yaml`` of commit 5fa5fb2)."""

TWO_ITERATIONS = ["--pipeline.iterations", "2", "--data.curriculum.solutions_per_round", "6"]
"""The loop's length every arm had before the demo went to one iteration (2026-12-07); each arm
starts from it, so the records keep their meaning (``final_rl_one_iteration`` overrides it)."""


def arm_args(arm: str) -> list[str]:
    """``arm``'s overrides of ``demo.yaml``, after :data:`TWO_ITERATIONS`."""
    return [*TWO_ITERATIONS, *ARMS[arm]]


BUDGET_ARM = "final_rl_one_iteration"
"""The ``full`` step's arm whose runs give the baselines their problems, banks and budgets: the
demo as it ships. Until 2026-12-07 (evening) it was ``changes_1207``, with more SFT examples and
rollouts; those records are in ``benchmarks/results/baselines_changes_1207_2026-12-07/``."""

VARIANTS: dict[str, list[str]] = {
    "full": [],
    "iterations": ["--pipeline.final.retrain", "false", "--pipeline.final.rl", "false"],
    "quick": QUICK,
}
"""``iterations``: the iterations only (no final retrain), to see what each iteration adds;
``quick``: ``coscale demo --quick``'s profile (a check that the study runs)."""


PRECISION = "32-true"
"""Every run's precision (recorded in the study's header)."""


def run_dir(out: str, variant: str, arm: str, seed: int) -> str:
    return os.path.join(out, f"{variant}-{arm}-s{seed}")


def train(folder: str, variant: str, arm: str, seed: int) -> float:
    """``coscale run`` of one arm and seed (resumes a stopped one); returns its wall seconds."""
    args = ["--config", demo_config(), "--pipeline.run_dir", folder, "--pipeline.logger", "csv"]
    args += ["--pipeline.seed", str(seed), "--data.curriculum.seed", str(seed)]
    # one precision for every run: `auto` times the machine at each start, and a noisy timing
    # would make arms differ in precision as well as in what they compare
    args += ["--pipeline.trainer.precision", PRECISION]
    args += [*VARIANTS[variant], *arm_args(arm)]
    coscale = os.path.join(os.path.dirname(sys.executable), "coscale")
    start = time.perf_counter()
    with open(folder + ".log", "a") as log:
        subprocess.run([coscale, "run", *args], stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def record(folder: str) -> dict:
    """The run's pool moves, seconds per stage and spend, all stages together, measurements
    included (from its ``pipeline_state.json``)."""
    with open(os.path.join(folder, "pipeline_state.json")) as f:
        state = json.load(f)
    results = state["results"]
    spend = total_spend(results)
    return {"moves": results.get("moves", {}), "stage_seconds": state["seconds"], "spend": spend}


def total_spend(results: dict) -> dict[str, int]:
    """SFT examples and rollouts of every stage of a run together, measurements included (its
    ``pipeline_state.json``'s ``results``)."""
    stages = results.get("spend", {}).values()
    return {k: sum(s.get(k, 0) for s in stages) for k in ("sft_examples", "rollouts")}


def run_settings(folder: str, variant: str, arm: str):
    """The run's parsed settings (its data loaded)."""
    parser = pipeline_parser()
    argv = ["--config", demo_config(), "--pipeline.run_dir", folder, *VARIANTS[variant]]
    init = parser.instantiate(parser.parse_args([*argv, *arm_args(arm)]))
    init.data.load()
    return init


def pass_rates_of(path: str, problems: list, k: int, engine: ReportEngine) -> list[float]:
    return [c / k for c in count_correct(path, problems, k, seed=0, engine=engine)]


def score(folder: str, variant: str, arm: str, k: int) -> dict[str, list[float]]:
    """Per-problem validation pass@1 of every iteration's model of one run."""
    init = run_settings(folder, variant, arm)
    engine = ReportEngine(init.pipeline)
    try:
        models = stage_models(init.pipeline, {})
        if not init.pipeline.final.retrain:  # "final" is then the last iteration's model
            models.pop("final", None)
        return {
            label: pass_rates_of(p, init.data.val_problems, k, engine)
            for label, p in models.items()
        }
    finally:
        engine.close()


def stage_detail(folder: str, variant: str, arm: str, k: int) -> dict[str, dict[str, float]]:
    """Mean pass@1 of every stage's exported model, in run order, on validation and on a seeded
    128 of the training problems (where an iteration's gain goes)."""
    init = run_settings(folder, variant, arm)
    with open(os.path.join(folder, "pipeline_state.json")) as f:
        done = json.load(f)["done"]
    stages = [st for st in done if os.path.isdir(os.path.join(folder, st, "model"))]
    train = list(init.data.problems.values())
    train = random.Random(0).sample(train, min(128, len(train)))
    engine = ReportEngine(init.pipeline)
    try:
        return {
            st: {
                "val": mean(
                    pass_rates_of(
                        os.path.join(folder, st, "model"), init.data.val_problems, k, engine
                    )
                ),
                "train": mean(pass_rates_of(os.path.join(folder, st, "model"), train, k, engine)),
            }
            for st in stages
        }
    finally:
        engine.close()


def merged(path: str, study: dict, arm: str, seed: str, run: dict) -> dict:
    """The study file as it is now (a study of other arms may run beside this one and write
    it), with ``run`` as ``arm``/``seed`` and the header fields of ``study``."""
    now = study
    if os.path.exists(path):
        with open(path) as f:
            now = json.load(f)
    now["runs"].setdefault(arm, {})[seed] = run
    return {**now, **{k: v for k, v in study.items() if k != "runs"}}


def load_study(path: str) -> dict:
    """The study file at ``path`` (no runs yet where there is none): a study resumes from it."""
    if not os.path.exists(path):
        return {"runs": {}}
    with open(path) as f:
        return json.load(f)


def save(path: str, data: dict) -> None:
    """``data`` as JSON at ``path`` (after every run: the study resumes from it)."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def report(path: str, header: str, text: str) -> None:
    """The tables ``text`` under ``header``, in the ``.md`` beside ``path``, and printed."""
    with open(path.replace(".json", ".md"), "w") as f:
        f.write(f"{header}\n\n{text}")
    print(text)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summary(study: dict) -> str:
    """The markdown tables: validation pass@1 per arm and stage, then the leads stage by stage."""
    lines = ["| arm | stage | val pass@1 % (mean, sd) | each seed |", "|---|---|---|---|"]
    leads = ["| arm | stage vs the one before | lead, points (mean, sd) | each seed | paired 95% |"]
    leads.append("|---|---|---|---|---|")
    for arm, runs in study["runs"].items():
        seeds = sorted(runs, key=int)
        stages = list(runs[seeds[0]]["scores"])
        per = {st: [mean(runs[s]["scores"][st]) * 100 for s in seeds] for st in stages}
        for st in stages:
            lines.append(f"| {arm} | {st} | {mean_sd(per[st])} | {each_seed(per[st])} |")
        for before, after in itertools.pairwise(stages):
            diff = [a - b for a, b in zip(per[after], per[before])]
            both = paired_cell(*([runs[s]["scores"][st] for s in seeds] for st in (after, before)))
            leads.append(
                f"| {arm} | {after} vs {before} | {mean_sd(diff)} | {each_seed(diff)} | {both} |"
            )
    text = "\n".join(lines) + "\n\n" + "\n".join(leads) + "\n\n" + arms_table(study)
    return text + stages_table(study)


def arms_table(study: dict) -> str:
    """Each arm's last model against the first arm's, on the seeds both have ("" for one arm)."""
    (first, ref), *others = study["runs"].items()
    lines = [f"| arm vs {first} (last model each) | lead, points (mean, sd) | each seed | paired 95% "
             "| SFT examples / rollouts, mean (the first arm's) |", "|---|---|---|---|---|"]  # fmt: skip
    for arm, runs in others:
        seeds = sorted(set(runs) & set(ref), key=int)
        if not seeds:
            continue
        last = [list(runs[s]["scores"].values())[-1] for s in seeds]
        theirs = [list(ref[s]["scores"].values())[-1] for s in seeds]
        diff = [(mean(a) - mean(b)) * 100 for a, b in zip(last, theirs)]
        lines.append(
            f"| {arm} | {mean_sd(diff)} | {each_seed(diff)} | {paired_cell(last, theirs)} "
            f"| {spend_cell(runs, seeds)} ({spend_cell(ref, seeds)}) |"
        )
    return "\n".join(lines) + "\n\n" if len(lines) > 2 else ""


def spend_cell(runs: dict, seeds: list[str]) -> str:
    """Mean SFT examples and rollouts of the seeds' runs."""
    spent = [runs[s]["spend"] for s in seeds if "spend" in runs[s]]
    if not spent:
        return "not recorded"
    return " / ".join(f"{mean([x[k] for x in spent]):,.0f}" for k in ("sft_examples", "rollouts"))


def stages_table(study: dict) -> str:
    """Every stage's model: pass@1 on validation and on training problems, mean over seeds."""
    lines = ["| arm | stage | val pass@1 % | train pass@1 % (up to 128 problems) | seeds |"]
    lines.append("|---|---|---|---|---|")
    for arm, runs in study["runs"].items():
        detail = [run["stages"] for run in runs.values() if "stages" in run]
        for st in detail[0] if detail else []:
            val, train = ([d[st][key] * 100 for d in detail if st in d] for key in ("val", "train"))
            lines.append(f"| {arm} | {st} | {mean(val):.1f} | {mean(train):.1f} | {len(val)} |")
    return "\n".join(lines) + "\n"


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
"""Student's t, 97.5% quantile, by degrees of freedom (standard tables)."""


def mean_sd(values: list[float]) -> str:
    """Mean over the seeds, their sd and the 95% t interval of the mean (seeds as the sample)."""
    m = mean(values)
    if len(values) < 2:
        return f"{m:.1f} (one seed)"
    sd = statistics.stdev(values)
    half = T975.get(len(values) - 1, 2.262) * sd / math.sqrt(len(values))
    return f"{m:.1f} (sd {sd:.1f}; seeds 95% [{m - half:.1f}, {m + half:.1f}])"


def paired_cell(first: list[list[float]], second: list[list[float]]) -> str:
    """``first - second`` in points, averaged over the seeds, with its 95% interval from the
    problems resampled alike on both sides (the same problems and samples in every seed)."""
    return paired_difference(first, second).fmt()


def each_seed(values: list[float]) -> str:
    """One figure per seed, in seed order."""
    return ", ".join(f"{v:.1f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default="measure_each_epoch,rollouts_relabel")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variant", default="iterations", choices=sorted(VARIANTS))
    parser.add_argument(
        "--samples", "--k", dest="k", type=int, default=8, help="samples per validation problem"
    )
    parser.add_argument("--out", default="runs/loop_study")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"study-{args.variant}.json")
    study = load_study(path)
    study |= {"cpu": cpu_line(), "variant": args.variant, "k": args.k, "precision": PRECISION}
    for arm in args.arms.split(","):
        for seed in args.seeds.split(","):
            runs = study["runs"].setdefault(arm, {})
            if seed in runs:
                continue
            folder = run_dir(args.out, args.variant, arm, int(seed))
            seconds = train(folder, args.variant, arm, int(seed))
            runs[seed] = {"seconds": seconds, "commit": code_commit(), **record(folder)}
            runs[seed]["scores"] = score(folder, args.variant, arm, args.k)
            study = merged(path, study, arm, seed, runs[seed])
            save(path, study)
            print(f"[loop_study] {arm} seed {seed}: {seconds:.0f} s", flush=True)
    for arm in args.arms.split(","):  # where each iteration's gain goes, stage by stage
        for seed, run in study["runs"].get(arm, {}).items():
            folder = run_dir(args.out, args.variant, arm, int(seed))
            if "spend" not in run:  # runs scored before the study recorded it
                run["spend"] = record(folder)["spend"]
            if "stages" not in run and os.path.isdir(folder):  # a run of another machine: none
                run["stages"] = stage_detail(folder, args.variant, arm, args.k)
            study = merged(path, study, arm, seed, run)
            save(path, study)
    header = f"{study['cpu']}\n\nvariant {args.variant}, k {args.k}, {PRECISION}"
    report(path, header, summary(study))


if __name__ == "__main__":
    main()
