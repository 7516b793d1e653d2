"""The HTTP calls coscale makes to a vLLM server (standard library only: ``urllib``).

Completions go to the OpenAI route ``/v1/completions`` with the prompt as token ids and
``return_token_ids`` (vLLM's extension), so a completion comes back as token ids and the
sampled tokens' log-probs; `as_engine_output` gives it the shape of vLLM's in-process
``RequestOutput`` that `coscale.rollout.vllm.requests.collect_completions` reads. One HTTP call
per request, ``concurrency`` of them in flight (the server batches them continuously).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from coscale.rollout.vllm.requests import Request

SAMPLING_KEYS = (
    "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "include_stop_str_in_output", "stop_token_ids", "logprobs", "skip_special_tokens",
)  # fmt: skip
"""The `vllm.SamplingParams` arguments coscale sets (`requests.engine_params`), all of which
``/v1/completions`` takes under the same names."""


class ServerClient:
    """One server's routes.

    Args:
        url: ``http://host:port``.
        timeout_s: Longest wait for one call.
        concurrency: Completion calls in flight at once.
    """

    def __init__(self, url: str, timeout_s: float = 3600.0, concurrency: int = 64) -> None:
        self.url, self.timeout_s, self.concurrency = url.rstrip("/"), timeout_s, concurrency

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
        the server's message for a status >= 400."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:2000]
            raise urllib.error.HTTPError(
                url, err.code, f"{err.reason}: {detail}", err.headers, None
            ) from None
        return json.loads(raw) if raw.strip() else None

    def healthy(self) -> bool:
        """True when ``/health`` answers 200 (False while it starts or when it is gone)."""
        try:
            self.call("GET", "/health", timeout_s=5.0)
            return True
        except (OSError, urllib.error.URLError):
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
        with ThreadPoolExecutor(max(1, min(self.concurrency, len(bodies)))) as pool:
            answers = list(pool.map(lambda b: self.call("POST", "/v1/completions", b), bodies))
        return [as_engine_output(a) for a in answers]


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
