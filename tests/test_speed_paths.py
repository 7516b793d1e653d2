"""Every speed path computes what the plain path computes; only the time differs.

Rollouts: `CachedDecodeBackend` with each switch on or off against the plain loop (all off)
and against HF `generate`: same tokens for greedy decoding, same tokens for seeded sampling,
log-probs within 1e-5 in fp32. Updates: trimmed padding columns, one prompt pass shared by
a prompt's rollouts and length-sorted micro-batches give the same log-probs, gradients and
weights after a GRPO step; the rollout log-probs serve as the old log-probs (no second
forward pass when num_iterations == 1).
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch.utils.data import DataLoader
from trainers import quiet_trainer

from coscale.modules import GRPOModule
from coscale.modules import grpo as grpo_module
from coscale.rl.logprobs import position_ids_from_mask, sequence_logprobs, token_entropy
from coscale.rl.micro_batches import micro_batches
from coscale.rollout import CachedDecodeBackend, HFGenerateBackend, SamplingParams
from coscale.rollout.cached.backend import filter_logits, pick_tokens

PROMPTS = ["Compute 2+3.", "What is 7*6?\n", "x"]
COUNTS = [4, 6, 2]  # R = 12, prompts of different lengths (left padding), N per prompt
SWITCHES = ("share_prefix", "drop_finished", "static_cache")
COMBOS = [dict(zip(SWITCHES, flags)) for flags in itertools.product([False, True], repeat=3)]
PLAIN = dict.fromkeys(SWITCHES, False)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: these tiny models only pay thread sync, and on the shared 2-core
    machine a second thread that waits for a busy core made this file ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ids(combo: dict) -> str:
    return "-".join(name for name, on in combo.items() if on) or "plain"


@pytest.fixture(scope="module")
def dot_stops(tiny_model, char_tokenizer):
    """The tiny model, with "." as a second EOS: its greedy text for PROMPTS[0] is "....",
    the others repeat one other character, so some rows finish at once and some never do."""
    model = copy.deepcopy(tiny_model)
    model.generation_config.eos_token_id = [
        char_tokenizer.eos_token_id,
        char_tokenizer(".")["input_ids"][0],
    ]
    return model


@pytest.fixture(scope="module")
def greedy_reference(dot_stops, char_tokenizer):
    greedy = SamplingParams(max_new_tokens=40, temperature=0)
    return HFGenerateBackend(dot_stops, char_tokenizer).generate(PROMPTS, COUNTS, greedy)


@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_greedy_tokens_equal_hf_generate(combo, greedy_reference, dot_stops, char_tokenizer):
    backend = CachedDecodeBackend(dot_stops, char_tokenizer, **combo)
    out = backend.generate(PROMPTS, COUNTS, SamplingParams(max_new_tokens=40, temperature=0))
    assert torch.equal(out.input_ids, greedy_reference.input_ids)
    assert out.finish_reasons == greedy_reference.finish_reasons
    assert "stop" in out.finish_reasons and "length" in out.finish_reasons  # rows drop early
    torch.testing.assert_close(out.logprobs, greedy_reference.logprobs, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def sampled_plain(tiny_model, char_tokenizer):
    sampling = SamplingParams(max_new_tokens=48, temperature=0.9, top_k=40, top_p=0.95, seed=3)
    return CachedDecodeBackend(tiny_model, char_tokenizer, **PLAIN).generate(
        PROMPTS, COUNTS, sampling
    )


@pytest.mark.parametrize("combo", COMBOS[1:], ids=_ids)
def test_seeded_sampling_is_the_same_with_every_switch(
    combo, sampled_plain, tiny_model, char_tokenizer
):
    sampling = SamplingParams(max_new_tokens=48, temperature=0.9, top_k=40, top_p=0.95, seed=3)
    out = CachedDecodeBackend(tiny_model, char_tokenizer, **combo).generate(
        PROMPTS, COUNTS, sampling
    )
    assert torch.equal(out.input_ids, sampled_plain.input_ids)
    assert out.texts == sampled_plain.texts
    torch.testing.assert_close(out.logprobs, sampled_plain.logprobs, rtol=0, atol=1e-5)


def test_seeded_sampling_reproduces_and_chunks_split_groups(tiny_model, char_tokenizer):
    sampling = SamplingParams(max_new_tokens=20, seed=11)
    fast = CachedDecodeBackend(tiny_model, char_tokenizer, batch_size=5)  # 5+5+2: groups split
    plain = CachedDecodeBackend(tiny_model, char_tokenizer, batch_size=5, **PLAIN)
    a, b = fast.generate(PROMPTS, COUNTS, sampling), fast.generate(PROMPTS, COUNTS, sampling)
    assert torch.equal(a.input_ids, b.input_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=0)
    ref = plain.generate(PROMPTS, COUNTS, sampling)
    assert torch.equal(a.input_ids, ref.input_ids)
    torch.testing.assert_close(a.logprobs, ref.logprobs, rtol=0, atol=1e-5)


def test_compiled_decode_step_computes_what_the_eager_loop_computes(
    greedy_reference, sampled_plain, dot_stops, tiny_model, char_tokenizer
):
    """compile=True: a torch.compile'd step over a static cache; rows that finish stay in the
    batch, yet their tokens past EOS are dropped, so greedy and seeded outputs are the same."""
    greedy = CachedDecodeBackend(dot_stops, char_tokenizer, compile=True).generate(
        PROMPTS, COUNTS, SamplingParams(max_new_tokens=40, temperature=0)
    )
    assert torch.equal(greedy.input_ids, greedy_reference.input_ids)
    assert greedy.finish_reasons == greedy_reference.finish_reasons
    torch.testing.assert_close(greedy.logprobs, greedy_reference.logprobs, rtol=0, atol=1e-5)
    sampling = SamplingParams(max_new_tokens=48, temperature=0.9, top_k=40, top_p=0.95, seed=3)
    backend = CachedDecodeBackend(tiny_model, char_tokenizer, compile=True)
    sampled = backend.generate(PROMPTS, COUNTS, sampling)
    assert torch.equal(sampled.input_ids, sampled_plain.input_ids)
    torch.testing.assert_close(sampled.logprobs, sampled_plain.logprobs, rtol=0, atol=1e-5)
    # a new model (e.g. after a reload) gets a step of its own
    other = copy.deepcopy(tiny_model)
    backend.update_weights(other)
    assert backend._compiled.model is other


def test_compile_refuses_models_with_sliding_window_layers(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model)
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with pytest.raises(ValueError, match="compile=True needs a model whose layers all use full"):
        CachedDecodeBackend(model, char_tokenizer, compile=True)


def test_inverse_cdf_pick_matches_hand_computed_tokens():
    # probs at temperature 1: softmax(log [0.1, 0.2, 0.3, 0.4]) = [0.1, 0.2, 0.3, 0.4];
    # cdf = [0.1, 0.3, 0.6, 1.0]: u = 0.05 -> 0, 0.29 -> 1, 0.31 -> 2, 1.0 (the total) -> 3
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(4, 4)
    u = torch.tensor([0.05, 0.29, 0.31, 1.0])
    assert pick_tokens(logits, SamplingParams(), u).tolist() == [0, 1, 2, 3]
    # top_k=2 keeps [0.3, 0.4] -> renormalised cdf [0, 0, 3/7, 1]; u=0.05 -> 2, u=0.5 -> 3
    two = pick_tokens(logits[:2], SamplingParams(top_k=2), torch.tensor([0.05, 0.5]))
    assert two.tolist() == [2, 3]
    # a uniform grid of u reproduces the distribution: counts 10/20/30/40 out of 100
    grid = (torch.arange(100) + 0.5) / 100
    counts = torch.bincount(pick_tokens(logits[:1].expand(100, 4), SamplingParams(), grid))
    assert counts.tolist() == [10, 20, 30, 40]


def test_top_k_top_p_filters_keep_the_documented_tokens():
    scaled = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()  # probs 0.4, 0.3, 0.2, 0.1
    kept = lambda k, p: torch.isfinite(filter_logits(scaled, k, p))[0].tolist()  # noqa: E731
    assert kept(2, 1.0) == [True, True, False, False]
    assert kept(0, 0.5) == [True, True, False, False]  # 0.4 < 0.5, so the 0.3 token stays
    assert kept(0, 0.69) == [True, True, False, False]  # 0.4 + 0.3 = 0.7 reaches top_p
    assert kept(0, 0.71) == [True, True, True, False]
    assert kept(0, 0.01) == [True, False, False, False]  # at least one token


def test_rollouts_follow_the_callers_autocast(tiny_model, char_tokenizer):
    """No precision setting of its own: under the trainer's bf16 autocast (``bf16-mixed``) the
    decode runs in bf16, its log-probs stay float32 and near the float32 ones."""
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0, seed=0)  # greedy
    backend = CachedDecodeBackend(tiny_model, char_tokenizer)
    plain = backend.generate(PROMPTS, COUNTS, sampling)
    seen = []
    hook = tiny_model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = backend.generate(PROMPTS, COUNTS, sampling)
    finally:
        hook.remove()
    assert set(seen) == {torch.bfloat16}
    kept = bf16.completion_mask.bool()
    assert bf16.logprobs.dtype == torch.float32 and torch.all(bf16.logprobs[kept] < 0)
    assert not torch.equal(bf16.logprobs, plain.logprobs)  # computed in bf16, not float32


def test_token_entropy_by_hand():
    # probs [1/2, 1/4, 1/4]: H = 1/2 ln 2 + 2 * 1/4 ln 4 = 3/2 ln 2; uniform over 3: ln 3.
    # Temperature 2 on logits 2 ln [1/2, 1/4, 1/4] gives the same probs back: 3/2 ln 2 again.
    logits = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.1]]).log()
    want = torch.tensor([1.5 * math.log(2), math.log(3)])
    torch.testing.assert_close(token_entropy(logits), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(token_entropy(2 * logits, 2.0), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(token_entropy(logits, 0.0), want, rtol=0, atol=1e-6)  # greedy: 1


def test_token_entropy_in_chunks_equals_one_pass(monkeypatch):
    """More positions than ENTROPY_ROWS run in chunks (bounded float32 copies): same values,
    same shape, and the gradient of an entropy bonus still reaches every position."""
    import coscale.rl.logprobs as lp

    logits = torch.randn(3, 7, 11, requires_grad=True)  # [R, T, V]
    whole = token_entropy(logits, 0.8)
    monkeypatch.setattr(lp, "ENTROPY_ROWS", 4)  # 21 positions: 6 chunks
    chunked = token_entropy(logits, 0.8)
    assert chunked.shape == (3, 7) and torch.equal(chunked, whole)
    (grad,) = torch.autograd.grad(chunked.sum(), logits)
    assert torch.count_nonzero(grad.abs().sum(-1)) == 21


def test_trimmed_padding_gives_the_same_logprobs(tiny_model, sampled_plain):
    ro = sampled_plain
    rows = torch.tensor([0, 5, 11])  # prompts of three lengths, completions of three lengths
    args = (tiny_model, ro.input_ids[rows], ro.attention_mask[rows], ro.prompt_length, 0.9)
    with torch.no_grad():
        full, full_h = sequence_logprobs(*args, trim_padding=False, entropy=True)
        trimmed, trimmed_h = sequence_logprobs(*args, entropy=True)
        positions = position_ids_from_mask(args[2])  # as `generate` numbered them
        logits = tiny_model(input_ids=args[1], attention_mask=args[2], position_ids=positions)
        logits = logits.logits  # [3, P+T, V]
    assert trimmed.shape == full.shape == (3, ro.input_ids.shape[1] - ro.prompt_length)
    torch.testing.assert_close(trimmed, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(trimmed_h, full_h, rtol=0, atol=1e-5)
    keep = ro.completion_mask[rows] != 0  # [3, T]
    assert torch.all(trimmed[~keep] == 0) and torch.all(trimmed_h[~keep] == 0)
    # the entropies are those of the distributions the completion tokens were sampled from
    direct = token_entropy(logits[:, ro.prompt_length - 1 : -1], 0.9)  # [3, T]
    torch.testing.assert_close(trimmed_h[keep], direct[keep], rtol=0, atol=1e-4)
    assert torch.all(trimmed_h[keep] > 0)


def test_shared_prompt_pass_gives_the_same_logprobs_and_gradients(tiny_model, sampled_plain):
    ro, model = sampled_plain, copy.deepcopy(tiny_model).train()
    weights = torch.randn(ro.logprobs.shape, generator=torch.Generator().manual_seed(0))

    def logprobs_and_grads(**options):
        model.zero_grad()
        args = (model, ro.input_ids, ro.attention_mask, ro.prompt_length, 0.9)
        logprobs, entropy = sequence_logprobs(*args, entropy=True, **options)
        (logprobs * weights + 0.1 * entropy).sum().backward()  # an entropy bonus's gradient too
        return logprobs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    plain, plain_h, plain_grads = logprobs_and_grads(trim_padding=False)
    shared, shared_h, shared_grads = logprobs_and_grads(prompt_index=ro.prompt_index)
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(shared_h, plain_h, rtol=0, atol=1e-5)
    # without an entropy bonus the entropies are computed outside autograd (no [R, T, V] kept)
    args = (model, ro.input_ids[:2], ro.attention_mask[:2], ro.prompt_length, 0.9)
    logprobs, entropy = sequence_logprobs(*args, entropy=True, entropy_grad=False)
    assert logprobs.requires_grad and not entropy.requires_grad
    for a, b in zip(shared_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert sum(float(g.abs().sum()) for g in plain_grads) > 1  # the gradient is not trivial


def test_micro_batches_sort_longest_first_and_keep_every_row():
    rows = torch.tensor([0, 2, 3, 5, 6])
    lengths = torch.tensor([3, 9, 1, 7, 9, 2, 5])  # rows 0..6
    chunks = micro_batches(rows, lengths, 2)
    assert [c.tolist() for c in chunks] == [[3, 6], [0, 5], [2]]  # lengths 7,5 | 3,2 | 1
    assert [c.tolist() for c in micro_batches(rows, lengths, 2, False)] == [[0, 2], [3, 5], [6]]


class _SpreadReward:
    """A reward with spread on a random model: the share of distinct characters."""

    def __call__(self, completions, answers, **_):
        return [len(set(c)) / (len(c) + 1) for c in completions]


def _grpo_step(tiny_model, char_tokenizer, plain=False):
    module = GRPOModule(
        model=copy.deepcopy(tiny_model), tokenizer=char_tokenizer, reward=_SpreadReward(),
        sampling={"max_new_tokens": 16, "temperature": 1.0}, update={"micro_batch_size": 3},
    )  # fmt: skip
    if plain:  # the plain update: no length sorting, every prompt run with each rollout
        module.sort_micro_batches = module.share_prompt_in_update = False
    params = [p for p in module.policy.parameters() if p.requires_grad]
    module.configure_optimizers = lambda: torch.optim.SGD(params, lr=0.5)  # weights = -lr * grad
    problems = [
        {"id": str(i), "question": q, "answer": "1", "n": n}
        for i, (q, n) in enumerate(zip(PROMPTS, COUNTS))
    ]
    loader = DataLoader(problems, batch_size=3, collate_fn=list)
    trainer = quiet_trainer(1)
    trainer.fit(module, train_dataloaders=loader)
    return module, trainer


def test_sorted_shared_prompt_update_gives_the_same_weights(
    tiny_model, char_tokenizer, monkeypatch
):
    calls = []
    original = grpo_module.sequence_logprobs
    monkeypatch.setattr(
        grpo_module, "sequence_logprobs", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    plain, _ = _grpo_step(tiny_model, char_tokenizer, plain=True)
    assert len(calls) == 4  # 12 rollouts / 3 per micro-batch, num_iterations = 1: no extra pass
    fast, trainer = _grpo_step(tiny_model, char_tokenizer)
    changed = 0
    for (name, a), b in zip(plain.policy.named_parameters(), fast.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
        changed += not torch.equal(a, tiny_model.get_parameter(name))
    assert changed == len(list(tiny_model.parameters()))
    # the ratio is computed against the rollout log-probs: 1 at the sampling weights
    assert abs(float(trainer.callback_metrics["train/ratio_mean"]) - 1) < 1e-5


def test_grpo_defaults_to_the_fast_backend(tiny_model, char_tokenizer):
    kwargs = {
        "model": copy.deepcopy(tiny_model),
        "tokenizer": char_tokenizer,
        "reward": _SpreadReward(),
    }
    assert isinstance(GRPOModule(**kwargs).backend, CachedDecodeBackend)
    slow = GRPOModule(**kwargs, rollout={"backend": "hf"})
    assert type(slow.backend) is HFGenerateBackend
    assert GRPOModule(**kwargs).backend._compiled is None  # compile is opt-in
    assert (
        GRPOModule(
            **kwargs, rollout={"backend": "cached", "options": {"compile": True}}
        ).backend._compiled
        is not None
    )


# ------------------------------------------------------------------------- update paths
def test_sft_loss_from_solution_logits_only_equals_the_full_pass(tiny_model, char_tokenizer):
    from coscale.sft.batch import solution_loss, token_mean_loss, tokenize_pairs

    prompts, sols = ["Compute 2+3.", "x", "What is 7*6?\n"], ["5", "1+1=2 done", "42."]
    enc = tokenize_pairs(char_tokenizer, prompts, sols, max_length=64)
    full = tiny_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    want, n_want = token_mean_loss(full.logits, enc["labels"])
    (g_want,) = torch.autograd.grad(want, tiny_model.lm_head.weight)
    got, n_got = solution_loss(tiny_model, enc)
    (g_got,) = torch.autograd.grad(got, tiny_model.lm_head.weight)
    assert n_got == n_want > 0
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(g_got, g_want, atol=1e-6)


def test_fused_adamw_is_chosen_on_cpu_and_updates_like_the_loop(tiny_model):
    from coscale.modules.optim import adamw_with_warmup
    from coscale.modules.settings import AdamWSettings

    def three_steps(fused: bool | None) -> torch.Tensor:
        model = copy.deepcopy(tiny_model)
        if fused is None:
            settings = AdamWSettings(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
            opt = adamw_with_warmup(model, settings)["optimizer"]
            assert opt.defaults["fused"] is True
        else:
            opt = torch.optim.AdamW(model.parameters(), 1e-3, (0.9, 0.99), weight_decay=0.01)
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.allclose(three_steps(None), three_steps(False), atol=1e-6)
