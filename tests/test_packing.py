"""Padding-free SFT batches (coscale.sft.packing): the layout, and the padded path's numbers."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from trainers import quiet_trainer
from transformers import LlamaConfig, MistralConfig

from coscale.models.capabilities import full_attention_only
from coscale.modules import SFTModule
from coscale.sft import packing
from coscale.sft.batch import IGNORE, solution_loss, token_mean_loss, tokenize_pairs

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


FAMILIES = {
    "llama-gqa": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 8}),
    "mistral-window": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    "gemma3-sliding": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, {"head_dim": 8}),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, {}),
    "gpt-neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM, {}),
}  # fmt: skip


def _family(name: str, tokenizer, **extra):
    config_cls, model_cls, defaults = FAMILIES[name]
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa", **{**defaults, **extra},
    )  # fmt: skip
    torch.manual_seed(0)
    return model_cls(config)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_packed_batch_equals_the_padded_batch_across_model_families(name, char_tokenizer):
    # grouped-query attention (4 heads, 2 key/value heads), q/k norms, sliding windows longer
    # than every row (Mistral's 4096, Gemma 3's sliding layers), partial rotary (GPT-NeoX)
    model = _family(name, char_tokenizer)
    enc = _enc(char_tokenizer)
    assert packing.can_pack(model, longest=enc["input_ids"].size(1))
    calls = packing._calls[0]
    (want, _, g_want), (got, _, g_got) = _padded_and_packed(model, enc)
    assert packing._calls[0] == calls + 2  # one call per layer: the packed path ran
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_sliding_window_shorter_than_a_row_takes_the_padded_path(char_tokenizer):
    model = _family("mistral-window", char_tokenizer, sliding_window=8)
    enc = _enc(char_tokenizer)
    assert enc["input_ids"].size(1) > 8
    assert not packing.can_pack(model, longest=enc["input_ids"].size(1))
    assert not packing.can_pack(model)  # the longest row unknown: no window allowed
    calls = packing._calls[0]
    assert solution_loss(model, enc)[1] > 0 and packing._calls[0] == calls


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


def test_models_outside_the_attention_interface_or_checkpoint_wrapped_are_refused(
    tiny_model, char_tokenizer
):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    falcon = transformers.FalconForCausalLM(
        transformers.FalconConfig(vocab_size=len(char_tokenizer), hidden_size=32,
                                  num_hidden_layers=1, num_attention_heads=4,
                                  attn_implementation="sdpa")
    )  # fmt: skip
    stablelm = transformers.StableLmForCausalLM(
        transformers.StableLmConfig(vocab_size=len(char_tokenizer), hidden_size=32,
                                    intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4, attn_implementation="sdpa")
    )  # fmt: skip
    wrapped = copy.deepcopy(tiny_model).train()
    layer = type(wrapped.model.layers[0])
    apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, layer))
    for model in (falcon, stablelm, wrapped):
        assert not packing.can_pack(model), type(model).__name__
    enc = _enc(char_tokenizer)
    want = solution_loss(tiny_model, enc, padding_free=False)[0]
    assert torch.allclose(solution_loss(wrapped, enc)[0], want, atol=1e-6)


def test_an_error_inside_the_packed_forward_restores_the_attention(tiny_model, char_tokenizer):
    model = copy.deepcopy(tiny_model)
    batch = packing.pack(_enc(char_tokenizer))
    batch.input_ids = batch.input_ids + 10_000  # out of the vocabulary: the embedding raises
    with pytest.raises(IndexError):
        packing.packed_loss(model, batch)
    assert model.config._attn_implementation == "sdpa"


def test_layers_that_drop_the_packing_keywords_get_an_error_naming_the_setting(tiny_model):
    q = torch.zeros(1, 4, 6, 8)
    with pytest.raises(ValueError, match="padding_free: false"):
        packing.varlen_sdpa(tiny_model.model.layers[0].self_attn, q, q, q, None)
    with pytest.raises(ValueError, match="sliding window 4 is shorter than a 6-token row"):
        packing.varlen_sdpa(
            None, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 6]), max_length_q=6,
            sliding_window=4,
        )  # fmt: skip


def test_mistral_style_sliding_window_without_layer_types_is_not_full_attention():
    assert not full_attention_only(MistralConfig(sliding_window=4096))
    assert full_attention_only(MistralConfig(sliding_window=None))
    assert full_attention_only(LlamaConfig())


class _NoInterface(torch.nn.Module):
    """A causal LM whose attention never goes through transformers' AttentionInterface."""

    @classmethod
    def is_backend_compatible(cls) -> bool:
        return True  # claims it, but does not

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
        model=copy.deepcopy(model), tokenizer=tokenizer, optimizer={"lr": 1e-3},
        padding_free=padding_free,
        verifier=lambda completions, answers, **_: [0.0] * len(completions),
    )  # fmt: skip
    rows = [{"question": q, "solution": s} for q, s in zip(PROMPTS, SOLUTIONS)] * 2
    trainer = quiet_trainer(3, limit_val_batches=0, gradient_clip_val=1.0)
    trainer.fit(module, train_dataloaders=DataLoader(rows, batch_size=3, collate_fn=list))
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()])


def test_sft_module_trains_the_same_weights_padding_free_or_padded(tiny_model, char_tokenizer):
    calls = packing._calls[0]
    packed = _fit(tiny_model, char_tokenizer, True)
    assert packing._calls[0] > calls  # the packed path ran
    calls = packing._calls[0]
    padded = _fit(tiny_model, char_tokenizer, False)
    assert packing._calls[0] == calls
    assert not torch.equal(packed, torch.cat([p.flatten() for p in tiny_model.parameters()]))
    assert torch.allclose(packed, padded, atol=1e-5)
