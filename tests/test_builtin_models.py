"""Tests for the ``builtin:`` models resolved by coscale.models.policy (moved from coscale.tasks.builtin).

``builtin:demo`` is the folder shipped in the package; ``builtin:tiny?...`` is built under the
cache root on first use and found there afterwards. Bad specs name every bad setting at once.
"""

from __future__ import annotations

import pytest

from coscale.models import policy
from coscale.tasks import builtin


def test_models_and_problem_sets_share_one_prefix():
    assert policy.BUILTIN_PREFIX == builtin.PREFIX
    assert not hasattr(builtin, "builtin_model")  # tasks know nothing of models


def test_paths_pass_through_and_demo_is_the_shipped_folder():
    assert policy.resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    demo = policy.resolve_model_path("builtin:demo")
    assert demo.replace("\\", "/").endswith("coscale/assets/demo_model")


def test_tiny_is_built_once_under_the_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("COSCALE_CACHE", str(tmp_path))
    spec = "builtin:tiny?hidden_size=32&num_layers=1&seed=0"
    folder = policy.resolve_model_path(spec)
    assert folder == str(tmp_path / "models" / "tiny-hidden_size32-num_layers1-seed0")
    written = tmp_path / "models" / "tiny-hidden_size32-num_layers1-seed0" / "config.json"
    stamp = written.stat().st_mtime_ns
    assert policy.resolve_model_path(spec) == folder and written.stat().st_mtime_ns == stamp


def test_bad_builtin_model_specs(tmp_path):
    with pytest.raises(ValueError, match=r"unknown builtin model 'huge' .*choices: demo, tiny"):
        policy.builtin_model("builtin:huge", tmp_path)
    with pytest.raises(ValueError) as info:
        policy.builtin_model("builtin:tiny?hidden=64&num_layers=two", tmp_path)
    assert str(info.value) == (
        "unknown setting 'hidden'; num_layers='two' is not an int in "
        "'builtin:tiny?hidden=64&num_layers=two'; allowed: hidden_size, num_layers, num_heads, "
        "intermediate_size, max_position_embeddings, seed (ints)"
    )
    assert not any(tmp_path.iterdir())  # nothing built


def test_a_model_folder_being_built_is_never_handed_out_half_written(tmp_path):
    """Ranks or jobs that start together all find a cached model missing. A build writes its
    config first and its weights later; the second caller must never get the folder in between
    (seen 2026-12-03: two pipelines started at once, one failed with 'no file named
    model.safetensors'). Each builds privately and renames into place; the first one wins."""
    import threading
    import time

    from coscale.models.cache_folder import build_once

    folder, built = tmp_path / "models" / "m", []

    def slow_build(tmp):
        (tmp / "config.json").write_text("{}")
        time.sleep(0.4)  # the weights come later
        (tmp / "model.safetensors").write_text(str(len(built)))
        built.append(tmp)

    first = threading.Thread(target=build_once, args=(folder, slow_build))
    first.start()
    time.sleep(0.1)  # the first build has written its config by now
    second = build_once(folder, slow_build)
    assert (folder / "model.safetensors").exists() and second == str(folder)
    first.join()
    assert len(built) == 2 and sorted(p.name for p in folder.parent.iterdir()) == ["m"]
    assert build_once(folder, lambda tmp: built.append(tmp)) == str(folder) and len(built) == 2
    assert (policy.builtin_model("builtin:tiny?hidden_size=32", tmp_path) + "/").startswith(
        str(tmp_path)
    )
