"""Padding-free SFT batches (coscale.packing): the layout, and the padded path's numbers."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from coscale import packing
from coscale.modules import SFTModule
from coscale.rollout.kv_cache import full_attention_only
from coscale.sft_batch import IGNORE, solution_loss, token_mean_loss, tokenize_pairs

PROMPTS = ["Compute 2+3.", "x", "What is 7*6?\n", "Add 10 and 20, then 5."]
SOLUTIONS = ["5", "1+1=2 done, the answer is 2", "42.", "35, since 10+20=30 and 30+5=35"]


def _enc(tokenizer):
    return tokenize_pairs(tokenizer, PROMPTS, SOLUTIONS, max_length=64)


def test_pack_lays_rows_end_to_end_and_targets_only_labelled_next_tokens():
    enc = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "labels": torch.tensor([[IGNORE, 6, 7, IGNORE], [8, 9, IGNORE, IGNORE]]),
    }
    got = packing.pack(enc)
    assert got.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert got.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert got.cu_seq_lens.tolist() == [0, 3, 5] and got.max_length == 3
    # position 0 predicts 6, 1 predicts 7, 3 (row 2's first token) predicts 9; row 2's first
    # label (8) is never a target, so row 1's last token (7, at 2) predicts nothing
    assert got.logit_index.tolist() == [0, 1, 3]
    assert got.targets.tolist() == [6, 7, 9]


def _padded_and_packed(model, enc):
    params = [p for p in model.parameters() if p.requires_grad]
    want, n_want = solution_loss(model, enc, padding_free=False)
    g_want = torch.autograd.grad(want, params)
    got, n_got = solution_loss(model, enc, padding_free=True)
    g_got = torch.autograd.grad(got, params)
    return (want, n_want, g_want), (got, n_got, g_got)


def test_packed_loss_and_gradients_equal_the_padded_batch(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model).train()
    enc = _enc(char_tokenizer)
    assert packing.can_pack(model) and enc["attention_mask"].sum() < enc["attention_mask"].numel()
    calls = packing._calls[0]
    (want, n_want, g_want), (got, n_got, g_got) = _padded_and_packed(model, enc)
    assert packing._calls[0] == calls + model.config.num_hidden_layers  # the packed path ran
    assert n_got == n_want > 0
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    # and both equal the plain full forward (every logit, the padding mask)
    full = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert torch.allclose(token_mean_loss(full.logits, enc["labels"])[0], got, atol=1e-6)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_packed_grouped_query_attention_equals_the_padded_batch(char_tokenizer):
    config = LlamaConfig(
        vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=char_tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    (want, _, g_want), (got, _, g_got) = _padded_and_packed(model, _enc(char_tokenizer))
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, atol=1e-5)


def test_models_that_cannot_pack_take_the_padded_path(tiny_model, char_tokenizer):
    checkpointed = copy.deepcopy(tiny_model).train()
    checkpointed.gradient_checkpointing_enable()
    eager = copy.deepcopy(tiny_model)
    eager.config._attn_implementation = "eager"
    enc = _enc(char_tokenizer)
    want = solution_loss(tiny_model, enc, padding_free=False)[0]
    for model in (checkpointed, eager):
        assert not packing.can_pack(model)
        calls = packing._calls[0]
        assert torch.allclose(solution_loss(model, enc)[0], want, atol=1e-6)
        assert packing._calls[0] == calls
    config = MistralConfig(
        vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, sliding_window=4, attn_implementation="sdpa",
    )  # fmt: skip
    sliding = MistralForCausalLM(config)
    assert not packing.can_pack(sliding)
    calls = packing._calls[0]
    assert solution_loss(sliding, enc)[1] > 0 and packing._calls[0] == calls


def test_mistral_style_sliding_window_without_layer_types_is_not_full_attention():
    assert not full_attention_only(MistralConfig(sliding_window=4096))
    assert full_attention_only(MistralConfig(sliding_window=None))
    assert full_attention_only(LlamaConfig())


class _NoInterface(torch.nn.Module):
    """A causal LM whose attention never goes through transformers' AttentionInterface."""

    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(attn_implementation="sdpa")
        self.emb = torch.nn.Embedding(8, 8)

    def forward(self, input_ids, position_ids=None, use_cache=None, logits_to_keep=0, **_):
        logits = self.emb(input_ids)[:, logits_to_keep]  # [1, K, V]
        return type("Out", (), {"logits": logits})()


def test_a_model_bypassing_the_attention_interface_is_refused_and_restored():
    model = _NoInterface()
    assert packing.can_pack(model)
    enc = {
        "input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "labels": torch.tensor([[IGNORE, 2, 3], [IGNORE, 5, IGNORE]]),
    }
    with pytest.raises(RuntimeError, match="padding_free: false"):
        packing.packed_loss(model, packing.pack(enc))
    assert model.config._attn_implementation == "sdpa"


def _fit(model, tokenizer, padding_free: bool) -> torch.Tensor:
    module = SFTModule(
        model=copy.deepcopy(model), tokenizer=tokenizer, lr=1e-3, padding_free=padding_free,
        reward=lambda completions, answers, **_: [0.0] * len(completions),
    )  # fmt: skip
    rows = [{"question": q, "solution": s} for q, s in zip(PROMPTS, SOLUTIONS)] * 2
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        gradient_clip_val=1.0,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(rows, batch_size=3, collate_fn=list))
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()])


def test_sft_module_trains_the_same_weights_padding_free_or_padded(tiny_model, char_tokenizer):
    packed, padded = (_fit(tiny_model, char_tokenizer, flag) for flag in (True, False))
    assert not torch.equal(packed, torch.cat([p.flatten() for p in tiny_model.parameters()]))
    assert torch.allclose(packed, padded, atol=1e-5)
