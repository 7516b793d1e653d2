"""Tests for coscale.models.tiny: the character tokenizer and the tiny Llama model."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from coscale.models.tiny import DEFAULT_CHARS, build_char_tokenizer, build_tiny_model, save_tiny

TEXT = "Let x = 3.\n\n  Then \\frac{x^2}{2} = 4.5, isn't it? {a_1} [b] (c) 'q' \"r\"\tok!"


def test_default_chars_cover_math_text():
    assert set(TEXT) <= set(DEFAULT_CHARS)
    assert len(set(DEFAULT_CHARS)) == len(DEFAULT_CHARS)


def test_ids_are_fixed(char_tokenizer):
    assert char_tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    assert (char_tokenizer.pad_token_id, char_tokenizer.bos_token_id) == (0, 1)
    assert (char_tokenizer.eos_token_id, char_tokenizer.unk_token_id) == (2, 3)
    # "0" is the first character of DEFAULT_CHARS, so it gets id 4
    assert char_tokenizer("0a\n")["input_ids"] == [4, 14, 4 + DEFAULT_CHARS.index("\n")]
    assert len(char_tokenizer) == 4 + len(DEFAULT_CHARS)


def test_one_token_per_character_and_exact_round_trip(char_tokenizer):
    ids = char_tokenizer(TEXT)["input_ids"]
    assert len(ids) == len(TEXT)  # no BOS/EOS added, every character is one token
    assert char_tokenizer.decode(ids) == TEXT


def test_unknown_character_and_special_tokens(char_tokenizer):
    assert char_tokenizer("a\u00e9b")["input_ids"] == [14, 3, 15]
    ids = char_tokenizer("ab")["input_ids"] + [char_tokenizer.eos_token_id]
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == "ab"


def test_left_padding(char_tokenizer):
    batch = char_tokenizer(["abc", "a"], padding=True)
    assert batch["input_ids"][1] == [0, 0, 14]
    assert batch["attention_mask"][1] == [0, 0, 1]


@pytest.mark.parametrize("loader", [AutoTokenizer, PreTrainedTokenizerFast])
def test_tokenizer_survives_save_and_load(tmp_path, char_tokenizer, loader):
    char_tokenizer.save_pretrained(tmp_path)
    loaded = loader.from_pretrained(tmp_path)
    ids = loaded(TEXT)["input_ids"]
    assert ids == char_tokenizer(TEXT)["input_ids"]
    assert loaded.decode(ids) == TEXT
    assert loaded.padding_side == "left"
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 2


def test_custom_chars_and_bad_chars():
    tok = build_char_tokenizer("ab ")
    assert len(tok) == 7
    assert tok.decode(tok("ba a")["input_ids"]) == "ba a"
    with pytest.raises(ValueError, match="chars must not repeat"):
        build_char_tokenizer("aba")
    with pytest.raises(ValueError, match="chars must hold"):
        build_char_tokenizer("")


def test_model_shape_ties_and_ids(tiny_model, char_tokenizer):
    assert isinstance(tiny_model, LlamaForCausalLM)
    cfg = tiny_model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (len(char_tokenizer), 64, 2)
    assert (cfg.num_attention_heads, cfg.intermediate_size) == (4, 128)
    assert tiny_model.lm_head.weight.data_ptr() == tiny_model.model.embed_tokens.weight.data_ptr()
    gen = tiny_model.generation_config
    assert (gen.eos_token_id, gen.pad_token_id, gen.bos_token_id) == (2, 0, 1)
    assert not tiny_model.training


def test_model_is_deterministic_from_seed(char_tokenizer):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_tiny_model(char_tokenizer, hidden_size=32, num_heads=2, seed=7)
    assert torch.equal(torch.rand(3), before)  # global RNG untouched
    b = build_tiny_model(char_tokenizer, hidden_size=32, num_heads=2, seed=7)
    c = build_tiny_model(char_tokenizer, hidden_size=32, num_heads=2, seed=8)
    for name, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[name]), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_bad_sizes_are_rejected(char_tokenizer):
    with pytest.raises(ValueError, match="hidden_size must be a multiple of num_heads=3"):
        build_tiny_model(char_tokenizer, hidden_size=64, num_heads=3)
    with pytest.raises(ValueError, match="num_layers must be an int >= 1, got 0"):
        build_tiny_model(char_tokenizer, num_layers=0)


def test_save_tiny_loads_back_with_auto_classes(tmp_path, char_tokenizer, tiny_model):
    path = save_tiny(tmp_path / "m", char_tokenizer, seed=0)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert isinstance(model, LlamaForCausalLM)
    for name, value in tiny_model.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT
    ids = torch.tensor([tok("1+1=")["input_ids"]])
    torch.testing.assert_close(model(ids).logits, tiny_model(ids).logits, rtol=0, atol=0)
