"""GPU check: a few GRPO steps of a small HF model with the HF backend under FSDP2; prints speed.

Built offline: a random character-level Llama (``builtin:tiny`` with the sizes below, ~25M
parameters by default) on the built-in arithmetic task, so the check needs no download. Every
rank samples ``--problems`` problems x ``--n`` rollouts of up to ``--new-tokens`` tokens per step
with HF ``generate``, then runs the GRPO update. Prints, per step: the step time, generated
tokens/s and trained tokens/s over all ranks; then the medians without the first (warm-up) step.
FSDP here is FSDP2 (``fully_shard`` per decoder layer and on the policy, Lightning's
ModelParallelStrategy): with Lightning's FSDPStrategy (FSDP1) GRPO's backward pass inside
``training_step`` fails (the root FSDP unit is still in its forward state).

Run: ``bash benchmarks/gpu_check.sh`` (all visible GPUs) or
``python benchmarks/gpu_check.py --devices 1 --steps 6``. Dry run on CPU:
``python benchmarks/gpu_check.py --accelerator cpu --strategy ddp --devices 2 --steps 2``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy

from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule


class HasDigitReward:
    """1.0 when a completion holds a digit: spread on a random model, so every step updates."""

    def __call__(self, completions, answers, **_):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]


class StepTimer(Callback):
    """Wall time of each training step and the tokens it generated and trained on (all ranks)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _sync(pl_module)
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        _sync(pl_module)
        seconds = time.perf_counter() - self.start
        ro = pl_module.last_rollouts
        generated = trainer.strategy.reduce(ro.completion_mask.sum().float(), reduce_op="sum")
        trained = trainer.strategy.reduce(ro.attention_mask.sum().float(), reduce_op="sum")
        row = (trainer.global_step, seconds, float(generated) / seconds, float(trained) / seconds)
        self.rows.append(row)
        if trainer.is_global_zero:
            print(f"[gpu_check] step {row[0]:>3}  {row[1]:7.3f} s  generated {row[2]:10.0f} tok/s  "
                  f"trained {row[3]:10.0f} tok/s", flush=True)  # fmt: skip


class TimedGRPO(GRPOModule):
    """GRPOModule that keeps its last rollouts for the timer and shards itself under FSDP2."""

    shard = False

    def sample(self, problems, n, sampling):
        rollouts, rewards = super().sample(problems, n, sampling)
        self.last_rollouts = rollouts
        return rollouts, rewards

    def configure_model(self) -> None:
        """FSDP2: each decoder layer, then the whole policy, sharded over the data-parallel mesh."""
        if not self.shard or getattr(self.policy, "_is_fsdp_managed_module", False):
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.policy.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.policy, mesh=mesh)
        # HF generate keeps every rank stepping until all are done only for modules it knows
        # are sharded; without this a rank that finishes early leaves the others hanging.
        self.policy._is_fsdp_managed_module = True


def _sync(module) -> None:
    if module.device.type == "cuda":
        torch.cuda.synchronize(module.device)


def _strategy(name: str, world: int):
    """``fsdp`` is FSDP2 (``fully_shard``) through Lightning's ModelParallelStrategy."""
    if name != "fsdp":
        return name
    return ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)


def _devices(value: str, accelerator: str) -> int:
    if value != "auto":
        return int(value)
    return max(1, torch.cuda.device_count()) if accelerator in ("gpu", "cuda") else 1


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--devices", default="auto", help="devices per node, or auto (all)")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--strategy", default="fsdp", help="fsdp (FSDP2) | ddp | auto")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--problems", type=int, default=16, help="problems per rank per step")
    p.add_argument("--n", type=int, default=8, help="rollouts per problem")
    p.add_argument("--new-tokens", type=int, default=64)
    return p.parse_args()


def main() -> None:
    args = _args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rank = os.environ.get("LOCAL_RANK", "0")  # one model folder per rank: no race under torchrun
    os.environ.setdefault("COSCALE_CACHE", os.path.join("/tmp", f"coscale_gpu_check_{rank}"))
    L.seed_everything(0, workers=True)
    sizes = f"hidden_size={args.hidden}&num_layers={args.layers}&num_heads=8"
    model = f"builtin:tiny?{sizes}&intermediate_size={args.hidden * 3}&seed=0"
    module = TimedGRPO(model=model, prompt={"template": "Q:{question}\nA:"}, reward=HasDigitReward(),
                       lr=1e-5, max_new_tokens=args.new_tokens, temperature=1.0,
                       micro_batch_size=args.problems * args.n)  # fmt: skip
    data = ProblemDataModule(
        train=f"builtin:arithmetic?n={64 * args.problems}&terms=2,3&seed=0",
        batch_size=args.problems, rollout_n=args.n, rl_unmeasured=True,
    )  # fmt: skip
    timer = StepTimer()
    module.shard = args.strategy == "fsdp"
    devices = _devices(args.devices, args.accelerator)
    trainer = L.Trainer(accelerator=args.accelerator, devices=devices, num_nodes=args.num_nodes,
                        strategy=_strategy(args.strategy, devices * args.num_nodes),
                        precision=args.precision, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                        callbacks=[timer])  # fmt: skip
    if trainer.is_global_zero:
        params = sum(p.numel() for p in module.policy.parameters())
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        print(f"[gpu_check] torch {torch.__version__}, {device} x {trainer.world_size}, "
              f"strategy {args.strategy}, precision {args.precision}, {params / 1e6:.1f}M params, "
              f"{args.problems} problems x {args.n} rollouts x <= {args.new_tokens} tokens per rank",
              flush=True)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    if trainer.is_global_zero and len(timer.rows) > 1:
        steady = timer.rows[1:]
        print(f"[gpu_check] median over steps 2..{len(timer.rows)}: "
              f"{statistics.median(r[1] for r in steady):.3f} s/step, "
              f"generated {statistics.median(r[2] for r in steady):.0f} tok/s, "
              f"trained {statistics.median(r[3] for r in steady):.0f} tok/s; "
              f"total {time.perf_counter() - start:.1f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
