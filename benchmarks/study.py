"""The loop's study in one command: every arm and seed on the current code, then the study
tables of ``docs/results.md`` written again from what the runs scored.

Steps, in this order (``--steps`` picks some; without it, :data:`DEFAULT_STEPS`):

* ``full``: ``loop_study.py --variant full``: the whole demo as it ships (the paper's loop with
  ``final.rl`` and one iteration: ``final_rl_one_iteration``), that with two iterations
  (``paper_loop_final_rl``, shipped until that change), the paper's loop unchanged
  (``paper_loop``), and the demo as it shipped until 2026-12-07 (``changes_1207``: no
  re-distillation fit, the final retrain on the bank, the better model kept; the ``needed``
  counts). Older arms (``sft4_rl4``, ``changes_1207_source_all``, ``final_rl_rl2``, ...) stay
  in the records and run by name with ``loop_study.py``.
* ``baselines``: ``baselines_study.py``: (g), (h), plain GRPO and the equal-budget view's
  ``fresh`` (SFT on fresh problems, one solution each, then GRPO) at the shipped loop's runs'
  problems, banks and budgets (it needs those runs; at the ``changes_1207`` runs' larger budgets
  until 2026-12-07: ``benchmarks/results/baselines_changes_1207_2026-12-07/``).
* ``techniques``: ``technique_study.py``: more solutions per problem at equal SFT examples, and
  how many solutions the ``changes_1207`` runs' problems needed before a measurement found them
  solvable.
* ``test``: ``heldout_study.py``: the test sets, scored once per finished run of the four
  ``full`` arms and the four recipes (never again: a scored run is skipped for good).
* ``smollm2`` (by name only): ``smollm2_study.py --test``: CoScale-RL against (h) on
  SmolLM2-135M-Instruct (``configs/run/smollm2-135m/pipeline_cpu.yaml``), on its validation
  split, then its test sets once per finished run.
* ``iterations`` (by name only): ``loop_study.py --variant iterations``: the iterations alone,
  the pools re-measured after every RL epoch against relabelled by the rollouts, a fixed Rollout
  N against the schedule, a re-distillation fit after each iteration's RL against none.

Every step resumes (a scored run is skipped, a stopped one goes on from its checkpoints), so the
command can be stopped and started again, across sessions. Every choice reads the validation
problems only; the test sets are scored by the ``test`` step alone. Then each study's tables go
into ``docs/results.md`` between its two markers (nothing else there changes) and its ``.json``
and ``.md`` into ``--results``, with ``study-seconds.json`` (each step's wall time, every call
added up).

Cost on a 2-core AMD EPYC (Zen 4), 32-true, one process with both cores (2026-12-07): a demo
run takes 8.6-9.3 min alone with two iterations plus about a minute to score its models (two
runs side by side, one torch thread each: 11-13 min each), so the ``full`` step's 12 runs take
about 2 hours; ``baselines``' 9 fits took 64 min as two processes side by side (g
and h 10-12 min a fit, plain GRPO 9-11); ``techniques``' 9 fits about 2 min each side by side
(18 min); ``test`` about 25 s a model (21 models). By these figures the default steps take about
3.5 hours here (not timed as a whole: ``study-seconds.json`` will say); ``iterations`` adds
12 runs of 5-25 min. The study of 2026-12-06, on the SFT recipe of that day, is kept in
``benchmarks/results/study_2026-12-06/``.

Run: .venv/bin/python benchmarks/study.py [--steps full,baselines,techniques,test] [--seeds 0,1,2]
     [--out runs/loop_study] [--tables-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import baselines_study
import heldout_study
import loop_study
import smollm2_study
import technique_study

HERE = os.path.dirname(os.path.abspath(__file__))

STEPS: dict[str, list[str]] = {
    "full": ["loop_study.py", "--variant", "full", "--arms",
             "paper_loop,changes_1207,paper_loop_final_rl,final_rl_one_iteration"],
    "baselines": ["baselines_study.py"],
    "iterations": ["loop_study.py", "--variant", "iterations", "--arms",
                   "measure_each_epoch,rollouts_relabel,fixed_n,redistill"],
    "techniques": ["technique_study.py"],
    "test": ["heldout_study.py"],
    "smollm2": ["smollm2_study.py", "--test"],
}  # fmt: skip
"""Each step's script and arguments (``--seeds`` and ``--out`` are added)."""

DEFAULT_STEPS = ("full", "baselines", "techniques", "test")
"""What the command runs without ``--steps``: about four hours on these 2 cores (module docstring);
``iterations`` is asked for by name."""

TITLES = {
    "full": "The whole demo: the shipped loop, the paper's, the changes of before, one change each",
    "baselines": "The simple recipes at the shipped loop's budgets (its problems; fresh ones)",
    "iterations": "The iterations alone (no final stage)",
    "techniques": "More solutions per problem at equal SFT examples; solutions a problem needed",
    "test": "The test sets, scored once per finished run (the shipped loop, the paper's, the recipes)",
    "smollm2": "SmolLM2-135M-Instruct: CoScale-RL against (h), validation, then the test sets once",
}


def run_step(step: str, seeds: str, out: str) -> None:
    """One step's script, in this interpreter, from ``benchmarks/``; raises if it fails. Its
    wall seconds are added to ``<out>/study-seconds.json`` (a resumed step adds what it took)."""
    script, *args = STEPS[step]
    command = [sys.executable, script, *args, "--seeds", seeds, "--out", out]
    print(f"[study] {step}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    try:
        subprocess.run(command, cwd=HERE, check=True)
    finally:
        spent = add_seconds(
            os.path.join(out, "study-seconds.json"), step, time.perf_counter() - start
        )
        print(f"[study] {step}: {spent / 60:.1f} min on this step in all, every call", flush=True)


def add_seconds(path: str, step: str, seconds: float) -> float:
    """``seconds`` added to ``step``'s total in the file at ``path``; returns the new total."""
    totals = load(path) or {}
    totals[step] = totals.get(step, 0.0) + seconds
    with open(path, "w") as f:
        json.dump(totals, f, indent=1)
    return totals[step]


def tables(step: str, out: str) -> str | None:
    """The step's tables from its study file under ``out`` (None: not run yet)."""
    study = load(os.path.join(out, f"study-{step}.json"))
    if study is None:
        return None
    if step == "techniques":
        text = technique_study.summary(study)
    elif step == "baselines":
        text = baselines_study.summary(study, baselines_study.references(out))
    elif step == "test":
        text = heldout_study.summary(study)
    elif step == "smollm2":
        text = smollm2_study.summary(study)
    else:
        text = loop_study.summary(study)
    side = "test" if step == "test" else "validation"
    header = f"{study['cpu']}; {study['precision']}; {study['k']} samples per {side} problem"
    code = "scored with the code of" if step == "test" else "the runs' code:"
    header += f"; {code} {', '.join(sorted(commits(study)))}"
    return f"### {TITLES[step]}\n\n{header}\n\n{text}"


def commits(study: dict) -> set[str]:
    """The code commits the study's runs recorded (``not recorded`` for a run without one)."""
    runs = [
        r for arm in study.get("runs", study.get("solutions", {})).values() for r in arm.values()
    ]
    return {r.get("commit", "not recorded") for r in runs} or {"no runs"}


def load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def markers(step: str) -> tuple[str, str]:
    return f"<!-- study {step}: begin -->", f"<!-- study {step}: end -->"


def write_into(doc: str, step: str, text: str) -> None:
    """``text`` in ``doc`` between the step's two markers, in place of what was there."""
    with open(doc) as f:
        page = f.read()
    begin, end = markers(step)
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise SystemExit(f"{doc}: needs the markers '{begin}' and '{end}', once each, in order")
    head, rest = page.split(begin)
    _, tail = rest.split(end)
    with open(doc, "w") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


def keep(step: str, out: str, results: str) -> None:
    """The step's study files, copied into ``results`` (the repository's record)."""
    os.makedirs(results, exist_ok=True)
    name = f"study-{step}"
    for ext in (".json", ".md"):
        if os.path.exists(path := os.path.join(out, name + ext)):
            shutil.copy(path, os.path.join(results, name + ext))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/loop_study")
    parser.add_argument("--doc", default=os.path.join(HERE, "..", "docs", "results.md"))
    parser.add_argument("--results", default=os.path.join(HERE, "results", "study"))
    parser.add_argument("--tables-only", action="store_true", help="no runs: the tables again")
    args = parser.parse_args()
    steps = args.steps.split(",")
    if unknown := sorted(set(steps) - set(STEPS)):
        raise SystemExit(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    out = os.path.abspath(args.out)
    for step in steps:
        if not args.tables_only:
            run_step(step, args.seeds, out)
        if (text := tables(step, out)) is not None:
            write_into(args.doc, step, text)
            keep(step, out, args.results)
            print(text, flush=True)
    if os.path.exists(seconds := os.path.join(out, "study-seconds.json")):
        os.makedirs(args.results, exist_ok=True)
        shutil.copy(seconds, os.path.join(args.results, "study-seconds.json"))


if __name__ == "__main__":
    main()
