"""One GRPO step of coscale's `GRPOModule` against TRL's `GRPOTrainer`, same model, same work.

Both sides get an identical freshly built model (random weights from one seed) and do the same
work per optimizer step: `--prompts` prompts x N rollouts of at most `--new-tokens` tokens at
temperature 1 (top-p 1, top-k off), a reward with spread in every group, group-scaled
advantages, the `grpo` loss (token mean per sequence, mean over sequences), clip 0.2, beta 0
(no reference model), one update per generation (num_iterations 1), fp32, AdamW at lr 1e-6,
grad-norm clip 1.0, and the same rows per forward/backward pass (coscale `micro_batch_size` =
TRL `per_device_train_batch_size`, TRL accumulating R / that many micro-batches). TRL runs on
CPU as its docs ask: `use_cpu=True, bf16=False, gradient_checkpointing=False,
report_to="none"`. coscale runs with its defaults (the cached decode loop, length-sorted micro-batches, each
prompt once per micro-batch); `--plain` adds a column with all three off; `--compile` turns on
`rollout.options.compile` (its compiling happens in the warm-up runs, which are not timed).

A run is one fit of `--steps` optimizer steps with a fresh Lightning `Trainer` / TRL trainer;
its figure is the median of its step times (the time between step ends, so data loading,
generation, reward, update and the framework's own work are all in). Pairs, ratios and peak
memory: see `paired.py`.

Tables: `sizes` (coscale vs TRL per model size), `sweep` (coscale vs TRL as N grows, at
`--sweep-size`), `paths` (coscale vs coscale with one speed path off), `lora` (per
`--lora-sizes` model: coscale's full fine-tune, coscale with a LoRA adapter, `GRPOModule(peft=...)`,
and TRL's `GRPOTrainer(peft_config=...)` with the same `peft.LoraConfig` as `bench_sft.py`'s, r 16,
alpha 32, all-linear; the paired ratio TRL/coscale of the LoRA steps and the three peaks). Each run of the script
should stay under ~10 minutes on the 2-core machine, hence two commands:
`.venv/bin/python benchmarks/bench_grpo.py --tables sizes,paths` and
`.venv/bin/python benchmarks/bench_grpo.py --tables sweep --prompts 2`; the LoRA table on SmolLM2
and the Qwen2.5-0.5B shape with short rollouts:
`.venv/bin/python benchmarks/bench_grpo.py --tables lora --prompts 2 --n 4 --new-tokens 16 --pairs 3`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import tempfile
import warnings

from paired import (
    build,
    count_params,
    header,
    lora_cells,
    mib,
    pair_cells,
    paired,
    run_peak,
    timed_fit,
    trl_fit,
)
from torch.utils.data import DataLoader

from coscale.modules import GRPOModule
from coscale.rl.losses import GRPOLoss

PLAIN = {"cached_rollouts": False, "sort_micro_batches": False, "share_prompt_in_update": False}
"""GRPOModule with every speed path off (HF generate, micro-batches in rollout order, full width):
``rollout.backend: hf`` and the two update paths (module attributes, not settings) off."""
TRL_WORKSPACE = (
    "TRL's peak includes the fp32 workspace of its chunked log-prob kernel, [min(tokens, 1600), "
    "32768] (up to 200 MiB) per pass whatever the vocabulary (98 here), mostly never written"
)
QUESTIONS = [f"Q{k}: what is {7 * k + 11}+{3 * k + 40}?\n" for k in range(512)]


def problems(n: int) -> list[dict]:
    """:data:`QUESTIONS` as problems of `n` rollouts each (no answer: the reward needs none)."""
    return [{"id": str(i), "question": q, "answer": "", "n": n} for i, q in enumerate(QUESTIONS)]


def spread(completions: list[str]) -> list[float]:
    """A position-weighted checksum of the text in [0, 1): differs between almost any two
    completions, however short (a share of distinct characters ties at 4 tokens, every group
    then has no advantage, no step is taken and the fit never ends)."""
    return [sum((i + 1) * ord(ch) for i, ch in enumerate(c)) % 1009 / 1009 for c in completions]


class SpreadReward:
    """coscale's reward signature ``(completions, answers) -> list[float]``."""

    def __call__(self, completions, answers, **_):
        return spread(completions)


def trl_reward(prompts, completions, **_):
    """TRL's reward signature, same scores."""
    return spread(completions)


def coscale_run(size: str, n: int, args, peft=None, **paths: bool):
    """A function running one fit of `args.steps` steps -> median step seconds; ``paths``
    turns speed paths of :data:`PLAIN` off; ``peft``: a LoRA adapter instead of every weight."""
    model, tok = build(size)
    cached = paths.pop("cached_rollouts", True)
    rollout = (
        {"backend": "cached", "options": {"compile": args.compile}} if cached else {"backend": "hf"}
    )
    module = GRPOModule(
        model=model, tokenizer=tok, reward=SpreadReward(), loss=GRPOLoss(epsilon=0.2),
        optimizer={"lr": 1e-6}, rollout=rollout,
        sampling={"max_new_tokens": args.new_tokens, "temperature": 1.0, "top_p": 1.0},
        update={"scale_rewards": "group", "max_grad_norm": 1.0, "num_iterations": 1,
                "micro_batch_size": min(args.micro_batch, args.prompts * n)},
        peft=peft,
    )  # fmt: skip
    for name, on in paths.items():
        setattr(module, name, on)

    def run(steps: int = args.steps) -> float:
        loader = DataLoader(problems(n), batch_size=args.prompts, collate_fn=list)
        return timed_fit(module, loader, steps)

    return run


def trl_run(size: str, n: int, args, peft=None):
    """The same for TRL's GRPOTrainer (``peft``: its ``peft_config``)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = build(size)
    rollouts = args.prompts * n
    micro = min(args.micro_batch, rollouts)
    dataset = Dataset.from_list([{"prompt": q} for q in QUESTIONS])
    out_dir = tempfile.mkdtemp(prefix="bench_grpo_trl_")

    def run(steps: int = args.steps) -> float:
        config = GRPOConfig(
            output_dir=out_dir, max_steps=steps, per_device_train_batch_size=micro,
            gradient_accumulation_steps=rollouts // micro, num_generations=n,
            max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            loss_type="grpo", scale_rewards="group", beta=0.0, epsilon=0.2, num_iterations=1,
            learning_rate=1e-6, lr_scheduler_type="constant", max_grad_norm=1.0,
            use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
            save_strategy="no", logging_steps=10_000, disable_tqdm=True, shuffle_dataset=False,
            dataloader_num_workers=0, seed=0,
        )  # fmt: skip
        return trl_fit(
            GRPOTrainer, model=model, reward_funcs=trl_reward, args=config,
            train_dataset=dataset, processing_class=tok, peft_config=peft,
        )  # fmt: skip

    return run


def row(label: str, size: str, n: int, args) -> None:
    """Paired coscale (A) vs TRL (B) for one setting -> one table row (+ the plain variant)."""
    fast, trl = coscale_run(size, n, args), trl_run(size, n, args)
    result = paired(fast, trl, args.pairs)
    cells = [label, *pair_cells(result), *(mib(run_peak(r)) for r in (fast, trl))]
    if args.plain:
        plain = coscale_run(size, n, args, **PLAIN)
        cells += pair_cells(paired(fast, plain, args.pairs))[1:]
    print("| " + " | ".join(cells) + " |", flush=True)


def table_head(first: str, plain: bool) -> None:
    cols = [first, "coscale step", "TRL step", "TRL/coscale (per pair)", "peak mem coscale"]
    cols += ["peak mem TRL"]
    if plain:
        cols += ["coscale plain step", "plain/coscale (per pair)"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))


def paths_table(args) -> None:
    """coscale (A) against itself with one speed path off (B), at the sweep model and --n."""
    print(f"\n## Each speed path: {args.sweep_size} model, {args.prompts} prompts x N={args.n}")
    print("| B = coscale with | coscale step | B step | B/coscale (per pair) |")
    print("|---|---|---|---|")
    fast = coscale_run(args.sweep_size, args.n, args)
    for name in [*PLAIN, "all three"]:
        options = PLAIN if name == "all three" else {name: False}
        other = coscale_run(args.sweep_size, args.n, args, **options)
        cells = pair_cells(paired(fast, other, args.pairs))
        print(f"| {name} off | {' | '.join(cells)} |", flush=True)


def lora_table(args) -> None:
    """coscale full, coscale LoRA and TRL LoRA per model: steps, LoRA ratio, peaks."""
    from bench_sft import lora_config

    n = args.n
    print(f"\n## GRPO step with a LoRA adapter (r 16, alpha 32, all-linear): {args.prompts} "
          f"prompts x N={n}, {args.new_tokens} new tokens")  # fmt: skip
    print("| model | coscale full | coscale LoRA | TRL LoRA | TRL/coscale LoRA (per pair) | "
          "peak full | peak coscale LoRA | peak TRL LoRA |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for size in args.lora_sizes.split(","):
        full = coscale_run(size, n, args)
        lora = coscale_run(size, n, args, peft=lora_config())
        trl = trl_run(size, n, args, peft=lora_config())
        print(f"| {size} | {' | '.join(lora_cells(full, lora, trl, args.pairs))} |", flush=True)
        del full, lora, trl  # this model's three copies and optimizer state, before the next
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="sizes,paths", help="of sizes, sweep, paths, lora")
    parser.add_argument("--sizes", default="0.5M,4M,30M")
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt (sizes, paths)")
    parser.add_argument("--sweep-size", default="4M", help="model of the N sweep and paths")
    parser.add_argument("--lora-sizes", default="smollm2-135m,qwen2.5-0.5b-shape")
    parser.add_argument("--sweep-n", default="8,16,32,64")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per fwd/bwd pass")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per run")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="add coscale with speed paths off")
    parser.add_argument(
        "--compile", action="store_true", help="coscale with rollout.options.compile"
    )
    args = parser.parse_args()
    header(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    tables = args.tables.split(",")
    if "sizes" in tables:
        print(
            f"\n## Model sizes: {args.prompts} prompts x N={args.n}, {args.new_tokens} new tokens"
        )
        table_head("model", args.plain)
        for size in [s for s in args.sizes.split(",") if s]:
            params = count_params(build(size)[0]) / 1e6
            row(f"{size} ({params:.1f}M)", size, args.n, args)
        print(f"# {TRL_WORKSPACE}")
    if "sweep" in tables:
        print(f"\n## N sweep: {args.sweep_size} model, {args.prompts} prompts x N")
        table_head("N (rollouts)", args.plain)
        for n in [int(n) for n in args.sweep_n.split(",") if n]:
            row(f"{n} ({args.prompts * n})", args.sweep_size, n, args)
        print(f"# {TRL_WORKSPACE}")
    if "paths" in tables:
        paths_table(args)
    if "lora" in tables:
        lora_table(args)


if __name__ == "__main__":
    main()
