"""Pure logic of the vLLM backend: prompts and N out as engine requests, `Rollouts` back.

Nothing here imports vLLM, so all of it runs in CI. A request carries the keyword arguments
of `vllm.SamplingParams` as a plain dict; the engine adapter (`coscale.rollout.vllm.engine.py`) turns it into
the real object.

How per-prompt N becomes requests (the outputs come back in request order, so mapping them
to `prompt_index` is a walk through the list):
- greedy (temperature 0): one request per prompt; its completion is copied N_i times.
- seeded (`SamplingParams.seed` set): one request per rollout with `n=1` and a seed derived
  from (seed, prompt, sample) by `coscale.seeds.derive_seed`, so a call is reproducible
  whatever vLLM does with `n > 1`.
- unseeded: one request per prompt with `n=N_i` (the prompt's KV is computed once).

Log-prob conventions: the contract wants `log_softmax(logits / temperature)` over the full
vocabulary. vLLM (>= 0.10.2) returns, per `logprobs_mode`, either `raw_logprobs` (the
model's distribution before temperature, penalties, top-k/top-p) or `processed_logprobs`
(after all of them). `logprobs_trusted` says when the returned values equal the contract;
otherwise the backend recomputes them with the trainer's policy. Older vLLM versions do not
say which they return: they are never trusted.

Shapes: B prompts, R rollouts, P prompt tokens, T completion tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coscale.rl.logprobs import effective_temperature
from coscale.rollout.base import Rollouts, SamplingParams
from coscale.rollout.text import stop_cut
from coscale.seeds import derive_seed


@dataclass(frozen=True)
class Request:
    """One engine request: a prompt's tokens, how many completions, and sampling settings."""

    prompt: int  # index of the prompt, 0..B-1
    token_ids: tuple[int, ...]  # the prompt's tokens, no padding
    n: int  # completions the engine samples for this request
    params: dict[str, Any]  # keyword arguments of vllm.SamplingParams
    copies: int = 1  # each completion stands for this many rollouts (greedy)


@dataclass(frozen=True)
class Completion:
    """One sampled completion as the engine returned it."""

    prompt: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # NaN where the engine gave none
    finish: str  # vLLM's finish_reason: "stop" | "length"
    stop_reason: int | str | None = None  # the stop token id or string, if any


def engine_params(
    sampling: SamplingParams, eos_ids: Sequence[int], n: int = 1, seed: int | None = None
) -> dict[str, Any]:
    """`vllm.SamplingParams` keyword arguments equivalent to `sampling` (n, seed per request)."""
    return {
        "n": n,
        "max_tokens": sampling.max_new_tokens,
        "temperature": float(sampling.temperature),  # 0 is greedy in vLLM too
        "top_p": float(sampling.top_p),
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,  # -1: off in every version
        "seed": seed,
        "stop": list(sampling.stop),
        "include_stop_str_in_output": True,  # the contract keeps the token that completes it
        "stop_token_ids": list(eos_ids),  # the policy's EOS ids, as the HF backend uses
        "logprobs": 0,  # only the sampled token's log-prob
        "skip_special_tokens": True,
    }


def build_requests(
    prompt_ids: Sequence[Sequence[int]],
    counts: Sequence[int],
    sampling: SamplingParams,
    eos_ids: Sequence[int],
    honor_seed: bool = True,
) -> list[Request]:
    """Requests for N_i completions of prompt i, in prompt order (see the module docstring).

    Args:
        prompt_ids: B token lists.
        counts: B rollout counts (>= 1 each, already normalised).
        sampling: How to sample.
        eos_ids: Token ids that end a completion.
        honor_seed: Fan a seeded call out into seeded single requests; False ignores the
            seed (faster: vLLM samples seeded requests one generator at a time).
    """
    requests = []
    for i, (ids, count) in enumerate(zip(prompt_ids, counts)):
        ids = tuple(int(t) for t in ids)
        if sampling.greedy:
            requests.append(Request(i, ids, 1, engine_params(sampling, eos_ids), copies=count))
        elif sampling.seed is not None and honor_seed:
            seeds = [derive_seed("vllm-request", sampling.seed, i, j) for j in range(count)]
            requests += [Request(i, ids, 1, engine_params(sampling, eos_ids, 1, s)) for s in seeds]
        else:
            requests.append(Request(i, ids, count, engine_params(sampling, eos_ids, count)))
    return requests


def collect_completions(requests: Sequence[Request], outputs: Sequence[Any]) -> list[Completion]:
    """Engine outputs (one per request, in request order) -> R completions in rollout order.

    Raises:
        RuntimeError: When the engine returned the wrong number of outputs or completions, or
            a completion that neither stopped nor hit the length limit (e.g. aborted).
    """
    if len(outputs) != len(requests):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
    found = []
    for request, output in zip(requests, outputs):
        samples = sorted(output.outputs, key=lambda s: getattr(s, "index", 0))
        if len(samples) != request.n:
            raise RuntimeError(
                f"vLLM returned {len(samples)} completions for prompt {request.prompt}, "
                f"asked for n={request.n}"
            )
        for sample in samples:
            if sample.finish_reason not in ("stop", "length"):
                raise RuntimeError(
                    f"vLLM ended a completion of prompt {request.prompt} with finish_reason="
                    f"{sample.finish_reason!r}; expected 'stop' or 'length' (request aborted?)"
                )
            tokens = tuple(int(t) for t in sample.token_ids)
            completion = Completion(
                request.prompt,
                tokens,
                sampled_logprobs(tokens, sample.logprobs),
                sample.finish_reason,
                getattr(sample, "stop_reason", None),
            )
            found += [completion] * request.copies
    return found


def sampled_logprobs(tokens: Sequence[int], positions: Sequence[Any] | None) -> tuple[float, ...]:
    """The log-prob of each sampled token from vLLM's per-position `{token: Logprob}` maps."""
    values = [math.nan] * len(tokens)
    for t, (token, entry) in enumerate(zip(tokens, positions or ())):
        found = entry.get(token) if isinstance(entry, Mapping) else None
        value = getattr(found, "logprob", found)
        values[t] = math.nan if value is None else float(value)
    return tuple(values)


def logprobs_trusted(mode: str | None, sampling: SamplingParams) -> bool:
    """Whether engine log-probs in `mode` equal the contract's for `sampling`.

    `raw_logprobs` are the temperature-1 distribution: right when the effective temperature
    is 1 (greedy counts as 1). `processed_logprobs` include temperature and top-k/top-p
    masking: right when neither truncation is on (and not greedy, whose processing varies).
    Any other mode, or an unknown one (None), is not trusted.
    """
    if mode == "raw_logprobs":
        return effective_temperature(sampling.temperature) == 1.0
    if mode == "processed_logprobs":
        return not sampling.greedy and sampling.top_k == 0 and sampling.top_p == 1.0
    return False


def assemble_rollouts(
    prompt_ids: Sequence[Sequence[int]],
    completions: Sequence[Completion],
    pad_id: int,
    eos_ids: Sequence[int],
    stop: Sequence[str],
    decode: Callable[[Sequence[int]], str],
) -> Rollouts:
    """R completions -> `Rollouts` (left-padded prompts, right-padded completions).

    A completion ends at its first EOS (kept) or after the token that completes a stop
    string; `finish_reasons` is "stop" then (or when vLLM said so), else "length". Log-probs
    the engine did not give stay NaN on kept tokens, for the caller to fill in.
    """
    width_p = max(len(ids) for ids in prompt_ids)
    kept = [_kept(c, set(eos_ids), tuple(stop), decode) for c in completions]
    width_t = max([1, *(len(tokens) for tokens, _, _ in kept)])
    r = len(completions)
    input_ids = torch.full((r, width_p + width_t), pad_id, dtype=torch.long)  # [R, P+T]
    attention = torch.zeros((r, width_p + width_t), dtype=torch.long)  # [R, P+T]
    logprobs = torch.zeros((r, width_t), dtype=torch.float32)  # [R, T]
    for row, (c, (tokens, values, _)) in enumerate(zip(completions, kept)):
        prompt = list(prompt_ids[c.prompt])
        start = width_p - len(prompt)
        input_ids[row, start:width_p] = torch.tensor(prompt, dtype=torch.long)
        attention[row, start:width_p] = 1
        input_ids[row, width_p : width_p + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention[row, width_p : width_p + len(tokens)] = 1
        logprobs[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return Rollouts(
        prompt_index=torch.tensor([c.prompt for c in completions], dtype=torch.long),
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=attention[:, width_p:].float(),
        logprobs=logprobs,
        texts=[decode(tokens) for tokens, _, _ in kept],
        finish_reasons=[reason for _, _, reason in kept],
        prompt_length=width_p,
        logprob_source="engine",  # until `fill_logprobs` decides
    )


def _kept(
    c: Completion, eos: set[int], stop: tuple[str, ...], decode: Callable[[Sequence[int]], str]
) -> tuple[list[int], list[float], str]:
    """The kept tokens of one completion, their log-probs, and its finish reason."""
    tokens, values = list(c.tokens), list(c.logprobs)
    ends = [t for t, token in enumerate(tokens) if token in eos]
    if ends:
        tokens, values = tokens[: ends[0] + 1], values[: ends[0] + 1]
    elif c.finish == "stop" and isinstance(c.stop_reason, int) and c.stop_reason in eos:
        tokens, values = [*tokens, c.stop_reason], [*values, math.nan]  # EOS left out by vLLM
        ends = [len(tokens) - 1]
    cut = stop_cut(tokens, stop, decode)
    if cut is not None:
        tokens, values = tokens[:cut], values[:cut]
    reason = "stop" if ends or cut is not None or c.finish == "stop" else "length"
    return tokens, values, reason
