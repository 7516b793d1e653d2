"""`precision: auto` picks bf16 only where the machine computes it natively (stubbed both ways)."""

from __future__ import annotations

import pytest

from coscale.stages import precision


@pytest.mark.parametrize(
    ("flags", "chosen", "why"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "bf16-mixed", "CPU flags include avx512_bf16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bf16-mixed", "CPU flags include amx_bf16"),
        ({"avx2", "fma"}, "32-true", "lack avx512_bf16 and amx_bf16 (bf16 would be emulated)"),
        (set(), "32-true", "lack avx512_bf16 and amx_bf16"),
    ],
)
def test_auto_on_cpu_follows_the_cpu_flags(monkeypatch, flags, chosen, why):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    args, line = precision.resolve_precision({"accelerator": "cpu", "precision": "auto"})
    assert args == {"accelerator": "cpu", "precision": chosen}
    assert line.startswith(f"precision auto -> {chosen}: ") and why in line


@pytest.mark.parametrize("supported", [True, False])
def test_auto_on_cuda_asks_the_device(monkeypatch, supported):
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "is_bf16_supported", lambda: supported)
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})  # not what decides
    args, line = precision.resolve_precision({"accelerator": "gpu", "precision": "auto"})
    assert args["precision"] == ("bf16-mixed" if supported else "32-true")
    assert ("supports" if supported else "lacks") in line


def test_an_explicit_precision_is_left_to_lightning(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    for value in ("bf16-mixed", "32-true", None):
        args = {"accelerator": "cpu", "precision": value}
        assert precision.resolve_precision(args) == (args, None)


def test_cpu_flags_reads_this_machine():
    flags = precision.cpu_flags()
    assert isinstance(flags, set)  # Linux: the flags line of /proc/cpuinfo; elsewhere empty
