"""``precision: auto``: the faster of float32 and bf16-mixed, measured on the model's own shapes.

CPU flags do not tell which is faster: without native bf16 kernels bf16 is emulated and far
slower, and even with ``avx512_bf16`` bf16-mixed can be the slower of the two (measurements in
docs/results.md). So on the CPU ``auto`` times one training step of the model in each
(:mod:`coscale.run.precision_timing`, about a second for a small model) and, where bf16-mixed
wins it, sampling too: bf16-mixed only where it is the faster at both, the two things every
stage of a run does. A training step alone misleads: on a Zen 4 with avx512_bf16 it timed
bf16-mixed 40% faster, where the demo's SFT stages then ran 18-37% slower and its sampling 27-36%
slower than in float32 (docs/results.md).
A CPU whose flags list neither ``avx512_bf16`` nor ``amx_bf16`` gets ``32-true`` untimed (bf16
would be emulated). On a CUDA device nothing is timed: ``bf16-mixed`` where the device supports
bf16 (tensor cores make it the faster there), else ``32-true``.

The decision is made once per run and kept in ``<run_dir>/precision.json``
(:mod:`coscale.run.precision_record`): every rank and every resume reads it back instead of
timing again. Only ``auto`` reads it: any other value of ``trainer.precision`` is passed to
Lightning as it is, and the record is left alone. Delete the file to measure again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from coscale.distributed import launched_as_rank_zero
from coscale.run import precision_record as records
from coscale.run.precision_timing import Timings, time_decode, time_fwd_bwd

AUTO = "auto"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
Timer = Callable[[str], Timings]
"""Times a training step, or sampling, of a model (its spec) in both precisions."""


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith("flags")]
    except OSError:  # not Linux: no flags known, so no native bf16 assumed
        return set()
    return set(lines[0].split(":", 1)[1].split()) if lines else set()


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("unknown CPU" where it has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return "unknown CPU"


def cpu_line() -> str:
    """The CPU's model name and whether it computes bf16 natively (every speed figure and every
    run's numerics depend on both)."""
    native = sorted(set(NATIVE_BF16_FLAGS) & cpu_flags())
    flags = ", ".join(native) if native else "no (AVX2-only or similar)"
    return f"CPU: {cpu_model()}; native bf16: {flags}"


def training_device(accelerator: str) -> str:
    """``cuda`` or ``cpu``: where a Trainer with ``accelerator`` trains here."""
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    return "cuda" if cuda else "cpu"


def decide(
    device: str,
    model: str,
    timer: Timer | None = None,
    shape: tuple[int, int] | None = None,
    sampler: Timer | None = None,
) -> tuple[str, str]:
    """The precision ``auto`` means for ``model`` on ``device``, and why (times, when timed).
    ``shape`` (sequences, tokens per sequence) is the batch the stages train on, timed by the
    default timer and sampler; None: :mod:`~coscale.run.precision_timing`'s own. ``timer``
    times a training step, ``sampler`` sampling (asked only where bf16-mixed wins the step)."""
    if device == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ("bf16-mixed" if ok else "32-true"), (
            f"CUDA device {'supports' if ok else 'lacks'} bf16 (not timed)"
        )
    if not set(NATIVE_BF16_FLAGS) & cpu_flags():
        flags = " and ".join(NATIVE_BF16_FLAGS)
        return "32-true", f"CPU flags lack {flags} (bf16 would be emulated; not timed)"
    t = (timer or _default(time_fwd_bwd, shape))(model)
    why = f"{_times(t)} per fwd+bwd of {model} (batch {t.batch} x {t.tokens} tokens)"
    if t.bf16 >= t.fp32:
        return "32-true", why
    d = (sampler or _default(time_decode, shape))(model)
    why += f"; {_times(d)} to sample {d.tokens // 2} tokens after {d.batch} prompts"
    return ("bf16-mixed" if d.bf16 < d.fp32 else "32-true"), why


def _default(timing: Callable[..., Timings], shape: tuple[int, int] | None) -> Timer:
    return timing if shape is None else partial(timing, batch=shape[0], tokens=shape[1])


def _times(t: Timings) -> str:
    return f"fp32 {t.fp32 * 1e3:.1f} ms, bf16-mixed {t.bf16 * 1e3:.1f} ms"


def resolve_precision(
    trainer_args: dict[str, Any],
    model: str,
    run_dir: str | None = None,
    timer: Timer | None = None,
    shape: tuple[int, int] | None = None,
    sampler: Timer | None = None,
) -> tuple[dict[str, Any], str | None]:
    """``trainer_args`` with ``precision: auto`` replaced by the run's choice.

    Args:
        trainer_args: ``lightning.Trainer`` arguments (``pipeline.trainer``).
        model: The run's model spec, timed when the choice is made here.
        run_dir: The run folder holding the record; None decides without one.
        timer: What times ``model``; None: :func:`~coscale.run.precision_timing.time_fwd_bwd`.
        shape: (sequences, tokens per sequence) of the stages' training batch, what the
            default timer times (the run's ``data.sft_batch_size`` x ``sft.max_length``).
        sampler: What times sampling with ``model`` where bf16-mixed wins the step; None:
            :func:`~coscale.run.precision_timing.time_decode` at ``shape``.

    Returns:
        The arguments, and the line to print (``precision auto -> <choice>: <why>``; None when
        ``precision`` is not ``auto``).

    Raises:
        ValueError: The record was made for another device or model (names the file and the
            setting), or the model's config cannot be read for the timing.
        TimeoutError: A rank other than 0 found no record from rank 0 in time.
    """
    if str(trainer_args.get("precision")) != AUTO:
        return trainer_args, None
    device = training_device(str(trainer_args.get("accelerator", "auto")))
    chosen, why = _run_choice(device, model, run_dir, timer, shape, sampler)
    return {**trainer_args, "precision": chosen}, f"precision auto -> {chosen}: {why}"


def _run_choice(
    device: str,
    model: str,
    run_dir: str | None,
    timer: Timer | None,
    shape: tuple[int, int] | None,
    sampler: Timer | None,
) -> tuple[str, str]:
    """The run's recorded choice; made, timed and recorded here by rank 0 when there is none."""
    if run_dir is None:
        return decide(device, model, timer, shape, sampler)
    path = records.record_path(run_dir)
    record = records.read_record(path) if launched_as_rank_zero() else records.wait_for_record(path)
    if record is None:
        chosen, why = decide(device, model, timer, shape, sampler)
        record = {"precision": chosen, "device": device, "model": model, "why": why}
        records.write_record(path, record)
        return chosen, why
    made_for = (record.get("device"), record.get("model"))
    if made_for != (device, model):
        raise ValueError(
            f"pipeline.trainer.precision: auto was decided as {record.get('precision')} for "
            f"{made_for[1]!r} on {made_for[0]} ({path}), but this run trains {model!r} on "
            f"{device}; delete {path} to measure again, or set pipeline.trainer.precision"
        )
    return record["precision"], f"{record['why']}; recorded in {path}"
