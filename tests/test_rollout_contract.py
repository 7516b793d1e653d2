"""The contract every rollout backend must meet, plus the rollout data types.

`CASES` lists the backends; each contract test runs once per case against the case's policy
(`policy`), whose teacher-forced forward pass is the reference for the log-probs.
To add a backend: write a factory `(policy, tokenizer, model_dir) -> RolloutBackend` and a
`pytest.param` with the marks that skip it where its engine or device is missing (see vLLM).

The vLLM case runs the real engine wherever vllm is installed (``./run.sh setup`` installs
vLLM's CPU build on x86_64 Linux), on a policy with head size 32: vLLM's CPU attention takes
head sizes 32, 64, 80, ... and the default tiny model's is 16.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

from coscale.rl.logprobs import sequence_logprobs
from coscale.rollout import (
    CachedDecodeBackend,
    HFGenerateBackend,
    RolloutBackend,
    Rollouts,
    SamplingParams,
    normalize_n_per_prompt,
)

PROMPTS = ["Compute 2+3.", "What is 7*6?\n", "x"]
COUNTS = [4, 6, 2]  # R = 12, a different N per prompt
SAMPLING = SamplingParams(max_new_tokens=48, seed=0)  # seed 0: 4 EOS stops, 8 length cut-offs


@dataclass(frozen=True)
class Case:
    """A backend under test: how to build it and how close its log-probs must be."""

    make: object  # (policy, tokenizer, model_dir) -> RolloutBackend
    logprob_atol: float
    head_dim: int | None = None  # None: the tiny model's own (16)


def _hf(policy, tokenizer, model_dir) -> RolloutBackend:
    return HFGenerateBackend(policy, tokenizer)


def _cached(policy, tokenizer, model_dir) -> RolloutBackend:
    return CachedDecodeBackend(policy, tokenizer)  # every speed path on (the defaults)


def _vllm(policy, tokenizer, model_dir) -> RolloutBackend:
    vllm_backend = pytest.importorskip("coscale.rollout.vllm.backend", reason="no vLLM backend")
    return vllm_backend.VLLMBackend(
        str(model_dir),
        tokenizer,
        policy,
        engine={"dtype": "float32", "gpu_memory_utilization": 0.2},
    )


CASES = [
    pytest.param(Case(_hf, 1e-5), id="hf"),
    pytest.param(Case(_cached, 1e-5), id="cached"),
    pytest.param(Case(_vllm, 1e-3, head_dim=32), id="vllm", marks=pytest.mark.vllm),
]


@pytest.fixture(scope="module", params=CASES)
def case(request) -> Case:
    return request.param


@pytest.fixture(scope="module")
def policy(case, tiny_model, char_tokenizer):
    """The tiny model, or one of the same width with the case's head size."""
    if case.head_dim is None:
        return tiny_model
    from coscale.models.tiny import build_tiny_model

    heads = tiny_model.config.hidden_size // case.head_dim
    return build_tiny_model(char_tokenizer, num_heads=heads, seed=0)


@pytest.fixture(scope="module")
def backend(case, policy, char_tokenizer, model_folder):
    path = model_folder("contract_model", policy, char_tokenizer)
    made = case.make(policy, char_tokenizer, path)
    yield made
    close = getattr(made, "close", None)
    if callable(close):
        close()  # frees the engine's memory before the next case


@pytest.fixture(scope="module")
def sampled(backend) -> Rollouts:
    return backend.generate(PROMPTS, COUNTS, SAMPLING)


def test_shapes_and_prompt_index(sampled, char_tokenizer):
    r, p = sum(COUNTS), max(len(char_tokenizer(x)["input_ids"]) for x in PROMPTS)
    t = sampled.input_ids.shape[1] - p
    assert sampled.num_rollouts == r and sampled.prompt_length == p and 1 <= t <= 48
    assert sampled.prompt_index.tolist() == [0] * 4 + [1] * 6 + [2] * 2
    assert sampled.attention_mask.shape == (r, p + t)
    assert sampled.completion_mask.shape == sampled.logprobs.shape == (r, t)
    assert sampled.completion_ids.shape == (r, t) and sampled.lengths.shape == (r,)
    assert sampled.logprobs.dtype == torch.float32
    assert len(sampled.texts) == len(sampled.finish_reasons) == r


def test_prompt_part_is_the_left_padded_prompt(sampled, char_tokenizer):
    mask = sampled.attention_mask[:, : sampled.prompt_length]
    assert torch.all(mask[:, 1:] >= mask[:, :-1])  # zeros (padding) first, then ones
    pads = sampled.prompt_ids[mask == 0]
    assert torch.all(pads == char_tokenizer.pad_token_id)
    for row, index in zip(sampled.prompt_ids, sampled.prompt_index.tolist()):
        assert char_tokenizer.decode(row, skip_special_tokens=True) == PROMPTS[index]


def test_masks_end_at_eos_and_agree_with_finish_reasons(sampled, char_tokenizer):
    eos, pad = char_tokenizer.eos_token_id, char_tokenizer.pad_token_id
    mask = sampled.completion_mask
    assert torch.equal(sampled.attention_mask[:, sampled.prompt_length :].float(), mask)
    assert torch.all(mask[:, 1:] <= mask[:, :-1])  # ones, then zeros
    for ids, n, reason in zip(sampled.completion_ids, sampled.lengths, sampled.finish_reasons):
        kept, rest = ids[:n].tolist(), ids[n:].tolist()
        assert rest == [pad] * len(rest)
        assert eos not in kept[:-1]
        assert (kept[-1] == eos) == (reason == "stop")
        assert reason == "stop" or n == SAMPLING.max_new_tokens
    assert set(sampled.finish_reasons) == {"stop", "length"}  # both cases are exercised


def test_texts_are_the_decoded_kept_tokens(sampled, char_tokenizer):
    for ids, n, text in zip(sampled.completion_ids, sampled.lengths, sampled.texts):
        assert text == char_tokenizer.decode(ids[:n], skip_special_tokens=True)


@pytest.mark.parametrize(
    "sampling",
    [SAMPLING, SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=5, seed=1)],
    ids=["t1", "t0.7-topk-topp"],
)
def test_logprobs_match_teacher_forced_forward(case, backend, policy, sampling):
    rollouts = backend.generate(PROMPTS, COUNTS, sampling)
    with torch.no_grad():
        expected = sequence_logprobs(
            policy,
            rollouts.input_ids,
            rollouts.attention_mask,
            rollouts.prompt_length,
            sampling.temperature,
        )
    kept = rollouts.completion_mask.bool()
    torch.testing.assert_close(rollouts.logprobs, expected, rtol=0, atol=case.logprob_atol)
    assert torch.all(rollouts.logprobs[kept] < 0) and torch.all(rollouts.logprobs[~kept] == 0)


def test_greedy_is_deterministic_and_picks_the_argmax(backend, policy):
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    first = backend.generate(PROMPTS, COUNTS, greedy)
    second = backend.generate(PROMPTS, COUNTS, greedy)
    assert torch.equal(first.input_ids, second.input_ids)
    for i in range(len(PROMPTS)):  # every copy of a prompt gets the same completion
        rows = first.input_ids[first.prompt_index == i]
        assert torch.all(rows == rows[0])
    pos = torch.clamp(first.attention_mask.cumsum(-1) - 1, min=0)
    with torch.no_grad():
        logits = policy(
            first.input_ids, attention_mask=first.attention_mask, position_ids=pos
        ).logits
    logits = logits[:, first.prompt_length - 1 : -1]  # [R, T, V]
    chosen = logits.gather(-1, first.completion_ids.unsqueeze(-1)).squeeze(-1)  # [R, T]
    gap = (logits.max(-1).values - chosen)[first.completion_mask.bool()]
    assert gap.max() < 1e-4


def test_seed_reproduces_and_different_seeds_differ(backend):
    a = backend.generate(PROMPTS, COUNTS, SAMPLING)
    b = backend.generate(PROMPTS, COUNTS, SAMPLING)
    c = backend.generate(PROMPTS, COUNTS, SamplingParams(max_new_tokens=48, seed=1))
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=0)
    assert a.texts != c.texts


def test_stop_string_cuts_after_the_token_that_completes_it(backend, sampled, char_tokenizer):
    row = sampled.finish_reasons.index("length")
    stop = sampled.texts[row][10:12]  # found in this row, at index 10 or earlier
    cut = backend.generate(PROMPTS, COUNTS, SamplingParams(max_new_tokens=48, seed=0, stop=(stop,)))
    assert cut.finish_reasons[row] == "stop"
    # same seed, same tokens: each completion is the uncut one, ended after its first stop
    for i, (before, text) in enumerate(zip(sampled.texts, cut.texts)):
        if stop in before:
            assert text == before[: before.index(stop) + len(stop)]
            assert cut.finish_reasons[i] == "stop"
            # the last kept token completes the stop (special tokens decode to nothing)
            ids = cut.completion_ids[i, : int(cut.lengths[i])].tolist()
            assert stop not in char_tokenizer.decode(ids[:-1], skip_special_tokens=True)
        else:
            assert text == before and cut.finish_reasons[i] == sampled.finish_reasons[i]


def test_a_seeded_call_leaves_the_global_rng_alone(backend):
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    backend.generate(PROMPTS, COUNTS, SamplingParams(max_new_tokens=6, seed=5))
    assert torch.equal(torch.rand(2), expected)


def test_max_new_tokens_is_respected(backend):
    rollouts = backend.generate(PROMPTS, 3, SamplingParams(max_new_tokens=5, seed=0))
    assert rollouts.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rollouts.completion_ids.shape[1] <= 5
    for n, reason in zip(rollouts.lengths.tolist(), rollouts.finish_reasons):
        assert n <= 5 and (reason == "stop" or n == 5)


def test_bad_requests_are_rejected(backend):
    with pytest.raises(ValueError, match="n_per_prompt entries must be ints >= 1"):
        backend.generate(PROMPTS, [1, 0, 2], SAMPLING)
    with pytest.raises(ValueError, match="one entry per prompt"):
        backend.generate(PROMPTS, [1, 2], SAMPLING)


# --- HF backend specifics ------------------------------------------------------------------


def test_hf_chunks_give_the_same_greedy_rollouts(tiny_model, char_tokenizer):
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    whole = HFGenerateBackend(tiny_model, char_tokenizer).generate(PROMPTS, COUNTS, greedy)
    chunked = HFGenerateBackend(tiny_model, char_tokenizer, batch_size=5)  # 5 + 5 + 2 rows
    parts = chunked.generate(PROMPTS, COUNTS, greedy)
    assert torch.equal(whole.input_ids, parts.input_ids)
    torch.testing.assert_close(whole.logprobs, parts.logprobs, rtol=0, atol=1e-5)


def test_hf_ignores_the_checkpoint_sampling_defaults(tiny_model, char_tokenizer):
    reference = HFGenerateBackend(tiny_model, char_tokenizer).generate(PROMPTS, COUNTS, SAMPLING)
    model = copy.deepcopy(tiny_model).train()
    model.generation_config.update(repetition_penalty=100.0, top_k=1, no_repeat_ngram_size=1)
    rollouts = HFGenerateBackend(model, char_tokenizer).generate(PROMPTS, COUNTS, SAMPLING)
    assert torch.equal(rollouts.input_ids, reference.input_ids)
    assert model.generation_config.repetition_penalty == 100.0  # restored after sampling
    assert model.training and not rollouts.logprobs.requires_grad


def test_hf_seed_leaves_the_global_rng_alone(tiny_model, char_tokenizer):
    backend = HFGenerateBackend(tiny_model, char_tokenizer)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    backend.generate(["x"], 2, SamplingParams(max_new_tokens=4, seed=9))
    assert torch.equal(torch.rand(2), expected)
    unseeded = SamplingParams(max_new_tokens=8)  # uses (and advances) the global RNG
    torch.manual_seed(4)
    a = backend.generate(["x"], 2, unseeded)
    torch.manual_seed(4)
    assert a.texts == backend.generate(["x"], 2, unseeded).texts


def test_hf_setup_errors_and_weight_update(tiny_model, char_tokenizer):
    with pytest.raises(ValueError, match="batch_size must be >= 1 or None, got 0"):
        HFGenerateBackend(tiny_model, char_tokenizer, batch_size=0)
    no_pad = copy.deepcopy(char_tokenizer)
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="tokenizer has no pad token"):
        HFGenerateBackend(tiny_model, no_pad)
    backend = HFGenerateBackend(tiny_model, char_tokenizer)
    other = copy.deepcopy(tiny_model)
    backend.update_weights(other)
    assert backend.model is other
    with pytest.raises(ValueError, match="prompts must hold at least one prompt"):
        backend.generate([], 1, SAMPLING)


# --- data types ----------------------------------------------------------------------------


def test_sampling_params_collect_every_problem():
    assert SamplingParams(stop=["\n\n"]).stop == ("\n\n",)  # a YAML list becomes a tuple
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
    with pytest.raises(ValueError) as err:
        SamplingParams(max_new_tokens=0, temperature=-1, top_p=0, top_k=-1, stop=("",))
    for name in ("max_new_tokens", "temperature", "top_p", "top_k", "stop"):
        assert f"{name} must" in str(err.value)


def test_normalize_n_per_prompt():
    assert normalize_n_per_prompt(3, 2) == [3, 3]
    assert normalize_n_per_prompt((1, 4), 2) == [1, 4]
    for bad in ([1, 0], [2, True], [1.5, 2], 0):
        with pytest.raises(ValueError, match="ints >= 1"):
            normalize_n_per_prompt(bad, 2)
    with pytest.raises(ValueError, match=r"one entry per prompt \(2\), got 3"):
        normalize_n_per_prompt([1, 1, 1], 2)


def _rollouts(**overrides) -> Rollouts:
    fields = {  # R=2, P=2, T=3
        "prompt_index": torch.tensor([0, 0]),
        "input_ids": torch.tensor([[0, 5, 6, 2, 0], [7, 8, 9, 9, 9]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        "completion_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
        "logprobs": torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]]),
        "texts": ["a", "bbb"],
        "finish_reasons": ["stop", "length"],
        "prompt_length": 2,
    }
    return Rollouts(**{**fields, **overrides})


def test_rollouts_properties_and_to():
    r = _rollouts()
    assert r.num_rollouts == 2 and r.lengths.tolist() == [2, 3]
    assert r.completion_ids.tolist() == [[6, 2, 0], [9, 9, 9]]
    assert r.prompt_ids.tolist() == [[0, 5], [7, 8]]
    moved = r.to("cpu")
    assert moved is not r and torch.equal(moved.input_ids, r.input_ids) and moved.texts == r.texts
    assert r.logprob_source == "trainer" and not r.from_engine  # the default: the policy sampled
    engine = _rollouts(logprob_source="engine").to("cpu")
    assert engine.logprob_source == "engine" and engine.from_engine


def test_rollouts_reject_inconsistent_fields():
    with pytest.raises(ValueError, match=r"logprobs must be \(2, 3\), got \(2, 2\)"):
        _rollouts(logprobs=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="texts must have R=2 entries, got 1"):
        _rollouts(texts=["a"])
    with pytest.raises(ValueError, match=r"finish_reasons must be in .*'eos'"):
        _rollouts(finish_reasons=["eos", "length"])
    with pytest.raises(ValueError, match=r"logprob_source must be one of .*'trainer'.*got 'vllm'"):
        _rollouts(logprob_source="vllm")
