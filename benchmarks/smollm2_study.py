"""CoScale-RL against (h) on a real pretrained chat model, seeds on validation, the test sets once.

The model and task: SmolLM2-135M-Instruct through ``configs/run/smollm2-135m/pipeline_cpu.yaml``
(its 128 training problems, the same for every seed). Per seed (``--pipeline.seed`` and the
curriculum's seed):

* ``coscale``: ``coscale run`` of the config as it ships, in ``<out>/smollm2-coscale-s<seed>``.
* ``h``: SFT from the base on that run's own bank at that run's SFT examples, then GRPO with its
  first Rollout N, fixed, on every training problem at its rollouts (measurements included):
  ``baselines_study.arm_models``, in ``<out>/smollm2-h-s<seed>``. It needs the seed's
  ``coscale`` run.

Every run trains in one precision, chosen from this machine once (``precision: auto``'s timing
of the stages' batch shape, ``coscale.run.precision``) and kept in the study file. Each arm's
models (``coscale``: iteration 1 and the final model; ``h``: its SFT and GRPO models) are scored
on the config's validation problems (``data.val``), ``--samples`` samples each, the same seeded
samples for every model. With ``--test``, once the seeds asked for are trained and scored, each
finished seed's last model of each arm is scored on the test sets (``--n_test`` test-side problems of each training pattern and of the easy tier T1,
seed 1), once: a scored model is never scored again.

Writes ``<out>/study-smollm2.json`` (per-problem scores; resumes from it, two processes on
disjoint ``--seeds`` may share ``--out``) and ``study-smollm2.md``: per arm and model, pass@1
over the seeds, and the ``coscale`` final model's lead over ``h``'s GRPO model, seed by seed and
paired (the same problems and samples), on validation and, once scored, on the test sets.

Run: .venv/bin/python benchmarks/smollm2_study.py --seeds 0,1,2 [--out runs/smollm2_study] [--test]
(``study.py --steps smollm2`` runs it with ``--test``.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from baselines_study import arm_models, finished_state
from loop_study import (
    each_seed,
    load_study,
    mean,
    mean_sd,
    merged,
    paired_cell,
    pass_rates_of,
    report,
    save,
    total_spend,
)
from paired import code_commit, cpu_line

from coscale.app.demo import stage_models
from coscale.app.report_engine import ReportEngine
from coscale.app.run_config import pipeline_parser
from coscale.run.precision import resolve_precision
from coscale.tasks import tiers

CONFIG_NAME = "configs/run/smollm2-135m/pipeline_cpu.yaml"
CONFIG = os.path.join(os.path.dirname(__file__), "..", CONFIG_NAME)
ARMS = ("coscale", "h")
RUNNER = "the coscale arm of its seed (smollm2_study.py --arms coscale)"
LAST = {"coscale": "final", "h": "grpo"}
"""Each arm's last model: the one the leads and the test sets compare."""
TEST_SETS = ("T2", "T2v", "T3", "T3x", tiers.EASY)
"""The config's training patterns (test side: disjoint problems) and the easy tier, never trained."""


def run_dir(out: str, arm: str, seed: int) -> str:
    return os.path.join(out, f"smollm2-{arm}-s{seed}")


def settings(folder: str, seed: int, precision: str):
    """The ``coscale`` run's parsed settings (its data loaded), as ``coscale run`` gets them."""
    parser = pipeline_parser()
    init = parser.instantiate(
        parser.parse_args(["--config", CONFIG, *run_args(folder, seed, precision)])
    )
    init.data.load()
    return init


def run_args(folder: str, seed: int, precision: str) -> list[str]:
    seeds = ["--pipeline.seed", str(seed), "--data.curriculum.seed", str(seed)]
    return ["--pipeline.run_dir", folder, *seeds, "--pipeline.trainer.precision", precision]


def study_precision(study: dict) -> str:
    """The study's precision: the one on record, else this machine's choice for the config."""
    if "precision" in study:
        return study["precision"]
    init = pipeline_parser().parse_args(["--config", CONFIG])
    cfg, data = init.pipeline, init.data
    shape = (data.sft_batch_size, cfg.sft.max_length)
    args, line = resolve_precision(dict(cfg.trainer), cfg.model, shape=shape)
    print(f"[smollm2_study] {line}", flush=True)
    return str(args["precision"])


def train_coscale(folder: str, seed: int, precision: str) -> float:
    """``coscale run`` of the config (resumes a stopped one); returns its wall seconds."""
    coscale = os.path.join(os.path.dirname(sys.executable), "coscale")
    argv = [coscale, "run", "--config", CONFIG, *run_args(folder, seed, precision)]
    start = time.perf_counter()
    with open(folder + ".log", "a") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def coscale_models(folder: str) -> dict[str, str]:
    """The run's iteration models and its final model (not the base: it is not trained)."""
    init = pipeline_parser().instantiate(pipeline_parser().parse_args(["--config", CONFIG]))
    init.pipeline.run_dir = folder
    return {m: p for m, p in stage_models(init.pipeline, {}).items() if m != "base"}


def models_of(out: str, arm: str, seed: int, precision: str) -> tuple[dict[str, str], float, dict]:
    """Trains ``arm``'s models for ``seed`` (kept ones are reused); their folders, the seconds
    it took and the spend."""
    folder, own = run_dir(out, arm, seed), run_dir(out, "coscale", seed)
    start = time.perf_counter()
    if arm == "coscale":
        train_coscale(folder, seed, precision)
        spent = total_spend(finished_state(folder, RUNNER)["results"])
        return coscale_models(folder), time.perf_counter() - start, spent
    state = finished_state(own, RUNNER)
    init = settings(own, seed, precision)
    init.data.load_state_dict({"curriculum": state["curriculum"]})  # the run's bank
    spent = total_spend(state["results"])
    return arm_models(arm, init, spent, seed, folder, precision), time.perf_counter() - start, spent


def score(jobs: dict[str, tuple[str, list]], k: int, init) -> dict[str, list[float]]:
    """Per-problem pass@1 of each label's (model folder, problems), on one engine, sampled as the
    run samples (its engine and prompt)."""
    engine = ReportEngine(init.pipeline)
    try:
        return {label: pass_rates_of(m, probs, k, engine) for label, (m, probs) in jobs.items()}
    finally:
        engine.close()


def validation(args, study: dict, path: str) -> dict:
    """Trains and scores every arm and seed not on record yet."""
    for seed in args.seeds.split(","):
        for arm in args.arms.split(","):
            if seed in study["runs"].setdefault(arm, {}):
                continue
            models, seconds, spent = models_of(args.out, arm, int(seed), study["precision"])
            init = settings(run_dir(args.out, "coscale", int(seed)), int(seed), study["precision"])
            run = {"seconds": seconds, "spend": spent, "commit": code_commit()}
            val = init.data.val_problems
            run["scores"] = score({m: (p, val) for m, p in models.items()}, args.k, init)
            study = merged(path, study, arm, seed, run)
            save(path, study)
            print(f"[smollm2_study] {arm} seed {seed}: {seconds:.0f} s", flush=True)
    return study


def test_once(args, study: dict, path: str) -> dict:
    """Scores the last model of each arm of every finished seed on the test sets, once."""
    sets = {name: tiers.problems(name, args.n_test, 1, "test") for name in TEST_SETS}
    for arm, runs in study["runs"].items():
        for seed, run in runs.items():
            if "test" in run or seed not in args.seeds.split(","):
                continue
            model = last_model(args.out, arm, int(seed))
            init = settings(run_dir(args.out, "coscale", int(seed)), int(seed), study["precision"])
            run["test"] = score({n: (model, probs) for n, probs in sets.items()}, args.k, init)
            study = merged(path, study, arm, seed, run)
            save(path, study)
            print(f"[smollm2_study] test: {arm} seed {seed} scored", flush=True)
    return study


def last_model(out: str, arm: str, seed: int) -> str:
    """The folder of ``arm``'s last model (:data:`LAST`) for ``seed``."""
    if arm == "coscale":
        return coscale_models(run_dir(out, arm, seed))[LAST[arm]]
    return os.path.join(run_dir(out, arm, seed), LAST[arm], "model")


def summary(study: dict) -> str:
    """Validation pass@1 per arm and model, the lead of ``coscale`` over ``h``, and the test
    sets' table once scored."""
    lines = ["| arm | model | val pass@1 % (mean, sd) | each seed |", "|---|---|---|---|"]
    for arm, runs in study["runs"].items():
        seeds = sorted(runs, key=int)
        for model in runs[seeds[0]]["scores"] if seeds else []:
            per = [mean(runs[s]["scores"][model]) * 100 for s in seeds]
            lines.append(f"| {arm} | {model} | {mean_sd(per)} | {each_seed(per)} |")
    text = "\n".join(lines) + "\n\n" + lead_table(study, "validation", _val) + "\n"
    return text + test_table(study)


def _val(run: dict, arm: str) -> list[float]:
    return run["scores"][LAST[arm]]


def _test(run: dict, arm: str) -> list[float]:
    """The training patterns' test problems as one list (equal sets: the patterns' mean)."""
    return [v for name in TEST_SETS[:-1] for v in run["test"][name]]


def lead_table(study: dict, label: str, values) -> str:
    """``coscale``'s last model ahead of ``h``'s, on the seeds both have (``values``: a run's
    per-problem scores)."""
    ours, theirs = study["runs"].get("coscale", {}), study["runs"].get("h", {})
    seeds = [
        s for s in sorted(set(ours) & set(theirs), key=int) if _has(ours[s], theirs[s], values)
    ]
    if not seeds:
        return f"{label}: no seed with both arms yet\n"
    a, b = [values(ours[s], "coscale") for s in seeds], [values(theirs[s], "h") for s in seeds]
    diff = [(mean(x) - mean(y)) * 100 for x, y in zip(a, b)]
    head = f"| {label}: coscale final ahead of h | points (mean, sd) | each seed | paired 95% |"
    return f"{head}\n|---|---|---|---|\n| seeds {', '.join(seeds)} | {mean_sd(diff)} | {each_seed(diff)} | {paired_cell(a, b)} |\n"


def _has(ours: dict, theirs: dict, values) -> bool:
    try:
        values(ours, "coscale"), values(theirs, "h")
    except KeyError:
        return False
    return True


def test_table(study: dict) -> str:
    """Each arm's last model on each test set, mean over the scored seeds, then the lead."""
    lines = ["| arm (last model) | " + " | ".join(TEST_SETS) + " | patterns' mean | seeds |"]
    lines.append("|---" * (len(TEST_SETS) + 3) + "|")
    for arm, runs in study["runs"].items():
        scored = [r for r in runs.values() if "test" in r]
        if not scored:
            continue
        cells = [f"{mean([mean(r['test'][n]) for r in scored]) * 100:.1f}" for n in TEST_SETS]
        patterns = mean([mean(_test(r, arm)) for r in scored]) * 100
        lines.append(f"| {arm} | {' | '.join(cells)} | {patterns:.1f} | {len(scored)} |")
    if len(lines) == 2:
        return "test sets: not scored yet (`--test`)\n"
    return "\n".join(lines) + "\n\n" + lead_table(study, "test (training patterns)", _test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--samples", "--k", dest="k", type=int, default=4, help="samples per problem"
    )
    parser.add_argument("--n_test", type=int, default=32, help="test-side problems per set")
    parser.add_argument(
        "--test", action="store_true", help="then score the test sets (once per run)"
    )
    parser.add_argument("--out", default="runs/smollm2_study")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "study-smollm2.json")
    study = load_study(path)
    for flag, key, given in (("samples", "k", args.k), ("n_test", "n_test", args.n_test)):
        if study.get(key, given) != given:
            raise SystemExit(f"--{flag} {given}: {path} was scored with {study[key]}")
    study |= {"cpu": cpu_line(), "k": args.k, "n_test": args.n_test}
    study["precision"] = study_precision(study)
    save(path, study)
    study = validation(args, study, path)
    if args.test:
        study = test_once(args, study, path)
    header = f"{study['cpu']}\n\nk {args.k}, {study['precision']}, config `{CONFIG_NAME}`"
    report(path, f"{header}\n\ncommand: {' '.join([sys.executable, *sys.argv])}", summary(study))


if __name__ == "__main__":
    main()
