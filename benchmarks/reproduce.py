"""The paper's comparison in miniature, at equal budget, side by side in one run.

Arms, all from the same shipped base model on the built-in task (coscale.tasks.tiers):
  (a) base model
  (b) SFT, 1 solution for each of many problems         (dataset scaling)
  (c) SFT, k solutions for each of few problems          (solution scaling), same SFT size as (b)
      (both: as many distinct pairs as (f)'s solution bank, on fresh training-side problems)
  (d) plain GRPO, fixed N, on all training problems
  (e) SFT (b), then plain GRPO
  (f) CoScale-RL: the demo pipeline (coscale/configs/demo.yaml)
(f) runs first; its spend (SFT examples and rollouts, pool measurements included, counted by
coscale.loop.budget) fixes the budget of the others: (b)/(c) train on as many SFT examples, (d) samples
as many rollouts, (e) splits the same two budgets. Every SFT arm mixes in the same replay share
as (f). Reports per-set pass@1 with 95% intervals, the ratio of the 4-set average over the base,
the trained problems' pass@16 for (b) vs (c), and the budget of every arm.

Run: .venv/bin/python benchmarks/reproduce.py [--quick] [--from-run runs/demo] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from lr_n_sweep import plain_grpo, sweep
from lr_n_sweep import write as write_sweep
from paired import cpu_line

from coscale.app.cli import pipeline_parser
from coscale.app.demo import (
    QUICK,
    average,
    average_cell,
    demo_config,
    evaluate_model,
    lead_cell,
    table,
)
from coscale.callbacks import run_sft
from coscale.loop import budget
from coscale.models.policy import resolve_model_path
from coscale.pipeline import Pipeline, instantiate
from coscale.run.precision import resolve_precision
from coscale.tasks import tiers


def coscale_arm(run_dir: str, quick: bool):
    """(f): the demo pipeline; returns its final model, its spend, its config and data."""
    parser = pipeline_parser()
    args = ["--config", demo_config(), "--pipeline.run_dir", run_dir, "--pipeline.logger", "csv"]
    cfg = parser.parse_args([*args, *(QUICK if quick else [])])
    init = parser.instantiate(cfg)
    before = budget.snapshot()
    Pipeline(init.pipeline, init.data).run()
    spent = budget.since(before)
    return os.path.join(run_dir, "final", "model"), spent, init.pipeline, init.data


def _precision(cfg) -> dict:
    """(f)'s Trainer precision (``auto`` resolved for this machine), for every other arm too."""
    resolved, _ = resolve_precision(dict(cfg.trainer))
    return {k: v for k, v in resolved.items() if k == "precision"}


def finished_arm(run_dir: str, quick: bool):
    """(f) from a finished ``coscale demo`` run (same config): its final model and its spend,
    read from the run's ``pipeline_state.json``, instead of running the pipeline again."""
    path = os.path.join(run_dir, "pipeline_state.json")
    with open(path) as f:
        state = json.load(f)
    stages = state["results"].get("spend", {})
    if "final" not in state["done"] or not stages:
        raise SystemExit(f"--from-run: {path} is not a finished run with per-stage spend")
    parser = pipeline_parser()
    args = ["--config", demo_config(), "--pipeline.run_dir", run_dir, "--pipeline.logger", "none"]
    init = parser.instantiate(parser.parse_args([*args, *(QUICK if quick else [])]))
    init.data.load()
    init.data.load_state_dict({"curriculum": state["curriculum"]})
    spent = {k: sum(s[k] for s in stages.values()) for k in ("sft_examples", "rollouts")}
    return os.path.join(run_dir, "final", "model"), spent, init.pipeline, init.data


def fresh_problems(count: int, exclude: set[str]) -> list:
    """``count`` training-side problems of the four patterns, none of (f)'s, interleaved."""
    per = -(-count // len(tiers.BENCHMARKS))
    sets = [
        [
            p
            for p in tiers.problems(t, per + len(exclude), seed=3, side="train")
            if p.question not in exclude
        ][:per]
        for t in tiers.BENCHMARKS
    ]
    return [p for group in zip(*sets) for p in group][:count]


def sft_arm(base: str, problems: list, per_problem: int, size: int, cfg, data, seed: int):
    """SFT from the base on ``per_problem`` teacher solutions of each of ``len(problems) //
    per_problem`` problems (as many new pairs as (f)'s bank), for ``size`` examples in all."""
    chosen = problems[: max(1, len(problems) // per_problem)]
    items = [
        {"id": p.id, "question": p.question, "solution": s}
        for p in chosen
        for s in list(tiers.solutions(p.question))[:per_problem]
    ]
    return train_on(base, items, size, cfg, data, seed), chosen


def train_on(base: str, items: list[dict], size: int, cfg, data, seed: int):
    """SFT from the base on ``items`` plus (f)'s replay share, for about ``size`` examples."""
    items = items + data.curriculum._replay_for(len(items))
    random.Random(seed).shuffle(items)
    epochs = max(1, round(size / len(items)))
    sft = {**instantiate(cfg.sft), "batch_size": data.sft_batch_size}
    trainer = {"max_epochs": epochs, "accelerator": "cpu", **_precision(cfg)}
    return run_sft(base, items, sft, trainer, seed=seed)


def bank_items(data, problems: list) -> list[dict]:
    """Every bank solution (f) collected for ``problems`` (teacher solutions of data scaling)."""
    bank = data.curriculum.bank
    return [
        {"id": p.id, "question": p.question, "solution": s}
        for p in problems
        for s in bank.take(p.id, bank.count(p.id))
    ]


def equal_budget_arms(base: str, problems: list, spent: dict, cfg, data, work: str, args):
    """(b), (c) on fresh problems of the same patterns and (e) = (b) then GRPO, each at (f)'s
    budget; also the trained problems' pass@16 of (b) and (c)."""
    fresh = fresh_problems(data.curriculum.bank.total(), {p.question for p in problems})
    models, spend = {}, {}
    before = budget.snapshot()
    b, _ = sft_arm(base, fresh, 1, spent["sft_examples"], cfg, data, seed=1)
    models["(b) SFT 1 x many"] = b.export(os.path.join(work, "b"))
    spend["(b) SFT 1 x many"] = budget.since(before)
    before = budget.snapshot()
    c, c_problems = sft_arm(base, fresh, args.k, spent["sft_examples"], cfg, data, seed=1)
    models[f"(c) SFT {args.k} x few"] = c.export(os.path.join(work, "c"))
    spend[f"(c) SFT {args.k} x few"] = budget.since(before)
    before = budget.snapshot()
    models["(e) SFT (b) + GRPO"] = grpo_arm(
        models["(b) SFT 1 x many"], problems, spent["rollouts"], cfg, data,
        os.path.join(work, "e"),
    )  # fmt: skip
    spend["(e) SFT (b) + GRPO"] = {**budget.since(before), "sft_examples": spent["sft_examples"]}
    potential = {
        "(b)": trained_pass16(models["(b) SFT 1 x many"], c_problems),
        "(c)": trained_pass16(models[f"(c) SFT {args.k} x few"], c_problems),
    }
    return models, spend, potential


def merged(shared: dict, arms: dict) -> dict:
    """One report: the arms' rows between (a) and (d) / (f), in the order of the table."""
    rows = {**shared["models"], **arms["models"]}
    order = sorted(rows, key=lambda label: label[1])  # (a) (b) (c) (d) (e) (f), primes beside
    return {**shared, "models": {label: rows[label] for label in order}}


def equal_problems_arms(base: str, problems: list, spent: dict, cfg, data, work: str):
    """The arms restricted to (f)'s own training problems, each at (f)'s budget:
    (b') SFT, one teacher solution per problem; (c') SFT on all of (f)'s bank solutions of
    them; (e') (b') then plain GRPO. (d) already trains on (f)'s problems."""
    models, spend = {}, {}
    size = spent["sft_examples"]
    before = budget.snapshot()
    b, _ = sft_arm(base, problems, 1, size, cfg, data, seed=1)
    models["(b') SFT 1 x (f)'s problems"] = b.export(os.path.join(work, "b_eq"))
    spend["(b') SFT 1 x (f)'s problems"] = budget.since(before)
    before = budget.snapshot()
    c = train_on(base, bank_items(data, problems), size, cfg, data, seed=1)
    models["(c') SFT on (f)'s bank"] = c.export(os.path.join(work, "c_eq"))
    spend["(c') SFT on (f)'s bank"] = budget.since(before)
    before = budget.snapshot()
    label = "(e') (b') + GRPO"
    models[label] = grpo_arm(
        models["(b') SFT 1 x (f)'s problems"], problems, spent["rollouts"], cfg, data,
        os.path.join(work, "e_eq"),
    )  # fmt: skip
    spend[label] = {**budget.since(before), "sft_examples": size}
    return models, spend


def grpo_arm(start: str, problems: list, rollouts: int, cfg, data, out: str) -> str:
    """Plain GRPO with (f)'s first N, fixed, on all ``problems`` for about ``rollouts`` rollouts."""
    n, grpo = data.curriculum.start_n, instantiate(cfg.grpo)
    return plain_grpo(
        start, problems, rollouts, n, grpo, data.batch_size, out, cfg.seed, **_precision(cfg)
    )


def trained_pass16(path: str, problems: list) -> float:
    """Sampled success on the SFT's own problems (the paper's measure of RL potential)."""
    return evaluate_model(path, problems, 16)["pass@16"].mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget, to check the script")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--from-run",
        default=None,
        help="take (f) from this finished `coscale demo` run folder instead of running it again",
    )
    parser.add_argument(
        "--sweep", action=argparse.BooleanOptionalAction, default=True, help="also the lr/N sweep"
    )
    parser.add_argument(
        "--per-problem",
        "--k",
        dest="k",
        type=int,
        default=6,
        help="solutions per problem in arm (c)",
    )
    parser.add_argument(
        "--views",
        default="budget,problems",
        help="budget: arms at (f)'s budget on any problems; problems: arms on (f)'s problems only",
    )
    args = parser.parse_args()
    work = os.path.join("runs", "reproduce")
    start = time.time()
    f_dir = args.from_run or os.path.join(work, "coscale")
    arm = finished_arm if args.from_run else coscale_arm
    final_f, spent_f, cfg, data = arm(f_dir, args.quick)
    base = resolve_model_path(cfg.model)
    problems = list(data.problems.values())
    random.Random(0).shuffle(problems)
    models, spend = {"(a) base": base}, {"(a) base": {"sft_examples": 0, "rollouts": 0}}
    before = budget.snapshot()
    models["(d) GRPO N fixed"] = grpo_arm(
        base, problems, spent_f["rollouts"], cfg, data, os.path.join(work, "d")
    )
    spend["(d) GRPO N fixed"] = budget.since(before)
    models["(f) CoScale-RL"], spend["(f) CoScale-RL"] = final_f, spent_f
    n_test = 32 if args.quick else 128
    shared = evaluate(models, n_test)
    if "budget" in args.views:
        arms, arm_spend, potential = equal_budget_arms(
            base, problems, spent_f, cfg, data, work, args
        )
        report = merged(shared, evaluate(arms, n_test))
        write(args, report, {**spend, **arm_spend}, potential, time.time() - start, "budget")
    if "problems" in args.views:
        arms, arm_spend = equal_problems_arms(base, problems, spent_f, cfg, data, work)
        report = merged(shared, evaluate(arms, n_test))
        write(args, report, {**spend, **arm_spend}, None, time.time() - start, "problems")
    if args.sweep:
        run_sweep(args, os.path.join(f_dir, "it1", "sft", "model"), problems, cfg, work)


def run_sweep(args, start: str, pool: list, cfg, work: str) -> None:
    """The lr/N sweep from (f)'s first SFT model on (f)'s training problems."""
    quick = {"rollouts": 256, "grid": [(2e-4, 4), (2e-4, 16)], "k": 4} if args.quick else {}
    grpo, out = instantiate(cfg.grpo), os.path.join(work, "sweep")
    result = sweep(start, pool, grpo, out, **_precision(cfg), **quick)
    suffix = " --quick" if args.quick else ""
    write_sweep(result, args.out, f".venv/bin/python benchmarks/reproduce.py{suffix}")


def evaluate(models: dict, n_test: int) -> dict:
    sets = {
        name: tiers.problems(name, n_test, seed=1, side="test")
        for name in (*tiers.BENCHMARKS, tiers.EASY)
    }
    report = {"k": 8, "n_test": n_test, "models": {}}
    for label, path in models.items():
        report["models"][label] = {
            name: evaluate_model(path, probs, 8) for name, probs in sets.items()
        }
        print(f"evaluated {label}", flush=True)
    return report


VIEWS = {
    "budget": ("reproduce", "equal budget: every arm spends (f)'s SFT examples and rollouts; (b), "
               "(c) train on fresh problems of the same patterns"),
    "problems": ("reproduce_equal_problems", "equal problems: every arm may use only (f)'s 256 "
                 "training problems (hard problems with verified answers are what users lack), "
                 "at (f)'s budget"),
}  # fmt: skip


def write(args, report, spend, potential, seconds, view: str) -> None:
    """``<name>.md`` and ``.json`` of one view (``VIEWS``)."""
    os.makedirs(args.out, exist_ok=True)
    name, what = VIEWS[view]
    name += "_quick" if args.quick else ""
    raw = {
        label: {s: {m: e.plain() for m, e in row.items()} for s, row in rows.items()}
        for label, rows in report["models"].items()
    }
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump({"models": raw, "spend": spend, "pass16": potential}, f, indent=1)
    text = "\n".join(
        [
            f"# reproduce.py ({'quick' if args.quick else 'full'}), "
            f"{time.strftime('%Y-%m-%d %H:%M')}, {seconds / 60:.1f} min since the start",
            "command: .venv/bin/python " + " ".join(sys.argv),
            f"{cpu_line()}; {os.cpu_count()} cores",
            f"view: {what}",
            "",
            summary(report, spend),
            "",
            "per set (pass@1 / pass@8 in %, 95% intervals):",
            "",
            table(report, base="(a) base"),
        ]
    )
    if potential:
        text += (
            f"\n\ntrained problems of (c), pass@16: (b) {potential['(b)'] * 100:.1f}%  "
            f"(c) {potential['(c)'] * 100:.1f}%"
        )
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(text + "\n")
    print(text)


def summary(report: dict, spend: dict) -> str:
    """Markdown rows: each arm's 4-set average pass@1 (95% interval), ratio over the base,
    CoScale-RL's lead over it (paired interval on the same problems), spend."""
    base = average(report, "(a) base")
    ours = next(label for label in report["models"] if label.startswith("(f)"))
    lines = [
        "| arm | avg pass@1 (4 sets, 95% interval) | x base | CoScale-RL ahead by (points, "
        "paired 95% interval) | SFT examples | rollouts |",
        "|---|---|---|---|---|---|",
    ]
    for label in report["models"]:
        avg = average(report, label)
        name, lead = (
            ("CoScale-RL", "") if label == ours else (label, lead_cell(report, ours, label))
        )
        lines.append(
            f"| {name} | {average_cell(report, label)} | {avg / base:.2f}x | {lead} | "
            f"{spend[label]['sft_examples']} | {spend[label]['rollouts']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
