"""Distillation in SFT (coscale.sft.distill): aligned logits, the KL term, a fit that moves the
student to the teacher without touching it, and the pipeline's choice of teacher."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from trainers import quiet_trainer

from coscale.models.tiny import build_tiny_model
from coscale.modules import SFTModule
from coscale.sft.batch import solution_logits, solution_loss, tokenize_pairs
from coscale.sft.distill import DistillationSettings, Teacher, distill_loss, kl_to_teacher

PAIRS = [
    ("Q:12+7-3\nA:", "12+7=19, 19-3=16 \\boxed{16}"),
    ("Q:5-9\nA:", "\\boxed{-4}"),
    ("Q:40+2+1+1\nA:", "40+2=42, 42+1=43, 43+1=44 \\boxed{44}"),
]


def _enc(tokenizer, pairs=PAIRS):
    return tokenize_pairs(tokenizer, [p for p, _ in pairs], [s for _, s in pairs], 96)


def test_packed_and_padded_logits_line_up(tiny_model, char_tokenizer):
    enc = _enc(char_tokenizer)
    packed, t_packed = solution_logits(tiny_model, enc, padding_free=True)
    padded, t_padded = solution_logits(tiny_model, enc, padding_free=False)
    assert torch.equal(t_packed, t_padded)
    assert len(t_packed) == int((enc["labels"][:, 1:] != -100).sum())  # every labelled token
    assert torch.allclose(packed, padded, atol=1e-5)
    want, _ = solution_loss(tiny_model, enc, padding_free=False)
    assert torch.allclose(F.cross_entropy(padded, t_padded), want, atol=1e-6)


def test_kl_term_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    assert float(kl_to_teacher(s, s)) == pytest.approx(0.0, abs=1e-6)
    for temp in (1.0, 2.0):
        p_t = F.softmax(t / temp, -1)
        want = (p_t * (p_t.log() - F.log_softmax(s / temp, -1))).sum(-1).mean() * temp**2
        assert float(kl_to_teacher(s, t, temp)) == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ValueError, match="tokenizer and vocabulary"):
        kl_to_teacher(s, torch.randn(5, 8))


def test_distill_loss_mixes_cross_entropy_and_kl(tiny_model, char_tokenizer):
    enc = _enc(char_tokenizer)
    other = build_tiny_model(char_tokenizer, seed=1)
    ce, _ = solution_loss(tiny_model, enc, padding_free=False)
    loss, _, parts = distill_loss(tiny_model, Teacher(other), enc, weight=0.25)
    parts = {key: float(value) for key, value in parts.items()}  # detached 0-d tensors
    assert parts["ce"] == pytest.approx(float(ce.detach()), rel=1e-5) and parts["kl"] > 0
    assert float(loss) == pytest.approx(0.75 * parts["ce"] + 0.25 * parts["kl"], rel=1e-5)
    same = distill_loss(tiny_model, Teacher(copy.deepcopy(tiny_model)), enc, weight=0.5)[2]
    assert float(same["kl"]) == pytest.approx(0.0, abs=1e-6)


def _fit(module, rows, steps):
    trainer = quiet_trainer(steps)
    loader = torch.utils.data.DataLoader(rows, batch_size=3, collate_fn=list)
    trainer.fit(module, loader)


def test_distilling_pulls_the_student_to_the_teacher_and_leaves_it_alone(
    tmp_path, tiny_model_dir, char_tokenizer
):
    teacher_dir = tmp_path / "teacher"
    build_tiny_model(char_tokenizer, seed=1).save_pretrained(teacher_dir)
    char_tokenizer.save_pretrained(teacher_dir)
    rows = [{"question": p[3:-3], "solution": s} for p, s in PAIRS]
    module = SFTModule(
        model=str(tiny_model_dir), distill=DistillationSettings(str(teacher_dir), weight=1.0),
        optimizer={"lr": 1e-2}, prompt="Q:{question}\nA:",
    )  # fmt: skip
    teacher_before = {k: v.clone() for k, v in module.teacher.model.state_dict().items()}
    enc = module.encode(rows)
    kl_before = float(distill_loss(module.policy, module.teacher, enc, 1.0)[2]["kl"])
    _fit(module, rows, 30)
    kl_after = float(distill_loss(module.policy, module.teacher, enc, 1.0)[2]["kl"])
    assert kl_after < 0.6 * kl_before, (kl_before, kl_after)
    for key, value in module.teacher.model.state_dict().items():
        assert torch.equal(value, teacher_before[key]), key
    # not a submodule: the checkpointed state is the policy's alone
    plain = SFTModule(model=str(tiny_model_dir))
    assert set(module.state_dict()) == set(plain.state_dict())


def test_weight_zero_is_plain_sft(tiny_model_dir, tmp_path, char_tokenizer):
    teacher_dir = tmp_path / "teacher"
    build_tiny_model(char_tokenizer, seed=1).save_pretrained(teacher_dir)
    char_tokenizer.save_pretrained(teacher_dir)
    rows = [{"question": p[3:-3], "solution": s} for p, s in PAIRS]
    weights = []
    for distill in (None, DistillationSettings(str(teacher_dir), weight=0.0)):
        torch.manual_seed(0)
        module = SFTModule(model=str(tiny_model_dir), distill=distill, optimizer={"lr": 1e-2})
        _fit(module, rows, 2)
        weights.append(module.policy.state_dict())
    for key in weights[0]:
        assert torch.allclose(weights[0][key], weights[1][key], atol=1e-6), key


def test_bad_distillation_settings_name_the_setting(tiny_model_dir):
    with pytest.raises(ValueError, match=r"distill.weight must be in \[0, 1\], got 1.5"):
        SFTModule(model=str(tiny_model_dir), distill=DistillationSettings("t", weight=1.5))
    with pytest.raises(ValueError, match=r"distill\.temperature must be > 0, got 0"):
        SFTModule(model=str(tiny_model_dir), distill={"teacher": "t", "temperature": 0})
