"""`bench_rollout.py --vllm`: rollout tokens/s of vLLM's engine against coscale's cached decode
and HF `generate` on SmolLM2-135M-Instruct, and the time of one weight sync.

Every side samples the same prompts (batch b = b/8 distinct prompts x N=8), at most
`--new-tokens` tokens, temperature 1, `--dtype` (float32), on one policy object (vLLM loads the same
folder). Sides: ``cached`` (`CachedDecodeBackend`, every speed path on), ``hf``
(`HFGenerateBackend`), ``vllm`` (`VLLMBackend`, seeded calls as `GRPOModule` makes them: one
request per rollout) and ``vllm-unseeded`` (the same engine, unseeded: one request of n=N per
prompt, the prompt's KV computed once). Per batch size: one untimed warm-up call per side, then
`--rounds` rounds of A B C D; a cell is the median tokens/s (kept completion tokens per second of
wall time) with each round's value; ratios are medians of the per-round ratios. The engine is
built once and kept across rounds and batch sizes; its build time is printed.

Weight sync: `--syncs` times (one AdamW step on the policy, then `update_weights`), the median
wall time and the engine-side time of `backend.book.last`; after each sync two timed `generate`
calls at batch 8 (whether the first after a sync takes longer than the second: work a sync
left to the next forward pass would belong to the sync's cost), then a parity check; after
the last sync, whether the engine's greedy completions equal HF's.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from statistics import median
from typing import Any

import torch
from paired import timed
from vllm_bench import (
    RESULTS,
    Report,
    cell,
    engine_options,
    optimiser_step,
    require_vllm,
    smollm2,
    write_header,
)

from coscale.rollout import CachedDecodeBackend, HFGenerateBackend, SamplingParams

SIDES = ("cached", "hf", "vllm", "vllm-unseeded")
GREEDY_PROMPTS = ["Q: what is 12+30?\n", "Name a colour.\n", "Count to five:"]


@dataclass
class Side:
    """A backend and whether its calls carry a seed."""

    name: str
    backend: Any
    seeded: bool = True


def check_args(args: argparse.Namespace) -> None:
    """Raises SystemExit naming every bad flag of the --vllm mode."""
    problems = [f"--sides: unknown {s!r} (choices: {', '.join(SIDES)})"
                for s in args.sides if s not in SIDES]  # fmt: skip
    problems += [f"--batches: {b} is not a multiple of 8" for b in args.batches if b % 8]
    if args.rounds < 1:
        problems.append(f"--rounds must be >= 1, got {args.rounds}")
    if args.syncs < 1:
        problems.append(f"--syncs must be >= 1, got {args.syncs}")
    if problems:
        raise SystemExit("bench_rollout.py --vllm: " + "; ".join(problems))


def build_sides(args, folder: str, policy, tok, report: Report) -> tuple[list[Side], Any]:
    """The sides named by --sides, and the vLLM backend (built once; None if not asked for)."""
    vllm = None
    if any(s.startswith("vllm") for s in args.sides):
        from coscale.rollout.vllm.backend import VLLMBackend

        options = engine_options(args.dtype, args.max_model_len, args.kv_cache_gib, args.eager)
        # parity is checked explicitly after each timed sync, never inside a timed call
        vllm = VLLMBackend(folder, tok, policy, parity={"every": 0}, **options)
        seconds = timed(lambda: vllm.engine)
        report(f"# vLLM engine built in {seconds:.1f} s, options {options}; "
               f"torch threads after the build: {torch.get_num_threads()}")  # fmt: skip
    make = {
        "cached": lambda: Side("cached", CachedDecodeBackend(policy, tok)),
        "hf": lambda: Side("hf", HFGenerateBackend(policy, tok)),
        "vllm": lambda: Side("vllm", vllm),
        "vllm-unseeded": lambda: Side("vllm-unseeded", vllm, seeded=False),
    }
    return [make[name]() for name in args.sides], vllm


def run_side(side: Side, prompts: list[str], n: int, new_tokens: int, seed: int):
    """One `generate` call -> (kept tokens per second, mean kept tokens per rollout)."""
    sampling = SamplingParams(
        max_new_tokens=new_tokens, temperature=1.0, seed=seed if side.seeded else None
    )
    start = time.perf_counter()
    rollouts = side.backend.generate(prompts, n, sampling)
    seconds = time.perf_counter() - start
    kept = float(rollouts.lengths.sum())
    return kept / seconds, kept / rollouts.num_rollouts


def batch_row(sides: list[Side], batch: int, args, prompts_for) -> str:
    """Warm-up, then --rounds rounds of every side in turn -> one table row."""
    prompts, n = prompts_for(batch)
    for side in sides:
        run_side(side, prompts, n, args.new_tokens, seed=10_000)
    rates: dict[str, list[float]] = {s.name: [] for s in sides}
    lengths: dict[str, list[float]] = {s.name: [] for s in sides}
    for r in range(args.rounds):
        for side in sides:
            rate, length = run_side(side, prompts, n, args.new_tokens, seed=r)
            rates[side.name].append(rate)
            lengths[side.name].append(length)
    first = sides[0].name
    cells = [f"{batch} ({len(prompts)} x {n})", *(cell(rates[s.name]) for s in sides)]
    for side in sides[1:]:
        ratios = [a / b for a, b in zip(rates[side.name], rates[first])]
        cells.append(f"{median(ratios):.2f}x")
    cells.append(" / ".join(f"{median(lengths[s.name]):.1f}" for s in sides))
    return "| " + " | ".join(cells) + " |"


def batch_table(report: Report, sides: list[Side], args, prompts_for) -> None:
    names = [s.name for s in sides]
    report(f"\n## Rollout tokens/s, SmolLM2-135M-Instruct {args.dtype}, {args.new_tokens} new "
           f"tokens, temperature 1; median of {args.rounds} rounds (each round)")  # fmt: skip
    cols = ["batch (prompts x N)", *(f"{s} tok/s" for s in names)]
    cols += [f"{s}/{names[0]}" for s in names[1:]]
    cols.append(f"mean tokens per rollout ({' / '.join(names)})")
    report("| " + " | ".join(cols) + " |")
    report("|" + "---|" * len(cols))
    for batch in args.batches:
        report(batch_row(sides, batch, args, prompts_for))


def sync_rows(report: Report, vllm, policy, tok, args, prompts_for) -> None:
    """--syncs x (optimiser step, timed `update_weights`, two timed `generate` calls at batch 8,
    parity check): the first call after a sync may pay for work the sync left to it."""
    optimiser = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    side, (prompts, n) = Side("vllm", vllm), prompts_for(8)
    walls, engine_s, first, second, parities = [], [], [], [], []
    for k in range(args.syncs):
        optimiser_step(policy, optimiser, tok)
        walls.append(timed(lambda: vllm.update_weights(policy)))
        engine_s.append(vllm.book.last.seconds)
        for into in (first, second):
            into.append(timed(lambda k=k: run_side(side, prompts, n, args.new_tokens, 100 + k)))
        parities.append(vllm.check_parity().mean_abs)
    last = vllm.book.last
    report(f"\n## Weight sync after an AdamW step ({args.syncs} syncs); then two generate calls "
           f"at batch 8 ({args.new_tokens} tokens), then a parity check")  # fmt: skip
    report("| tensors | MB | sync wall s | book.last.seconds | 1st generate after sync s | "
           "2nd generate s | parity mean abs logp diff |")  # fmt: skip
    report("|---|---|---|---|---|---|---|")
    report(f"| {last.tensors} | {last.bytes / 1e6:,.0f} | {cell(walls, '{:.2f}')} | "
           f"{cell(engine_s, '{:.2f}')} | {cell(first, '{:.2f}')} | {cell(second, '{:.2f}')} | "
           f"{' '.join(f'{p:.1e}' for p in parities)} |")  # fmt: skip


def greedy_line(report: Report, vllm, policy, tok) -> None:
    """After the syncs: the engine's greedy completions against HF's on the trained policy."""
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    engine = vllm.generate(GREEDY_PROMPTS, 1, greedy).texts
    trainer = HFGenerateBackend(policy, tok).generate(GREEDY_PROMPTS, 1, greedy).texts
    same = sum(a == b for a, b in zip(engine, trainer))
    report(
        f"# greedy after the last sync: {same}/{len(trainer)} completions equal HF's"
        + ("" if same == len(trainer) else f"; engine {engine!r}, HF {trainer!r}")
    )


def run(args: argparse.Namespace, prompts_for) -> None:
    """The --vllm mode of bench_rollout.py (see the module doc)."""
    if args.quick:
        args.batches, args.rounds, args.new_tokens, args.syncs = [8], 1, 8, 2
    check_args(args)
    if any(s.startswith("vllm") for s in args.sides):
        require_vllm()
    threads = args.threads or len(os.sched_getaffinity(0))
    out = args.out or (
        "/tmp/bench_rollout_vllm_quick.txt" if args.quick else RESULTS / "bench_rollout_vllm.txt"
    )
    report = Report(out)
    write_header(report, threads, args.dtype)
    folder, policy, tok = smollm2(args.dtype)
    sides, vllm = build_sides(args, folder, policy, tok, report)
    batch_table(report, sides, args, prompts_for)
    if vllm is not None:
        report(f"# vLLM log-probs from: {vllm.last_logprob_source}")
        sync_rows(report, vllm, policy, tok, args, prompts_for)
        greedy_line(report, vllm, policy, tok)
        vllm.close()
    report(f"# written to {out}")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the --vllm mode."""
    group = parser.add_argument_group("--vllm mode (SmolLM2-135M, see rollout_vllm.py)")
    group.add_argument(
        "--vllm",
        action="store_true",
        help="vLLM vs cached decode vs HF generate on SmolLM2-135M, + sync time",
    )
    group.add_argument("--sides", default=",".join(SIDES), help=f"of {', '.join(SIDES)}")
    group.add_argument("--rounds", type=int, default=3, help="rounds of A B C D per batch")
    group.add_argument("--syncs", type=int, default=5, help="timed weight syncs")
    group.add_argument("--dtype", default="float32", help="float32 | bfloat16, every side")
    group.add_argument("--max-model-len", type=int, default=512, help="vLLM max_model_len")
    group.add_argument("--kv-cache-gib", type=float, default=None,
                       help="vLLM KV cache in GiB (default: coscale's CPU default)")  # fmt: skip
    group.add_argument("--eager", action="store_true", help="vLLM with enforce_eager=True")
    group.add_argument(
        "--quick",
        action="store_true",
        help="check the script: batch 8, 1 round, 8 tokens, 2 syncs, out in /tmp",
    )
    group.add_argument(
        "--out",
        default=None,
        help="results file (appended; default results/bench_rollout_vllm.txt)",
    )
