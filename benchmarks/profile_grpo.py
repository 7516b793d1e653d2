"""Where a coscale GRPO step on a real model spends its time (issue 13's profile).

The step of ``bench_grpo.py``'s ``sizes`` table (same module settings, 4 prompts x N=8, 32 new
tokens, float32, 1 thread) on ``--size`` (default ``smollm2-135m``), split into its phases by
wall clock (rollouts, reward, update: forward + backward + optimiser), then the operators with
the most self CPU time under ``torch.profiler`` for one more step.

Run: .venv/bin/python benchmarks/profile_grpo.py [--size smollm2-135m] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_grpo import SpreadReward, problems
from paired import build, cpu_line, timed_fit
from torch.utils.data import DataLoader

from coscale.modules import GRPOModule
from coscale.rl.losses import GRPOLoss


class PhaseClock:
    """Wraps a module's rollout, reward and update calls with wall-clock timers."""

    def __init__(self, module: GRPOModule) -> None:
        self.seconds: dict[str, list[float]] = {"rollouts": [], "reward": [], "update": []}
        self._wrap(module.backend, "generate", "rollouts")
        self._wrap(module.rewards, "score", "reward")
        self._wrap(module, "update", "update")

    def _wrap(self, owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase].append(time.perf_counter() - start)

        setattr(owner, name, timed)


def module_for(size: str, n: int, args) -> GRPOModule:
    model, tok = build(size)
    return GRPOModule(model=model, tokenizer=tok, reward=SpreadReward(), loss=GRPOLoss(epsilon=0.2), optimizer={'lr': 1e-06}, sampling={'max_new_tokens': args.new_tokens, 'temperature': 1.0, 'top_p': 1.0}, update={'scale_rewards': 'group', 'max_grad_norm': 1.0, 'num_iterations': 1, 'micro_batch_size': min(args.micro_batch, args.prompts * n)})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# {cpu_line()}; torch threads 1; float32; {args.size}")
    module = module_for(args.size, args.n, args)
    clock = PhaseClock(module)
    loader = DataLoader(problems(args.n), batch_size=args.prompts, collate_fn=list)
    timed_fit(module, loader, args.steps)
    total = {k: statistics.median(v) for k, v in clock.seconds.items() if v}
    print("## median seconds per step, by phase")
    for phase, s in total.items():
        print(f"{phase:10s} {s:8.2f} s")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        timed_fit(module, loader, 1)
    print(f"## top {args.top} operators by self CPU time (one step)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
