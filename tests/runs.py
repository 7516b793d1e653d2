"""`coscale run` or a test worker in a subprocess, for the tests that run whole pipelines (kill
tests, 2 ranks) or 2-rank fits.

:func:`run` starts the command in a session of its own and, once rank 0 (the process it
started) has exited, SIGKILLs whatever is left of that session, as a job launcher (torchrun,
SLURM) does when one process of a job dies: under DDP and FSDP2 Lightning starts rank 1 as a
child of rank 0, and a rank whose peer was killed would otherwise wait in its next collective.
The next run then starts on a clean machine, from what the disk holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWO_RANKS = ROOT / "tests" / "configs" / "two_ranks.yaml"
FSDP2 = (
    "{class_path: lightning.pytorch.strategies.ModelParallelStrategy, "
    "init_args: {data_parallel_size: 2, tensor_parallel_size: 1}}"
)
STRATEGIES = {"single": None, "ddp": "ddp", "fsdp2": FSDP2}
TWO_RANK_ENV = {"OMP_NUM_THREADS": "1"}  # one torch thread a rank: 2 ranks on 2 cores


def command(config: Path, run_dir: Path, *extra: str) -> list[str]:
    """``coscale run --config <config>`` into ``run_dir``, with CSV logs and ``extra`` flags."""
    cmd = [sys.executable, "-m", "coscale", "run", "--config", str(config)]
    return [*cmd, "--pipeline.run_dir", str(run_dir), "--pipeline.logger", "csv", *extra]


def two_ranks_command(run_dir: Path, strategy: str, *overlays: Path) -> list[str]:
    """tests/configs/two_ranks.yaml (then each of ``overlays``) under ``strategy`` (a key of
    :data:`STRATEGIES`)."""
    trainer = "{accelerator: cpu, precision: 32-true}"
    if STRATEGIES[strategy] is not None:
        trainer = (
            "{accelerator: cpu, precision: 32-true, devices: 2, "
            f"strategy: {STRATEGIES[strategy]}}}"
        )
    more = [arg for overlay in overlays for arg in ("--config", str(overlay))]
    return command(TWO_RANKS, run_dir, *more, "--pipeline.trainer", trainer)


def env(**extra: str) -> dict[str, str]:
    """This environment without fault injection, plus ``extra``, and without ``WANDB_SERVICE``:
    wandb sets it in a process that used it (this one, after an in-process W&B test), and a
    child that inherits it logs through that process's W&B service, which still holds a killed
    run's stream, so its restart would be refused ("run ID ... is in use"). A run started from
    a shell has its own service."""
    drop = ("COSCALE_KILL", "WANDB_SERVICE")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**base, "PYTHONPATH": str(ROOT), **extra}


def run(cmd: list[str], log: Path, timeout: float = 900, **extra: str) -> int:
    """Runs ``cmd`` (output appended to ``log``) to its end; returns rank 0's exit status
    (negative: killed by that signal). What is left of its session is killed first."""
    with open(log, "a") as out:
        proc = subprocess.Popen(
            cmd, env=env(**extra), stdout=out, stderr=out, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout)
        finally:
            kill_session(proc.pid)


def worker_ranks(script: str, model_dir: Path, out: Path, timeout: float) -> list[dict]:
    """Runs ``tests/<script> <model_dir> <out>``, a worker whose 2 ranks each write
    ``<out>/rank<r>.json``; returns what ranks 0 and 1 wrote (a failed run: its stderr's end)."""
    cmd = [sys.executable, str(ROOT / "tests" / script), str(model_dir), str(out)]
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in (0, 1)]


def kill_session(sid: int, wait_s: float = 60.0) -> None:
    """SIGKILLs every live process of session ``sid`` and waits until none is left."""
    deadline = time.monotonic() + wait_s
    while pids := _live_in_session(sid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"processes {pids} of session {sid} outlived SIGKILL"
        time.sleep(0.1)


def _live_in_session(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not zombies (``/proc/<pid>/stat``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, session
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def commit_labels(log: Path) -> list[str]:
    """The labels of the commit points a run passed (``COSCALE_COMMIT_LOG``), in order."""
    return [line.split("\t", 1)[1] for line in log.read_text().splitlines()]
