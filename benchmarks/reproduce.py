"""The paper's comparison in miniature, at equal budget, side by side in one run.

Arms, all from the same shipped base model on the built-in task (coscale.tasks.tiers):
  (a) base model
  (b) SFT, 1 solution for each of many problems         (dataset scaling)
  (c) SFT, k solutions for each of few problems          (solution scaling), same SFT size as (b)
  (d) plain GRPO, fixed N, on all training problems
  (e) SFT (b), then plain GRPO
  (f) CoScale-RL: the demo pipeline (coscale/configs/demo.yaml)
(f) runs first; its spend (SFT examples and rollouts, pool measurements included, counted by
coscale.budget) fixes the budget of the others: (b)/(c) train on as many SFT examples, (d) samples
as many rollouts, (e) splits the same two budgets. Every SFT arm mixes in the same replay share
as (f). Reports per-set pass@1 with 95% intervals, the ratio of the 4-set average over the base,
the trained problems' pass@16 for (b) vs (c), and the budget of every arm.

Run: .venv/bin/python benchmarks/reproduce.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import lightning as L

from coscale import budget
from coscale.callbacks import run_sft
from coscale.cli import pipeline_parser
from coscale.datamodules import ProblemDataModule
from coscale.demo import QUICK, _measure, average, demo_config, table
from coscale.modules import GRPOModule
from coscale.pipeline import Pipeline, instantiate
from coscale.policy import resolve_model_path
from coscale.tasks import tiers


def coscale_arm(run_dir: str, quick: bool):
    """(f): the demo pipeline; returns its final model, its spend, its config and data."""
    parser = pipeline_parser()
    args = ["--config", demo_config(), "--pipeline.run_dir", run_dir, "--pipeline.logger", "csv"]
    cfg = parser.parse_args([*args, *(QUICK if quick else [])])
    init = parser.instantiate_classes(cfg)
    before = budget.snapshot()
    Pipeline(init.pipeline, init.data).run()
    spent = _delta(before)
    return os.path.join(run_dir, "final", "model"), spent, init.pipeline, init.data


def sft_arm(base: str, problems: list, per_problem: int, size: int, cfg, data, seed: int):
    """SFT from the base on ``per_problem`` teacher solutions of as many problems as fit ``size``."""
    chosen = problems[: max(1, size // per_problem)]
    items = [
        {"id": p.id, "question": p.question, "solution": s}
        for p in chosen
        for s in list(tiers.solutions(p.question))[:per_problem]
    ]
    items += data._replay_for(len(items))
    random.Random(seed).shuffle(items)
    epochs = max(1, round(size / len(items)))
    sft = {**instantiate(cfg.sft), "batch_size": data.sft_batch_size}
    module = run_sft(base, items, sft, {"max_epochs": epochs, "accelerator": "cpu"}, seed=seed)
    return module, chosen


def grpo_arm(start: str, problems: list, rollouts: int, cfg, data, out: str) -> str:
    """Plain GRPO with a fixed N on all ``problems`` for about ``rollouts`` rollouts."""
    dm = ProblemDataModule(
        train=[p.to_dict() for p in problems],
        batch_size=data.batch_size,
        rollout_n=data.rollout_n,
        rl_unmeasured=True,
        low=0.0,
        seed=cfg.seed,
    )
    module = GRPOModule(model=start, **instantiate(cfg.grpo))
    steps = max(1, rollouts // (data.batch_size * data.rollout_n))
    trainer = L.Trainer(
        max_steps=steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    return module.export(out)


def trained_pass16(path: str, problems: list) -> float:
    """Sampled success on the SFT's own problems (the paper's measure of RL potential)."""
    return _measure(path, problems, 16)["pass@16"].mean


def _delta(before: dict) -> dict:
    now = budget.snapshot()
    return {k: now.get(k, 0) - before.get(k, 0) for k in ("sft_examples", "rollouts")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget, to check the script")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--k", type=int, default=4, help="solutions per problem in arm (c)")
    args = parser.parse_args()
    work = os.path.join("runs", "reproduce")
    start = time.time()
    final_f, spent_f, cfg, data = coscale_arm(os.path.join(work, "coscale"), args.quick)
    base = resolve_model_path(cfg.model)
    problems = list(data.problems.values())
    random.Random(0).shuffle(problems)
    models, spend = {"(a) base": base}, {"(a) base": {"sft_examples": 0, "rollouts": 0}}
    before = budget.snapshot()
    b, _ = sft_arm(base, problems, 1, spent_f["sft_examples"], cfg, data, seed=1)
    models["(b) SFT 1 x many"] = b.export(os.path.join(work, "b"))
    spend["(b) SFT 1 x many"] = _delta(before)
    before = budget.snapshot()
    c, c_problems = sft_arm(base, problems, args.k, spent_f["sft_examples"], cfg, data, seed=1)
    models[f"(c) SFT {args.k} x few"] = c.export(os.path.join(work, "c"))
    spend[f"(c) SFT {args.k} x few"] = _delta(before)
    before = budget.snapshot()
    models["(d) GRPO N fixed"] = grpo_arm(
        base, problems, spent_f["rollouts"], cfg, data, os.path.join(work, "d")
    )
    spend["(d) GRPO N fixed"] = _delta(before)
    before = budget.snapshot()
    models["(e) SFT (b) + GRPO"] = grpo_arm(
        models["(b) SFT 1 x many"],
        problems,
        spent_f["rollouts"],
        cfg,
        data,
        os.path.join(work, "e"),
    )
    spend["(e) SFT (b) + GRPO"] = {
        **_delta(before),
        "sft_examples": spend["(b) SFT 1 x many"]["sft_examples"],
    }
    models["(f) CoScale-RL"], spend["(f) CoScale-RL"] = final_f, spent_f
    report = evaluate(models, 32 if args.quick else 128)
    potential = {
        "(b)": trained_pass16(models["(b) SFT 1 x many"], c_problems),
        "(c)": trained_pass16(models[f"(c) SFT {args.k} x few"], c_problems),
    }
    write(args, report, spend, potential, time.time() - start)


def evaluate(models: dict, n_test: int) -> dict:
    sets = {
        name: tiers.problems(name, n_test, seed=1, held_out=True)
        for name in (*tiers.BENCHMARKS, tiers.EASY)
    }
    report = {"k": 8, "n_test": n_test, "models": {}}
    for label, path in models.items():
        report["models"][label] = {name: _measure(path, probs, 8) for name, probs in sets.items()}
        print(f"evaluated {label}", flush=True)
    return report


def write(args, report, spend, potential, seconds) -> None:
    os.makedirs(args.out, exist_ok=True)
    base = average(report, "(a) base")
    lines = [
        "| arm | avg pass@1 (4 sets) | x base | SFT examples | rollouts |",
        "|---|---|---|---|---|",
    ]
    for label in report["models"]:
        avg = average(report, label)
        name = "CoScale-RL" if label.startswith("(f)") else label
        lines.append(
            f"| {name} | {avg * 100:.1f} | {avg / base:.2f}x | "
            f"{spend[label]['sft_examples']} | {spend[label]['rollouts']} |"
        )
    text = "\n".join(
        [
            f"# reproduce.py ({'quick' if args.quick else 'full'}), {time.strftime('%Y-%m-%d')}, {seconds / 60:.1f} min",
            f"command: .venv/bin/python benchmarks/reproduce.py {'--quick' if args.quick else ''}".rstrip(),
            "",
            "\n".join(lines),
            "",
            "per set (pass@1 / pass@8 in %, 95% intervals):",
            "",
            table(report),
            "",
            f"trained problems of (c), pass@16: (b) {potential['(b)'] * 100:.1f}%  (c) {potential['(c)'] * 100:.1f}%",
        ]
    )
    name = "reproduce_quick.md" if args.quick else "reproduce.md"
    with open(os.path.join(args.out, name), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
