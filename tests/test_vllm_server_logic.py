"""`rollout.backend: vllm-server` without a server: its settings and their errors, the command
line it starts, the HTTP bodies and answers, the sync's bookkeeping on a fake server."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from coscale.rollout.base import SamplingParams
from coscale.rollout.factory import RolloutSettings
from coscale.rollout.vllm.requests import build_requests, collect_completions
from coscale.rollout.vllm.server.client import ServerClient, as_engine_output, completion_body
from coscale.rollout.vllm.server.engine import ServerEngine, check_extension, per_worker
from coscale.rollout.vllm.server.launch import (
    WORKER_EXTENSION,
    ServerError,
    ServerProcess,
    log_tail,
    serve_argv,
    server_environment,
    server_module,
)
from coscale.rollout.vllm.server.settings import ServerSettings, as_server, server_errors
from coscale.rollout.vllm.server.worker import PING


def test_server_settings_name_every_bad_value():
    errors = server_errors(
        {"url": "gpu-3:8000", "port": 0, "cores": [1, -2], "concurrency": 0, "devices": []}
    )
    assert errors == [
        "server.url must start with http:// or https://, got 'gpu-3:8000'",
        "server.port must be an int >= 1 or None, got 0",
        "server.concurrency must be an int >= 1, got 0",
        "server.cores must be a non-empty list of CPU ids (ints >= 0), got (1, -2)",
        "server.devices must be a non-empty list of GPU ids (ints >= 0), got ()",
    ]
    assert server_errors({"ports": 1}) == [
        "server.ports is not a server setting (it takes: concurrency, cores, devices, host, log, "
        "port, request_timeout_s, start_timeout_s, sync_dir, transfer, transfer_address, "
        "transfer_port, url)"
    ]
    assert as_server({"cores": [1]}) == ServerSettings(cores=(1,))
    with pytest.raises(ValueError, match=r"rollout\.options\.server\.port must be"):
        as_server({"port": -1})


def test_the_rollout_choice_checks_the_server_group_and_the_engine_groups():
    errors = RolloutSettings(
        "vllm-server", {"server": {"port": "x"}, "parity": {"every": -1}}
    ).errors()
    assert "options.parity.every must be an int >= 0, got -1" in errors
    assert "options.server.port must be an int >= 1 or None, got 'x'" in errors
    assert RolloutSettings("vllm-server", {"server": {"url": "http://h:1"}}).errors() == []
    wrong = RolloutSettings("vllm-server", {"servr": {}}).errors()
    assert wrong and wrong[0].startswith(
        "options.servr is not an option of the vllm-server backend"
    )


def test_colocated_only_settings_are_refused_naming_them():
    from coscale.rollout.vllm.server.backend import refuse_colocated_only
    from coscale.rollout.vllm.settings import EngineSettings, SyncSettings

    with pytest.raises(ValueError, match=r"engine\.sleep_level must be 0 with backend vllm-server"):
        refuse_colocated_only(EngineSettings(sleep_level=1), SyncSettings())
    with pytest.raises(ValueError, match=r"sync\.adapter must be 'merged'"):
        refuse_colocated_only(EngineSettings(), SyncSettings(adapter="lora"))


def test_serve_argv_turns_engine_arguments_into_flags():
    args = {
        "model": "/m", "tokenizer": "/m", "dtype": "float32", "enable_sleep_mode": False,
        "enforce_eager": True, "max_model_len": 256, "max_num_seqs": None,
        "compilation_config": {"level": 0},
    }  # fmt: skip
    argv = serve_argv(args, "127.0.0.1", 8011)
    assert argv[:5] == [sys.executable, "-m", server_module(), "--model", "/m"]
    tail = argv[5:]
    assert tail[:2] == ["--tokenizer", "/m"] and "--no-enable-sleep-mode" in tail
    assert "--enforce-eager" in tail and "--max-num-seqs" not in tail
    assert tail[tail.index("--compilation-config") + 1] == '{"level": 0}'
    assert tail[-6:] == ["--host", "127.0.0.1", "--port", "8011", "--worker-extension-cls", WORKER_EXTENSION]  # fmt: skip


def test_server_environment_turns_dev_routes_on_and_binds_cores(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env = server_environment((2, 3))
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and env["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert server_environment(None, (1,))["CUDA_VISIBLE_DEVICES"] == "1"  # the server's GPU
    assert server_environment(None)["CUDA_VISIBLE_DEVICES"] == "0,1"  # the trainer's


def test_a_completion_round_trips_into_what_collect_completions_reads():
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)
    requests = build_requests([[5, 6, 7]], [2], sampling, eos_ids=[2])
    body = completion_body("tiny", requests[0])
    assert body["prompt"] == [5, 6, 7] and body["return_token_ids"] is True
    assert body["seed"] == requests[0].params["seed"] and body["stop_token_ids"] == [2]
    answer = {
        "choices": [
            {"index": 0, "token_ids": [9, 2], "finish_reason": "stop", "stop_reason": 2,
             "logprobs": {"token_logprobs": [-0.5, -1.25], "tokens": ["a", "b"]}},
        ]
    }  # fmt: skip
    outputs = [as_engine_output(answer), as_engine_output(answer)]
    done = collect_completions(requests, outputs)
    assert [c.tokens for c in done] == [(9, 2), (9, 2)]
    assert done[0].logprobs == (-0.5, -1.25) and done[0].stop_reason == 2
    none = as_engine_output({"choices": [{"token_ids": [4], "finish_reason": "length"}]})
    assert math.isnan(collect_completions(requests[:1], [none])[0].logprobs[0])


def test_rpc_results_come_back_as_counts_per_worker():
    assert per_worker(["272", None, "None", 5]) == [272, None, None, 5]


class _FakeServer(BaseHTTPRequestHandler):
    """The routes a sync and a completion use, recorded in order on the class."""

    calls: ClassVar[list[str]] = []
    version = "0"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, body) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        self.calls.append(path)
        answers = {
            "/version": {"version": "0.32.0"},
            "/weight_info": {"weight_version": type(self).version},
            "/server_info": {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}},
            "/v1/models": {"data": [{"id": "tiny"}]},
        }  # fmt: skip
        self._answer(answers.get(path, {}))

    def do_POST(self) -> None:
        url = urlparse(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if url.path == "/collective_rpc":
            self.calls.append(f"rpc:{body['method']}")
            result = {"coscale_ping": PING, "coscale_load_file": "3"}.get(body["method"], "0")
            return self._answer({"results": [result]})
        if url.path == "/update_weight_version":
            type(self).version = body["new_version"]
        query = parse_qs(url.query)
        self.calls.append(url.path + (f"?mode={query['mode'][0]}" if "mode" in query else ""))
        if url.path == "/v1/completions":
            return self._answer({"choices": [{"token_ids": [1], "finish_reason": "length"}]})
        self._answer({})


@pytest.fixture
def fake_server():
    _FakeServer.calls, _FakeServer.version = [], "0"
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_sync_pauses_loads_each_bucket_file_sets_the_version_and_resumes(fake_server, tmp_path):
    import torch

    client = ServerClient(fake_server)
    check_extension(client)
    engine = ServerEngine(client, "tiny", sync_dir=str(tmp_path))
    assert engine.logprobs_mode == "processed_logprobs" and engine.version == "0.32.0"
    _FakeServer.calls.clear()
    engine.begin_load()
    counts = engine.load_weights([("w", torch.ones(2)), ("b", torch.zeros(1))])
    engine.end_load()
    assert counts == [3] and list(tmp_path.iterdir()) == []  # the file is gone after the load
    assert _FakeServer.calls == [
        "/pause?mode=wait", "rpc:coscale_begin_load", "rpc:coscale_load_file",
        "rpc:coscale_end_load", "/reset_prefix_cache", "/update_weight_version", "/resume",
    ]  # fmt: skip
    assert client.weight_version() == engine.weight_version == "1"


def test_a_server_without_coscale_s_extension_is_refused_with_how_to_start_it(fake_server):
    client = ServerClient(fake_server)
    client.rpc = lambda method, *a, **k: ["something else"]
    with pytest.raises(ServerError, match=r"--worker-extension-cls coscale\.rollout\.vllm"):
        check_extension(client)


def test_a_dead_server_is_reported_with_its_exit_code_and_log(tmp_path):
    log = tmp_path / "server.log"
    script = "import sys; print('loading model'); print('CUDA out of memory'); sys.exit(3)"
    process = ServerProcess([sys.executable, "-c", script], {}, log)
    process.process.wait(30)
    with pytest.raises(ServerError, match=r"exited with code 3 while sampling") as err:
        process.check_alive("sampling")
    assert "CUDA out of memory" in str(err.value) and str(log) in str(err.value)
    assert log_tail(tmp_path / "missing.log").startswith("(no log at")
    with pytest.raises(ServerError, match="start_timeout_s"):
        ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], {}, log).wait_ready(
            lambda: False, 1.0
        )


def test_a_server_dies_with_the_run_that_started_it_even_when_the_run_is_sigkilled(tmp_path):
    """A `coscale run` SIGKILLed (or OOM-killed) leaves no server behind: the server runs in a
    session of its own, out of reach of the run's process group, and ends by its parent-death
    signal."""
    starter = (
        "import sys, time; from coscale.rollout.vllm.server.launch import ServerProcess; "
        "p = ServerProcess([sys.executable, '-c', 'import time; time.sleep(600)'], {}, "
        f"{str(tmp_path / 'server.log')!r}); print(p.pid, flush=True); time.sleep(600)"
    )
    run = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    server = int(run.stdout.readline())
    assert os.getsid(server) == server  # its own session: killing the run's group misses it
    run.send_signal(signal.SIGKILL)
    run.wait(30)
    deadline = time.monotonic() + 30
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server), f"the server (pid {server}) outlived the run that started it"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_call_that_fails_as_the_server_dies_waits_to_name_its_exit_code(tmp_path):
    dying = "import sys, time; time.sleep(1); sys.exit(3)"
    process = ServerProcess([sys.executable, "-c", dying], {}, tmp_path / "server.log")
    process.check_alive("pausing")  # still running: nothing to say yet
    with pytest.raises(ServerError, match="exited with code 3 while pausing"):
        process.check_alive("pausing", wait_s=30)
