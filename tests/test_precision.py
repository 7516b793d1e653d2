"""`precision: auto` takes the faster of two measured timings, once per run (fake timers, real ones).

Every decision test injects a timer that returns fixed seconds, so the choice is deterministic;
no test asserts a measured speed. The record (``<run_dir>/precision.json``) is what makes the
decision the same on every rank and on resume.
"""

from __future__ import annotations

import json
import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from coscale import distributed
from coscale.rollout.factory import RolloutSettings
from coscale.run import precision, precision_record, precision_timing
from coscale.run.context import StageContext
from coscale.run.precision_timing import Timings

TINY = "builtin:tiny?hidden_size=64&num_layers=2&seed=0"
CPU_AUTO = {"accelerator": "cpu", "precision": "auto"}


def fixed(fp32_ms: float, bf16_ms: float, calls: list[str] | None = None):
    """A timer that reports these milliseconds per step (and lists the models it timed)."""

    def timer(model: str) -> Timings:
        if calls is not None:
            calls.append(model)
        return Timings(fp32=fp32_ms / 1e3, bf16=bf16_ms / 1e3, batch=4, tokens=64)

    return timer


def never(model: str) -> Timings:
    raise AssertionError(f"{model} was timed, but the decision should not have needed it")


@pytest.fixture(autouse=True)
def rank_zero_with_native_bf16(monkeypatch):
    """Rank 0 of a one-process run on a CPU that lists avx512_bf16 (so timing decides)."""
    for name in distributed.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})


@pytest.mark.parametrize(
    ("fp32_ms", "bf16_ms", "chosen"),
    [(41.2, 63.0, "32-true"), (63.0, 41.2, "bf16-mixed"), (50.0, 50.0, "32-true")],
)
def test_auto_on_cpu_takes_the_faster_of_the_two_timings(fp32_ms, bf16_ms, chosen):
    """bf16-mixed where it wins the training step and sampling; sampling is timed only where
    bf16-mixed wins the step (a tie keeps float32)."""
    sampler = fixed(30.0, 20.0) if bf16_ms < fp32_ms else never
    args, line = precision.resolve_precision(
        CPU_AUTO, "builtin:demo", timer=fixed(fp32_ms, bf16_ms), sampler=sampler
    )
    assert args == {"accelerator": "cpu", "precision": chosen}
    step = (
        f"fp32 {fp32_ms:.1f} ms, bf16-mixed {bf16_ms:.1f} ms per fwd+bwd of builtin:demo "
        "(batch 4 x 64 tokens)"
    )
    sampled = "; fp32 30.0 ms, bf16-mixed 20.0 ms to sample 32 tokens after 4 prompts"
    assert line == f"precision auto -> {chosen}: {step}" + (sampled if sampler is not never else "")


def test_a_faster_bf16_step_with_slower_sampling_takes_float32():
    """The Zen 4 case (docs/results.md): bf16-mixed wins the step, loses sampling."""
    args, line = precision.resolve_precision(
        CPU_AUTO, "builtin:demo", timer=fixed(415.2, 326.3), sampler=fixed(448.9, 571.8)
    )
    assert args["precision"] == "32-true"
    assert line.endswith("; fp32 448.9 ms, bf16-mixed 571.8 ms to sample 32 tokens after 4 prompts")


@pytest.mark.parametrize("flags", [{"avx2", "fma"}, set()])
def test_a_cpu_without_native_bf16_takes_float32_untimed(monkeypatch, flags):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    args, line = precision.resolve_precision(CPU_AUTO, "builtin:demo", timer=never)
    assert args["precision"] == "32-true"
    assert line == (
        "precision auto -> 32-true: CPU flags lack avx512_bf16 and amx_bf16 "
        "(bf16 would be emulated; not timed)"
    )


@pytest.mark.parametrize("supported", [True, False])
def test_auto_on_cuda_asks_the_device_without_timing(monkeypatch, supported):
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "is_bf16_supported", lambda: supported)
    args, line = precision.resolve_precision(
        {"accelerator": "gpu", "precision": "auto"}, "builtin:demo", timer=never
    )
    assert args["precision"] == ("bf16-mixed" if supported else "32-true")
    assert line.endswith(f"CUDA device {'supports' if supported else 'lacks'} bf16 (not timed)")


def test_the_decision_is_recorded_and_reused_without_timing(tmp_path):
    calls: list[str] = []
    first = precision.resolve_precision(
        CPU_AUTO, TINY, str(tmp_path), fixed(63.0, 41.2, calls), sampler=fixed(30.0, 20.0, calls)
    )
    assert calls == [TINY, TINY] and first[0]["precision"] == "bf16-mixed"
    record = json.loads((tmp_path / "precision.json").read_text())
    assert record == {
        "precision": "bf16-mixed",
        "device": "cpu",
        "model": TINY,
        "why": first[1].removeprefix("precision auto -> bf16-mixed: "),
    }
    # a resume (or another rank) that would time float32 faster keeps the run's choice
    args, line = precision.resolve_precision(
        CPU_AUTO, TINY, str(tmp_path), timer=never, sampler=never
    )
    assert args == first[0]
    assert line == f"{first[1]}; recorded in {tmp_path / 'precision.json'}"


@pytest.mark.parametrize("value", ["32-true", "bf16-mixed", "16-mixed", None])
def test_an_explicit_precision_passes_through_and_ignores_the_record(tmp_path, value):
    (tmp_path / "precision.json").write_text(
        json.dumps({"precision": "bf16-mixed", "device": "cpu", "model": TINY, "why": "x"})
    )
    args = {"accelerator": "cpu", "precision": value}
    assert precision.resolve_precision(args, TINY, str(tmp_path), timer=never) == (args, None)
    assert json.loads((tmp_path / "precision.json").read_text())["precision"] == "bf16-mixed"


def test_an_explicit_precision_writes_no_record(tmp_path):
    args = {"accelerator": "cpu", "precision": "32-true"}
    assert precision.resolve_precision(args, TINY, str(tmp_path), timer=never) == (args, None)
    assert not (tmp_path / "precision.json").exists()


@pytest.mark.parametrize(("device", "model"), [("cuda", TINY), ("cpu", "builtin:demo")])
def test_a_record_for_another_device_or_model_is_refused(tmp_path, device, model):
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({"precision": "32-true", "device": device, "model": model}))
    with pytest.raises(ValueError) as err:
        precision.resolve_precision(CPU_AUTO, TINY, str(tmp_path), timer=never)
    msg = str(err.value)
    assert msg.startswith("pipeline.trainer.precision: auto was decided as 32-true")
    assert str(path) in msg and f"delete {path} to measure again" in msg


def test_a_rank_other_than_zero_waits_for_rank_zeros_record(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's subprocess launcher's rank 1
    assert not distributed.launched_as_rank_zero()
    record = {"precision": "bf16-mixed", "device": "cpu", "model": TINY, "why": "timed by 0"}
    writer = threading.Timer(
        0.3, precision_record.write_record, (str(tmp_path / "precision.json"), record)
    )
    writer.start()
    args, line = precision.resolve_precision(CPU_AUTO, TINY, str(tmp_path), timer=never)
    writer.join()
    assert args["precision"] == "bf16-mixed" and "timed by 0; recorded in" in line


def test_waiting_for_a_record_that_never_comes_names_the_setting(tmp_path):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"set pipeline\.trainer\.precision to 32-true or bf16"):
        precision_record.wait_for_record(str(tmp_path / "precision.json"), 0.3, 0.05)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("variable", "value", "zero"),
    [
        ("RANK", "2", False),
        ("RANK", "0", True),
        ("NODE_RANK", "1", False),
        ("SLURM_PROCID", "1", False),
    ],
)
def test_rank_zero_is_read_from_the_launchers_variables(monkeypatch, variable, value, zero):
    monkeypatch.setenv(variable, value)
    assert distributed.launched_as_rank_zero() is zero


def test_stage_context_times_the_sft_batch_prints_the_one_line_and_records_it(
    tmp_path, monkeypatch, capsys
):
    """The timing is of the batch the SFT stages train on (data.sft_batch_size x
    sft.max_length), not the timer's own small default."""
    asked: list[tuple[int, int]] = []

    def timer(model: str, batch: int = 4, tokens: int = 64) -> Timings:
        asked.append((batch, tokens))
        return Timings(fp32=41.2e-3, bf16=63.0e-3, batch=batch, tokens=tokens)

    monkeypatch.setattr(precision, "time_fwd_bwd", timer)
    monkeypatch.setattr(precision, "time_decode", never)  # float32 won the step: not asked
    cfg = SimpleNamespace(
        trainer=dict(CPU_AUTO),
        model="builtin:demo",
        run_dir=str(tmp_path),
        rollout=RolloutSettings("hf"),
    )
    data = SimpleNamespace(sft_batch_size=32)
    ctx = StageContext(cfg, None, data, False, {"max_length": 128}, {})
    assert asked == [(32, 128)]
    assert ctx.trainer_args["precision"] == "32-true"
    lines = [line for line in capsys.readouterr().out.splitlines() if "precision" in line]
    assert lines == [
        "[coscale] precision auto -> 32-true: fp32 41.2 ms, bf16-mixed 63.0 ms per fwd+bwd of "
        "builtin:demo (batch 32 x 128 tokens)"
    ]
    assert (tmp_path / "precision.json").exists()


@pytest.mark.parametrize(
    ("seconds", "repeats", "rounds"),
    [(0.01, 5, 5), (0.2, 5, 4), (0.5, 5, 2), (1.0, 5, 1), (0.01, 1, 1)],
)
def test_timing_takes_the_median_after_a_warm_up_within_its_budget(
    monkeypatch, seconds, repeats, rounds
):
    """A fake step takes ``seconds`` in fp32, twice that in bf16 (plus its index in us). After
    the warm-up, rounds go on up to ``repeats`` while the rounds before took under ``budget_s``
    (2 s), at least one: 0.2 s -> rounds of 0.6 s -> a fourth starts at 1.8 s; 0.5 s -> a
    second starts at 1.5 s; 1.0 s -> 3 s after the first, no second."""
    net = SimpleNamespace(
        config=SimpleNamespace(max_position_embeddings=32),
        get_input_embeddings=lambda: SimpleNamespace(num_embeddings=10),
    )
    steps: list[tuple[tuple[int, ...], bool]] = []

    def step(model, ids, bf16):
        steps.append((tuple(ids.shape), bf16))
        return seconds * (2 if bf16 else 1) + len(steps) * 1e-6

    monkeypatch.setattr(precision_timing, "random_model", lambda model: net)
    monkeypatch.setattr(precision_timing, "_step", step)
    t = precision_timing.time_fwd_bwd("any", batch=4, tokens=64, repeats=repeats, budget_s=2.0)
    assert steps == [((4, 32), False), ((4, 32), True)] * (1 + rounds)  # interleaved, T capped
    fp32 = [seconds + i * 1e-6 for i in range(3, 3 + 2 * rounds, 2)]  # steps 3, 5, ...
    bf16 = [2 * seconds + i * 1e-6 for i in range(4, 4 + 2 * rounds, 2)]
    middle = (rounds - 1) // 2, rounds // 2  # sorted already; an even count: the mean of two
    assert (t.batch, t.tokens) == (4, 32)
    assert t.fp32 == pytest.approx(sum(fp32[i] for i in middle) / 2, abs=1e-12)
    assert t.bf16 == pytest.approx(sum(bf16[i] for i in middle) / 2, abs=1e-12)


def test_a_real_timing_of_the_tiny_model_is_quick_and_leaves_the_rng_alone():
    precision_timing.random_model(TINY)  # builds the cached folder first: not part of the timing
    rng = torch.get_rng_state()
    start = time.perf_counter()
    t = precision_timing.time_fwd_bwd(TINY)
    took = time.perf_counter() - start
    assert torch.equal(torch.get_rng_state(), rng)
    assert (t.batch, t.tokens) == (4, 64)
    assert all(math.isfinite(s) and s > 0 for s in (t.fp32, t.bf16))
    assert took < 20, f"timing took {took:.1f} s; it should take a few (budget_s=2 plus a warm-up)"


def test_a_real_timing_of_sampling_is_quick_and_leaves_the_rng_alone():
    precision_timing.random_model(TINY)
    rng = torch.get_rng_state()
    start = time.perf_counter()
    t = precision_timing.time_decode(TINY, batch=2, tokens=16)
    took = time.perf_counter() - start
    assert torch.equal(torch.get_rng_state(), rng)
    assert (t.batch, t.tokens) == (2, 16)
    assert all(math.isfinite(s) and s > 0 for s in (t.fp32, t.bf16))
    assert took < 20, f"timing took {took:.1f} s"


def test_an_unreadable_model_config_names_the_setting(tmp_path):
    with pytest.raises(ValueError, match=r"set pipeline\.trainer\.precision to 32-true or bf16"):
        precision_timing.random_model(str(tmp_path / "no_model_here"))


def test_cpu_flags_reads_this_machine():
    flags = precision.cpu_flags()
    assert isinstance(flags, set)  # Linux: the flags line of /proc/cpuinfo; elsewhere empty
