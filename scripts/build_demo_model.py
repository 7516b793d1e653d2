"""Builds the demo's base model from a seed: a 1.8M-parameter character-level Llama that has
learned the easy tiers of the built-in task (``coscale.tasks.tiers``) and single-step drills.

It is the "weak model" of the demo: it adds and subtracts two numbers reliably, but has seen
four-term chains only rarely, so the four held-out sets sit at its ability boundary.

Run: ``.venv/bin/python scripts/build_demo_model.py`` (writes ``coscale/assets/demo_model``;
about 4 minutes on an idle 2-core machine; the shipped model took 27 minutes on a busy one).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from coscale.models.tiny import build_char_tokenizer, build_tiny_model
from coscale.sft.batch import token_mean_loss, tokenize_pairs
from coscale.tasks import tiers

OUT = Path(__file__).resolve().parents[1] / "coscale" / "assets" / "demo_model"


def drill(rng: random.Random) -> tuple[str, str]:
    """A single step ``x+y`` or ``x-y`` with x up to 299: the arithmetic the chains reuse."""
    x, y = rng.randint(1, 299), rng.randint(1, 99)
    sign = rng.choice((1, -1))
    question = f"{x}{'+' if sign > 0 else '-'}{y}"
    return question, tiers.canonical_solution(question)


def example(rng: random.Random, chain_fraction: float) -> tuple[str, str]:
    """One pre-training pair: a drill, an easy-tier problem, or (rarely) a four-term chain."""
    u = rng.random()
    if u < 0.30:
        return drill(rng)
    if u < 1 - chain_fraction:
        tier = tiers.TIERS[rng.choice(["T1", "T1", "T2", "T2v"])]
    else:
        tier = tiers.TIERS[rng.choice(tiers.BENCHMARKS)]
    while True:
        q = tiers._question(rng, tier)
        if not tiers.is_held_out(q):
            return q, tiers.canonical_solution(q)


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    tok = build_char_tokenizer(tiers.CHARS)
    sizes = {"hidden_size": 192, "num_layers": 4, "num_heads": 6, "intermediate_size": 512}
    model = build_tiny_model(tok, max_position_embeddings=128, seed=args.seed, **sizes)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05
    )
    start = time.time()
    for step in range(args.steps):
        pairs = [example(rng, args.chain_fraction) for _ in range(args.batch)]
        prompts = [tiers.PROMPT.format(question=q) for q, _ in pairs]
        enc = tokenize_pairs(tok, prompts, [s for _, s in pairs], max_length=128)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        loss, _ = token_mean_loss(logits, enc["labels"])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d}  loss {loss.item():.4f}  {time.time() - start:6.1f}s", flush=True
            )
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {n / 1e6:.2f}M parameters to {args.out} in {time.time() - start:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--chain-fraction",
        type=float,
        default=0.003,
        help="share of four-term chains in pre-training (puts them at the boundary)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=OUT)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
