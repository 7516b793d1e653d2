"""``precision: auto``: bf16 where the machine computes it natively, float32 elsewhere.

On a CPU without native bf16 kernels, bf16 is emulated and an SFT step runs many times slower
than in float32 (docs/results.md). So the choice comes from the machine, never from a constant:
CUDA devices that support bf16, and CPUs whose flags list ``avx512_bf16`` or ``amx_bf16``, get
``bf16-mixed``; everything else ``32-true``. Any other value of ``trainer.precision`` is passed to Lightning.
"""

from __future__ import annotations

import torch

AUTO = "auto"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith("flags")]
    except OSError:  # not Linux: no flags known, so no native bf16 assumed
        return set()
    return set(lines[0].split(":", 1)[1].split()) if lines else set()


def native_bf16(accelerator: str) -> tuple[bool, str]:
    """Whether ``accelerator`` computes bf16 natively here, and the evidence."""
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if cuda:
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, f"CUDA device {'supports' if ok else 'lacks'} bf16"
    found = sorted(set(NATIVE_BF16_FLAGS) & cpu_flags())
    if found:
        return True, f"CPU flags include {', '.join(found)}"
    return False, f"CPU flags lack {' and '.join(NATIVE_BF16_FLAGS)} (bf16 would be emulated)"


def resolve_precision(trainer_args: dict) -> tuple[dict, str | None]:
    """``trainer_args`` with ``precision: auto`` replaced by the machine's choice, and a line
    saying what was chosen and why (None when nothing was resolved)."""
    if str(trainer_args.get("precision")) != AUTO:
        return trainer_args, None
    ok, why = native_bf16(str(trainer_args.get("accelerator", "auto")))
    chosen = "bf16-mixed" if ok else "32-true"
    return {**trainer_args, "precision": chosen}, f"precision auto -> {chosen}: {why}"
