"""Loading a Hugging Face causal LM as a policy, and exporting one so that it loads unchanged.

Every stage starts from, or is saved as, a plain ``save_pretrained`` folder (safetensors +
tokenizer + generation config): transformers and vLLM read it as is. ``builtin:`` model specs
(``builtin:demo``, ``builtin:tiny?hidden_size=64&seed=0``, ``builtin:smollm2-135m-instruct``)
name models coscale ships, builds or finds in an installed package offline, and a path to a
``.gguf`` file is converted once (`coscale.models.gguf`); all resolve to such a folder here
(``builtin:`` problem sets live in `coscale.tasks.builtin`, which knows nothing of models).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import torch

from coscale.models import gguf
from coscale.models.adapters import is_adapter_folder, load_merged_adapter
from coscale.models.cache_folder import build_once
from coscale.models.capabilities import DTYPES
from coscale.models.full_state import save_full

BUILTIN_PREFIX = "builtin:"
"""Prefix of a built-in model spec (the same as `coscale.tasks.builtin.PREFIX` for problems)."""
TINY_SETTINGS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "seed",
)
"""Settings of ``builtin:tiny?...`` (ints, passed to `coscale.models.tiny.build_tiny_model`)."""


def resolve_dtype(dtype: str) -> torch.dtype:
    """Maps a dtype name from config to ``torch.dtype``; the error lists the choices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_model_path(name_or_path: str) -> str:
    """A ``builtin:`` model spec or a ``.gguf`` file becomes its folder (built on first use, in
    ``$COSCALE_CACHE/models``); hub names and folders pass through."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        return builtin_model(name_or_path, _models_cache())
    if gguf.is_gguf(name_or_path):
        return gguf.converted_folder(name_or_path, _models_cache())
    return name_or_path


def _models_cache() -> str:
    """Where built and converted models live: ``$COSCALE_CACHE/models`` (~/.cache/coscale)."""
    root = os.environ.get("COSCALE_CACHE", os.path.expanduser("~/.cache/coscale"))
    return os.path.join(root, "models")


def builtin_model(spec: str, root: str | os.PathLike) -> str:
    """Folder of a ``builtin:`` model: ``demo`` is shipped in the package; ``tiny`` is built
    under ``root`` on first use; a packaged GGUF model (`coscale.models.gguf.PACKAGED`) is
    converted under ``root`` on first use.

    Raises:
        ValueError: An unknown model name, ``tiny`` settings that are unknown or not ints, or
            settings given to a packaged model.
        ModuleNotFoundError: A packaged model whose package is not installed (says how to).
    """
    name, _, query = spec.removeprefix(BUILTIN_PREFIX).partition("?")
    if name == "demo":
        return _demo_model()
    if name in gguf.PACKAGED:
        if query:
            raise ValueError(f"builtin:{name} takes no settings; drop '?{query}' from {spec!r}")
        return gguf.converted_folder(gguf.packaged_gguf(name), root)
    if name != "tiny":
        choices = ", ".join(["demo", "tiny", *gguf.PACKAGED])
        raise ValueError(f"unknown builtin model {name!r} in {spec!r}; choices: {choices}")
    sizes = _tiny_sizes(spec, dict(parse_qsl(query)))
    folder = Path(root) / ("tiny-" + "-".join(f"{k}{v}" for k, v in sorted(sizes.items())))
    return build_once(folder, lambda tmp: _save_tiny(tmp, sizes))


def _save_tiny(folder: Path, sizes: dict[str, int]) -> None:
    from coscale.models.tiny import save_tiny  # loads transformers: only when needed

    save_tiny(folder, **sizes)


def _tiny_sizes(spec: str, settings: dict[str, str]) -> dict[str, int]:
    """The ``builtin:tiny`` settings as ints; one error lists every bad one."""
    problems = [f"unknown setting {k!r}" for k in settings if k not in TINY_SETTINGS]
    problems += [
        f"{k}={v!r} is not an int" for k, v in settings.items() if not v.lstrip("-").isdigit()
    ]
    if problems:
        raise ValueError(
            f"{'; '.join(problems)} in {spec!r}; allowed: {', '.join(TINY_SETTINGS)} (ints)"
        )
    return {k: int(v) for k, v in settings.items()}


def _demo_model() -> str:
    """The demo's base model shipped in ``coscale/assets/demo_model``."""
    folder = Path(__file__).resolve().parents[1] / "assets" / "demo_model"
    if not (folder / "model.safetensors").exists():
        raise FileNotFoundError(
            f"the demo model is missing from {folder}; build it with "
            "`python scripts/build_demo_model.py`"
        )
    return str(folder)


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """Loads a tokenizer with left padding (generation pads on the left) and a pad token.

    ``name_or_path`` may be anything :func:`resolve_model_path` takes (a ``.gguf`` file, a
    ``builtin:`` spec). ``padding_side`` is passed as a keyword: set as an attribute it would not
    be saved with the tokenizer.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        resolve_model_path(name_or_path), padding_side="left", trust_remote_code=trust_remote_code
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
        model: Hub name, folder, ``.gguf`` file or ``builtin:`` spec of a causal LM (see
            :func:`resolve_model_path`), a PEFT adapter folder (merged into the base its
            config names; the tokenizer is the base's), or an already built ``PreTrainedModel``.
        tokenizer: Name, path or object; defaults to the model's own folder.
        dtype: Weights' dtype name (see :data:`coscale.models.capabilities.DTYPES`).
        trust_remote_code: Allow code shipped with the model (off unless asked).
        gradient_checkpointing: Trade compute for activation memory during training.
    """
    from transformers import AutoModelForCausalLM

    if isinstance(model, (str, os.PathLike)):
        path = resolve_model_path(os.fspath(model))
        load = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code}
        if is_adapter_folder(path):  # an adapter alone: merged into its base
            net, path = load_merged_adapter(path, **load)
        else:
            net = AutoModelForCausalLM.from_pretrained(path, **load)
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
    """Saves model (safetensors), tokenizer and generation config to ``path``; returns it.

    Under DDP or FSDP2 every rank calls it: the whole weights are gathered, rank 0 writes, and
    no rank returns before the folder is complete (:mod:`coscale.models.full_state`)."""
    return save_full(model, tokenizer, path)
