"""The vLLM backend on the real engine (vLLM's CPU build here): weight sync every step, the
trainer's process left as found, CPU options. Skipped only where vllm is not installed.

The policy is the tiny Llama with head size 32 (vLLM's CPU attention refuses 16) and tied
embeddings, so every sync also exercises the tied LM head (`coscale.rollout.vllm.reload`).
"""

from __future__ import annotations

import copy
import os
import random

import lightning as L
import pytest
import torch
from reward_examples import HasDigit
from test_modules import _changed, _params, _rl_dm, _trainer

from coscale.rollout import HFGenerateBackend, SamplingParams

pytestmark = pytest.mark.vllm
PROMPTS = ["1+2=", "7*6=", "x"]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0)


@pytest.fixture(scope="module")
def policy32(char_tokenizer):
    from coscale.models.tiny import build_tiny_model

    return build_tiny_model(char_tokenizer, num_heads=2, seed=0)  # hidden 64: head size 32


@pytest.fixture(scope="module")
def model32_dir(model_folder, policy32, char_tokenizer):
    return model_folder("tiny32", policy32, char_tokenizer)


def _backend(model_dir, tokenizer, policy, **engine):
    """A float32 engine on `model_dir`; ``engine`` adds `vllm_settings.EngineSettings` fields."""
    from coscale.rollout.vllm.backend import VLLMBackend

    return VLLMBackend(str(model_dir), tokenizer, policy, engine={"dtype": "float32", **engine})


def _step(policy: torch.nn.Module, lr: float = 0.05, steps: int = 2) -> None:
    """A few optimiser steps on one row: every weight moves, the tied embedding too."""
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    ids = torch.tensor([[1, 8, 9, 10, 11, 12, 13, 14]])
    policy.train()
    for _ in range(steps):
        policy(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    policy.eval()


def _host() -> dict:
    return {
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "set_num_threads": torch.set_num_threads,
        "num_threads": torch.get_num_threads(),
        "affinity": os.sched_getaffinity(0),
    }


def _same_host(a: dict, b: dict) -> list[str]:
    return [k for k in a if not (torch.equal(a[k], b[k]) if k == "torch_rng" else a[k] == b[k])]


def test_the_engine_leaves_the_trainer_process_as_it_found_it(model32_dir, char_tokenizer):
    torch.manual_seed(11)
    random.seed(11)
    before, env = _host(), dict(os.environ)
    backend = _backend(model32_dir, char_tokenizer, None)
    assert backend.engine is not None  # built: vLLM seeded its RNGs, replaced set_num_threads
    assert _same_host(before, _host()) == []
    backend.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4, seed=3))  # seeded: no draw
    assert _same_host(before, _host()) == []
    torch.rand(1)  # the trainer draws while the engine lives: the close keeps that, no rewind
    drawn = {**before, "torch_rng": torch.get_rng_state()}
    backend.close()
    assert _same_host(drawn, _host()) == []
    assert dict(os.environ) == env  # VLLM_* variables of the start are gone again


def test_cpu_options_sleep_refused_and_kv_cache_sized_from_the_model(model32_dir, char_tokenizer):
    from coscale.rollout.vllm.cpu import KV_MIN_GIB, on_cpu

    if not on_cpu():
        pytest.skip("vLLM runs on a GPU here: sleep mode exists and the cache follows its memory")
    with pytest.raises(
        ValueError, match=r"rollout.options.engine.sleep_level=1: vLLM has no sleep"
    ):
        _backend(model32_dir, char_tokenizer, None, sleep_level=1)
    default = _backend(model32_dir, char_tokenizer, None, max_model_len=256)
    # 2 layers x 2 KV heads x 32 x 4 bytes x (K, V) = 1 KiB a token; 32 x 256 tokens = 8 MiB,
    # below the floor of the default size
    assert default._args["kv_cache_memory_bytes"] == int(KV_MIN_GIB * 2**30)
    sized = _backend(model32_dir, char_tokenizer, None, kv_cache_gib=0.125)
    assert sized._args["kv_cache_memory_bytes"] == 2**27


def test_seeded_prompts_past_one_steps_token_budget_are_never_cut(model32_dir, char_tokenizer):
    """On CPU a cut prefill of a seeded request killed the engine ("CPU Generator does not use
    offset"): 80 requests of 100-token prompts are twice the 4,096-token step budget."""
    from coscale.rollout.vllm.cpu import CPU_BATCHED_TOKENS, on_cpu

    if not on_cpu():
        pytest.skip("vLLM runs on a GPU here: its generators rewind")
    backend = _backend(model32_dir, char_tokenizer, None, max_model_len=256)
    assert backend._args["enable_chunked_prefill"] is False
    assert backend._args["max_num_batched_tokens"] == CPU_BATCHED_TOKENS
    prompts = [f"{i:03d}" + "1+2=" * 24 for i in range(40)]  # 100 characters each
    rollouts = backend.generate(prompts, 2, SamplingParams(max_new_tokens=4, seed=7))
    assert rollouts.num_rollouts == 80
    assert int(rollouts.completion_mask.sum(dim=1).min()) >= 1
    backend.close()


def test_a_head_size_the_cpu_engine_cannot_run_is_refused_by_name(tiny_model_dir, char_tokenizer):
    from coscale.rollout.vllm.cpu import on_cpu

    if not on_cpu():
        pytest.skip("vLLM runs on a GPU here")
    with pytest.raises(ValueError, match=r"head size 16, and vLLM's CPU attention takes only \["):
        _backend(tiny_model_dir, char_tokenizer, None)  # hidden 64 / 4 heads


def test_a_stale_tied_head_fails_parity_and_the_refreshed_one_passes(
    model32_dir, char_tokenizer, policy32, monkeypatch
):
    from coscale.rollout.vllm import reload as vllm_reload
    from coscale.rollout.vllm.sync import ParityError

    policy = copy.deepcopy(policy32)
    backend = _backend(model32_dir, char_tokenizer, policy)
    try:
        backend.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=0))  # parity at start
        _step(policy)
        with monkeypatch.context() as patch:  # the reload without coscale's tied-head refresh
            patch.setattr(vllm_reload, "refresh_tied_layers", lambda model: 0)
            backend.update_weights(policy)
        with pytest.raises(ParityError, match="disagree after weight sync #1"):
            backend.check_parity()
        backend.update_weights(policy)  # the same weights, with the refresh
        result = backend.check_parity()
        assert result.ok and result.mean_abs < 1e-4, result
        engine = backend.generate(PROMPTS, 1, GREEDY)
        trainer = HFGenerateBackend(policy, char_tokenizer).generate(PROMPTS, 1, GREEDY)
        assert engine.texts == trainer.texts
    finally:
        backend.close()


class _Watch(L.Callback):
    """Records every parity check of the module's vLLM backend; compares greedy output with the
    trainer's at the end of the fit (before teardown closes the engine)."""

    def __init__(self) -> None:
        self.parity: list = []
        self.greedy: tuple[list[str], list[str]] | None = None

    def on_train_start(self, trainer, module) -> None:
        backend, check = module.backend, module.backend.check_parity

        def recorded():
            result = check()
            self.parity.append((backend.book.version, result))
            return result

        backend.check_parity = recorded

    def on_train_end(self, trainer, module) -> None:
        backend = module.backend
        self.parity.append((backend.book.version, backend.check_parity()))  # the last sync's
        engine = backend.generate(PROMPTS, 1, GREEDY)
        hf = HFGenerateBackend(module.policy, module.tokenizer).generate(PROMPTS, 1, GREEDY)
        self.greedy = (engine.texts, hf.texts)


def _grpo(model_dir, **kw):
    """A GRPOModule on ``model_dir`` rewarding digits (spread on a random model), 8 new tokens
    at temperature 1, float32 vLLM rollouts; ``kw`` adds or replaces settings."""
    from coscale.modules import GRPOModule

    settings = {
        "reward": HasDigit(),
        "sampling": {"max_new_tokens": 8, "temperature": 1.0},
        "rollout": {"backend": "vllm", "options": {"engine": {"dtype": "float32"}}},
    }
    return GRPOModule(model=str(model_dir), **(settings | kw))


def _watched_fit(module, steps: int) -> tuple[L.Trainer, _Watch]:
    """``steps`` steps of ``module`` on 4 solvable problems, 2 a batch, watched by a `_Watch`."""
    watch = _Watch()
    trainer = _trainer(steps, callbacks=[watch])
    trainer.fit(module, datamodule=_rl_dm([4, 4, 4, 4], batch_size=2))
    return trainer, watch


def test_a_grpo_fit_with_vllm_rollouts_syncs_and_checks_parity_every_step(model32_dir):
    module = _grpo(model32_dir, optimizer={"lr": 0.02})
    before = _params(module)
    trainer, watch = _watched_fit(module, 3)
    assert trainer.global_step == 3 and len(_changed(before, module)) == len(before)
    # sync #1 at the start, one after each of the 3 steps, a parity check after every one (the
    # last sync's at the epoch's end sampling, if any, and at the end of the fit)
    versions = [version for version, _ in watch.parity]
    assert sorted(set(versions)) == [1, 2, 3, 4] and versions == sorted(versions)
    assert all(r.ok and r.mean_abs < 1e-4 for _, r in watch.parity), watch.parity
    engine, hf = watch.greedy
    assert engine == hf
    assert module._backend._engine is None  # teardown shut the engine down


def test_a_lora_grpo_fit_syncs_the_merged_weights_and_keeps_parity(model32_dir):
    pytest.importorskip("peft", reason="install coscale[peft]")
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=16, target_modules="all-linear")
    module = _grpo(model32_dir, optimizer={"lr": 0.05}, peft=lora)
    frozen = {
        n: p.detach().clone() for n, p in module.policy.named_parameters() if "lora_" not in n
    }
    trainer, watch = _watched_fit(module, 3)
    assert trainer.global_step == 3
    lora_b = [p for n, p in module.policy.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # the adapter moved off zero
    assert all(
        torch.equal(p, frozen[n]) for n, p in module.policy.named_parameters() if n in frozen
    )
    versions = [version for version, _ in watch.parity]
    assert sorted(set(versions)) == [1, 2, 3, 4], versions  # a merged sync after every step
    assert all(r.ok and r.mean_abs < 1e-4 for _, r in watch.parity), watch.parity
    engine, hf = watch.greedy  # the engine samples the merged policy the trainer trains
    assert engine == hf


def test_a_lora_grpo_fit_syncs_the_adapter_alone_and_keeps_parity(model32_dir):
    """``sync.adapter: lora``: the engine keeps its base and gets the adapter as a vLLM LoRA
    request after every step; parity after every sync, greedy output equal to the trainer's."""
    pytest.importorskip("peft", reason="install coscale[peft]")
    from peft import LoraConfig

    options = {"engine": {"dtype": "float32"}, "sync": {"adapter": "lora"}}
    module = _grpo(
        model32_dir,
        optimizer={"lr": 0.05},
        rollout={"backend": "vllm", "options": options},
        peft=LoraConfig(r=4, lora_alpha=16, target_modules="all-linear"),
    )
    trainer, watch = _watched_fit(module, 3)
    assert trainer.global_step == 3
    book = module._backend.book
    lora = [n for n, _ in module.policy.named_parameters() if "lora_" in n]
    assert book.last.tensors == len(lora) and all("lora_" in n for n in book.names)
    full = sum(p.numel() * p.element_size() for p in module.policy.parameters())
    assert book.last.bytes < full / 4  # the adapter's factors, not the model
    assert module._backend._args["enable_lora"] and module._backend._args["max_lora_rank"] == 8
    versions = [version for version, _ in watch.parity]
    assert sorted(set(versions)) == [1, 2, 3, 4], versions  # an adapter sync after every step
    assert all(r.ok and r.mean_abs < 1e-4 for _, r in watch.parity), watch.parity
    engine, hf = watch.greedy  # the engine samples the adapted policy the trainer trains
    assert engine == hf


def test_ddp_on_two_cpu_ranks_with_one_engine_per_rank(model32_dir, tmp_path):
    from runs import worker_ranks

    r0, r1 = worker_ranks("vllm_ddp_worker.py", model32_dir, tmp_path, timeout=600)
    assert r0["grpo_sum"] == pytest.approx(r1["grpo_sum"], abs=1e-9)  # DDP kept them equal
    for rank in (r0, r1):
        # each fit: a sync at its start and after each of its 2 steps, each checked at the next
        # sampling (the last one's engine is shut down first); the second fit's engine is new,
        # synced from the trained policy before its first rollout, and its book goes on counting
        first, second = ([version for version, _ in fit] for fit in rank["parity"])
        assert (first, second) == ([1, 2], [4, 5]), rank["parity"]
        assert all(diff < 1e-4 for fit in rank["parity"] for _, diff in fit), rank["parity"]
        assert rank["syncs"] == 6
    # the engines are replicas with their own seeds: the ranks sampled different completions
    assert r0["texts"][0] != r1["texts"][0]


def test_a_grpo_fit_on_smollm2_with_vllm_rollouts(smollm2_dir):
    # the real chat model: BPE tokenizer, ChatML template, <|im_end|> ends a turn
    module = _grpo(
        smollm2_dir,
        prompt={"template": "Compute {question}.", "chat": True},
        optimizer={"lr": 1e-05},
        sampling={"max_new_tokens": 12, "temperature": 1.0},
        rollout={
            "backend": "vllm",
            "options": {"engine": {"max_model_len": 256, "kwargs": {"enforce_eager": True}}},
        },
    )
    # two batches in epoch 0: both steps there, whichever pools the first epoch's rollouts leave
    _, watch = _watched_fit(module, 2)
    versions = [version for version, _ in watch.parity]
    assert sorted(set(versions)) == [1, 2, 3], watch.parity
    assert all(r.ok and r.mean_abs < 1e-3 for _, r in watch.parity), watch.parity
    im_end = module.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in module._backend.eos_token_ids  # the turn's end stops a rollout
    engine, hf = watch.greedy
    assert engine == hf
