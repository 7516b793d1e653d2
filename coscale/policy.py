"""Loading a Hugging Face causal LM as a policy, and exporting one so that it loads unchanged.

Every stage starts from, or is saved as, a plain ``save_pretrained`` folder (safetensors +
tokenizer + generation config): transformers and vLLM read it as is.
"""

from __future__ import annotations

import os
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str) -> torch.dtype:
    """Maps a dtype name from config to ``torch.dtype``; the error lists the choices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_model_path(name_or_path: str) -> str:
    """A ``builtin:`` model spec becomes its folder (built on first use); others pass through."""
    from coscale.tasks.builtin import builtin_model, is_builtin

    if not is_builtin(name_or_path):
        return name_or_path
    root = os.environ.get(
        "COSCALE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "coscale")
    )
    return builtin_model(name_or_path, os.path.join(root, "models"))


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """Loads a tokenizer with left padding (generation pads on the left) and a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        name_or_path, padding_side="left", trust_remote_code=trust_remote_code
    )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(
    model: str | os.PathLike | Any,
    tokenizer: str | os.PathLike | Any | None = None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
) -> tuple[Any, Any]:
    """Returns ``(model, tokenizer)`` from a hub name, a local folder or ready objects.

    Args:
        model: Name or path of a causal LM, or an already built ``PreTrainedModel``.
        tokenizer: Name, path or object; defaults to the model's own folder.
        dtype: Weights' dtype name (see :data:`DTYPES`).
        trust_remote_code: Allow code shipped with the model (off unless asked).
        gradient_checkpointing: Trade compute for activation memory during training.
    """
    from transformers import AutoModelForCausalLM

    if isinstance(model, (str, os.PathLike)):
        path = resolve_model_path(os.fspath(model))
        net = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code
        )
    else:
        net, path = model, getattr(getattr(model, "config", None), "_name_or_path", None)
    tok_src = tokenizer if tokenizer is not None else path
    if tok_src is None:
        raise ValueError("tokenizer must be given when model is an object without a saved path")
    tok = (
        load_tokenizer(os.fspath(tok_src), trust_remote_code)
        if isinstance(tok_src, (str, os.PathLike))
        else tok_src
    )
    if gradient_checkpointing:
        net.gradient_checkpointing_enable()
        net.config.use_cache = False
    _sync_special_tokens(net, tok)
    return net, tok


def _sync_special_tokens(model: Any, tokenizer: Any) -> None:
    """Makes generation stop on the tokenizer's EOS and pad with its pad token."""
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id


def export_policy(model: Any, tokenizer: Any, path: str | os.PathLike) -> str:
    """Saves model (safetensors), tokenizer and generation config to ``path``; returns it."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
