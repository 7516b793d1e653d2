"""``rollout.options.sync.adapter``: what the adapter-only vLLM sync accepts, refuses and asks
of the engine, without an engine (the real engine runs it in tests/test_vllm_engine.py)."""

from __future__ import annotations

import copy
import os

import pytest

peft = pytest.importorskip("peft", reason="install coscale[peft]")

from coscale.models.adapters import with_adapter  # noqa: E402
from coscale.rollout.vllm.backend import VLLMBackend  # noqa: E402
from coscale.rollout.vllm.lora import AdapterSync, lora_engine_kwargs, lora_errors  # noqa: E402


def _lora(tiny_model, **config):
    config = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", **config}
    return with_adapter(copy.deepcopy(tiny_model), peft.LoraConfig(**config))


def _backend(policy, tokenizer, adapter="lora", **engine):
    return VLLMBackend(
        "unused/path",
        tokenizer,
        policy,
        engine={"dtype": "float32", **engine},
        sync={"adapter": adapter},
        engine_factory=object,
    )


@pytest.mark.parametrize("r, slot", [(1, 1), (4, 8), (16, 16), (17, 32), (300, 320)])
def test_the_engine_gets_lora_on_and_the_smallest_rank_slot_that_holds_the_adapter(
    tiny_model, r, slot
):
    assert lora_engine_kwargs(_lora(tiny_model, r=r, lora_alpha=r)) == {
        "enable_lora": True,
        "max_loras": 1,
        "max_lora_rank": slot,
    }


def test_lora_mode_sets_the_engine_arguments_and_the_users_engine_kwargs_win(
    tiny_model, char_tokenizer
):
    backend = _backend(_lora(tiny_model), char_tokenizer)
    assert backend._args["enable_lora"] and backend._args["max_lora_rank"] == 8
    assert isinstance(backend._adapters, AdapterSync)
    mine = _backend(_lora(tiny_model), char_tokenizer, kwargs={"max_lora_rank": 64})
    assert mine._args["max_lora_rank"] == 64
    merged = _backend(_lora(tiny_model), char_tokenizer, adapter="merged")
    assert "enable_lora" not in merged._args and merged._adapters is None
    plain = _backend(copy.deepcopy(tiny_model), char_tokenizer)  # no adapter: nothing to send
    assert "enable_lora" not in plain._args and plain._adapters is None


def test_an_adapter_vllm_cannot_serve_is_refused_naming_the_setting(tiny_model, char_tokenizer):
    saved = _lora(tiny_model, modules_to_save=["lm_head"])
    with pytest.raises(ValueError) as err:
        _backend(saved, char_tokenizer)
    assert "rollout.options.sync.adapter=lora" in str(err.value)
    assert "peft.modules_to_save=['lm_head']" in str(err.value)
    assert "use sync.adapter=merged" in str(err.value)
    dora = _lora(tiny_model, use_dora=True)
    assert any("use_dora" in e for e in lora_errors(dora))
    assert lora_errors(_lora(tiny_model)) == []


def test_an_unknown_adapter_sync_is_refused_naming_the_choices(tiny_model, char_tokenizer):
    with pytest.raises(
        ValueError, match=r"rollout\.options\.sync\.adapter must be one of merged, lora"
    ):
        _backend(_lora(tiny_model), char_tokenizer, adapter="delta")


class _Engine:
    """The calls `AdapterSync.push` makes, recorded."""

    def __init__(self):
        self.calls = []

    def add_lora(self, slot):
        self.calls.append(("add", slot.id))
        return True

    def remove_lora(self, lora_id):
        self.calls.append(("remove", lora_id))
        return True

    def reset_prefix_cache(self):
        self.calls.append(("reset",))


def test_each_sync_loads_the_saved_adapter_under_a_new_id_and_drops_the_old_one(tiny_model):
    from safetensors.torch import load_file

    from coscale.rollout.vllm.sync import SyncBook

    policy, engine, book, sync = _lora(tiny_model), _Engine(), SyncBook(), AdapterSync()
    first = sync.push(engine, policy, book, deadline=None)
    saved = load_file(f"{sync.slot.path}/adapter_model.safetensors")
    lora = {n: p for n, p in policy.named_parameters() if "lora_" in n}
    assert first.version == 1 and first.tensors == len(saved) == len(lora) > 0
    assert first.bytes == sum(p.numel() * p.element_size() for p in lora.values())
    old = sync.slot.path
    sync.push(engine, policy, book, deadline=None)
    assert engine.calls == [("add", 1), ("reset",), ("add", 2), ("remove", 1), ("reset",)]
    assert sync.slot.id == 2 and not os.path.exists(old)
    sync.forget_engine()  # the engine shut down: the next sync loads anew
    assert sync.slot is None


def test_modules_to_save_over_tied_embeddings_is_refused_by_name(tiny_model):
    from coscale.models.adapter_weights import adapter_sync_errors

    assert tiny_model.config.tie_word_embeddings
    (error,) = adapter_sync_errors(_lora(tiny_model, modules_to_save=["embed_tokens", "lm_head"]))
    assert "peft.modules_to_save=['embed_tokens', 'lm_head'] trains its own copy" in error
    assert adapter_sync_errors(_lora(tiny_model)) == []
