"""One SFT step of coscale's `SFTModule` against TRL's `SFTTrainer`, same model, same work.

Both sides train an identical freshly built model on the same (prompt, solution) pairs in the
same order: `--batch` pairs per optimizer step, EOS appended to the solution, the loss the token
mean over the solution tokens only (TRL: a prompt-completion data set, `completion_only_loss`),
no packing, no padding-free batches, fp32, AdamW at lr 1e-5 (constant), grad-norm clip 1.0
(Lightning `gradient_clip_val=1.0`). TRL runs on CPU as its docs ask: `use_cpu=True,
bf16=False, gradient_checkpointing=False, report_to="none"`; its data set is tokenized when
the trainer is built (off the clock), coscale tokenizes inside its step (on the clock).

coscale runs with its defaults, so padding-free batches (`coscale.sft.packing`): the same loss
and gradient, no FLOPs on padding. TRL's `padding_free=True` is left off: on CPU it would attend
over the whole packed row under a [S, S] mask.

A run is one fit of `--steps` steps with a fresh trainer; its figure is the median time
between step ends. Pairs, ratios and peak memory: see `paired.py`.

Tables (`--tables`): `sizes`, coscale against TRL per model size; `paths`, coscale's
padding-free batches against its padded path, per size; `lora`, per `--lora-sizes` model
(default SmolLM2-135M and a random Qwen2.5-0.5B shape): coscale's full fine-tune, coscale with a
LoRA adapter (`SFTModule(peft=...)`) and TRL's `SFTTrainer(peft_config=...)` with the same
`peft.LoraConfig` (r 16, alpha 32, all-linear), the paired ratio TRL/coscale of the LoRA steps,
the peaks, and the size of a checkpoint of each coscale fit (`trainer.save_checkpoint`).

Run: `.venv/bin/python benchmarks/bench_sft.py [--tables sizes,paths,lora] [--sizes 0.5M,4M,30M]
[--lora-sizes smollm2-135m,qwen2.5-0.5b-shape] [--batch 8] [--pairs 5]`
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import statistics
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

from coscale.modules import SFTModule


def pairs_data(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Arithmetic questions with worked solutions of 60-200 characters (lengths vary)."""
    rng = random.Random(seed)
    rows = []
    for k in range(count):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        steps = " ".join(
            f"Step {i}: carry the digits of {a} and {b}." for i in range(rng.randint(1, 4))
        )
        solution = f"{steps} So {a}+{b}={a + b}, and the answer is \\boxed{{{a + b}}}."
        rows.append({"question": f"Q{k}: what is {a}+{b}?\n", "solution": solution})
    return rows


class _NoReward:
    """SFT validation is not run here; avoids building the default math-verify reward."""

    def __call__(self, completions, answers, **_):
        return [0.0] * len(completions)


def lora_config():
    """The adapter both sides train in the `lora` table."""
    import peft

    return peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")


def coscale_run(size: str, data: list[dict], args, padding_free: bool = True, peft=None):
    """A function running one fit of `args.steps` steps -> median step seconds; its
    ``module`` as an attribute (for a checkpoint of the last fit)."""
    model, tok = build(size)
    module = SFTModule(
        model=model, tokenizer=tok, optimizer={"lr": 1e-5}, max_length=1024, verifier=_NoReward(),
        padding_free=padding_free, peft=peft,
    )  # fmt: skip

    def run(steps: int = args.steps) -> float:
        loader = DataLoader(data, batch_size=args.batch, collate_fn=list)
        return timed_fit(module, loader, steps, gradient_clip_val=1.0, limit_val_batches=0)

    run.module = module
    return run


def trl_run(size: str, data: list[dict], args, peft=None):
    """The same for TRL's SFTTrainer (``peft``: its ``peft_config``)."""
    from datasets import Dataset, disable_progress_bar
    from trl import SFTConfig, SFTTrainer

    disable_progress_bar()
    model, tok = build(size)
    rows = [{"prompt": r["question"], "completion": r["solution"]} for r in data]
    dataset = Dataset.from_list(rows)
    out_dir = tempfile.mkdtemp(prefix="bench_sft_trl_")

    def run(steps: int = args.steps) -> float:
        config = SFTConfig(
            output_dir=out_dir, max_steps=steps, per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1, max_length=1024, packing=False, padding_free=False,
            completion_only_loss=True, learning_rate=1e-5, lr_scheduler_type="constant",
            max_grad_norm=1.0, use_cpu=True, bf16=False, gradient_checkpointing=False,
            report_to="none", save_strategy="no", logging_steps=10_000, disable_tqdm=True,
            shuffle_dataset=False, dataloader_num_workers=0, seed=0,
        )  # fmt: skip
        return trl_fit(
            SFTTrainer, model=model, args=config, train_dataset=dataset, processing_class=tok,
            peft_config=peft,
        )  # fmt: skip

    return run


def print_row(label: str, run_a, run_b, pairs: int) -> None:
    """One table row of two fit runners: both medians, the paired ratio and both peaks."""
    result = paired(run_a, run_b, pairs)
    cells = [label, *pair_cells(result), *(mib(run_peak(r)) for r in (run_a, run_b))]
    print("| " + " | ".join(cells) + " |", flush=True)


def sizes_table(data: list[dict], args) -> None:
    """coscale against TRL per model size."""
    print("| model | coscale step | TRL step | TRL/coscale (per pair) | peak mem coscale | "
          "peak mem TRL |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        fast, trl = coscale_run(size, data, args), trl_run(size, data, args)
        params = count_params(build(size)[0]) / 1e6
        print_row(f"{size} ({params:.1f}M)", fast, trl, args.pairs)


def paths_table(data: list[dict], args) -> None:
    """coscale's padding-free batches against its padded path per model size."""
    print("\n## coscale SFT step: padding-free batches vs padded")
    print("| model | padding-free | padded | padded/padding-free (per pair) | peak mem "
          "padding-free | peak mem padded |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        free, padded = (coscale_run(size, data, args, flag) for flag in (True, False))
        print_row(size, free, padded, args.pairs)


def checkpoint_bytes(run) -> int:
    """Bytes of a checkpoint of the last fit of a :func:`coscale_run` runner."""
    path = os.path.join(tempfile.mkdtemp(prefix="bench_sft_ckpt_"), "last.ckpt")
    run.module.trainer.save_checkpoint(path)
    size = os.path.getsize(path)
    os.remove(path)
    return size


def lora_table(data: list[dict], args) -> None:
    """coscale full, coscale LoRA and TRL LoRA per model; checkpoint sizes full vs LoRA."""
    print("\n## SFT step with a LoRA adapter (r 16, alpha 32, all-linear)")
    print("| model | coscale full | coscale LoRA | TRL LoRA | TRL/coscale LoRA (per pair) | "
          "peak full | peak coscale LoRA | peak TRL LoRA | ckpt full | ckpt LoRA |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.lora_sizes:
        full = coscale_run(size, data, args)
        lora, trl = (
            coscale_run(size, data, args, peft=lora_config()),
            trl_run(size, data, args, peft=lora_config()),
        )
        cells = lora_cells(full, lora, trl, args.pairs)
        ckpts = [checkpoint_bytes(r) for r in (full, lora)]
        print(
            f"| {size} | {' | '.join(cells)} | {ckpts[0] / 2**20:,.1f} MiB | "
            f"{ckpts[1] / 2**20:,.2f} MiB ({ckpts[0] / ckpts[1]:,.0f}x smaller) |",
            flush=True,
        )
        del full, lora, trl  # this model's three copies and optimizer state, before the next
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="sizes,paths", help="of sizes, paths")
    parser.add_argument("--sizes", default="0.5M,4M,30M")
    parser.add_argument("--lora-sizes", default="smollm2-135m,qwen2.5-0.5b-shape")
    parser.add_argument("--batch", type=int, default=8, help="pairs per optimizer step")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.lora_sizes = [s for s in args.lora_sizes.split(",") if s]
    header(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    data = pairs_data(512)
    mean_len = statistics.mean(len(r["question"]) + len(r["solution"]) + 1 for r in data)
    print(f"\n## SFT step: {args.batch} pairs per step, ~{mean_len:.0f} tokens per pair")
    tables = args.tables.split(",")
    if "sizes" in tables:
        sizes_table(data, args)
    if "paths" in tables:
        paths_table(data, args)
    if "lora" in tables:
        lora_table(data, args)


if __name__ == "__main__":
    main()
