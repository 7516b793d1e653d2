"""The HTTP calls coscale makes to a vLLM server, over ``httpx``.

Completions go to the OpenAI route ``/v1/completions`` with the prompt as token ids and
``return_token_ids`` (vLLM's extension), so a completion comes back as token ids and the
sampled tokens' log-probs; `as_engine_output` gives it the shape of vLLM's in-process
``RequestOutput`` that `coscale.rollout.vllm.requests.collect_completions` reads. One HTTP call
per request, up to ``concurrency`` of them in flight on one asynchronous client (the server
batches them continuously). Every call has a timeout, and a connection that fails to open is
tried again (``retries`` times: a server that is restarting its listener, a refused connection),
as is a completion whose connection closed before any answer came (a kept-alive connection the
server closed as the request went out; sampling again is harmless: a completion changes nothing
on the server, and a seeded one samples the same); a call the server answered with an error is
not repeated: it is raised with the server's message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import httpx

from coscale.rollout.vllm.requests import Request

SAMPLING_KEYS = (
    "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "include_stop_str_in_output", "stop_token_ids", "logprobs", "skip_special_tokens",
)  # fmt: skip
"""The `vllm.SamplingParams` arguments coscale sets (`requests.engine_params`), all of which
``/v1/completions`` takes under the same names."""
CONNECT_TIMEOUT_S = 10.0
"""Longest wait for a connection to open (each try)."""
UNREACHABLE = (httpx.TransportError, OSError)
DROPPED = (httpx.ReadError, httpx.RemoteProtocolError)
"""A connection closed with no answer (no status line): the completion is sent again."""
"""What a call raises when the server could not be reached or stopped answering."""


class HTTPError(OSError):
    """The server answered a call with a status >= 400.

    Attributes:
        status: The HTTP status.
    """

    def __init__(self, method: str, url: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {url}: {status} {detail}")
        self.status = status


class ServerClient:
    """One server's routes.

    Args:
        url: ``http://host:port``.
        timeout_s: Longest wait for one call's answer.
        concurrency: Completion calls in flight at once.
        retries: Tries again of a connection that failed to open, and of a completion whose
            connection closed with no answer.
    """

    def __init__(
        self, url: str, timeout_s: float = 3600.0, concurrency: int = 64, retries: int = 3
    ) -> None:
        self.url, self.timeout_s, self.concurrency = url.rstrip("/"), timeout_s, concurrency
        self.retries = retries
        self._client: httpx.Client | None = None  # opened at the first call, kept (thread-safe)

    def _timeout(self, timeout_s: float | None) -> httpx.Timeout:
        return httpx.Timeout(timeout_s or self.timeout_s, connect=CONNECT_TIMEOUT_S)

    # --------------------------------------------------------------- plumbing
    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """The JSON answer of ``method path`` (None for an empty one); raises `HTTPError` with
        the server's message for a status >= 400, one of `UNREACHABLE` when there is no answer."""
        if self._client is None:
            transport = httpx.HTTPTransport(retries=self.retries)
            self._client = httpx.Client(transport=transport, timeout=self._timeout(None))
        answer = self._client.request(
            method, self.url + path, json=body, params=query, timeout=self._timeout(timeout_s)
        )
        return _json(answer)

    def close(self) -> None:
        """Closes the connections of the control calls (a later call opens them again)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def healthy(self) -> bool:
        """True when ``/health`` answers 200 (False while it starts or when it is gone)."""
        try:
            with httpx.Client(timeout=self._timeout(5.0)) as client:
                return client.get(self.url + "/health").status_code == 200
        except UNREACHABLE:
            return False

    # --------------------------------------------------------------- server facts
    def version(self) -> str | None:
        return self.call("GET", "/version").get("version")

    def served_model(self) -> str:
        """The model name the server answers to (``/v1/models``' first)."""
        return self.call("GET", "/v1/models")["data"][0]["id"]

    def config(self) -> dict[str, Any]:
        """The server's vLLM config (development route ``/server_info``)."""
        info = self.call("GET", "/server_info", query={"config_format": "json"})
        config = info.get("vllm_config", {})
        return json.loads(config) if isinstance(config, str) else config

    # --------------------------------------------------------------- RL routes
    def rpc(self, method: str, *args: str, timeout_s: float | None = None) -> list[Any]:
        """Calls ``method`` on every worker (``/collective_rpc``); one result per worker."""
        body: dict[str, Any] = {"method": method, "args": list(args)}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        answer = self.call("POST", "/collective_rpc", body, timeout_s=timeout_s)
        return [] if answer is None else list(answer.get("results", []))

    def pause(self) -> None:
        """Stops taking new work once the requests in flight are done (mode ``wait``)."""
        self.call("POST", "/pause", query={"mode": "wait"})

    def resume(self) -> None:
        self.call("POST", "/resume")

    def set_weight_version(self, version: str) -> None:
        self.call("POST", "/update_weight_version", {"new_version": version})

    def weight_version(self) -> str | None:
        return self.call("GET", "/weight_info").get("weight_version")

    def reset_prefix_cache(self) -> None:
        self.call("POST", "/reset_prefix_cache")

    # --------------------------------------------------------------- sampling
    def complete(self, model: str, requests: Sequence[Request]) -> list[Any]:
        """One engine-shaped output per request (`as_engine_output`), in request order."""
        bodies = [completion_body(model, r) for r in requests]
        return [as_engine_output(a) for a in asyncio.run(self._complete_all(bodies))]

    async def _complete_all(self, bodies: list[dict[str, Any]]) -> list[Any]:
        """Every body's answer, at most ``concurrency`` in flight (one connection each)."""
        limits = httpx.Limits(max_connections=max(1, self.concurrency))
        transport = httpx.AsyncHTTPTransport(retries=self.retries, limits=limits)
        gate = asyncio.Semaphore(max(1, self.concurrency))
        async with httpx.AsyncClient(transport=transport, timeout=self._timeout(None)) as client:

            async def one(body: dict[str, Any]) -> Any:
                async with gate:
                    for tried in range(self.retries + 1):
                        try:
                            return _json(await client.post(self.url + "/v1/completions", json=body))
                        except DROPPED:
                            if tried == self.retries:
                                raise

            return await asyncio.gather(*(one(b) for b in bodies))


def _json(answer: httpx.Response) -> Any:
    """The answer's JSON (None when empty); `HTTPError` with the server's message for an error."""
    if answer.status_code >= 400:
        detail = f"{answer.reason_phrase}: {answer.text[:2000]}"
        raise HTTPError(answer.request.method, str(answer.request.url), answer.status_code, detail)
    return answer.json() if answer.content.strip() else None


def completion_body(model: str, request: Request) -> dict[str, Any]:
    """The ``/v1/completions`` body of one engine request."""
    params = {k: v for k, v in request.params.items() if k in SAMPLING_KEYS}
    unknown = sorted(set(request.params) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling arguments the server route does not take: {unknown}")
    return {"model": model, "prompt": list(request.token_ids), "return_token_ids": True, **params}


def as_engine_output(answer: dict[str, Any]) -> Any:
    """A ``/v1/completions`` answer as vLLM's ``RequestOutput`` is read by coscale: ``outputs``,
    each with ``index``, ``token_ids``, ``logprobs`` (per position ``{token: logprob}``),
    ``finish_reason`` and ``stop_reason``."""
    outputs = []
    for choice in answer["choices"]:
        tokens = [int(t) for t in choice.get("token_ids") or []]
        values = (choice.get("logprobs") or {}).get("token_logprobs") or []
        positions = [{t: v} for t, v in zip(tokens, values)]
        outputs.append(
            SimpleNamespace(
                index=choice.get("index", 0),
                token_ids=tokens,
                logprobs=positions or None,
                finish_reason=choice.get("finish_reason"),
                stop_reason=choice.get("stop_reason"),
            )
        )
    return SimpleNamespace(outputs=outputs)
