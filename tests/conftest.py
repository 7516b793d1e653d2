"""Shared pytest fixtures: offline environment and tiny models built in memory.

The environment is set before anything imports transformers or wandb, so no test reaches a
hub or asks for an API key. Model fixtures are session-scoped: build once, never mutate
(a test that changes a model works on `copy.deepcopy(tiny_model)`).
"""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def char_tokenizer():
    """The default character tokenizer (`coscale.tiny.build_char_tokenizer()`)."""
    from coscale.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(char_tokenizer):
    """A 2-layer, 64-wide random Llama for `char_tokenizer` (seed 0), in eval mode."""
    from coscale.tiny import build_tiny_model

    return build_tiny_model(char_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, char_tokenizer):
    """A folder with `tiny_model` and `char_tokenizer` saved in HF format."""
    path = tmp_path_factory.mktemp("tiny_model")
    tiny_model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True, scope="session")
def _coscale_cache(tmp_path_factory):
    """``builtin:`` models are built into a per-session folder, never the user's cache."""
    os.environ["COSCALE_CACHE"] = str(tmp_path_factory.mktemp("coscale_cache"))
