"""The vLLM server client's HTTP behaviour on a local stand-in server: completions in flight at
once and in order, a connection tried again while the server is not listening yet, a completion
sent again when its connection closed with no answer, timeouts, and an error answer raised with
the server's message (not tried again)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from coscale.rollout.vllm.requests import Request
from coscale.rollout.vllm.server.client import UNREACHABLE, HTTPError, ServerClient


class _Server(BaseHTTPRequestHandler):
    """``/v1/completions`` echoes the prompt's first token after ``delay_s`` (the first ``drops``
    of them close the connection with no answer); ``/slow`` sleeps 2 s; ``/broken`` answers 500;
    each path's calls are counted."""

    calls: ClassVar[dict[str, int]] = {}
    in_flight: ClassVar[list[int]] = [0, 0]  # now, most at once
    delay_s = 0.05
    drops = 0
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._count()
        if self.path == "/slow":
            time.sleep(2.0)
        self._send(200, {"version": "0.32.0"})

    def do_POST(self) -> None:
        self._count()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/broken":
            return self._send(500, {"error": "worker crashed"})
        with self.lock:
            drop, _Server.drops = self.drops > 0, max(0, self.drops - 1)
        if drop:  # as a server closing a kept-alive connection the request went out on
            self.close_connection = True
            return None
        with self.lock:
            self.in_flight[0] += 1
            self.in_flight[1] = max(self.in_flight)
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight[0] -= 1
        self._send(200, {"choices": [{"token_ids": body["prompt"][:1], "finish_reason": "stop"}]})

    def _count(self) -> None:
        with self.lock:
            self.calls[self.path] = self.calls.get(self.path, 0) + 1


def _serve(port: int = 0) -> ThreadingHTTPServer:
    _Server.calls, _Server.in_flight[:], _Server.drops = {}, [0, 0], 0
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def server():
    httpd = _serve()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_completions_run_concurrently_up_to_the_limit_and_come_back_in_order(server):
    requests = [Request(i, (i, 7), 1, {"n": 1, "max_tokens": 2}) for i in range(12)]
    outputs = ServerClient(server, concurrency=4).complete("tiny", requests)
    assert [o.outputs[0].token_ids for o in outputs] == [[i] for i in range(12)]
    assert _Server.calls == {"/v1/completions": 12}
    assert 1 < _Server.in_flight[1] <= 4


def test_a_completion_whose_connection_closed_with_no_answer_is_sent_again(server):
    requests = [Request(i, (i, 7), 1, {"n": 1, "max_tokens": 2}) for i in range(6)]
    _Server.drops = 2
    outputs = ServerClient(server, concurrency=2, retries=2).complete("tiny", requests)
    assert [o.outputs[0].token_ids for o in outputs] == [[i] for i in range(6)]
    assert _Server.calls == {"/v1/completions": 8}  # the two dropped ones were sent again
    _Server.drops = 1
    with pytest.raises(httpx.RemoteProtocolError):  # no retries: the drop is raised
        ServerClient(server, retries=0).complete("tiny", requests[:1])


def test_a_connection_is_tried_again_until_the_server_listens():
    with socket.socket() as probe:  # a free port, with nothing listening on it yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    later: list[ThreadingHTTPServer] = []
    timer = threading.Timer(0.3, lambda: later.append(_serve(port)))
    timer.start()
    try:
        assert ServerClient(f"http://127.0.0.1:{port}", retries=4).version() == "0.32.0"
    finally:
        timer.join()
        for httpd in later:
            httpd.shutdown()
            httpd.server_close()
    with pytest.raises(httpx.ConnectError):  # no retries: the refusal is raised at once
        ServerClient(f"http://127.0.0.1:{port}", retries=0).version()


def test_a_call_past_its_timeout_raises_and_an_error_answer_is_not_repeated(server):
    client = ServerClient(server, timeout_s=0.3)
    with pytest.raises(UNREACHABLE):
        client.call("GET", "/slow")
    with pytest.raises(HTTPError, match=r"POST .*/broken: 500 Internal Server Error: .*crashed"):
        client.call("POST", "/broken", {"x": 1})
    assert _Server.calls["/broken"] == 1
    assert isinstance(HTTPError("GET", "u", 404, "x"), OSError)  # a ServerError's cause
    assert not ServerClient("http://127.0.0.1:9").healthy()
