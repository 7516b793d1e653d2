"""A finished pipeline run, copied and rolled back to the end of one of its stages.

The copy holds the stages up to ``--after`` (their exported models and results) and the
curriculum as it was when that stage ended (read from the stage's last checkpoint, which holds
the data module's state; the run must have kept it: ``--pipeline.keep_checkpoints true``), so that ``coscale run``/``coscale demo`` on the copy resumes after
that stage and reruns the later ones under changed settings (e.g. ``--pipeline.final.epochs
14``) without redoing the earlier ones. Only stages that end in a fit have such a checkpoint.

Run: .venv/bin/python benchmarks/rollback_run.py runs/demo_v2 runs/exp --after it2/rl
then: .venv/bin/coscale demo --pipeline.run_dir runs/exp --pipeline.final.epochs 14
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import torch

from coscale.loop.checkpoint_store import last_checkpoint


def rolled_back(state: dict, src: str, dst: str, after: str, curriculum: dict) -> dict:
    """``state`` (a ``pipeline_state.json``) cut after stage ``after``, its paths in ``dst``."""
    if after not in state["done"]:
        raise SystemExit(f"--after {after}: not a finished stage of {src} ({state['done']})")
    keep = state["done"][: state["done"].index(after) + 1]
    models = {k: v.replace(src, dst, 1) for k, v in state["models"].items() if k in keep}
    results = {k: v for k, v in state["results"].items() if k in keep}
    results["spend"] = {k: v for k, v in state["results"]["spend"].items() if k in keep}
    current = [models[k] for k in keep if k in models]
    return {
        "done": keep,
        "current": current[-1] if current else state["config"]["model"],
        "models": models,
        "curriculum": curriculum,
        "results": results,
        "seconds": {k: v for k, v in state["seconds"].items() if k in keep},
        "config": state["config"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a run folder with pipeline_state.json")
    ap.add_argument("dst", help="the new run folder (must not exist)")
    ap.add_argument("--after", required=True, help="the last stage to keep, e.g. it2/rl")
    args = ap.parse_args()
    src, dst = args.src.rstrip("/"), args.dst.rstrip("/")
    if os.path.exists(dst):
        raise SystemExit(f"{dst} exists: give a new folder")
    with open(os.path.join(src, "pipeline_state.json")) as f:
        state = json.load(f)
    folder = os.path.join(src, args.after, "ckpt")
    ckpt = last_checkpoint(folder)
    if ckpt is None:
        raise SystemExit(
            f"--after {args.after}: no checkpoint in {folder} (only fits leave one, and only "
            "runs with pipeline.keep_checkpoints: true keep it after the stage)"
        )
    if os.path.isdir(ckpt):  # FSDP2: the non-tensor state is in the folder's meta.pt
        ckpt = os.path.join(ckpt, "meta.pt")
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    new = rolled_back(state, src, dst, args.after, saved["CurriculumDataModule"]["curriculum"])
    for stage in new["models"]:
        shutil.copytree(os.path.join(src, stage, "model"), os.path.join(dst, stage, "model"))
    with open(os.path.join(dst, "pipeline_state.json"), "w") as f:
        json.dump(new, f)
    print(f"{dst}: stages {', '.join(new['done'])}; current model {new['current']}")


if __name__ == "__main__":
    main()
