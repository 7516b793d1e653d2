"""Tiny offline building blocks: a character tokenizer and a small Llama model.

Tests and the CPU demo can download nothing, so they build what they need here: a
one-token-per-character tokenizer (made with the `tokenizers` library, wrapped as a
`PreTrainedTokenizerFast`) and a randomly initialised `LlamaForCausalLM` sized from it.
Both save with `save_pretrained` and load back with `AutoModelForCausalLM` /
`AutoTokenizer.from_pretrained` (a Llama config on purpose: transformers 5 maps a `qwen2`
config to `Qwen2Tokenizer`, which drops spaces from a character vocabulary).

Choices:
- Ids are fixed: `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, then one id per character in
  the order of `chars`, so checkpoints stay valid as long as `chars` does not change.
- No special token is added when encoding (no BOS, no EOS): a prompt is tokenised verbatim,
  one id per character. Training data that wants an EOS appends `tokenizer.eos_token`.
- `decode(encode(text)) == text` exactly (spaces, newlines, punctuation) for text made of
  `chars`; any other character becomes `<unk>`.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from coscale.checks import at_least
from coscale.seeds import seeded

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
"""Special tokens, in id order: pad=0, bos=1, eos=2, unk=3."""

DEFAULT_CHARS: str = (
    string.digits
    + string.ascii_lowercase
    + string.ascii_uppercase
    + " \n\t"
    + string.punctuation  # !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
)
"""Characters of the default vocabulary: enough for ASCII math text (LaTeX included)."""


def build_char_tokenizer(chars: str = DEFAULT_CHARS) -> PreTrainedTokenizerFast:
    """Builds a one-token-per-character tokenizer in memory.

    Args:
        chars: The characters of the vocabulary, each once; their order fixes the ids
            (the first character gets id 4).

    Returns:
        A fast tokenizer with pad/bos/eos/unk set, left padding, and no special tokens
        added on encode.

    Raises:
        ValueError: If `chars` is empty or repeats a character.
    """
    if not chars:
        raise ValueError("chars must hold at least one character, got ''")
    repeated = sorted({c for c in chars if chars.count(c) > 1})
    if repeated:
        raise ValueError(f"chars must not repeat characters, got repeats {repeated!r}")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({c: len(SPECIAL_TOKENS) + i for i, c in enumerate(chars)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own piece; `[\s\S]` also matches newlines (`.` would not).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join pieces with nothing in between
    pad, bos, eos, unk = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        padding_side="left",  # a keyword, so that save_pretrained keeps it
        clean_up_tokenization_spaces=False,  # keep " ." and " '" as they are
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Builds a small randomly initialised Llama model for `tokenizer`.

    The weights depend only on the arguments (the global torch RNG is left untouched).

    Args:
        tokenizer: Gives the vocabulary size and the pad/bos/eos ids.
        hidden_size: Model width; a multiple of `num_heads`.
        num_layers: Number of decoder layers.
        num_heads: Attention heads (also key/value heads).
        intermediate_size: Width of the MLP.
        max_position_embeddings: Longest sequence (prompt + completion) the model expects.
        seed: Seed of the weight initialisation.

    Returns:
        The model in eval mode (as `from_pretrained` returns it), with tied input/output
        embeddings and a generation config holding the tokenizer's eos/pad/bos ids.

    Raises:
        ValueError: If a size is not positive or `hidden_size` is not a multiple of `num_heads`.
    """
    _check_sizes(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        **ids,
    )
    with seeded(seed):
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model.eval()


def _check_sizes(**sizes: int) -> None:
    """Raises one ValueError naming every bad size."""
    problems = at_least(1, **sizes)
    hidden, heads = sizes["hidden_size"], sizes["num_heads"]
    if not problems and hidden % heads:
        problems.append(f"hidden_size must be a multiple of num_heads={heads}, got {hidden}")
    if problems:
        raise ValueError("build_tiny_model: " + "; ".join(problems))


def save_tiny(
    path: str | Path, tokenizer: PreTrainedTokenizerFast | None = None, **model_kwargs: int
) -> Path:
    """Builds a tiny model and writes it with its tokenizer in HF format.

    Args:
        path: Target folder (created if missing).
        tokenizer: The tokenizer to use; `build_char_tokenizer()` when None.
        **model_kwargs: Passed to `build_tiny_model` (sizes, `seed`).

    Returns:
        The folder, loadable with `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained`.
    """
    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
    model = build_tiny_model(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
