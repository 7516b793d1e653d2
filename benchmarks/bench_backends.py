"""One GRPO step of `GRPOModule` per rollout backend on SmolLM2-135M-Instruct, same work.

Backends (`--backends`): ``hf`` (``rollout.backend: hf``: HF `generate`), ``cached``
(the default: `CachedDecodeBackend`), ``vllm`` (``rollout.backend:
vllm``, the engine colocated in this process, weights synced after every optimiser step) and
``vllm-unseeded`` (the same with ``rollout.options.honor_seed: false``: one request of n=N per
prompt instead of one seeded request per rollout). With a LoRA adapter (r 16, alpha 32,
all-linear, `bench_sft.lora_config`) on the same model: ``cached-lora``, ``vllm-lora-merged``
(``rollout.options.sync.adapter: merged``: every sync sends the merged weights) and ``vllm-lora``
(``sync.adapter: lora``: every sync sends the adapter alone, a vLLM LoRA request).
``vllm-server`` (``rollout.backend: vllm-server``) samples from a ``vllm serve`` process this
script starts, on the CPUs of `--server-cores`, while the trainer's steps run on
`--trainer-cores` (the other backends' steps on every core); ``vllm-server-async`` is the same
with ``update.max_staleness: 1`` (the next batch is sampled while one trains; its fits read
coscale's `ProblemDataModule`, every problem solvable with N=`--n`, since the batches ahead come
from coscale's loader). Every module loads its own copy of the model
in `--dtype` (float32) and does the same work per step: `--prompts` prompts x N=`--n` rollouts
of at most `--new-tokens` tokens at temperature 1, a reward with spread in every group, the
`grpo` loss, AdamW at lr 1e-6, `--micro-batch` rows per forward/backward pass.

Timing: `--rounds` rounds; in a round every backend runs one fit (a fresh `Trainer`) of
1 + `--steps` steps, in turn (A B C A B C ...); the first step of each fit is a warm-up and not
timed, the others are (the time between step ends, so generation, reward, update and, for vLLM,
the weight sync are all in). A cell is the median step time over all rounds, with every timed
step; beside it the sampling time (generate + reward; for vLLM also the parity check that
follows every sync by default, `--parity-every`; none for ``-async``, whose batches are sampled
ahead), the step's wait for its rollouts (coscale's clock, ``sampling``: the generate call, or
for ``-async`` what the overlap with the previous step left) and, for vLLM, the weight sync's
(`backend.book.last.seconds`) of the same steps. The vLLM engines are built once, before the
rounds (build time printed), and kept across fits.

Run (alone on the machine; writes results/bench_backends.txt):
`HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python benchmarks/bench_backends.py [--backends hf,cached,vllm] [--rounds 3]`;
`--quick` checks the script (2 prompts x 4, 8 tokens, 1 round of 1 step, output in /tmp).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from statistics import median

import lightning as L
import torch
from bench_grpo import SpreadReward, problems
from paired import LightningTimer, timed
from torch.utils.data import DataLoader
from vllm_bench import (
    RESULTS,
    SMOLLM2,
    Report,
    cell,
    engine_options,
    require_vllm,
    write_header,
)

from coscale import clock
from coscale.callbacks import RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule
from coscale.rl.losses import GRPOLoss

BACKENDS = (
    "hf", "cached", "vllm", "vllm-unseeded", "vllm-server", "vllm-server-async",
    "cached-lora", "vllm-lora-merged", "vllm-lora",
)  # fmt: skip


class KeptEngineGRPO(GRPOModule):
    """GRPOModule whose rollout backend outlives a fit (the rounds reuse one vLLM engine), and
    that times each step's sampling (generate + reward) and notes each weight sync's seconds."""

    def teardown(self, stage: str) -> None:
        pass  # GRPOModule closes its backend here; `close` does at the end

    def sample(self, problems, n, sampling):
        start = time.perf_counter()
        out = super().sample(problems, n, sampling)
        self.sample_seconds.append(time.perf_counter() - start)
        return out

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self.clock_before = clock.snapshot()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # the step's wait for its rollouts: generate, or (sampled ahead) what the overlap left
        self.wait_seconds.append(clock.since(self.clock_before, 0.0).get("sampling", 0.0))
        book = getattr(self.backend, "book", None)  # vLLM's sync records
        if book is not None and book.last is not None:
            self.sync_seconds.append(book.last.seconds)

    def close(self) -> None:
        self.backend.close()


def build_module(name: str, args) -> KeptEngineGRPO:
    """The module of backend `name` (see the module doc), its engine not yet built."""
    from bench_sft import lora_config

    lora = "lora" in name
    rollout = {"backend": name.removesuffix("-lora")}
    if name.startswith("vllm"):
        options = engine_options(args.dtype, args.max_model_len, args.kv_cache_gib, args.eager)
        options |= {"honor_seed": name != "vllm-unseeded", "parity": {"every": args.parity_every}}
        if lora:
            options["sync"] = {"adapter": "merged" if name.endswith("merged") else "lora"}
        rollout = {"backend": "vllm", "options": options}
        if name.startswith("vllm-server"):
            log = f"/tmp/bench_{name}.log"
            options["server"] = {"cores": args.server_cores, "log": log}
            rollout = {"backend": "vllm-server", "options": options}
    module = KeptEngineGRPO(
        model=SMOLLM2, reward=SpreadReward(), loss=GRPOLoss(epsilon=0.2),
        load={"dtype": args.dtype}, optimizer={"lr": 1e-6}, rollout=rollout,
        update={"scale_rewards": "group", "max_grad_norm": 1.0, "num_iterations": 1,
                "micro_batch_size": min(args.micro_batch, args.prompts * args.n),
                "max_staleness": int(name.endswith("-async"))},
        sampling={"max_new_tokens": args.new_tokens, "temperature": 1.0, "top_p": 1.0},
        peft=lora_config() if lora else None,
    )  # fmt: skip
    module.sample_seconds, module.sync_seconds, module.wait_seconds = [], [], []
    return module


@dataclass
class Timings:
    """Per timed step of one backend: step, sampling (generate + reward), wait for the rollouts
    and sync seconds."""

    step: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)


def use_cores(cores: list[int]) -> None:
    """This process (the trainer) on `cores`, one torch thread each."""
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))


def fit_steps(module: KeptEngineGRPO, args, into: Timings) -> None:
    """One fit of 1 + --steps steps; adds the timings of each step after the first."""
    server = module.backend.name == "vllm-server"
    use_cores(args.trainer_cores if server and args.trainer_cores else args.all_cores)
    module.sample_seconds, module.sync_seconds, module.wait_seconds = [], [], []
    rows = problems(args.n)
    data: dict = {"train_dataloaders": DataLoader(rows, args.prompts, collate_fn=list)}
    if module.update_settings.max_staleness:
        data = {"datamodule": solvable_data(rows, args)}
    timer = LightningTimer()
    trainer = L.Trainer(
        max_steps=1 + args.steps, accelerator="cpu", devices=1, logger=False,
        callbacks=[timer, RolloutNSchedule(n_init=args.n, factor=1.0)],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, **data)
    module.policy.zero_grad(set_to_none=True)
    ends = timer.ends[1:]  # [0] is train start: the first interval is the warm-up step
    into.step += [b - a for a, b in itertools.pairwise(ends)]
    into.sample += module.sample_seconds[1:]
    into.sync += module.sync_seconds[1:]
    into.wait += module.wait_seconds[1:]


def solvable_data(problems: list[dict], args) -> ProblemDataModule:
    """`problems` in coscale's data module, every one solvable with N=--n, --prompts a batch."""
    rows = [{"id": p["id"], "question": p["question"], "answer": "0"} for p in problems]
    dm = ProblemDataModule(train=rows, batch_size=args.prompts,
                           curriculum={"seed": 0})  # fmt: skip
    dm.load()
    for pid in dm.problems:
        dm.curriculum.pools.record(pid, 4, 2)
    return dm


def check_args(args: argparse.Namespace) -> None:
    """Raises SystemExit naming every bad flag."""
    problems = [f"--backends: unknown {b!r} (choices: {', '.join(BACKENDS)})"
                for b in args.backends if b not in BACKENDS]  # fmt: skip
    for flag in ("rounds", "steps", "prompts", "n", "new_tokens", "micro_batch"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.parity_every < 0:
        problems.append(f"--parity-every must be >= 0, got {args.parity_every}")
    if problems:
        raise SystemExit("bench_backends.py: " + "; ".join(problems))


def measure(report: Report, args) -> dict[str, Timings]:
    """Builds every module (and engine), then --rounds rounds -> timings per backend."""
    modules = {}
    for name in args.backends:
        modules[name] = build_module(name, args)
        if name.startswith("vllm"):  # the engine and its first sync, outside the rounds
            module = modules[name]
            seconds = timed(lambda m=module: m.backend.update_weights(m.policy))
            report(f"# {name}: engine built and first sync in {seconds:.1f} s")
    timings = {name: Timings() for name in args.backends}
    for _ in range(args.rounds):
        for name, module in modules.items():
            fit_steps(module, args, timings[name])
    for module in modules.values():
        module.close()
    return timings


def write_table(report: Report, timings: dict[str, Timings], args) -> None:
    first = next(iter(timings))
    report(f"\n## One GRPO step per backend: SmolLM2-135M-Instruct {args.dtype}, {args.prompts} "
           f"prompts x N={args.n}, {args.new_tokens} new tokens; {args.rounds} rounds x "
           f"{args.steps} timed steps (after a warm-up step per fit)")  # fmt: skip
    report(f"| backend | step s (every timed step) | step / {first} | sampling s "
           "(generate + reward) | waiting for rollouts s | weight sync s |")  # fmt: skip
    report("|---|---|---|---|---|---|")
    for name, t in timings.items():
        ratio = median(t.step) / median(timings[first].step)
        sync = cell(t.sync, "{:.2f}") if t.sync else "-"
        sample = cell(t.sample, "{:.2f}") if t.sample else "- (sampled ahead)"
        report(f"| {name} | {cell(t.step, '{:.2f}')} | {ratio:.2f}x | {sample} | "
               f"{cell(t.wait, '{:.2f}')} | {sync} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="hf,cached,vllm", help=f"of {', '.join(BACKENDS)}")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="token limit per rollout")
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per fwd/bwd pass")
    parser.add_argument("--rounds", type=int, default=3, help="fits per backend, in turn")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per fit")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--max-model-len", type=int, default=512, help="vLLM max_model_len")
    parser.add_argument("--kv-cache-gib", type=float, default=None, help="vLLM KV cache, GiB")
    parser.add_argument("--eager", action="store_true", help="vLLM with enforce_eager=True")
    parser.add_argument("--parity-every", type=int, default=1,
                        help="vLLM parity check every this many syncs (0: never)")  # fmt: skip
    parser.add_argument(
        "--quick",
        action="store_true",
        help="check the script: 2 prompts x 4, 8 tokens, 1 round of 1 step",
    )
    parser.add_argument("--server-cores", default=None,
                        help="vllm-server: CPU ids of the server, e.g. 1 (default: all)")  # fmt: skip
    parser.add_argument("--trainer-cores", default=None,
                        help="vllm-server: CPU ids of the trainer's steps, e.g. 0 (default: all)")  # fmt: skip
    parser.add_argument("--out", default=None, help="results file (appended)")
    args = parser.parse_args()
    args.backends = [b for b in args.backends.split(",") if b]
    args.all_cores = sorted(os.sched_getaffinity(0))
    for flag in ("server_cores", "trainer_cores"):
        value = getattr(args, flag)
        setattr(args, flag, None if value is None else [int(c) for c in value.split(",")])
    if args.quick:
        args.prompts, args.n, args.new_tokens, args.rounds, args.steps = 2, 4, 8, 1, 1
    check_args(args)
    if any(b.startswith("vllm") for b in args.backends):
        require_vllm()
    out = args.out or ("/tmp/bench_backends_quick.txt" if args.quick
                       else RESULTS / "bench_backends.txt")  # fmt: skip
    report = Report(out)
    write_header(report, args.threads or len(os.sched_getaffinity(0)), args.dtype)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    write_table(report, measure(report, args), args)
    report(f"# written to {out}")


if __name__ == "__main__":
    main()
