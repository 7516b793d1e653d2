"""The simple recipes at CoScale-RL's problems and budget, scored on validation, seed by seed.

For each seed with a finished run of ``loop_study.py --variant full``'s ``BUDGET_ARM`` (the demo
as it ships: the paper's loop with ``final.rl``, one iteration; its folder
``<out>/full-final_rl_one_iteration-s<seed>``), from the same base model, on that run's 256
training problems:

* ``g``: SFT on every training problem with teacher solutions spread evenly, as many in all as
  the run's bank holds; then GRPO with one fixed N on every problem.
* ``h``: SFT on the run's own bank (the loop's data without its iterations); then the same GRPO.
* ``grpo``: the same GRPO from the base.
* ``fresh``: the paper's equal-budget view (dataset scaling, any problems): SFT on fresh
  training-side problems of the four patterns, none of the run's, one teacher solution each, as
  many problems as the run's bank holds solutions; then the same GRPO on the run's problems.

Every SFT spends the run's SFT examples (all its stages together), mixes in the demo's replay share
(``data.sft_replay``, ``data.curriculum.replay_fraction``) and keeps its best step on validation
(the demo's ``pipeline.selection``); every GRPO spends the run's rollouts (its measurements and
selections included, so the recipes get more training rollouts than the loop) at N = the run's
``pipeline.schedule.n_init``, fixed, with the demo's GRPO settings. Each model is scored on the
validation problems as ``loop_study.py`` scores (``--samples`` per problem, the same seeded samples), so
the rows stand beside its table; nothing reads the test side.

Writes ``<out>/study-baselines.json`` (per-problem scores; resumes from it, and an arm's SFT model
is kept) and ``study-baselines.md``: per arm and model, validation pass@1 over the seeds, and the
lead of that run, of the paper's loop with ``final.rl`` and two iterations and of the paper's
loop over each recipe (:data:`LEADS`), seed by seed (paired: the
same problems and samples). Two processes on disjoint ``--seeds`` may share ``--out`` (one torch
thread each on 2 cores): each run is merged into the file as it is on disk.

Run: .venv/bin/python benchmarks/baselines_study.py --seeds 0,1,2 [--out runs/loop_study]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import lightning as L
from loop_study import (
    BUDGET_ARM,
    PRECISION,
    load_study,
    mean,
    mean_sd,
    merged,
    paired_cell,
    pass_rates_of,
    run_dir,
    run_settings,
    save,
    total_spend,
)
from lr_n_sweep import plain_grpo
from paired import code_commit, cpu_line
from reproduce import fresh_problems

from coscale.app.report_engine import ReportEngine
from coscale.datamodules import ProblemDataModule
from coscale.loop.schedule import NSchedule
from coscale.modules import SFTModule
from coscale.pipeline import instantiate
from coscale.tasks import tiers

ARMS = ("g", "h", "grpo", "fresh")


LEADS = (BUDGET_ARM, "paper_loop_final_rl", "paper_loop")
"""The ``full`` step's arms whose final models' leads over each recipe the tables give."""


def budget_run(out: str, seed: int):
    """The finished ``BUDGET_ARM`` run of ``seed``: its parsed settings (data loaded, its
    curriculum restored: the bank) and its spend over all stages."""
    folder = run_dir(out, "full", BUDGET_ARM, seed)
    state = finished_state(folder, "loop_study.py --variant full")
    init = run_settings(folder, "full", BUDGET_ARM)
    init.data.load_state_dict({"curriculum": state["curriculum"]})
    return init, total_spend(state["results"])


def finished_state(folder: str, runner: str) -> dict:
    """The ``pipeline_state.json`` of the finished run in ``folder`` (else an exit that names
    ``runner``, what makes it)."""
    with open(os.path.join(folder, "pipeline_state.json")) as f:
        state = json.load(f)
    if "final" not in state["done"]:
        raise SystemExit(f"{folder} is not finished: run {runner} first")
    return state


def bank_rows(data) -> list[dict]:
    """``h``'s set: each training problem with the bank's solutions of it."""
    bank = data.curriculum.bank
    return [_row(p, bank.take(p.id, bank.count(p.id))) for p in data.problems.values()]


def even_rows(data) -> list[dict]:
    """``g``'s set: as many teacher solutions in all as the bank holds, spread evenly over every
    training problem (the first ``total % problems`` get one more)."""
    problems = list(data.problems.values())
    share, extra = divmod(data.curriculum.bank.total(), len(problems))
    return [
        _row(p, list(tiers.solutions(p.question))[: share + (i < extra)])
        for i, p in enumerate(problems)
    ]


def fresh_rows(data) -> list[dict]:
    """``fresh``'s set: one teacher solution each for as many fresh training-side problems (none
    of the run's) as the bank holds solutions."""
    exclude = {p.question for p in data.problems.values()}
    fresh = fresh_problems(data.curriculum.bank.total(), exclude)
    return [_row(p, list(tiers.solutions(p.question))[:1]) for p in fresh]


ROWS = {"g": even_rows, "h": bank_rows, "fresh": fresh_rows}
"""Each SFT recipe's set, from the run's data."""


def _row(problem, solutions: list[str]) -> dict:
    return {**problem.to_dict(), "solutions": list(solutions)}


def sft(
    init, rows: list[dict], examples: int, seed: int, folder: str, precision: str = PRECISION
) -> str:
    """SFT from the base on ``rows``' solutions with the run's replay share, about ``examples``
    examples, its best step on validation kept (the run's ``pipeline.selection``); returns the
    model folder (kept: a restarted study does not train it again)."""
    out = os.path.join(folder, "model")
    if os.path.isdir(out):
        return out
    cfg, data = init.pipeline, init.data
    pairs = sum(len(r["solutions"]) for r in rows)
    dm = ProblemDataModule(
        train=rows,
        bank_solutions=max(len(r["solutions"]) for r in rows),
        sft_source="bank",
        sft_batch_size=data.sft_batch_size,
        sft_replay=data.replay_source,
        curriculum={"replay_fraction": data.curriculum.settings.replay_fraction, "seed": seed},
    )
    share = 1 - data.curriculum.settings.replay_fraction
    epochs = max(1, round(examples * share / pairs))  # replay adds the rest of each epoch
    L.seed_everything(seed, workers=True)
    module = SFTModule(model=cfg.model, **cfg.sampling.sft_args(instantiate(cfg.sft)))
    select = cfg.selection.build(
        cfg.selection.candidates(data.val_problems, data.curriculum),
        os.path.join(folder, "select"),
        seed,
        os.path.basename(folder),
    )
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[select] if select is not None else [],
    )
    trainer.fit(module, datamodule=dm)
    best = select.best_model() if select is not None else None
    if best is None:
        return module.export(out)
    os.replace(best, out)
    return out


def grpo(
    init, start: str, rollouts: int, seed: int, folder: str, precision: str = PRECISION
) -> str:
    """GRPO from ``start`` with the run's first N, fixed, on every training problem, for about
    ``rollouts`` rollouts."""
    out = os.path.join(folder, "model")
    if os.path.isdir(out):
        return out
    cfg, data = init.pipeline, init.data
    n = NSchedule(**cfg.schedule).n_init
    args = cfg.sampling.grpo_args(instantiate(cfg.grpo))
    problems = list(data.problems.values())
    return plain_grpo(start, problems, rollouts, n, args, data.batch_size, out, seed, precision)


def arm_models(
    arm: str, init, spent: dict, seed: int, folder: str, precision: str = PRECISION
) -> dict[str, str]:
    """The models one arm trains, in order (its SFT model, then its GRPO model)."""
    rollouts, base = spent["rollouts"], init.pipeline.model
    if arm == "grpo":
        return {"grpo": grpo(init, base, rollouts, seed, os.path.join(folder, "grpo"), precision)}
    rows = ROWS[arm](init.data)
    sft_dir, grpo_dir = os.path.join(folder, "sft"), os.path.join(folder, "grpo")
    start = sft(init, rows, spent["sft_examples"], seed, sft_dir, precision)
    return {"sft": start, "grpo": grpo(init, start, rollouts, seed, grpo_dir, precision)}


def summary(study: dict, references: dict[str, dict]) -> str:
    """Validation pass@1 per arm and model over the seeds, and each reference arm's lead
    (``references``: arm -> seed -> its final model's per-problem scores)."""
    head = "| arm | model | val pass@1 % (mean, sd) | each seed |"
    head += "".join(f" {ref} ahead by, points | paired 95% |" for ref in references)
    lines = [head, "|---|---|---|---|" + "---|---|" * len(references)]
    for arm, runs in study["runs"].items():
        seeds = sorted(runs, key=int)
        for model in runs[seeds[0]]["scores"]:
            per = [mean(runs[s]["scores"][model]) * 100 for s in seeds]
            row = f"| {arm} | {model} | {mean_sd(per)} | {', '.join(f'{v:.1f}' for v in per)} |"
            for scores in references.values():
                row += lead_cells(scores, runs, seeds, model, per)
            lines.append(row)
    return "\n".join(lines) + "\n"


def lead_cells(scores: dict, runs: dict, seeds: list[str], model: str, per: list[float]) -> str:
    """A reference arm's lead over ``model`` of a recipe, mean and paired (n/a without the
    reference's scores of every seed)."""
    if not all(s in scores for s in seeds):
        return " n/a | n/a |"
    lead = [mean(scores[s]) * 100 - p for s, p in zip(seeds, per)]
    both = [scores[s] for s in seeds], [runs[s]["scores"][model] for s in seeds]
    return f" {mean_sd(lead)} | {paired_cell(*both)} |"


def references(out: str) -> dict[str, dict]:
    """The final models' per-problem scores of :data:`LEADS`, from ``<out>/study-full.json``."""
    path = os.path.join(out, "study-full.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        runs = json.load(f)["runs"]
    return {arm: {s: r["scores"]["final"] for s, r in runs.get(arm, {}).items()} for arm in LEADS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--samples", "--k", dest="k", type=int, default=8, help="samples per validation problem"
    )
    parser.add_argument("--out", default="runs/loop_study")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="a share of the budgets (a smoke run: 0.02)"
    )
    args = parser.parse_args()
    path = os.path.join(args.out, "study-baselines.json")
    study = load_study(path)
    study |= {"cpu": cpu_line(), "k": args.k, "precision": PRECISION, "scale": args.scale}
    for seed in args.seeds.split(","):
        init, spent = budget_run(args.out, int(seed))
        spent = {k: max(1, int(v * args.scale)) for k, v in spent.items()}
        for arm in args.arms.split(","):
            runs = study["runs"].setdefault(arm, {})
            if seed in runs:
                continue
            folder = os.path.join(args.out, f"baseline-{arm}-s{seed}")
            start = time.perf_counter()
            models = arm_models(arm, init, spent, int(seed), folder)
            seconds = time.perf_counter() - start
            engine = ReportEngine(init.pipeline)
            try:
                scores = {
                    m: pass_rates_of(p, init.data.val_problems, args.k, engine)
                    for m, p in models.items()
                }
            finally:
                engine.close()
            runs[seed] = {"seconds": seconds, "spent": spent, "scores": scores}
            runs[seed]["commit"] = code_commit()
            study = merged(path, study, arm, seed, runs[seed])  # a run beside this one may write
            save(path, study)
            print(f"[baselines] {arm} seed {seed}: {seconds:.0f} s", flush=True)
    text = summary(study, references(args.out))
    header = f"{study['cpu']}\n\nk {args.k}, {PRECISION}, budget scale {args.scale}"
    with open(path.replace(".json", ".md"), "w") as f:
        f.write(f"{header}\n\ncommand: {' '.join([sys.executable, *sys.argv])}\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
