"""Tests for coscale.rl.losses: every variant, the mismatch correction and the entropy bonus
against values worked out by hand (tests/test_loss_parity_trl.py runs TRL's own code)."""

from __future__ import annotations

import math

import pytest
import torch

from coscale.rl.losses import (
    CISPOLoss,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    GSPOLoss,
    LossOutput,
    MismatchSettings,
    PolicyLoss,
    as_loss,
)

LOSSES = {cls.name: cls for cls in (GRPOLoss, DrGRPOLoss, DAPOLoss, GSPOLoss, CISPOLoss)}


def build_loss(name: str, **kwargs) -> PolicyLoss:
    return LOSSES[name](**kwargs)


F64 = torch.float64
LN2 = math.log(2.0)

# R=2 sequences, T=3 tokens; the last token of row 1 is padding.
# ratio = exp(logp - old) is set directly:   row 0: 1.5, 1.0, 0.7   row 1: 1.1, 0.5, (1.3)
# advantages: row 0 A=+1, row 1 A=-2; epsilon=0.2 -> clip range [0.8, 1.2].
# surrogate = min(ratio*A, clip(ratio)*A), per-token loss = -surrogate:
#   row 0 t0: min(1.5, 1.2) = 1.2 (clipped high)       -> -1.2
#   row 0 t1: min(1.0, 1.0) = 1.0                      -> -1.0
#   row 0 t2: min(0.7, 0.8) = 0.7 (A>0: no low clip)   -> -0.7
#   row 1 t0: min(-2.2, -2.2) = -2.2                   -> 2.2
#   row 1 t1: min(-1.0, 0.8*-2=-1.6) = -1.6 (clipped low) -> 1.6
# Row sums: -2.9 and 3.8; total 0.9 over 5 masked tokens.
#   grpo:    ((-2.9/3) + (3.8/2)) / 2 = (-29/30 + 57/30) / 2 = 7/15
#   dr_grpo: 0.9 / (2 sequences * max_tokens 4) = 0.1125
#   dapo:    0.9 / 5 = 0.18
# Metrics: clipped tokens row0 t0 (high) and row1 t1 (low) -> clip_ratio 2/5, low 1/5, high 1/5;
# ratio_mean (1.5 + 1.0 + 0.7 + 1.1 + 0.5) / 5 = 0.96.
RATIOS = [[1.5, 1.0, 0.7], [1.1, 0.5, 1.3]]
OLD = [[-0.3, -1.2, -0.5], [-2.0, -0.1, -0.7]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]
EXPECTED = {"grpo": 7 / 15, "dr_grpo": 0.9 / 8, "dapo": 0.18}
KWARGS = {"grpo": {}, "dr_grpo": {"max_tokens": 4}, "dapo": {}, "gspo": {}, "cispo": {}}
ALL = sorted(KWARGS)


def _inputs(dtype=F64):
    old = torch.tensor(OLD, dtype=dtype)
    logp = (old + torch.tensor(RATIOS, dtype=dtype).log()).detach().requires_grad_()
    return logp, old, torch.tensor(ADV, dtype=dtype), torch.tensor(MASK)


def _close(actual, expected, tol=1e-12):
    value = actual.item() if isinstance(actual, torch.Tensor) else actual
    assert abs(value - expected) <= tol, (value, expected)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo"])
def test_hand_values(name):
    out = build_loss(name, **KWARGS[name])(*_inputs())
    assert isinstance(out, LossOutput)
    _close(out.loss, EXPECTED[name])
    assert out.metrics.keys() == {"clip_ratio", "clip_ratio_low", "clip_ratio_high", "ratio_mean"}
    for key, value in {"clip_ratio": 0.4, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}.items():
        _close(out.metrics[key], value, 1e-6)
    _close(out.metrics["ratio_mean"], 0.96, 1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo"])
def test_float32_bool_mask(name):
    logp, old, adv, mask = _inputs(torch.float32)
    out = build_loss(name, **KWARGS[name])(logp, old, adv, mask.bool())
    assert out.loss.dtype == torch.float32
    _close(out.loss, EXPECTED[name], 1e-6)


def test_grpo_gradient_by_hand():
    # d(-ratio*A)/d logp = -A*ratio on unclipped tokens, 0 on clipped ones and padding;
    # grpo scales token (i, t) by 1 / (n_i * R) with n = (3, 2), R = 2:
    #   row 0: t0 clipped 0; t1 -1*1.0/6; t2 -1*0.7/6     row 1: t0 2*1.1/4 = 0.55; t1 clipped 0
    logp, old, adv, mask = _inputs()
    old.requires_grad_()
    adv.requires_grad_()
    GRPOLoss()(logp, old, adv, mask).loss.backward()
    expected = torch.tensor([[0.0, -1 / 6, -0.7 / 6], [0.55, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert old.grad is None and adv.grad is None


def test_gradient_flows_to_logprobs_only_with_reference():
    logp, old, adv, mask = _inputs()
    ref = torch.zeros_like(logp, requires_grad=True)
    for tensor in (old, adv):
        tensor.requires_grad_()
    DAPOLoss(beta=0.1)(logp, old, adv, mask, ref_logprobs=ref).loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    assert old.grad is None and adv.grad is None and ref.grad is None


# k3 KL with ref - logp = D:  D = [[ln2, 0, -ln2], [0, ln2, 5 (padding)]]
#   exp(d) - d - 1:  d=ln2 -> 1 - ln2;  d=0 -> 0;  d=-ln2 -> 1/2 + ln2 - 1 = ln2 - 1/2
#   row 0 kl sum: (1 - ln2) + (ln2 - 1/2) = 1/2 (mean 1/6); row 1 kl sum: 1 - ln2 (mean (1-ln2)/2)
#   total 3/2 - ln2 over 5 tokens. beta = 0.1:
#   grpo:    7/15 + 0.1 * (1/6 + (1 - ln2)/2) / 2
#   dr_grpo: (0.9 + 0.1 * (3/2 - ln2)) / 8
#   dapo:    0.18 + 0.1 * (3/2 - ln2) / 5
KL_GAP = [[LN2, 0.0, -LN2], [0.0, LN2, 5.0]]
EXPECTED_KL = {
    "grpo": 7 / 15 + 0.1 * (1 / 6 + (1 - LN2) / 2) / 2,
    "dr_grpo": (0.9 + 0.1 * (1.5 - LN2)) / 8,
    "dapo": 0.18 + 0.1 * (1.5 - LN2) / 5,
}


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo"])
def test_kl_term_by_hand(name):
    logp, old, adv, mask = _inputs()
    ref = logp.detach() + torch.tensor(KL_GAP, dtype=F64)
    out = build_loss(name, beta=0.1, **KWARGS[name])(logp, old, adv, mask, ref_logprobs=ref)
    _close(out.loss, EXPECTED_KL[name])
    _close(out.metrics["kl"], (1.5 - LN2) / 5, 1e-6)
    # beta = 0: the reference only feeds the metric, the loss is unchanged.
    out0 = build_loss(name, **KWARGS[name])(logp, old, adv, mask, ref_logprobs=ref)
    _close(out0.loss, EXPECTED[name])
    _close(out0.metrics["kl"], (1.5 - LN2) / 5, 1e-6)


def test_epsilon_high_asymmetry():
    # epsilon_high=0.6 -> upper bound 1.6: row 0 t0 no longer clipped, loss -1.5 instead of -1.2.
    # grpo: ((-1.5 - 1.0 - 0.7)/3 + 3.8/2) / 2 = (-3.2/3 + 5.7/3) / 2 = 2.5/6 = 5/12.
    out = GRPOLoss(epsilon=0.2, epsilon_high=0.6)(*_inputs())
    _close(out.loss, 5 / 12)
    assert (out.metrics["clip_ratio_high"], out.metrics["clip_ratio_low"]) == (0.0, 0.2)
    # epsilon=0.6, epsilon_high=0.2 -> [0.4, 1.2]: row 1 t1 (0.5) unclipped -> loss 1.0;
    # dapo: (-1.2 - 1.0 - 0.7 + 2.2 + 1.0) / 5 = 0.3 / 5 = 0.06.
    out = DAPOLoss(epsilon=0.6, epsilon_high=0.2)(*_inputs())
    _close(out.loss, 0.06)
    assert (out.metrics["clip_ratio_high"], out.metrics["clip_ratio_low"]) == (0.2, 0.0)
    assert GRPOLoss(epsilon=0.3).epsilon_high == 0.3


def _random_batch(rows=6, cols=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, cols, generator=gen, dtype=F64) * 3
    logp = (old + 0.4 * torch.randn(rows, cols, generator=gen, dtype=F64)).requires_grad_()
    ref = old + 0.2 * torch.randn(rows, cols, generator=gen, dtype=F64)
    adv = torch.randn(rows, generator=gen, dtype=F64)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = (torch.arange(cols) < lengths[:, None]).float()
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("name", ALL)
def test_micro_batches_sum_to_full_batch(name):
    # with the KL, the entropy bonus and the mismatch correction on: every term adds up
    extra = {} if name == "cispo" else {"epsilon_high": 0.28}
    mismatch = {"mode": "truncate", "level": "sequence", "cap": 1.1}
    loss_fn = build_loss(
        name, beta=0.05, entropy_coef=0.01, mismatch=mismatch, **extra, **KWARGS[name]
    )
    logp, old, adv, mask, ref = _random_batch()
    ent = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    engine = old + 0.1 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(2))
    more = {"entropy": ent, "sampling_logprobs": engine}
    full = loss_fn(logp, old, adv, mask, ref_logprobs=ref, **more).loss
    full.backward()
    full_grad = logp.grad.clone()
    logp.grad = None
    totals = {"num_sequences": 6, "num_tokens": int(mask.sum())}
    parts = []
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        pieces = {k: v[rows] for k, v in more.items()}
        part = loss_fn(logp[rows], old[rows], adv[rows], mask[rows], ref[rows], **totals, **pieces)
        part = part.loss
        part.backward()
        parts.append(part.item())
    _close(sum(parts), full.item())
    torch.testing.assert_close(logp.grad, full_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_padding_garbage_never_leaks(name):
    logp, old, adv, mask = _inputs()
    loss_fn = build_loss(name, entropy_coef=0.1, **KWARGS[name])
    ent = torch.ones_like(old)
    clean = loss_fn(logp, old, adv, mask, entropy=ent).loss
    logp_bad, old_bad, ent_bad = logp.detach().clone(), old.clone(), ent.clone()
    logp_bad[1, 2], old_bad[1, 2], ent_bad[1, 2] = float("-inf"), float("nan"), float("inf")
    logp_bad.requires_grad_()
    engine = old.clone()
    engine[1, 2] = float("nan")
    out = loss_fn(logp_bad, old_bad, adv, mask, entropy=ent_bad, sampling_logprobs=engine)
    out.loss.backward()
    _close(out.loss, clean.item())
    assert torch.isfinite(logp_bad.grad).all() and logp_bad.grad[1, 2] == 0


@pytest.mark.parametrize("name", ALL)
def test_fully_masked_batch_gives_zero(name):
    logp, old, adv, mask = _inputs()
    out = build_loss(name, **KWARGS[name])(logp, old, adv, torch.zeros_like(mask))
    assert out.loss.item() == 0.0
    assert out.metrics["clip_ratio"] == 0.0


def test_each_variant_by_its_name_and_class():
    assert set(LOSSES) == {"grpo", "dr_grpo", "dapo", "gspo", "cispo"}
    loss = build_loss("dr_grpo", max_tokens=7, beta=0.2)
    assert isinstance(loss, DrGRPOLoss) and isinstance(loss, PolicyLoss)
    assert (loss.max_tokens, loss.beta, loss.epsilon_high) == (7, 0.2, 0.2)
    assert isinstance(build_loss("gspo"), GRPOLoss) and build_loss("cispo").max_weight == 5.0


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: GRPOLoss(epsilon=-0.1), r"epsilon=-0.1"),
        (lambda: DAPOLoss(epsilon_high=-1.0), r"epsilon_high=-1.0"),
        (lambda: GRPOLoss(beta=float("nan")), r"beta=nan"),
        (lambda: DrGRPOLoss(max_tokens=0), r"max_tokens=0"),
        (lambda: DrGRPOLoss(max_tokens=2.5), r"max_tokens=2.5"),
        (lambda: DAPOLoss(entropy_coef=-1), r"entropy_coef=-1 must be finite"),
        (lambda: CISPOLoss(max_weight=0), r"CISPOLoss: max_weight=0 must be a number > 0"),
        (
            lambda: GSPOLoss(mismatch={"mode": "cap", "level": "row", "cap": 0}),
            r"GSPOLoss: mismatch.mode must be one of none, truncate, mask; got 'cap'; "
            r"mismatch.level must be one of token, sequence; got 'row'; "
            r"mismatch.cap must be a number > 0, got 0",
        ),
    ],
)
def test_rejects_bad_config(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_rejects_bad_call_inputs():
    logp, old, adv, mask = _inputs()
    loss = GRPOLoss()
    with pytest.raises(ValueError, match=r"mask shape \(2, 2\)"):
        loss(logp, old, adv, mask[:, :2])
    with pytest.raises(ValueError, match=r"advantages shape \(3,\)"):
        loss(logp, old, torch.ones(3, dtype=F64), mask)
    with pytest.raises(ValueError, match=r"old_logprobs shape.*ref_logprobs shape"):
        loss(logp, old[:1], adv, mask, ref_logprobs=old[:, :1])
    with pytest.raises(ValueError, match=r"ref_logprobs is required when beta=0.1"):
        GRPOLoss(beta=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"num_tokens=0"):
        DAPOLoss()(logp, old, adv, mask, num_tokens=0)
    with pytest.raises(ValueError, match=r"num_sequences=-2"):
        DAPOLoss()(logp, old, adv, mask, num_sequences=-2)
    with pytest.raises(ValueError, match=r"logprobs must be a 2-D"):
        loss(logp[0], old, adv, mask)
    with pytest.raises(ValueError, match=r"entropy is required when entropy_coef=0.1"):
        GRPOLoss(entropy_coef=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"entropy shape.*sampling_logprobs shape \(2, 1\)"):
        loss(logp, old, adv, mask, entropy=old[:1], sampling_logprobs=old[:, :1])


# ------------------------------------------------------------------ GSPO and CISPO by hand
# GSPO: one ratio per sequence, the geometric mean of the token ratios (padding left out):
#   s0 = (1.5 * 1.0 * 0.7)^(1/3) = 1.05^(1/3) ~ 1.0164      s1 = (1.1 * 0.5)^(1/2) = 0.55^(1/2) ~ 0.7416
# epsilon=0.3 -> [0.7, 1.3]: neither is clipped. Per-token loss -s*A on each of a row's tokens:
#   row 0: -s0 (token mean -s0), row 1: +2 s1 (token mean 2 s1); grpo mean over 2 sequences:
#   loss = (-1.05^(1/3) + 2 * 0.55^(1/2)) / 2
# Gradient: value s on every token, d/dlogp_t = s (stop-gradient form); grpo's 1 / (n_i * R):
#   row 0 tokens: -1 * s0 / (3 * 2) = -s0 / 6       row 1 tokens: 2 * s1 / (2 * 2) = s1 / 2
# epsilon=0.2 -> [0.8, 1.2]: s1 < 0.8 with A < 0 is clipped: row 1 gives 1.6 and no gradient.
S0, S1 = 1.05 ** (1 / 3), 0.55**0.5


def test_gspo_by_hand():
    logp, old, adv, mask = _inputs()
    out = GSPOLoss(epsilon=0.3)(logp, old, adv, mask)
    _close(out.loss, (-S0 + 2 * S1) / 2)
    out.loss.backward()
    want = torch.tensor([[-S0 / 6] * 3, [S1 / 2, S1 / 2, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, want, rtol=0, atol=1e-12)
    _close(out.metrics["ratio_mean"], (3 * S0 + 2 * S1) / 5, 1e-9)  # token-weighted
    logp.grad = None
    out = GSPOLoss()(logp, old, adv, mask)
    _close(out.loss, (-S0 + 1.6) / 2)
    _close(out.metrics["clip_ratio_low"], 2 / 5)  # both of row 1's tokens
    out.loss.backward()
    want[1] = 0.0
    torch.testing.assert_close(logp.grad, want, rtol=0, atol=1e-12)


# CISPO, max_weight=1.2: weights min(ratio, 1.2) = [1.2, 1.0, 0.7], [1.1, 0.5]; per-token loss
# -w * A * logp with logp = old + log(ratio); dapo: sum / 5 tokens. Gradient -w * A / 5:
#   row 0: -1.2/5, -1/5, -0.7/5      row 1: 2 * 1.1/5 = 0.44, 2 * 0.5/5 = 0.2      padding 0
# Only row 0 t0 (1.5 > 1.2) is capped: clip_ratio_high 1/5.
def test_cispo_by_hand():
    logp, old, adv, mask = _inputs()
    out = CISPOLoss(max_weight=1.2)(logp, old, adv, mask)
    row0 = -(1.2 * (-0.3 + math.log(1.5)) + 1.0 * -1.2 + 0.7 * (-0.5 + math.log(0.7)))
    row1 = 2 * (1.1 * (-2.0 + math.log(1.1)) + 0.5 * (-0.1 + LN2 * -1))
    _close(out.loss, (row0 + row1) / 5)
    out.loss.backward()
    want = torch.tensor([[-0.24, -0.2, -0.14], [0.44, 0.2, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, want, rtol=0, atol=1e-12)
    assert (out.metrics["clip_ratio_high"], out.metrics["clip_ratio_low"]) == (0.2, 0.0)


# ----------------------------------------------------------- mismatch correction by hand
# The engine's log-probs are set so that rho = exp(old - engine) is, per token,
#   row 0: 2.0, 1.0, 4.0      row 1: 0.5, 3.5, (padding)            cap 3.
# GRPO's per-token policy terms (above): row 0 [-1.2, -1.0, -0.7], row 1 [2.2, 1.6].
# token truncate: w = [2, 1, 3], [0.5, 3]: row 0 (-2.4 - 1.0 - 2.1)/3, row 1 (1.1 + 4.8)/2
#   -> (-5.5/3 + 5.9/2) / 2 = 6.7/12; is_ratio_mean (2+1+3+0.5+3)/5 = 1.9; capped 2/5
# token mask: w = [2, 1, 0], [0.5, 0]: (-3.4/3 + 1.1/2) / 2 = -1.75/6; mean 3.5/5; capped 2/5
# sequence (products 2*1*4 = 8 and 0.5*3.5 = 1.75):
#   truncate: w0 = 3, w1 = 1.75: (3 * -2.9/3 + 1.75 * 3.8/2) / 2 = (-2.9 + 3.325) / 2 = 0.2125;
#             mean (3*3 + 2*1.75)/5 = 2.5; capped: row 0's 3 tokens, 3/5
#   mask:     w0 = 0, w1 = 1.75: 3.325 / 2 = 1.6625; mean 3.5/5 = 0.7; capped 3/5
# none: w = 1, the plain loss 7/15.
RHO = [[2.0, 1.0, 4.0], [0.5, 3.5, 100.0]]
MISMATCH = {
    ("truncate", "token"): (6.7 / 12, 1.9, 0.4),
    ("mask", "token"): (-1.75 / 6, 0.7, 0.4),
    ("truncate", "sequence"): (0.2125, 2.5, 0.6),
    ("mask", "sequence"): (1.6625, 0.7, 0.6),
    ("none", "token"): (7 / 15, 1.0, 0.0),
}


@pytest.mark.parametrize(("mode", "level"), list(MISMATCH))
def test_mismatch_by_hand(mode, level):
    logp, old, adv, mask = _inputs()
    engine = old - torch.tensor(RHO, dtype=F64).log()
    loss_fn = GRPOLoss(mismatch=MismatchSettings(mode=mode, level=level, cap=3.0))
    out = loss_fn(logp, old, adv, mask, sampling_logprobs=engine)
    loss, ratio_mean, capped = MISMATCH[mode, level]
    _close(out.loss, loss)
    _close(out.metrics["is_ratio_mean"], ratio_mean, 1e-9)
    _close(out.metrics["is_capped"], capped, 1e-9)
    # without the engine's log-probs nothing is weighted, and no is_* metric appears
    plain = loss_fn(logp, old, adv, mask)
    _close(plain.loss, 7 / 15)
    assert "is_ratio_mean" not in plain.metrics


def test_mismatch_weights_scale_the_gradient_but_never_receive_it():
    # token truncate: the grpo gradient (test_grpo_gradient_by_hand) times w = [2, 1, 3], [0.5, 3]
    logp, old, adv, mask = _inputs()
    engine = (old - torch.tensor(RHO, dtype=F64).log()).requires_grad_()
    out = GRPOLoss(mismatch={"mode": "truncate", "level": "token"})(
        logp, old, adv, mask, sampling_logprobs=engine
    )
    out.loss.backward()
    want = torch.tensor([[0.0, -1 / 6, -2.1 / 6], [0.275, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, want, rtol=0, atol=1e-12)
    assert engine.grad is None


def test_mismatch_defaults_are_trls():
    assert MismatchSettings() == MismatchSettings(mode="mask", level="sequence", cap=3.0)
    assert GRPOLoss().mismatch == MismatchSettings()


# ------------------------------------------------------------------ entropy bonus by hand
# H = [[0.5, 1.0, 1.5], [2.0, 0.25, (padding)]], mean over the 5 tokens 5.25/5 = 1.05.
# entropy_coef=0.1 lowers any loss by 0.105 (a token mean over the batch, whatever the
# aggregation): dapo 0.18 - 0.105 = 0.075, grpo 7/15 - 0.105. d loss / d H = -0.1/5 = -0.02.
def test_entropy_bonus_by_hand():
    logp, old, adv, mask = _inputs()
    ent = torch.tensor([[0.5, 1.0, 1.5], [2.0, 0.25, 9.0]], dtype=F64, requires_grad=True)
    out = DAPOLoss(entropy_coef=0.1)(logp, old, adv, mask, entropy=ent)
    _close(out.loss, 0.075)
    _close(out.metrics["entropy"], 1.05, 1e-9)
    out.loss.backward()
    want = torch.tensor([[-0.02] * 3, [-0.02, -0.02, 0.0]], dtype=F64)
    torch.testing.assert_close(ent.grad, want, rtol=0, atol=1e-12)
    _close(GRPOLoss(entropy_coef=0.1)(logp, old, adv, mask, entropy=ent).loss, 7 / 15 - 0.105)
    # entropy_coef=0: the entropy only feeds the metric
    plain = GRPOLoss()(logp, old, adv, mask, entropy=ent)
    _close(plain.loss, 7 / 15)
    _close(plain.metrics["entropy"], 1.05, 1e-9)


def test_new_losses_are_picked_by_class_path_with_their_settings():
    # what LightningCLI does with `loss: {class_path: ..., init_args: ...}` in a YAML file
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--loss", type=PolicyLoss)
    built = []
    for name, init in [
        ("GSPOLoss", {"epsilon": 3e-4, "mismatch": {"mode": "truncate"}}),
        ("CISPOLoss", {"max_weight": 4.0, "entropy_coef": 0.01}),
    ]:
        value = {"class_path": f"coscale.rl.losses.{name}", "init_args": init}
        built.append(parser.instantiate_classes(parser.parse_object({"loss": value})).loss)
    gspo, cispo = built
    assert type(gspo) is GSPOLoss and gspo.epsilon == 3e-4
    assert gspo.mismatch == MismatchSettings(mode="truncate", level="sequence", cap=3.0)
    assert type(cispo) is CISPOLoss and (cispo.max_weight, cispo.entropy_coef) == (4.0, 0.01)


def test_a_class_path_mapping_is_built_and_anything_else_refused_named():
    spec = {"class_path": "coscale.rl.losses.DrGRPOLoss", "init_args": {"max_tokens": 8}}
    loss = as_loss(spec)
    assert isinstance(loss, DrGRPOLoss) and loss.max_tokens == 8
    assert as_loss(loss) is loss and as_loss(None) is None
    with pytest.raises(ValueError, match=r"loss must be a PolicyLoss or a class_path mapping"):
        as_loss({"init_args": {}})
    with pytest.raises(ValueError, match=r"loss class_path='torch.nn.Linear' names no PolicyLoss"):
        as_loss({"class_path": "torch.nn.Linear"})
