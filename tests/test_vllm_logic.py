"""The vLLM backend without vLLM or a GPU: requests, result mapping, weight sync, parity.

`FakeLLM` stands in for `vllm.LLM` behind the real adapter (`VLLMEngine`): it samples token by
token from its own copy of the tiny model, reports log-probs as vLLM's ``processed_logprobs``
(after temperature, or before it as vLLM 0.10.0-0.10.1.1 did) or ``raw_logprobs`` (before it),
and loads weights through ``apply_model(lambda model: model.load_weights(...))``. Variants that
silently skip the load, report nothing loaded or hang exercise the sync guard. The engine's
``vllm.__version__`` is faked per test (default 0.33.0).
"""

from __future__ import annotations

import copy
import gc
import math
import os
import subprocess
import sys
import time
import weakref
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from coscale.rl.logprobs import sequence_logprobs
from coscale.rollout import HFGenerateBackend, SamplingParams, build_backend
from coscale.rollout.base import SampleCall
from coscale.rollout.factory import close_backend
from coscale.rollout.vllm import engine as ve
from coscale.rollout.vllm import launch as vl
from coscale.rollout.vllm.backend import VLLMBackend
from coscale.rollout.vllm.parity import fill_logprobs, parity_verdict
from coscale.rollout.vllm.requests import (
    Completion,
    Request,
    assemble_rollouts,
    build_requests,
    collect_completions,
    engine_params,
    logprobs_trusted,
    sampled_logprobs,
)
from coscale.rollout.vllm.settings import EngineSettings, ParitySettings, SyncSettings, with_dtype
from coscale.rollout.vllm.sync import (
    ParityError,
    SyncBook,
    WeightSyncError,
    WeightSyncTimeout,
    call_with_timeout,
)
from coscale.rollout.vllm.versions import (
    applies_temperature,
    check_logprobs_source,
    parse_version,
    stop_llm,
)
from coscale.rollout.weights import (
    buckets,
    clean_name,
    gathered_parameters,
    is_sharded,
    select_weights,
)
from coscale.seeds import derive_seed

PROMPTS = ["Compute 2+3.", "What is 7*6?\n", "x"]
F32 = EngineSettings(dtype="float32")
EOS = (2,)


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """`vllm.LLM`'s surface over a private copy of a HF model (see the module docstring)."""

    def __init__(self, hf, tok, mode="processed_logprobs", copy_weights=True, report=True,
                 delay=0.0, temperature_in_processed=True, **engine_kwargs):  # fmt: skip
        self.model, self.tokenizer, self.kwargs = copy.deepcopy(hf).eval(), tok, engine_kwargs
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=mode))
        self.copy_weights, self.report, self.delay = copy_weights, report, delay
        self.temperature_in_processed = temperature_in_processed  # False: vLLM 0.10.0-0.10.1.1
        self.calls: list = []
        self.requests: list = []
        self.unseeded = torch.Generator().manual_seed(123)

    def generate(self, prompts, params, use_tqdm=True):
        self.requests += [(p["prompt_token_ids"], sp) for p, sp in zip(prompts, params)]
        return [
            SimpleNamespace(
                outputs=[self._sample(p["prompt_token_ids"], sp, j) for j in range(sp.n)]
            )
            for p, sp in zip(prompts, params)
        ]

    def _sample(self, ids, sp, index):
        gen = self.unseeded if sp.seed is None else torch.Generator().manual_seed(sp.seed)
        tokens, positions = [], []
        for _ in range(sp.max_tokens):
            with torch.inference_mode():
                logits = self.model(torch.tensor([list(ids) + tokens])).logits[0, -1].float()
            scaled = logits / sp.temperature if sp.temperature > 0 else logits
            if sp.temperature == 0:
                token = int(scaled.argmax())
            else:
                token = int(torch.multinomial(scaled.softmax(-1), 1, generator=gen))
            processed = self.llm_engine.model_config.logprobs_mode == "processed_logprobs"
            shown = scaled if processed and self.temperature_in_processed else logits
            positions.append({token: SimpleNamespace(logprob=float(shown.log_softmax(-1)[token]))})
            tokens.append(token)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True) if sp.stop else ""
            hit = [s for s in sp.stop if s in text]
            if token in sp.stop_token_ids or hit:
                return SimpleNamespace(index=index, token_ids=tokens, logprobs=positions,
                                       finish_reason="stop", stop_reason=hit[0] if hit else token)  # fmt: skip
        return SimpleNamespace(index=index, token_ids=tokens, logprobs=positions,
                               finish_reason="length", stop_reason=None)  # fmt: skip

    def apply_model(self, fn):
        return [fn(self)]

    def collective_rpc(self, fn, args=(), kwargs=None):  # one worker whose model is this fake
        return [fn(SimpleNamespace(get_model=lambda: self), *args, **(kwargs or {}))]

    def load_weights(self, weights):  # called as model.load_weights on the worker
        time.sleep(self.delay)
        params = dict(self.model.named_parameters())
        for name, value in weights:
            if self.copy_weights:
                params[name].data.copy_(value)
        self.calls.append(("load", len(weights)))
        return {name for name, _ in weights} if self.report else set()

    def sleep(self, level):
        self.calls.append(("sleep", level))
        if level == 2:  # the weights are gone
            for p in self.model.parameters():
                p.data.zero_()

    def wake_up(self, tags=None):
        self.calls.append(("wake", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset",))


def _backend(policy, tokenizer, fake_options=None, version="0.33.0", **options) -> VLLMBackend:
    fakes = []

    def factory(**kwargs):
        fakes.append(FakeLLM(policy, tokenizer, **(fake_options or {}), **kwargs))
        return ve.VLLMEngine(fakes[-1], FakeSamplingParams, version)

    backend = VLLMBackend("unused/path", tokenizer, policy, engine_factory=factory, **options)
    backend.fake = lambda: (backend.engine, fakes[0])[1]
    return backend


@pytest.fixture
def policy(tiny_model):
    return copy.deepcopy(tiny_model)


def _perturb(model: nn.Module, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    pb = dict(b.named_parameters())
    return all(torch.equal(p, pb[n]) for n, p in a.named_parameters())


# --- requests and results ------------------------------------------------------------------


def test_engine_params_map_every_setting():
    sampling = SamplingParams(max_new_tokens=9, temperature=0.7, top_p=0.9, stop=("##",))
    assert engine_params(sampling, EOS, n=3, seed=5) == {
        "n": 3, "max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "seed": 5,
        "stop": ["##"], "include_stop_str_in_output": True, "stop_token_ids": [2], "logprobs": 0,
        "skip_special_tokens": True,
    }  # fmt: skip
    assert engine_params(SamplingParams(top_k=4), EOS)["top_k"] == 4


def test_requests_fan_out_by_mode():
    ids, counts = [[5, 6], [7]], [3, 2]
    unseeded = build_requests(ids, counts, SamplingParams(), EOS)
    assert [(r.prompt, r.n, r.copies, r.params["seed"]) for r in unseeded] == [
        (0, 3, 1, None), (1, 2, 1, None)
    ]  # fmt: skip
    seeded = build_requests(ids, counts, SamplingParams(seed=4), EOS)
    assert [(r.prompt, r.n, r.token_ids) for r in seeded] == [(0, 1, (5, 6))] * 3 + [
        (1, 1, (7,))
    ] * 2
    seeds = [r.params["seed"] for r in seeded]
    assert seeds == [
        derive_seed("vllm-request", 4, i, j) for i, j in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    ]
    assert len(set(seeds)) == 5 and all(0 <= s < 2**31 for s in seeds)
    greedy = build_requests(ids, counts, SamplingParams(temperature=0, seed=4), EOS)
    assert [(r.prompt, r.n, r.copies) for r in greedy] == [(0, 1, 3), (1, 1, 2)]
    ignored = build_requests(ids, counts, SamplingParams(seed=4), EOS, honor_seed=False)
    assert [r.n for r in ignored] == [3, 2] and ignored[0].params["seed"] is None


def _out(index, tokens, finish="length", stop_reason=None, lps=None):
    positions = [
        {t: SimpleNamespace(logprob=v)} for t, v in zip(tokens, lps or [-1.0] * len(tokens))
    ]
    return SimpleNamespace(index=index, token_ids=tokens, logprobs=positions,
                           finish_reason=finish, stop_reason=stop_reason)  # fmt: skip


def test_collect_completions_orders_copies_and_rejects_bad_outputs():
    requests = [Request(0, (5,), 2, {}), Request(1, (6,), 1, {}, copies=2)]
    outputs = [
        SimpleNamespace(outputs=[_out(1, [9]), _out(0, [8], "stop", 2)]),  # out of index order
        SimpleNamespace(outputs=[_out(0, [7, 2], "stop")]),
    ]
    found = collect_completions(requests, outputs)
    assert [(c.prompt, c.tokens, c.finish) for c in found] == [
        (0, (8,), "stop"), (0, (9,), "length"), (1, (7, 2), "stop"), (1, (7, 2), "stop")
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="returned 1 outputs for 2 requests"):
        collect_completions(requests, outputs[:1])
    with pytest.raises(RuntimeError, match="1 completions for prompt 0, asked for n=2"):
        collect_completions(requests[:1], [SimpleNamespace(outputs=[_out(0, [8])])])
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        collect_completions(requests[1:], [SimpleNamespace(outputs=[_out(0, [8], "abort")])])


def test_sampled_logprobs_read_the_sampled_token_and_mark_gaps():
    positions = [{4: SimpleNamespace(logprob=-0.5)}, {9: -1.25}, {1: SimpleNamespace(logprob=-3.0)}]
    values = sampled_logprobs([4, 9, 7], positions)
    assert values[:2] == (-0.5, -1.25) and math.isnan(values[2])  # token 7 not in its map
    assert all(math.isnan(v) for v in sampled_logprobs([4, 5], None))


def test_assemble_cuts_at_eos_stop_string_and_fills_gaps(char_tokenizer):
    enc = char_tokenizer.convert_tokens_to_ids
    a, b, c, z = enc("a"), enc("b"), enc("c"), enc("z")
    prompts = [[a, b], [c]]
    completions = [
        Completion(0, (z, a, 2, b), (-1.0, -2.0, -3.0, -4.0), "stop", 2),  # EOS then junk
        Completion(1, (a, b), (-1.0, -1.5), "length"),
        Completion(1, (z, a, b, c), (-1.0,) * 4, "stop", "ab"),  # stop string "ab"
        Completion(0, (b,), (-0.5,), "stop", 2),  # vLLM left the EOS out of token_ids
    ]
    decode = lambda ids: char_tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ro = assemble_rollouts(prompts, completions, 0, EOS, ("ab",), decode)
    assert ro.prompt_length == 2 and ro.prompt_index.tolist() == [0, 1, 1, 0]
    assert ro.input_ids.tolist() == [
        [a, b, z, a, 2], [0, c, a, b, 0], [0, c, z, a, b], [a, b, b, 2, 0]
    ]  # fmt: skip
    assert ro.attention_mask[:, :2].tolist() == [[1, 1], [0, 1], [0, 1], [1, 1]]
    assert ro.completion_mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    assert ro.texts == ["za", "ab", "zab", "b"]  # row 1: "ab" completes the stop string too
    assert ro.finish_reasons == ["stop", "stop", "stop", "stop"]
    assert ro.logprobs[0].tolist() == [-1.0, -2.0, -3.0] and ro.logprobs[1].tolist() == [
        -1,
        -1.5,
        0,
    ]
    assert ro.logprobs[3, 0] == -0.5 and math.isnan(ro.logprobs[3, 1])  # filled in later
    plain = assemble_rollouts(prompts, completions[1:2], 0, EOS, (), decode)
    assert plain.finish_reasons == ["length"] and plain.texts == ["ab"]


@pytest.mark.parametrize(
    ("mode", "sampling", "trusted"),
    [
        ("raw_logprobs", SamplingParams(temperature=1.0, top_k=5), True),
        ("raw_logprobs", SamplingParams(temperature=0), True),
        ("raw_logprobs", SamplingParams(temperature=0.7), False),
        ("processed_logprobs", SamplingParams(temperature=0.7), True),
        ("processed_logprobs", SamplingParams(temperature=0.7, top_p=0.9), False),
        ("processed_logprobs", SamplingParams(temperature=1.0, top_k=5), False),
        ("processed_logprobs", SamplingParams(temperature=0), False),
        ("raw_logits", SamplingParams(), False),
        (None, SamplingParams(), False),
    ],
)
def test_logprobs_trusted(mode, sampling, trusted):
    assert logprobs_trusted(mode, sampling) is trusted


# --- weights, timeouts, bookkeeping, parity ------------------------------------------------


def test_weight_names_are_cleaned_and_selected():
    assert clean_name(
        "_fsdp_wrapped_module.policy.model.layers.0._checkpoint_wrapped_module.mlp.w"
    ) == ("policy.model.layers.0.mlp.w")
    named = [("policy.a", 1), ("ref_policy.a", 2), ("_orig_mod.policy.b", 3), ("x._flat_param", 4)]
    assert select_weights(named, "policy.") == [("a", 1), ("b", 3)]
    assert select_weights([("a", 1)], "policy.") == [("a", 1)]  # a bare policy has no prefix
    with pytest.raises(ValueError, match="repeated names"):
        select_weights([("policy.a", 1), ("_orig_mod.policy.a", 2)], "policy.")
    with pytest.raises(ValueError, match="no parameters"):
        select_weights([], "policy.")


def test_gathered_parameters_of_a_container_and_buckets(tiny_model):
    holder = nn.Module()
    holder.policy, holder.ref_policy = tiny_model, copy.deepcopy(tiny_model)
    with gathered_parameters(holder) as named:
        assert [n for n, _ in named] == [n for n, _ in tiny_model.named_parameters()]
    assert not is_sharded(holder)  # plain modules: no collective forward, no padding passes
    sizes = [
        ("a", torch.zeros(4)),
        ("b", torch.zeros(4)),
        ("c", torch.zeros(16)),
        ("d", torch.zeros(2)),
    ]
    groups = [[n for n, _ in g] for g in buckets(sizes, max_bytes=40)]  # float32: 16, 16, 64, 8 B
    assert groups == [["a", "b"], ["c"], ["d"]]


def test_call_with_timeout_returns_raises_and_times_out():
    assert (
        call_with_timeout(lambda: 3, 1.0, "x") == 3 and call_with_timeout(lambda: 4, None, "x") == 4
    )
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["missing"], 1.0, "x")
    start = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"loading did not finish within 0\.1 s"):
        call_with_timeout(lambda: time.sleep(2), 0.1, "loading")
    assert time.monotonic() - start < 1.0
    with pytest.raises(WeightSyncTimeout, match="no time left"):
        call_with_timeout(lambda: 1, 0.0, "loading")


def test_sync_book_guards_names_counts_and_parity_schedule():
    book = SyncBook(parity_every=2)
    for version in (1, 2, 3):
        book.begin(["b", "a"])
        record = book.finish(2, 64, 0.1, [[1], [1]])
        assert record.version == version and record.engine_loaded == [2]
        assert book.parity_pending is (version != 2)  # syncs 1 and 3
    with pytest.raises(WeightSyncError, match=r"missing \['b'\], new \['c'\]"):
        book.begin(["a", "c"])
    with pytest.raises(WeightSyncError, match="loaded \\[1\\] tensors per worker, sync #1 loaded"):
        book.finish(2, 64, 0.1, [[1]])
    with pytest.raises(WeightSyncError, match="loading 0 tensors"):
        SyncBook().finish(1, 4, 0.1, [[0]])
    assert SyncBook().finish(1, 4, 0.1, [[None]]).engine_loaded == [None]  # old vLLM says nothing


def test_parity_verdict_mean_max_and_nan():
    engine = torch.tensor([[-1.0, -2.0, 0.0], [-1.5, -0.5, -9.0]])
    trainer = torch.tensor([[-1.1, -2.0, 0.0], [-1.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    result = parity_verdict(engine, trainer, mask, atol=0.2)  # |diffs| 0.1, 0, 0.5, 0
    assert result.tokens == 4 and result.ok
    assert result.mean_abs == pytest.approx(0.15) and result.max_abs == pytest.approx(0.5)
    assert not parity_verdict(engine, trainer, mask, atol=0.1).ok
    engine[0, 1] = float("nan")
    assert not parity_verdict(engine, trainer, mask, atol=10.0).ok


# --- the backend over a fake engine --------------------------------------------------------


def test_backend_samples_per_prompt_n_with_the_policy_logprobs(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, parity={"tokens": 4})
    sampling = SamplingParams(max_new_tokens=6, seed=0)
    ro = backend.generate(PROMPTS, [3, 1, 2], sampling)
    assert ro.prompt_index.tolist() == [0, 0, 0, 1, 2, 2] and ro.prompt_length == 13
    assert backend.last_logprob_source == "engine" and backend.last_parity.ok  # checked at start
    assert ro.logprob_source == "engine" and ro.from_engine  # the GRPO update corrects these
    with torch.no_grad():
        expected = sequence_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_length)
    torch.testing.assert_close(ro.logprobs, expected, rtol=0, atol=1e-4)
    for ids, n, text in zip(ro.completion_ids, ro.lengths, ro.texts):
        assert text == char_tokenizer.decode(ids[:n], skip_special_tokens=True)
    again = backend.generate(PROMPTS, [3, 1, 2], sampling)
    assert torch.equal(again.input_ids, ro.input_ids)
    assert backend.fake().kwargs["logprobs_mode"] == "processed_logprobs"


def test_untrusted_engine_logprobs_are_recomputed_by_the_trainer(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, {"mode": "raw_logprobs"}, parity={"tokens": 4})
    sampling = SamplingParams(max_new_tokens=6, temperature=0.7, seed=1)
    ro = backend.generate(PROMPTS, 2, sampling)
    assert backend.last_logprob_source == ro.logprob_source == "trainer" and not ro.from_engine
    with torch.no_grad():
        expected = sequence_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_length, 0.7)
    torch.testing.assert_close(ro.logprobs, expected, rtol=0, atol=1e-6)


def test_greedy_and_unseeded_requests(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, parity=ParitySettings(every=0))
    greedy = backend.generate(PROMPTS, [2, 3, 1], SamplingParams(max_new_tokens=4, temperature=0))
    for i in range(3):
        rows = greedy.input_ids[greedy.prompt_index == i]
        assert torch.all(rows == rows[0])
    fake = backend.fake()
    assert [sp.n for _, sp in fake.requests] == [1, 1, 1]  # one request per prompt, copied
    fake.requests.clear()
    backend.generate(PROMPTS, [2, 3, 1], SamplingParams(max_new_tokens=4))
    assert [sp.n for _, sp in fake.requests] == [2, 3, 1] and backend.last_parity is None


def test_sync_loads_the_new_weights_and_parity_passes(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, parity={"tokens": 4})
    fake = backend.fake()  # the engine starts from the policy's current weights
    _perturb(policy)
    holder = nn.Module()
    holder.policy = policy  # a container, as a LightningModule holds its policy
    backend.update_weights(holder)
    assert _same_weights(fake.model, policy) and backend.book.version == 1
    assert fake.calls[-2:] == [("load", len(list(policy.parameters()))), ("reset",)]
    backend.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4, seed=0))
    assert backend.last_parity.ok and backend.last_parity.tokens > 0


def test_silent_noop_sync_is_caught_by_the_parity_check(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, {"copy_weights": False})
    backend.fake()
    _perturb(policy)
    backend.update_weights(policy)
    with pytest.raises(ParityError, match=r"disagree after weight sync #1: mean"):
        backend.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=0))


def test_sync_reporting_nothing_loaded_or_hanging_is_an_error(policy, char_tokenizer):
    with pytest.raises(WeightSyncError, match="loading 0 tensors"):
        _backend(policy, char_tokenizer, {"report": False}).update_weights(policy)
    slow = _backend(policy, char_tokenizer, {"delay": 2.0}, sync={"timeout_s": 0.2})
    with pytest.raises(WeightSyncTimeout, match="sync #1"):
        slow.update_weights(policy)


def test_an_engine_error_during_a_sync_is_a_weight_sync_error(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer)
    fake = backend.fake()

    def broken(weights):
        raise AttributeError("'Parameter' object has no attribute 'weight_loader'")

    fake.load_weights = broken
    with pytest.raises(WeightSyncError, match=r"loading weights into the engine \(sync #1\) "
                       r"failed: AttributeError: 'Parameter' object") as err:  # fmt: skip
        backend.update_weights(policy)
    assert isinstance(err.value.__cause__, AttributeError)


def test_parity_tolerance_follows_the_engine_dtype(policy, char_tokenizer):
    atol = {d: _backend(policy, char_tokenizer, engine={"dtype": d}).parity_atol for d in
            ("float32", "float16", "bfloat16", "auto")}  # fmt: skip
    assert atol == {"float32": 0.01, "float16": 0.1, "bfloat16": 0.15, "auto": 0.15}
    assert _backend(policy, char_tokenizer, parity={"atol": 0.5}).parity_atol == 0.5
    # a stale tied head after one step measured 0.303 (vllm_parity.PARITY_ATOL): above them all
    assert max(atol.values()) < 0.303


def test_parity_under_autocast_takes_the_looser_bound_of_the_trainer_dtype(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer, engine=F32, parity={"tokens": 4})
    backend.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, seed=0))  # parity at start
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer under bf16-mixed
        assert backend.check_parity().atol == 0.15
    assert backend.check_parity().atol == 0.01
    given = _backend(policy, char_tokenizer, engine=F32, parity={"atol": 0.02})
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a tolerance set by the user is kept
        assert given.check_parity().atol == 0.02


def test_the_engine_dtype_follows_the_trainer_precision(tiny_model_dir):
    from types import SimpleNamespace

    from coscale.modules import GRPOModule

    module = GRPOModule(model=str(tiny_model_dir), reward=lambda c, a, **_: [0.0] * len(c))
    got = {}
    for precision in ("bf16-mixed", "16-mixed", "32-true", "bf16-true", "64-true"):
        module._trainer = SimpleNamespace(precision=precision)
        got[precision] = module._compute_dtype()
    assert got == {"bf16-mixed": "bfloat16", "16-mixed": "float16", "32-true": "float32",
                   "bf16-true": "bfloat16", "64-true": None}  # fmt: skip


def test_stale_policy_is_synced_or_refused(policy, char_tokenizer):
    sampling = SamplingParams(max_new_tokens=4, seed=0)
    strict = _backend(
        policy, char_tokenizer, sync=SyncSettings(on_stale="error"), parity=ParitySettings(every=0)
    )
    strict.generate(PROMPTS, 1, sampling)
    _perturb(policy, 0.01)  # an optimiser step without update_weights
    with pytest.raises(WeightSyncError, match="changed since the last weight sync"):
        strict.generate(PROMPTS, 1, sampling)
    auto = _backend(policy, char_tokenizer, parity=ParitySettings(every=0))
    _perturb(policy, 0.01)
    auto.generate(PROMPTS, 1, sampling)
    assert auto.book.version == 1 and _same_weights(auto.fake().model, policy)


def test_sleep_levels_free_and_restore_the_engine(policy, char_tokenizer):
    sampling = SamplingParams(max_new_tokens=4, seed=0)
    one = _backend(
        policy, char_tokenizer, engine=EngineSettings(sleep_level=1), parity=ParitySettings(every=0)
    )
    one.generate(PROMPTS, 1, sampling)
    one.update_weights(policy)
    one.generate(PROMPTS, 1, sampling)
    n = len(list(policy.parameters()))
    assert one.fake().calls == [
        ("sleep", 1), ("wake", ("weights",)), ("load", n), ("reset",), ("wake", ("kv_cache",)),
        ("sleep", 1),
    ]  # fmt: skip
    two = _backend(
        policy, char_tokenizer, engine=EngineSettings(sleep_level=2), parity=ParitySettings(every=0)
    )
    two.generate(PROMPTS, 1, sampling)
    assert two.needs_sync and not _same_weights(two.fake().model, policy)
    two.generate(PROMPTS, 1, sampling)  # one process: synced from the policy first
    assert two.book.version == 1 and two.fake().calls[1:3] == [("wake", ("weights",)), ("load", n)]


def test_fill_logprobs_without_a_policy_keeps_engine_values():
    ro = SimpleNamespace(
        completion_mask=torch.tensor([[1.0, 1.0, 0.0]]),
        logprobs=torch.tensor([[-1.0, float("nan"), float("nan")]]),
    )
    assert fill_logprobs(ro, True, None, 1.0, 4) == "engine-unchecked"
    assert ro.logprobs.tolist() == [[-1.0, 0.0, 0.0]]


# --- engine adapter, construction, choice --------------------------------------------------


def _fake_vllm(monkeypatch, reject_logprobs_mode=False, version=None, **environ):
    """A `vllm` module whose LLM reads the launcher's variables as vLLM's external_launcher
    does; ``os.environ`` is a copy holding `environ` instead of any launcher variable."""
    built = []

    class LLM:
        def __init__(self, **kwargs):
            if reject_logprobs_mode and "logprobs_mode" in kwargs:
                raise TypeError("__init__() got an unexpected keyword argument 'logprobs_mode'")
            if kwargs.get("distributed_executor_backend") == "external_launcher":
                kwargs["_ranks"] = (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]))
            built.append(kwargs)

    module = SimpleNamespace(LLM=LLM, SamplingParams=FakeSamplingParams)
    if version is not None:
        module.__version__ = version
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vl.importlib.util, "find_spec", lambda name: object())
    launcher = {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "SLURM_LOCALID",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
    }
    env = {k: v for k, v in os.environ.items() if k not in launcher} | environ
    monkeypatch.setattr(os, "environ", env)  # restored after the test, whatever it sets
    return built


def _fake_ranks(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setattr(vl.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(vl.dist, "get_world_size", lambda: world)
    monkeypatch.setattr(vl.dist, "get_rank", lambda: rank)


def test_build_engine_defaults_and_old_vllm_fallback(monkeypatch):
    built = _fake_vllm(monkeypatch, reject_logprobs_mode=True)
    args = ve.engine_args(
        "m", None, EngineSettings(sleep_level=1, kwargs={"enforce_eager": True, "seed": 3})
    )
    assert args == {
        "model": "m", "tokenizer": "m", "dtype": "auto", "gpu_memory_utilization": 0.3,
        "seed": 3, "enable_sleep_mode": True, "generation_config": "vllm",
        "logprobs_mode": "processed_logprobs", "enforce_eager": True,
    }  # fmt: skip
    engine = ve.build_engine(**args)
    assert "logprobs_mode" not in built[0] and built[0]["enable_sleep_mode"]
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # in-process engine
    assert engine.logprobs_mode is None  # this fake says nothing: log-probs get recomputed
    assert engine.version is None  # nor its version: never trusted
    _fake_ranks(monkeypatch, rank=3, world=4)
    replica = ve.engine_args("m", engine=EngineSettings(seed=5))
    assert replica["distributed_executor_backend"] == "external_launcher" and replica["seed"] == 8


def test_adapter_translates_calls():
    class Mode:
        value = "raw_logprobs"

    class LLM:
        llm_engine = SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=Mode()))

        def __init__(self):
            self.woken = []

        def generate(self, prompts, params, use_tqdm=True):
            return [(p, sp.__dict__, use_tqdm) for p, sp in zip(prompts, params)]

        def collective_rpc(self, fn, args=(), kwargs=None):  # two workers
            models = (SimpleNamespace(load_weights=lambda w: {n for n, _ in w}),
                      SimpleNamespace(load_weights=lambda w: None))  # fmt: skip
            return [fn(SimpleNamespace(get_model=lambda m=m: m), *args) for m in models]

        def wake_up(self, **kwargs):
            if kwargs:
                raise TypeError("no tags in this version")
            self.woken.append("all")

    llm = LLM()
    engine = ve.VLLMEngine(llm, FakeSamplingParams)
    out = engine.generate([Request(0, (5, 6), 2, {"n": 2})])
    assert out == [({"prompt_token_ids": [5, 6]}, {"n": 2}, False)]
    assert engine.load_weights(iter([("a", torch.zeros(1)), ("b", torch.zeros(1))])) == [2, None]
    engine.wake_up(["weights"])
    assert llm.woken == ["all"] and engine.logprobs_mode == "raw_logprobs"
    engine.reset_prefix_cache()  # absent on this LLM: nothing to do


def test_choosing_vllm_without_vllm_says_how_to_install(monkeypatch, char_tokenizer):
    monkeypatch.setattr(vl.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ImportError, match=r"install coscale\[vllm\] to use the vLLM rollout backend"
    ):
        build_backend("vllm", None, char_tokenizer, "some/model")
    with pytest.raises(ImportError, match=r"install coscale\[vllm\]"):
        VLLMBackend("some/model", char_tokenizer)


def test_bad_settings_and_choices_are_named(char_tokenizer, tiny_model):
    with pytest.raises(ValueError) as err:
        VLLMBackend("m", char_tokenizer, logprobs="x", engine_factory=object,
                    engine={"gpu_memory_utilization": 1.5, "sleep_level": 3},
                    parity=ParitySettings(tokens=0, every=-1, atol=float("nan")),
                    sync={"timeout_s": 0, "on_stale": "maybe"})  # fmt: skip
    for name in ("engine.gpu_memory_utilization", "logprobs", "engine.sleep_level", "parity.tokens",
                 "parity.every", "parity.atol", "sync.timeout_s", "sync.on_stale"):  # fmt: skip
        assert f"rollout.options.{name} must" in str(err.value)
    with pytest.raises(ValueError, match=r"rollout\.options\.parity\.evry is not a parity setting "
                       r"\(it takes: every, prompts, tokens, atol, recompute_batch_size\)"):  # fmt: skip
        VLLMBackend("m", char_tokenizer, parity={"evry": 2}, engine_factory=object)
    with pytest.raises(
        ValueError,
        match=r"rollout\.backend must be one of auto, cached, hf, vllm, vllm-server, got 'sglang'",
    ):
        build_backend("sglang", tiny_model, char_tokenizer)
    with pytest.raises(ValueError, match=r"rollout\.backend='vllm' needs model_path"):
        build_backend("vllm", tiny_model, char_tokenizer)
    assert build_backend("hf", tiny_model, char_tokenizer).model is tiny_model


def test_grpo_rollout_options_are_checked_by_group_and_flat_ones_refused(tiny_model_dir):
    from coscale.modules import GRPOModule

    def refused(options):
        with pytest.raises(ValueError) as err:
            GRPOModule(model=str(tiny_model_dir), rollout={"backend": "vllm", "options": options})
        return str(err.value)

    bad = refused({"parity": {"every": -1}, "engine": {"sleep_level": 3}, "logprobs": "x"})
    assert "rollout.options.parity.every must be an int >= 0, got -1" in bad
    assert "rollout.options.engine.sleep_level must be 0, 1 or 2, got 3" in bad
    assert "rollout.options.logprobs must be one of auto, engine, trainer" in bad
    flat = refused({"max_model_len": 256, "parity_every": 2})  # a setting outside its group
    assert "options.max_model_len is not an option of the vllm backend" in flat
    assert "set options.engine.max_model_len" in flat and "set options.parity.every" in flat
    assert "rollout.options.sync.deadline is not a sync setting" in refused(
        {"sync": {"deadline": 3}}
    )
    ok = {"engine": {"max_model_len": 256}, "sync": SyncSettings(), "parity": {"every": 0}}
    assert GRPOModule(model=str(tiny_model_dir), rollout={"backend": "vllm", "options": ok})


def test_settings_default_once_and_the_engine_dtype_follows_the_policy(policy, char_tokenizer):
    backend = _backend(policy, char_tokenizer)  # no engine.dtype: the float32 policy's
    assert backend._args["dtype"] == "float32" and backend.parity_atol == 0.01
    assert (backend.engine_settings.gpu_memory_utilization, backend.sync_settings, backend.parity_settings) == (
        0.3, SyncSettings(), ParitySettings()
    )  # fmt: skip
    assert VLLMBackend("m", char_tokenizer, engine_factory=object)._args["dtype"] == "auto"
    # the GRPO module fills in the trainer's compute dtype where the options leave it unset
    assert with_dtype({"engine": {"max_model_len": 8}}, "bfloat16")["engine"] == {
        "max_model_len": 8, "dtype": "bfloat16"
    }  # fmt: skip
    assert with_dtype({"engine": F32}, "bfloat16")["engine"] is F32
    assert with_dtype({}, None) == {} and with_dtype({}, "float16")["engine"] == {
        "dtype": "float16"
    }


def test_importing_coscale_never_imports_vllm():
    # a fresh interpreter: other tests of this process may have imported the installed vllm
    code = (
        "import sys, coscale.app.evaluate, coscale.rollout.vllm.backend, coscale.modules.grpo\n"
        "assert coscale.rollout.vllm.backend.VLLMBackend is coscale.rollout.VLLMBackend\n"
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- vLLM versions: whose log-probs include the temperature (issue 15, item 5) --------------


@pytest.mark.parametrize(
    ("version", "applies"),
    [
        ("0.9.2", False),
        ("0.10.0", False),
        ("0.10.1.1", False),  # logprobs_mode exists, processed_logprobs are pre-temperature
        ("0.10.2rc1", False),  # pre-releases of 0.10.2 may predate the fix
        ("0.10.2.dev3+g1a2b3c4", False),
        ("0.10.2", True),
        ("0.10.2.post1", True),
        ("0.11.0rc1", True),
        ("0.33.0", True),
        ("dev", False),  # a source build without metadata
        (None, False),
    ],
)
def test_versions_that_apply_the_temperature(version, applies):
    assert applies_temperature(version) is applies


def test_version_strings_parse_sanely():
    assert (
        parse_version("0.10.2.dev3+g1a2b3c4") < parse_version("0.10.2") < parse_version("0.11.0rc1")
    )
    assert parse_version("0.10.1.1") < parse_version("0.10.2") < parse_version("0.33.0")
    assert parse_version("not a version") is None and parse_version(None) is None


def test_logprobs_engine_is_refused_where_the_temperature_is_missing():
    check_logprobs_source("engine", "0.10.2")  # fine
    check_logprobs_source("auto", "0.10.1.1")  # auto falls back to the trainer instead
    for version, shown in (("0.10.1.1", "'0.10.1.1'"), (None, "of unknown version")):
        with pytest.raises(ValueError, match=r"logprobs='engine'") as err:
            check_logprobs_source("engine", version)
        assert shown in str(err.value) and "vllm>=0.10.2" in str(err.value)


def test_old_vllm_logprobs_are_recomputed_by_the_trainer(policy, char_tokenizer):
    sampling = SamplingParams(max_new_tokens=6, temperature=0.7, seed=1)

    def trainer_view(ro):  # the contract: log_softmax(logits / 0.7)
        with torch.no_grad():
            return sequence_logprobs(policy, ro.input_ids, ro.attention_mask, ro.prompt_length, 0.7)

    # vLLM 0.10.1.1 says processed_logprobs but leaves the temperature out
    old = _backend(policy, char_tokenizer, {"temperature_in_processed": False},
                   version="0.10.1.1", parity={"tokens": 4})  # fmt: skip
    ro = old.generate(PROMPTS, 2, sampling)
    assert old.last_logprob_source == "trainer" and old.vllm_version == "0.10.1.1"
    torch.testing.assert_close(ro.logprobs, trainer_view(ro), rtol=0, atol=1e-6)
    new = _backend(policy, char_tokenizer, version="0.10.2", parity={"tokens": 4})
    ro = new.generate(PROMPTS, 2, sampling)
    assert new.last_logprob_source == "engine"
    torch.testing.assert_close(ro.logprobs, trainer_view(ro), rtol=0, atol=1e-4)
    strict = _backend(policy, char_tokenizer, version="0.10.1.1", logprobs="engine")
    with pytest.raises(ValueError, match=r"logprobs='engine'.*'0\.10\.1\.1'"):
        strict.generate(PROMPTS, 1, sampling)


def test_logprobs_engine_on_old_vllm_fails_at_choice_time(monkeypatch, char_tokenizer):
    _fake_vllm(monkeypatch, version="0.10.1.1")
    with pytest.raises(ValueError, match=r"logprobs='engine'.*'0\.10\.1\.1'"):
        VLLMBackend("m", char_tokenizer, logprobs="engine")
    assert VLLMBackend("m", char_tokenizer).logprobs == "auto"  # auto: recomputed instead
    engine = ve.build_engine(model="m")
    assert engine.version == "0.10.1.1"


def test_an_engine_refused_for_its_version_is_shut_down():
    stopped = []
    old = SimpleNamespace(version="0.10.1.1", shutdown=lambda: stopped.append("old"))
    with pytest.raises(ValueError, match=r"logprobs='engine'.*'0\.10\.1\.1'"):
        ve.start_engine(lambda **kwargs: old, {"model": "m"}, "engine")
    assert stopped == ["old"]  # never left holding GPU memory
    assert ve.start_engine(lambda **kwargs: old, {"model": "m"}, "auto") is old


# --- launchers and tensor parallelism (issue 15, items 4 and 6) -----------------------------


def test_external_launcher_gets_its_ranks_without_torchrun(monkeypatch):
    # Lightning's subprocess launcher sets LOCAL_RANK only: vLLM used to fail on KeyError 'RANK'
    built = _fake_vllm(monkeypatch, version="0.33.0", LOCAL_RANK="1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _fake_ranks(monkeypatch, rank=1, world=2)
    engine = ve.build_engine(**ve.engine_args("m", engine=EngineSettings(seed=5)))
    assert built[0]["distributed_executor_backend"] == "external_launcher"
    assert built[0]["_ranks"] == (1, 1) and built[0]["seed"] == 6
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("1", "2")
    assert engine.version == "0.33.0"
    monkeypatch.setattr(vl.dist, "is_initialized", lambda: False)  # no process group to join
    with pytest.raises(RuntimeError, match="launch with torchrun"):
        ve.build_engine(model="m", distributed_executor_backend="external_launcher")


def test_launcher_env_from_torchrun_lightning_and_slurm():
    torchrun = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert vl.launcher_env(torchrun, 3, 4, device=1) == torchrun
    assert vl.launcher_env({"LOCAL_RANK": "1"}, 3, 4, device=1) == torchrun  # Lightning
    assert vl.launcher_env({}, 3, 4, device=1) == torchrun  # the rank's CUDA device
    assert vl.launcher_env({"SLURM_LOCALID": "1"}, 3, 4, device=None) == torchrun  # SLURM, no GPU
    with pytest.raises(RuntimeError, match=r"no LOCAL_RANK, SLURM_LOCALID.*launch with torchrun"):
        vl.launcher_env({}, 3, 4, device=None)
    with pytest.raises(RuntimeError, match=r"RANK=2 but torch.distributed says 3"):
        vl.launcher_env({"RANK": "2"}, 3, 4, device=1)
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=0 but this rank trains on cuda:2"):
        vl.launcher_env({"LOCAL_RANK": "0"}, 0, 2, device=2)  # Trainer(devices=[2, 3])


def test_tensor_parallel_engines_are_refused_across_ranks(monkeypatch, char_tokenizer):
    tp2 = {"tensor_parallel_size": 2}
    assert (
        ve.engine_args("m", engine=EngineSettings(kwargs=tp2))["tensor_parallel_size"] == 2
    )  # one process: vLLM's own
    _fake_ranks(monkeypatch, rank=0, world=2)
    with pytest.raises(ValueError, match=r"rollout\.options\.engine\.kwargs\.tensor_parallel_size"):
        ve.engine_args("m", engine=EngineSettings(kwargs=tp2))
    with pytest.raises(ValueError, match=r"must be 1 under torch\.distributed, got 2"):
        VLLMBackend("m", char_tokenizer, engine={"kwargs": tp2}, engine_factory=object)
    assert (
        ve.engine_args("m", engine=EngineSettings(kwargs={"tensor_parallel_size": 1}))["seed"] == 0
    )


# --- shutdown at the end of a stage (issue 15, item 7) --------------------------------------


def test_close_shuts_the_engine_down_and_frees_it(policy, char_tokenizer):
    closed, built = [], []

    class ClosingLLM(FakeLLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.myself = self  # a reference cycle: only the cycle collector frees it

        def shutdown(self):
            closed.append(id(self))

    def factory(**kwargs):
        llm = ClosingLLM(policy, char_tokenizer, **kwargs)
        built.append(weakref.ref(llm))
        gc.freeze()  # as vLLM does after building an in-process engine
        return ve.VLLMEngine(llm, FakeSamplingParams, "0.33.0")

    backend = VLLMBackend("unused/path", char_tokenizer, policy, engine_factory=factory,
                          parity=ParitySettings(every=0))  # fmt: skip
    sampling = SamplingParams(max_new_tokens=4, seed=0)
    try:
        backend.generate(PROMPTS, 1, sampling)
        backend.close()
        alive = built[0]() is not None  # close() itself must unfreeze and collect
    finally:
        gc.unfreeze()
    assert len(closed) == 1 and not alive  # shut down, and no reference left
    assert backend.needs_sync  # a new engine starts from the checkpoint, not the policy
    backend.close()  # nothing to close: fine
    _perturb(policy, 0.01)
    backend.generate(PROMPTS, 1, sampling)  # one process: a new engine, synced from the policy
    assert len(built) == 2 and backend.book.version == 1 and not backend.needs_sync
    close_backend(backend)
    assert len(closed) == 2
    close_backend(None)  # a backend never built
    close_backend(HFGenerateBackend(policy, char_tokenizer))  # nothing to free


def test_stop_llm_uses_the_hook_each_version_has():
    calls = []
    hook = lambda name: lambda: calls.append(name)  # noqa: E731
    v1 = SimpleNamespace(
        llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=hook("core")))
    )
    v0 = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(shutdown=hook("exec")))
    )
    new = SimpleNamespace(shutdown=hook("llm"), llm_engine=v1.llm_engine)
    for llm in (v1, v0, new, SimpleNamespace()):
        stop_llm(llm)
    assert calls == ["core", "exec", "llm"]  # one hook each, the newest API first


# --- real sharding: 2 CPU ranks (gloo) ------------------------------------------------------


def _sharded_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from coscale.models.tiny import build_char_tokenizer, build_tiny_model
    from coscale.rollout.vllm.parity import trainer_logprobs
    from coscale.rollout.weights import full_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    ref = {n: p.detach().clone() for n, p in build_tiny_model(tok).named_parameters()}
    wrap = {"device_id": torch.device("cpu"), "use_orig_params": True}
    holder = nn.Module()
    holder.policy = build_tiny_model(tok)
    root = FSDP(holder, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), **wrap)
    sharded = any(p.numel() == 0 for p in root.parameters())  # rank 1 holds empty views
    sharded &= is_sharded(root.policy)
    with gathered_parameters(root) as named:
        fsdp1 = sorted(n for n, _ in named) == sorted(ref)
        fsdp1 &= all(torch.equal(full_tensor(p), ref[n]) for n, p in named)
    model2 = build_tiny_model(tok)
    for layer in model2.model.layers:
        fully_shard(layer)
    fully_shard(model2)
    with gathered_parameters(model2) as named:
        fsdp2 = all(torch.equal(full_tensor(p), ref[n]) for n, p in named)
    # uneven R per rank: 5 rows in chunks of 2 (3 passes) vs 1 row (1 pass + 2 padding passes)
    policy = FSDP(build_tiny_model(tok), **wrap)
    rows = 5 if rank == 0 else 1
    ids = torch.randint(4, 60, (rows, 9), generator=torch.Generator().manual_seed(rank))
    ro = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), prompt_length=4,
                         num_rollouts=rows, logprobs=torch.zeros(rows, 5))  # fmt: skip
    lp = trainer_logprobs(policy, ro, 1.0, batch_size=2)
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"sharded": sharded, "fsdp1": fsdp1, "fsdp2": fsdp2, "shape": list(lp.shape)}, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_gather_and_recompute_under_real_fsdp_sharding(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sharded_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[1]["sharded"]  # really sharded, not NO_SHARD
    assert all(r["fsdp1"] and r["fsdp2"] for r in results)
    assert [r["shape"] for r in results] == [[5, 5], [1, 5]]  # no hang on uneven R


def test_the_vllm_extra_allows_only_versions_whose_logprobs_apply_the_temperature():
    """Issue 15 item 8: ``coscale[vllm]`` names a range, and its floor is a version whose engine
    log-probs coscale may trust (vllm>=0.8 let 0.10.0-0.10.1.1 in silently)."""
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    (spec,) = extras["vllm"]
    allowed = Requirement(spec).specifier
    assert allowed.contains("0.10.2") and allowed.contains("0.33.0")
    for old in ("0.8.5", "0.10.0", "0.10.1.1"):
        assert not allowed.contains(old), old
        assert not applies_temperature(old)
    assert not allowed.contains("0.34.0")  # newer vLLM internals are untested: capped


def test_only_the_expected_failed_to_load_lines_are_dropped(caplog):
    import logging

    from coscale.rollout.vllm import reload as vllm_reload

    vllm_reload.quiet_expected_warnings()
    vllm_reload.quiet_expected_warnings()  # once a process, however often an engine starts
    logger = logging.getLogger(vllm_reload.LAYERWISE_LOGGER)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=vllm_reload.LAYERWISE_LOGGER):
        for layer in (
            "ParallelLMHead",
            "RotaryEmbedding",
            "Llama3RotaryEmbedding",
            "QKVParallelLinear",
        ):
            logger.warning("%s: Failed to load weights", layer)
    assert [r.getMessage() for r in caplog.records] == ["QKVParallelLinear: Failed to load weights"]


def test_generate_many_sends_every_call_in_one_engine_call_with_each_calls_own_seeds(
    policy, char_tokenizer
):
    backend = _backend(policy, char_tokenizer, parity=ParitySettings(every=0))
    fake = backend.fake()
    calls = [
        SampleCall(PROMPTS[:2], [2, 1], SamplingParams(max_new_tokens=5, seed=10)),
        SampleCall(PROMPTS[2:], 3, SamplingParams(max_new_tokens=5, seed=11)),
    ]
    engine_calls = []
    generate = fake.generate
    fake.generate = lambda prompts, params, **kw: (
        engine_calls.append(len(prompts)) or generate(prompts, params, **kw)
    )
    together = backend.generate_many(calls)
    assert engine_calls == [3 + 3]  # one engine call: 2 + 1 and 3 seeded single requests
    for call, got in zip(calls, together):  # as each call made alone
        alone = backend.generate(call.prompts, call.n_per_prompt, call.sampling)
        assert torch.equal(got.input_ids, alone.input_ids) and got.texts == alone.texts
        assert torch.equal(got.prompt_index, alone.prompt_index)
    assert engine_calls == [6, 3, 3]


def test_follow_makes_a_new_model_the_policy_and_the_next_sample_syncs_it_first(
    policy, char_tokenizer
):
    backend = _backend(policy, char_tokenizer, parity={"tokens": 4})
    fake = backend.fake()
    other = copy.deepcopy(policy)
    _perturb(other)
    backend.follow(other)
    assert backend.needs_sync and backend.policy is other and backend.book.parity_pending
    backend.update_weights(other)  # what every rank does before sampling (the run engine)
    assert _same_weights(fake.model, other) and not backend.needs_sync
    backend.generate(PROMPTS, 1, SamplingParams(max_new_tokens=4, seed=0))
    assert backend.last_parity.ok  # checked against the new model
    assert backend.starts == 1  # the same engine throughout
