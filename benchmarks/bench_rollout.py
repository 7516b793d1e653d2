"""New tokens/s of the rollout backends, and the share of the matmul-bound rate they reach.

Side A is `CachedDecodeBackend` (all speed paths on), side B is `HFGenerateBackend`
(`model.generate`), on the same model and prompts: batch b is b/8 distinct prompts with N=8
rollouts each (batch 1: one prompt, N=1), `--new-tokens` per completion, temperature 1, random
weights (so some rows meet EOS early, as in RL). Tokens/s counts kept completion tokens per
second of wall time. The matmul-bound rate is this machine's fp32 matmul peak (the best of
the 1024^3 matmuls timed before each batch row, same threads) divided by the model's FLOPs
per new token (2 x the non-embedding weights incl. the LM head, plus attention over the
average context). "Matmuls alone" times only the weight matmuls of one decode step at the batch's row count: the
ceiling of any decode loop on this machine. Then each speed path is switched off in turn at
one batch, to show what each one buys.
Peak memory: see `paired.py` (live tensor bytes above the weights, one untimed run per side).

Run: `.venv/bin/python benchmarks/bench_rollout.py [--size 30M] [--batches 1,8,64,256]
[--new-tokens 32] [--pairs 5] [--threads 1] [--ablation-size 4M] [--ablation-batch 64]`;
`--compile [--compile-sizes 0.5M,4M,30M]` runs only the `compile=True` check (its first call
per size compiles, 10-30 s).

`--vllm` runs only the vLLM comparison on SmolLM2-135M-Instruct (vLLM's engine vs cached decode
vs HF generate, batches 8/64/256, plus the time of one weight sync; see `rollout_vllm.py`),
written to results/bench_rollout_vllm.txt: `HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TOKENIZERS_PARALLELISM=false .venv/bin/python benchmarks/bench_rollout.py --vllm` (`--quick`:
batch 8, one round, 8 tokens, output in /tmp, to check the script).
"""

from __future__ import annotations

import argparse
from statistics import median_high

import rollout_vllm
import torch
from paired import (
    build,
    count_params,
    header,
    matmul_peak,
    mib,
    paired,
    peak_tensor_bytes,
    ratio_cell,
    timed,
)

from coscale.rollout import CachedDecodeBackend, HFGenerateBackend, SamplingParams

PROMPT = "Q{k}: what is {a}+{b}?\n"


def prompts_for(batch: int) -> tuple[list[str], int]:
    """(distinct prompts, N): b/8 prompts x 8 rollouts, or one prompt x 1 for batch < 8."""
    if batch < 8:
        return [PROMPT.format(k=0, a=12, b=30)] * batch, 1
    return [PROMPT.format(k=k, a=7 * k + 11, b=3 * k + 40) for k in range(batch // 8)], 8


def flops_per_token(model, context: float) -> float:
    """2 x matmul weights (non-embedding + LM head) + 4 x layers x width x context."""
    cfg = model.config
    weights = count_params(model) - cfg.vocab_size * cfg.hidden_size  # tied: embedding once
    lm_head = cfg.vocab_size * cfg.hidden_size
    return 2 * (weights + lm_head) + 4 * cfg.num_hidden_layers * cfg.hidden_size * context


def matmuls_alone(model, rows: int, repeats: int = 5) -> float:
    """tok/s if a decode step were nothing but its weight matmuls at `rows` rows: every
    `nn.Linear` of the model (and the tied LM head) applied once to random [rows, in] inputs,
    best of `repeats`. No attention, no element-wise work, no finished rows: a ceiling."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, w.shape[1]) for w in weights]

    def step() -> None:
        for x, w in zip(inputs, weights):
            torch.nn.functional.linear(x, w)

    step()
    return rows / min(timed(step) for _ in range(repeats))


def rate_runner(backend, prompts: list[str], n: int, sampling: SamplingParams, tokens: list):
    """A run: one `generate` call -> seconds per kept token (so B/A is a tokens/s ratio)."""

    def run() -> float:
        kept = []
        seconds = timed(
            lambda: kept.append(int(backend.generate(prompts, n, sampling).lengths.sum()))
        )
        tokens.append(kept[0] / seconds)
        return seconds / kept[0]

    return run


def compare(a, b, prompts, n, sampling, pairs: int) -> tuple[float, float, object]:
    """Paired runs of backends a and b -> (a's median tokens/s, b's, Paired)."""
    rates_a, rates_b = [], []
    result = paired(
        rate_runner(a, prompts, n, sampling, rates_a),
        rate_runner(b, prompts, n, sampling, rates_b),
        pairs,
    )
    return median_high(rates_a[1:]), median_high(rates_b[1:]), result  # [0] is the warm-up


def memory(backend, prompts: list[str], n: int, sampling: SamplingParams) -> int:
    """Peak live tensor bytes of one `generate` call."""
    return peak_tensor_bytes(lambda: backend.generate(prompts, n, sampling))


def batch_table(args, peaks: list[float]) -> None:
    """Rows per batch size; the bound uses the best matmul peak measured during the table."""
    model, tok = build(args.size)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    fast, ref = CachedDecodeBackend(model, tok), HFGenerateBackend(model, tok)
    rows = []
    for batch in args.batches:
        prompts, n = prompts_for(batch)
        peaks.append(matmul_peak())  # the load moves; the best peak seen is the bound
        rate_a, rate_b, result = compare(fast, ref, prompts, n, sampling, args.pairs)
        mems = [memory(x, prompts, n, sampling) for x in (ref, fast)]
        alone = matmuls_alone(model, batch)
        rows.append((batch, rate_b, rate_a, result, mems, alone))
    peaks.append(matmul_peak())
    bound = max(peaks) / flops_per_token(model, 20 + args.new_tokens / 2)
    print(
        f"\n## {args.size} model ({count_params(model) / 1e6:.1f}M parameters), "
        f"{args.new_tokens} new tokens, matmul-bound rate {bound:,.0f} tok/s "
        f"(best fp32 peak of the table, {max(peaks) / 1e9:.0f} GFLOP/s)"
    )
    print("| batch | HF generate tok/s | cached tok/s | cached/HF (per pair) | HF % of bound | "
          "cached % of bound | matmuls alone % of bound | peak mem HF | peak mem cached |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for batch, rb, ra, result, (mem_b, mem_a), alone in rows:
        print(
            f"| {batch} | {rb:,.0f} | {ra:,.0f} | {ratio_cell(result)} | {rb / bound:.0%} | "
            f"{ra / bound:.0%} | {alone / bound:.0%} | {mib(mem_b)} | {mib(mem_a)} |"
        )
    print(
        "# matmuls alone: the step's weight matmuls only, timed at the batch's row count "
        "(no attention, element-wise work or finished rows): the most any decode loop could reach"
    )


def ablation_table(args) -> None:
    model, tok = build(args.ablation_size)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    prompts, n = prompts_for(args.ablation_batch)
    fast = CachedDecodeBackend(model, tok)
    print(
        f"\n## Each speed path: {args.ablation_size} model, batch {args.ablation_batch} "
        f"({len(prompts)} prompts x {n}), {args.new_tokens} new tokens; A = all paths on"
    )
    print("| B = A with | A tok/s | B tok/s | A/B (per pair) | peak mem A | peak mem B |")
    print("|---|---|---|---|---|---|")
    variants = {
        "share_prefix off": {"share_prefix": False},
        "drop_finished off": {"drop_finished": False},
        "static_cache off (HF DynamicCache)": {"static_cache": False},
        "all three off (plain loop)": dict.fromkeys(
            ("share_prefix", "drop_finished", "static_cache"), False
        ),
    }
    mem_a = memory(fast, prompts, n, sampling)
    for label, options in variants.items():
        other = CachedDecodeBackend(model, tok, **options)
        rate_a, rate_b, result = compare(fast, other, prompts, n, sampling, args.pairs)
        mem_b = memory(other, prompts, n, sampling)
        print(
            f"| {label} | {rate_a:,.0f} | {rate_b:,.0f} | "
            f"{ratio_cell(result)} | {mib(mem_a)} | {mib(mem_b)} |",
            flush=True,
        )


def compile_check(args) -> None:
    """`CachedDecodeBackend(compile=True)` (A) against the eager backend (B), per model size."""
    print(
        f"\n## compile=True: batch {args.ablation_batch}, {args.new_tokens} new tokens; "
        "A = compiled step over a static cache, B = eager (all speed paths on)"
    )
    print("| model | first call (compiles) | A tok/s | B tok/s | A/B (per pair) | peak mem A | "
          "peak mem B |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    prompts, n = prompts_for(args.ablation_batch)
    for size in args.compile_sizes.split(","):
        model, tok = build(size)
        eager = CachedDecodeBackend(model, tok)
        compiled = CachedDecodeBackend(model, tok, compile=True)
        first = timed(lambda c=compiled: c.generate(prompts, n, sampling))
        rate_a, rate_b, result = compare(compiled, eager, prompts, n, sampling, args.pairs)
        mems = [memory(x, prompts, n, sampling) for x in (compiled, eager)]
        print(
            f"| {size} | {first:.0f} s | {rate_a:,.0f} | {rate_b:,.0f} | "
            f"{ratio_cell(result)} | {mib(mems[0])} | {mib(mems[1])} |",
            flush=True,
        )


def default_batches(vllm: bool) -> str:
    return "8,64,256" if vllm else "1,8,64,256"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="30M")
    parser.add_argument("--batches", default=None, help="default 1,8,64,256 (--vllm: 8,64,256)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=None, help="default 1 (--vllm: every core of the process)"
    )
    parser.add_argument("--ablation-size", default="4M")
    parser.add_argument("--ablation-batch", type=int, default=64)
    parser.add_argument("--compile", action="store_true", help="only the compile=True check")
    parser.add_argument("--compile-sizes", default="0.5M,4M,30M")
    rollout_vllm.add_flags(parser)
    args = parser.parse_args()
    args.batches = [int(b) for b in (args.batches or default_batches(args.vllm)).split(",")]
    if args.vllm:
        args.sides = [s for s in args.sides.split(",") if s]
        rollout_vllm.run(args, prompts_for)
        return
    args.threads = args.threads or 1
    header(args.threads)
    peak = matmul_peak()
    print(
        f"# fp32 matmul peak (1024^3, best of 5): {peak / 1e9:.0f} GFLOP/s; "
        f"bf16: {matmul_peak(torch.bfloat16) / 1e9:.0f} GFLOP/s"
    )
    if args.compile:
        compile_check(args)
        return
    peaks = [peak]
    batch_table(args, peaks)
    ablation_table(args)
    peaks.append(matmul_peak())
    print(f"# fp32 matmul peaks measured (GFLOP/s): {' '.join(f'{p / 1e9:.0f}' for p in peaks)}")


if __name__ == "__main__":
    main()
