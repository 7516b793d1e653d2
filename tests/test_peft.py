"""PEFT adapters (``peft=``) on both modules: only the adapter trains, the KL reference is the base
with the adapter off, exports are merged with the adapter beside the weights, checkpoints resume.

All on the tiny Llama of the fixtures (LoRA rank 4 on every linear layer); one slow test wraps
SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from jsonargparse import ArgumentParser
from reward_examples import HasDigit
from test_modules import _rows
from torch.utils.data import DataLoader
from trainers import quiet_trainer

peft = pytest.importorskip("peft", reason="install coscale[peft]")

from coscale.datamodules import ProblemDataModule  # noqa: E402
from coscale.models.adapter_checkpoint import FINGERPRINT_KEY, frozen_keys  # noqa: E402
from coscale.models.adapters import ADAPTER_FOLDER, has_adapter, linear_layer_names  # noqa: E402
from coscale.models.capabilities import keep_last_logits  # noqa: E402
from coscale.models.policy import load_policy  # noqa: E402
from coscale.modules import GRPOModule, SFTModule  # noqa: E402
from coscale.rl.logprobs import sequence_logprobs  # noqa: E402
from coscale.rl.losses import GRPOLoss  # noqa: E402
from coscale.rollout.base import SamplingParams  # noqa: E402
from coscale.sft.batch import solution_loss, tokenize_pairs  # noqa: E402
from coscale.sft.packing import can_pack  # noqa: E402

LINEARS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
"""The tiny Llama's linear layers that ``all-linear`` wraps (all but ``lm_head``)."""
IDS = torch.tensor([[5, 9, 12, 7, 3, 20, 11, 4]])  # [1, 8] a few tokens of the char vocabulary


def lora(**kw) -> peft.LoraConfig:
    return peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": "all-linear"} | kw)


def _pairs(n: int = 8) -> DataLoader:
    pairs = [{"question": r["question"], "solution": r["solutions"][0]} for r in _rows(n)]
    return DataLoader(pairs, batch_size=4, collate_fn=list)


def _rl_data(n: int = 4) -> ProblemDataModule:
    dm = ProblemDataModule(train=_rows(n), batch_size=2)
    dm.load()
    for pid in dm.problems:
        dm.curriculum.pools.record(pid, 10, 3)  # acc 0.3: solvable
        dm.curriculum.n_per_problem[pid] = 4
    return dm


def _grpo(model_dir, **kw) -> GRPOModule:
    settings = {"max_new_tokens": 6, "temperature": 1.0}
    return GRPOModule(model=str(model_dir), reward=HasDigit(), sampling=settings, **kw)


def _split(module) -> tuple[dict, dict]:
    """(base weights, adapter weights) of the policy, cloned."""
    state = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
    adapter = {k: v for k, v in state.items() if "lora_" in k}
    return {k: v for k, v in state.items() if k not in adapter}, adapter


def _assert_only_adapter_trained(module, trainer, before) -> None:
    base, adapter = before
    base_after, adapter_after = _split(module)
    assert base_after.keys() == base.keys()
    assert all(torch.equal(base[k], base_after[k]) for k in base)  # bit-identical base
    assert len(adapter) == 2 * len(LINEARS) * 2  # A and B of 7 linears in each of 2 layers
    assert all(not torch.equal(adapter[k], adapter_after[k]) for k in adapter)
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    optimised = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimised == {id(p) for p in module.policy.parameters() if p.requires_grad}


def _perturb_adapter(module, seed: int = 0) -> None:
    """Non-zero LoRA B matrices (they start at zero), so the adapter changes the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def _logits(model) -> torch.Tensor:
    """Eval-mode logits of :data:`IDS`; the model's mode is restored."""
    training = model.training
    with torch.no_grad():
        logits = model.eval()(input_ids=IDS).logits  # [1, 8, V]
    model.train(training)
    return logits


# ------------------------------------------------------------------------ training
def test_sft_with_lora_trains_only_the_adapter(tiny_model_dir):
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2}, peft=lora())
    before = _split(module)
    trainer = quiet_trainer(2, devices=1)
    trainer.fit(module, train_dataloaders=_pairs())
    assert trainer.global_step == 2
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    _assert_only_adapter_trained(module, trainer, before)


def test_grpo_with_lora_and_kl_trains_only_the_adapter(tiny_model_dir):
    module = _grpo(tiny_model_dir, optimizer={"lr": 1e-2}, loss=GRPOLoss(beta=0.1), peft=lora())
    assert module.ref_policy is None and module.base_is_reference  # no second copy
    before = _split(module)
    trainer = quiet_trainer(2, devices=1, limit_val_batches=0)
    trainer.fit(module, datamodule=_rl_data())
    assert trainer.global_step == 2 and trainer.callback_metrics["train/skipped"] == 0
    assert torch.isfinite(trainer.callback_metrics["train/kl"])
    _assert_only_adapter_trained(module, trainer, before)


def test_no_peft_is_the_full_fine_tune(tiny_model_dir):
    module = _grpo(tiny_model_dir, loss=GRPOLoss(beta=0.1))
    assert not has_adapter(module.policy) and "peft" not in module.hparams
    assert module.ref_policy is not None and not module.base_is_reference
    assert all(p.requires_grad for p in module.policy.parameters())


# ------------------------------------------------------------------- refusals
def test_a_target_that_matches_nothing_is_refused_with_the_linear_layers(
    tiny_model_dir, monkeypatch
):
    def never(*args, **kwargs):
        raise AssertionError("get_peft_model ran before the targets were checked")

    monkeypatch.setattr(peft, "get_peft_model", never)
    with pytest.raises(ValueError, match=r"peft\.target_modules") as err:
        SFTModule(model=str(tiny_model_dir), peft=lora(target_modules=["q_proj", "qkv_proj"]))
    message = str(err.value)
    assert "'qkv_proj' matches no module" in message and "'q_proj'" not in message
    assert f"linear layers: {', '.join(sorted([*LINEARS, 'lm_head']))}" in message
    with pytest.raises(ValueError, match=r"peft\.target_modules: '.\*c_attn' matches no"):
        GRPOModule(model=str(tiny_model_dir), peft=lora(target_modules=".*c_attn"))


def test_the_engine_gets_the_merged_weights_under_the_base_names_and_the_base_stays(
    tiny_model_dir,
):
    from coscale.models.adapter_weights import merged_named_weights
    from coscale.models.adapters import merged_copy
    from coscale.rollout.weights import full_tensor, gathered_parameters

    module = SFTModule(model=str(tiny_model_dir), peft=lora(modules_to_save=["lm_head"]))
    _perturb_adapter(module)
    with torch.no_grad():
        module.policy.base_model.model.lm_head.modules_to_save.default.weight.mul_(2)
    base_before = _split(module)[0]
    merged = dict(merged_copy(module.policy).named_parameters())  # PEFT's own merge
    # a tied model's engine holds one tensor for the embeddings and the head: a trained copy of
    # the head could not reach it, so the sync refuses it by name
    with pytest.raises(ValueError, match=r"peft\.modules_to_save=\['lm_head'\] trains its own"):
        merged_named_weights(module.policy)
    module.policy.get_base_model().config.tie_word_embeddings = False  # as an untied model
    with gathered_parameters(module.policy) as named:  # what a vLLM sync sends
        sent = {name: full_tensor(value) for name, value in named}
    plain, _ = load_policy(str(tiny_model_dir))
    # the engine's names; the tiny model ties its head to the embeddings, the trained copy of
    # the head (modules_to_save) is sent under the head's own name
    assert list(sent) == [*dict(plain.named_parameters()), "lm_head.weight"]
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(sent["lm_head.weight"], plain.lm_head.weight)  # the trained copy
    assert all(torch.equal(v, _split(module)[0][k]) for k, v in base_before.items())  # untouched
    with pytest.raises(ValueError, match=r"peft\.use_dora"):
        merged_named_weights(SFTModule(model=str(tiny_model_dir), peft=lora(use_dora=True)).policy)


def test_the_callers_config_is_left_for_the_next_module(tiny_model_dir):
    config = lora(target_modules=["q_proj", "v_proj"])
    first = SFTModule(model=str(tiny_model_dir), peft=config)
    assert config.target_modules == {"q_proj", "v_proj"} and config.task_type is None
    second = SFTModule(model=str(tiny_model_dir), peft=config)
    assert first.policy is not second.policy and has_adapter(second.policy)


@pytest.mark.parametrize("backend", ["cached", "hf"])
def test_the_speed_paths_see_the_model_under_the_adapter(tiny_model_dir, backend):
    # PEFT's wrapper forward names few keywords and passes the rest on: the checks look through
    # it, so LoRA keeps padding-free SFT and logits_to_keep (same results as the plain paths);
    # both backends sample from the adapted policy (their log-probs are its log-probs)
    module = _grpo(tiny_model_dir, peft=lora(), rollout={"backend": backend})
    _perturb_adapter(module)
    policy = module.policy.eval()
    assert can_pack(policy) and keep_last_logits(policy, 2) == {"logits_to_keep": 2}
    rows = _rows(4)
    prompts = module.prompts_for([r["question"] for r in rows])
    enc = tokenize_pairs(module.tokenizer, prompts, [r["solutions"][0] for r in rows], 64)
    with torch.no_grad():
        packed, padded = solution_loss(policy, enc, True), solution_loss(policy, enc, False)
    assert packed[1] == padded[1]
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-5)

    problems = [{"question": r["question"], "answer": r["answer"]} for r in rows[:2]]
    ro, _ = module.sample(problems, 3, SamplingParams(max_new_tokens=5, temperature=1.0))
    args = (policy, ro.input_ids, ro.attention_mask, ro.prompt_length)
    with torch.no_grad():
        shared = sequence_logprobs(*args, prompt_index=ro.prompt_index)  # [R, T]
        torch.testing.assert_close(shared, sequence_logprobs(*args), rtol=0, atol=1e-5)
        torch.testing.assert_close(ro.logprobs, sequence_logprobs(*args), rtol=0, atol=1e-5)


# ----------------------------------------------------------------- KL reference
def test_kl_reference_is_the_base_with_the_adapter_disabled(tiny_model_dir):
    module = _grpo(tiny_model_dir, loss=GRPOLoss(beta=0.1), peft=lora())
    _perturb_adapter(module)
    base, _ = load_policy(str(tiny_model_dir))
    assert not torch.allclose(_logits(module.policy), _logits(base))  # the adapter matters
    assert module.policy.training
    from coscale.models.adapters import adapter_disabled

    with adapter_disabled(module.policy) as ref:  # what the module's reference runs under
        assert ref is module.policy and not ref.training  # eval: no dropout in the reference
        assert torch.equal(_logits(ref), _logits(base))
    assert module.policy.training  # train mode and the adapter are back
    assert not torch.allclose(_logits(module.policy), _logits(base))

    problems = [{"question": r["question"], "answer": r["answer"]} for r in _rows(2)]
    ro, _ = module.sample(problems, 3, SamplingParams(max_new_tokens=5, temperature=1.0))
    ref = module._ref_logprobs(ro, torch.arange(ro.num_rollouts))  # [R, T]
    expected = sequence_logprobs(base, ro.input_ids, ro.attention_mask, ro.prompt_length)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------ export
def test_export_is_merged_with_the_adapter_beside_and_the_module_trains_on(
    tiny_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2}, peft=lora())
    _perturb_adapter(module)
    before, live = _split(module), _logits(module.policy)
    folder = module.export(tmp_path / "model")

    merged = AutoModelForCausalLM.from_pretrained(folder)
    plain, _ = load_policy(str(tiny_model_dir))
    assert merged.state_dict().keys() == plain.state_dict().keys()  # a plain HF folder
    assert not torch.allclose(_logits(merged), _logits(plain))  # the adapter is merged in
    torch.testing.assert_close(_logits(merged), live, rtol=0, atol=1e-5)
    adapter = peft.PeftModel.from_pretrained(plain, tmp_path / "model" / ADAPTER_FOLDER)
    torch.testing.assert_close(_logits(adapter), _logits(merged), rtol=0, atol=1e-5)

    after = _split(module)  # the live module: unmerged, its base untouched, still training
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert torch.equal(_logits(module.policy), live)
    trainer = quiet_trainer(2, devices=1)
    trainer.fit(module, train_dataloaders=_pairs())
    _assert_only_adapter_trained(module, trainer, before)


def test_coscale_eval_takes_the_merged_folder_or_the_adapter_alone(
    tiny_model_dir, tmp_path, capsys
):
    from coscale.app.cli import main

    module = SFTModule(model=str(tiny_model_dir), peft=lora())
    _perturb_adapter(module)
    module.export(tmp_path / "model")
    bench = tmp_path / "b.jsonl"
    bench.write_text("\n".join(f'{{"problem": "{i}+1", "answer": {i + 1}}}' for i in range(4)))
    table, benchmarks = {}, json.dumps([f"b?path={bench}"])
    for name, folder in (("merged", "model"), ("adapter", f"model/{ADAPTER_FOLDER}")):
        out = tmp_path / f"{name}.json"
        flags = ["--eval.model", str(tmp_path / folder), "--eval.benchmarks", benchmarks]
        flags += [
            "--eval.prompt",
            '{"template": "Q:{question}\\nA:"}',
            "--eval.samples",
            "2",
            "--eval.k",
            "[1, 2]",
        ]
        flags += ["--eval.max_new_tokens", "6", "--eval.logger", "none", "--eval.seed", "1"]
        flags += ["--eval.device", "cpu", "--eval.output", str(out)]
        assert main(["eval", *flags]) == 0
        table[name] = json.loads(out.read_text())["results"]
    assert table["adapter"] == table["merged"]  # the same samples: the same weights
    capsys.readouterr()
    assert main(["eval", "--eval.model", str(tmp_path / "model" / ADAPTER_FOLDER),
                 "--eval.benchmarks", benchmarks, "--eval.backend", "vllm"]) == 2  # fmt: skip
    assert re.search(r"eval\.model=.*adapter folder.*eval\.backend=hf", capsys.readouterr().err)


# ------------------------------------------------------------ settings and resume
def test_yaml_class_path_builds_both_modules_with_the_adapter(tiny_model_dir):
    for cls in (SFTModule, GRPOModule):
        parser = ArgumentParser()
        parser.add_class_arguments(cls, "module")
        lora_yaml = {"class_path": "peft.LoraConfig", "init_args": {"r": 2, "lora_alpha": 4}}
        lora_yaml["init_args"]["target_modules"] = "all-linear"
        config = parser.parse_object({"module": {"model": str(tiny_model_dir), "peft": lora_yaml}})
        module = parser.instantiate_classes(config).module
        assert type(module) is cls and has_adapter(module.policy)
        assert module.policy.peft_config["default"].r == 2
        assert module.hparams["peft"]["r"] == 2 and module.hparams["peft"]["peft_type"] == "LORA"


def test_checkpoint_resumes_the_adapter_into_a_fresh_module(tiny_model_dir, tmp_path):
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2}, peft=lora(r=3))
    trainer = quiet_trainer(2, devices=1)
    trainer.fit(module, train_dataloaders=_pairs())
    trainer.save_checkpoint(tmp_path / "last.ckpt")

    fresh = SFTModule(model=str(tiny_model_dir), peft=lora(r=3))
    trained, initial = _split(module)[1], _split(fresh)[1]
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)
    resumed = SFTModule.load_from_checkpoint(tmp_path / "last.ckpt")
    assert isinstance(resumed.hparams["peft"], dict)
    assert resumed.policy.peft_config["default"].r == 3
    adapter = _split(resumed)[1]
    assert adapter.keys() == trained.keys()
    assert all(torch.equal(adapter[k], trained[k]) for k in trained)


def test_the_checkpoint_holds_the_adapter_not_the_frozen_base(tiny_model_dir, tmp_path):
    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2}, peft=lora())
    trainer = quiet_trainer(2, devices=1)
    trainer.fit(module, train_dataloaders=_pairs())
    trainer.save_checkpoint(tmp_path / "lora.ckpt")
    saved = torch.load(tmp_path / "lora.ckpt", weights_only=False)
    trainable = {f"policy.{n}" for n, p in module.policy.named_parameters() if p.requires_grad}
    assert set(saved["state_dict"]) == trainable  # no frozen weight, no base
    assert saved[FINGERPRINT_KEY]["tensors"] == len(frozen_keys(module)) > 0

    full = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2})
    quiet_trainer(2, devices=1).fit(full, train_dataloaders=_pairs())
    full.trainer.save_checkpoint(tmp_path / "full.ckpt")
    lora_size, full_size = ((tmp_path / n).stat().st_size for n in ("lora.ckpt", "full.ckpt"))
    assert lora_size * 3 < full_size, (lora_size, full_size)


def test_an_adapter_checkpoint_on_another_base_is_refused(
    tiny_model_dir, model_folder, char_tokenizer, tmp_path
):
    from coscale.models.tiny import build_tiny_model

    module = SFTModule(model=str(tiny_model_dir), optimizer={"lr": 1e-2}, peft=lora())
    trainer = quiet_trainer(1, devices=1)
    trainer.fit(module, train_dataloaders=_pairs())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    other = model_folder("other_base", build_tiny_model(char_tokenizer, seed=7), char_tokenizer)
    with pytest.raises(ValueError, match=r"another base model.*other_base"):  # same shapes
        SFTModule.load_from_checkpoint(tmp_path / "last.ckpt", model=str(other))
    with pytest.raises(ValueError, match="adapter without its frozen base"):
        SFTModule.load_from_checkpoint(tmp_path / "last.ckpt", peft=None)


# ------------------------------------------------------------------ a real model
@pytest.mark.slow
def test_all_linear_wraps_every_projection_of_smollm2(smollm2_dir):
    from peft.tuners.lora import LoraLayer

    model, _ = load_policy(str(smollm2_dir))
    assert linear_layer_names(model) == sorted([*LINEARS, "lm_head"])
    with pytest.raises(ValueError, match=r"peft\.target_modules: 'c_attn'.*down_proj, gate_proj"):
        SFTModule(model=model, tokenizer=str(smollm2_dir), peft=lora(target_modules=["c_attn"]))
    module = SFTModule(model=model, tokenizer=str(smollm2_dir), peft=lora())
    wrapped = [n for n, m in module.policy.named_modules() if isinstance(m, LoraLayer)]
    assert len(wrapped) == len(LINEARS) * model.config.num_hidden_layers
    assert {n.rsplit(".", 1)[-1] for n in wrapped} == set(LINEARS)
