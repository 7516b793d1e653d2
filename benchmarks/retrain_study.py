"""Why does a retrain from the initial model end below the model it replaces? (issue 14)

Takes a finished demo run (``coscale demo`` / ``./run.sh demo``: its ``pipeline_state.json``
holds the curriculum the final retrain trained on: bank, replay buffer of correct RL rollouts,
pools) and retrains the base model from scratch under one changed setting at a time: more steps,
the set's make-up (bank, latest correct RL rollouts, replay of easy tiers), learning rate. Each
retrain is measured like the pipeline's ``final.keep`` judge (pass@1 on the training problems,
the same seeded samples for every model) and on the easy tier, beside the run's own RL models.

Run: .venv/bin/python benchmarks/retrain_study.py --run runs/demo_auto [--only A,B]
Writes benchmarks/results/retrain_study.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

from paired import cpu_line

from coscale.app.cli import pipeline_parser
from coscale.app.demo import demo_config, evaluate_model
from coscale.callbacks import run_sft
from coscale.models.policy import export_policy, resolve_model_path
from coscale.pipeline import instantiate
from coscale.tasks import tiers

VARIANTS: dict[str, dict] = {
    # name: (what changes against the demo's final retrain)
    "A demo (600 steps, bank + 4 RL rollouts/problem, replay 0.5)": {},
    "B 1800 steps": {"steps": 1800},
    "C RL rollouts only, no bank (4/problem)": {"keep_rl_bank": False},
    "D bank + 16 RL rollouts/problem": {"per_problem": 16},
    "E no replay": {"replay_fraction": 0.0},
    "F RL rollouts only, 16/problem, no bank": {"keep_rl_bank": False, "per_problem": 16},
    "G lr 1e-3": {"lr": 1.0e-3},
    # distillation from the last RL model (coscale.sft.distill), 7 passes as the demo's stages
    "H 7 passes": {"epochs": 7},
    "I 7 passes, KL to the last RL model, weight 0.5": {"epochs": 7, "teacher": 0.5},
    "J 7 passes, KL to the last RL model, weight 0.9": {"epochs": 7, "teacher": 0.9},
}


def load_run(run: str):
    """The demo's config and data module, its curriculum restored from the run's state file."""
    parser = pipeline_parser()
    init = parser.instantiate(parser.parse_args(["--config", demo_config()]))
    init.data.load()
    with open(os.path.join(run, "pipeline_state.json")) as f:
        state = json.load(f)
    init.data.curriculum.load_state_dict(state["curriculum"])
    return init.pipeline, init.data, state


def training_set(data, change: dict) -> list[dict]:
    """The final retrain's SFT set (``sft_pairs("all")``) under ``change``'s data settings."""
    cur = data.curriculum
    saved = cur.settings
    keys = {"keep_rl_bank", "replay_fraction", "redistill_per_problem"}
    over = {k: v for k, v in change.items() if k in keys}
    if "per_problem" in change:
        over["redistill_per_problem"] = change["per_problem"]
    cur.settings = dataclasses.replace(saved, **over)
    try:
        return cur.sft_pairs("all")
    finally:
        cur.settings = saved


def retrain(cfg, data, items: list[dict], change: dict, out: str, rl_model: str | None):
    """SFT of the base on ``items`` as the pipeline's SFT stages do; returns (folder, seconds).
    ``change["teacher"]``: distil from ``rl_model`` with that weight."""
    sft = {**instantiate(cfg.sft), "batch_size": data.sft_batch_size}
    if "lr" in change:
        sft["optimizer"] = {**sft.get("optimizer", {}), "lr": change["lr"]}
    if "teacher" in change:
        sft["distill"] = {"teacher": rl_model, "weight": change["teacher"]}
    if "epochs" in change:  # passes over the set decide the length, as in the demo now
        trainer = {"max_epochs": change["epochs"]}
    else:  # a step count decides it (the demo's 600 steps before issue 14)
        trainer = {"max_epochs": 10_000, "max_steps": change.get("steps", 600)}
    start = time.perf_counter()
    module = run_sft(cfg.model, items, sft, trainer, seed=cfg.seed, precision="32-true")
    return export_policy(module.policy, module.tokenizer, out), time.perf_counter() - start


def judge(path: str, train: list, easy: list, k: int) -> dict:
    return {
        "train": evaluate_model(path, train, k)["pass@1"],
        "T1": evaluate_model(path, easy, k)["pass@1"],
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo_auto")
    ap.add_argument("--out", default="benchmarks/results/retrain_study.md")
    ap.add_argument("--only", default="", help="comma-separated variant letters")
    ap.add_argument("--samples", "--k", dest="k", type=int, default=4)
    args = ap.parse_args(argv)
    cfg, data, state = load_run(args.run)
    train = list(data.curriculum.problems.values())
    easy = tiers.problems(tiers.EASY, 128, seed=1, side="test")
    rows = []
    for label in ("it1/rl", "it2/rl"):
        if label in state["models"]:
            scores = judge(state["models"][label], train, easy, args.k)
            rows.append((f"run's {label} model", None, None, scores))
    rows.append(("base", None, None, judge(resolve_model_path(cfg.model), train, easy, args.k)))
    for name, change in VARIANTS.items():
        if args.only and name[0] not in args.only.split(","):
            continue
        items = training_set(data, change)
        folder = os.path.join(args.run, "retrain_study", name[0])
        rl_model = state["models"].get("it2/rl") or state["models"].get("it1/rl")
        path, seconds = retrain(cfg, data, items, change, folder, rl_model)
        rows.append((name, len(items), seconds, judge(path, train, easy, args.k)))
        print(f"[study] {name}: {len(items)} pairs, {seconds:.0f} s, {rows[-1][3]['train'].fmt()}")
    write(args, rows)


def write(args, rows) -> None:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Retrains from the base model on the demo's final set, one change at a time",
        "",
        f"Measured {when}: `python benchmarks/retrain_study.py {' '.join(sys.argv[1:])}`; "
        f"{cpu_line()}; float32. Run: `{args.run}`. pass@1 in % with 95% bootstrap intervals, "
        f"{args.k} samples per problem at temperature 1.0: 'train' = the 256 training problems "
        "(what `final.keep` judges on), T1 = 128 held-out easy-tier problems.",
        "",
        "| model | SFT pairs | SFT s | train pass@1 | T1 pass@1 |",
        "|---|---|---|---|---|",
    ]
    for name, n, seconds, est in rows:
        n_cell = "" if n is None else str(n)
        s_cell = "" if seconds is None else f"{seconds:.0f}"
        lines.append(f"| {name} | {n_cell} | {s_cell} | {est['train'].fmt()} | {est['T1'].fmt()} |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
