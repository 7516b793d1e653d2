"""coscale's losses against TRL 1.16's own loss code: the same inputs give the same loss and the
same gradient (float32, within 1e-6).

TRL's code runs, not a copy of it: ``GRPOTrainer._compute_loss`` (and, for the engine/trainer
mismatch correction, ``GRPOTrainer._generate_and_score_completions``, where TRL computes its
importance-sampling ratio) are called unbound on a stub ``self`` holding only the attributes
they read, for one process without gradient accumulation. The stub's model forward
(``_get_per_token_logps_and_entropies``) returns the test's tensors; the log-probs and entropies
handed to ``_compute_loss`` are leaves, so the gradient w.r.t. them is compared.

The TRL settings that give coscale's numbers (TRL -> coscale):

- ``loss_type="grpo"`` -> :class:`GRPOLoss`; ``"dr_grpo"`` with ``max_completion_length=M`` ->
  ``DrGRPOLoss(max_tokens=M)``; ``"dapo"`` and ``"bnpo"`` -> :class:`DAPOLoss` (on one process
  without accumulation TRL's dapo normaliser, ``num_items_in_batch``, and bnpo's local token
  count are both the batch's token count, coscale's ``num_tokens``);
- ``loss_type="grpo", importance_sampling_level="sequence"`` -> :class:`GSPOLoss`;
- ``loss_type="cispo", epsilon_high=X`` -> ``CISPOLoss(max_weight=X)`` (TRL reads ``epsilon_high``
  as the cap itself under cispo);
- ``epsilon`` / ``epsilon_high`` -> ``epsilon`` / ``epsilon_high``; ``entropy_coef`` the same;
- ``beta > 0`` needs ``use_bias_correction_kl=False``: TRL's default (True) multiplies the KL by
  the ratio, coscale never does;
- ``vllm_importance_sampling_mode="<level>_<mode>"``, ``vllm_importance_sampling_clip_max=C``,
  ``clip_min=None`` -> ``MismatchSettings(mode, level, cap=C)``, the old log-probs being the trainer's.

Advantages (TRL's ``scale_rewards``) are not part of the loss: both get the same ones. TRL's
``GRPOConfig`` defaults (``loss_type="dapo"``, ``sequence_mask`` at 3.0) are coscale's
``DAPOLoss()`` defaults, checked below.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl", reason="TRL is a dev dependency: pip install -e '.[dev]'")
with warnings.catch_warnings():  # TRL 1.16 warns at import about vLLM versions it has not seen
    warnings.simplefilter("ignore", UserWarning)
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

from coscale.rl.losses import (
    CISPOLoss,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    GSPOLoss,
    MismatchSettings,
)

ATOL = 1e-6
MAX_LEN = 16  # TRL's max_completion_length, DrGRPOLoss's max_tokens
# (TRL settings, coscale loss class and arguments) for each shared loss; epsilon 0.2 / 0.28
LOSSES = {
    "grpo": ({"loss_type": "grpo"}, GRPOLoss, {"epsilon_high": 0.28}),
    "dr_grpo": (
        {"loss_type": "dr_grpo"},
        DrGRPOLoss,
        {"max_tokens": MAX_LEN, "epsilon_high": 0.28},
    ),
    "dapo": ({"loss_type": "dapo"}, DAPOLoss, {"epsilon_high": 0.28}),
    "bnpo": ({"loss_type": "bnpo"}, DAPOLoss, {"epsilon_high": 0.28}),
    "gspo": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        GSPOLoss,
        {"epsilon_high": 0.28},
    ),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 1.3}, CISPOLoss, {"max_weight": 1.3}),
}
TERMS = {"plain": (0.0, 0.0), "kl+entropy": (0.04, 0.01)}  # (beta, entropy_coef)
# (R x T: completion lengths): right padding, one shape with an empty completion
SHAPES = {"4x7": [7, 3, 0, 5], "6x12": [12, 1, 9, 4, 12, 6]}


def _trl_self(
    loss: str, beta: float, entropy_coef: float, mismatch: MismatchSettings | None = None
):
    """A stub ``self`` for TRL's methods: one process, no gradient accumulation, the settings
    of ``LOSSES[loss]`` (TRL's ``epsilon=0.2, epsilon_high=0.28`` unless it sets its own)."""
    settings = {"importance_sampling_level": "token", "epsilon_high": 0.28} | LOSSES[loss][0]
    args = SimpleNamespace(
        use_bias_correction_kl=False, delta=None, steps_per_generation=1,
        gradient_accumulation_steps=1, per_device_train_batch_size=8,
        gradient_checkpointing_kwargs=None,
    )  # fmt: skip
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), num_processes=1, process_index=0,
        gather=lambda x: x, reduce=lambda x, reduction: x, gather_for_metrics=lambda x: x,
        sync_gradients=True,
    )  # fmt: skip
    return SimpleNamespace(
        **settings, args=args, accelerator=accelerator, beta=beta, epsilon_low=0.2,
        max_completion_length=MAX_LEN, entropy_coef=entropy_coef,
        _entropy_bonus_enabled=entropy_coef != 0.0, use_adaptive_entropy=False,
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        current_gradient_accumulation_steps=1, model=_model(), ref_model=_model(),
        use_vllm=mismatch is not None, vllm_importance_sampling_correction=mismatch is not None,
        vllm_importance_sampling_mode=mismatch and f"{mismatch.level}_{mismatch.mode}",
        vllm_importance_sampling_clip_max=mismatch and mismatch.cap,
        vllm_importance_sampling_clip_min=None,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )  # fmt: skip


def _model():
    return SimpleNamespace(training=True, is_gradient_checkpointing=False)


def _batch(lengths: list[int], seed: int):
    """Random float32 inputs for R = len(lengths) rollouts of T = max(lengths) completion tokens; the
    padding holds values of the same spread (both sides must ignore them)."""
    gen = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    old = -torch.rand(b, t, generator=gen) * 3  # [R, T] trainer's old log-probs
    drift = 0.3 * randn(b, 1)  # [R, 1] a row's shift: GSPO's sequence ratios leave the clip range
    return {
        "mask": (torch.arange(t) < torch.tensor(lengths)[:, None]).long(),  # [R, T]
        "logp": old + 0.3 * randn(b, t) + drift,  # [R, T] current policy
        "old": old,
        "ref": old + 0.2 * randn(b, t),  # [R, T] reference policy
        "engine": old + 0.5 * randn(b, t),  # [R, T] the engine's view of the sampled tokens
        "entropy": 2 * torch.rand(b, t, generator=gen),  # [R, T]
        "advantages": randn(b).abs() * drift.squeeze(1).sign(),  # [R] the clip's side
        "rewards": torch.rand(b, 1, generator=gen),  # [R, 1] one reward function
    }


def _trl_loss(stub, x, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's ``_compute_loss`` on ``inputs``, its forward returning ``x``'s log-probs and
    entropies as leaves -> (loss, grad w.r.t. log-probs, grad w.r.t. entropies)."""
    logp = x["logp"].clone().requires_grad_()
    entropy = x["entropy"].clone().requires_grad_()
    stub._get_per_token_logps_and_entropies = lambda model, *a, **k: (logp, entropy, None)
    loss = GRPOTrainer._compute_loss(stub, _model(), inputs)
    return loss.detach(), *_grads(loss, logp, entropy)


def _coscale_loss(loss_fn, x, advantages, sampling=None):
    logp = x["logp"].clone().requires_grad_()
    entropy = x["entropy"].clone().requires_grad_()
    out = loss_fn(
        logp, x["old"], advantages, x["mask"], ref_logprobs=x["ref"], entropy=entropy,
        sampling_logprobs=sampling,
    )  # fmt: skip
    return out.loss.detach(), *_grads(out.loss, logp, entropy), out.metrics


def _grads(loss, logp, entropy):
    """d loss / d (log-probs, entropies); zeros where the loss does not depend on one."""
    grads = torch.autograd.grad(loss, [logp, entropy], allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (logp, entropy))]


def _coscale(loss: str, beta: float, entropy_coef: float, mismatch=MismatchSettings()):
    _, cls, kwargs = LOSSES[loss]
    return cls(beta=beta, entropy_coef=entropy_coef, mismatch=mismatch, **kwargs)


def _assert_same(trl, ours, what):
    for name, a, b in zip(("loss", "grad logp", "grad entropy"), trl, ours):
        diff = float((a - b).abs().max())
        assert diff <= ATOL, f"{what}: {name} differs by {diff:.3g}"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("terms", list(TERMS))
@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_and_gradient_equal_trls(loss, terms, shape):
    beta, entropy_coef = TERMS[terms]
    x = _batch(SHAPES[shape], seed=len(SHAPES[shape]))
    b, t = x["mask"].shape
    inputs = {
        "prompt_ids": torch.ones(b, 3, dtype=torch.long),
        "prompt_mask": torch.ones(b, 3, dtype=torch.long),
        "completion_ids": torch.ones(b, t, dtype=torch.long),
        "completion_mask": x["mask"],
        "advantages": x["advantages"],
        "old_per_token_logps": x["old"],
        "ref_per_token_logps": x["ref"],
        "num_items_in_batch": x["mask"].sum(),
    }
    trl = _trl_loss(_trl_self(loss, beta, entropy_coef), x, inputs)
    *ours, metrics = _coscale_loss(_coscale(loss, beta, entropy_coef), x, x["advantages"])
    _assert_same(trl, ours, f"{loss} {terms} {shape}")
    # the inputs reach the clip (or CISPO's cap) on some tokens and not on others
    assert 0 < metrics["clip_ratio"] < 1, metrics


def _generated(x, lengths):
    """What TRL's ``_generate`` returns for ``x``: prompts of 2-4 tokens, the completions, the
    engine's log-probs of each completion token, no tools or images."""
    prompts = [[5] * (2 + i % 3) for i in range(len(lengths))]
    completions = [[7] * n for n in lengths]
    engine = [x["engine"][i, :n].tolist() for i, n in enumerate(lengths)]
    return prompts, completions, None, ["text"] * len(lengths), engine, {}, None, None


MISMATCH = [(m, lv) for m in ("truncate", "mask") for lv in ("token", "sequence")]


@pytest.mark.parametrize(("mode", "level"), MISMATCH)
@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "gspo", "cispo"])
def test_mismatch_correction_equals_trls(loss, mode, level):
    """TRL's ratio comes from its ``_generate_and_score_completions`` (vLLM's log-probs against
    the trainer's recomputed ones), its loss from ``_compute_loss`` on that method's output."""
    lengths = [6, 2, 5, 6, 3, 4]  # 3 prompts x 2 generations, no empty completion
    x = _batch(lengths, seed=7)
    mismatch = MismatchSettings(mode=mode, level=level, cap=2.0)
    stub = _trl_self(loss, 0.04, 0.01, mismatch)
    no_grad_passes = {id(stub.model): x["old"], id(stub.ref_model): x["ref"]}

    def forward(model, *args, **kwargs):  # the trainer's old log-probs, the reference's
        return no_grad_passes[id(model)], None, None

    stub._get_per_token_logps_and_entropies = forward
    stub._generate = lambda prompts: _generated(x, lengths)
    stub._calculate_rewards = lambda *a: x["rewards"]
    stub.__dict__.update(
        environment_factories=None, tools=[], environments=[], _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None, mask_truncated_completions=False, num_iterations=1,
        num_generations=2, multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(1), scale_rewards="group", reward_func_names=["r"],
        _logs={"prompt": [], "completion": [], "advantages": [], "rewards": defaultdict(list),
               "extra": defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False,
    )  # fmt: skip
    inputs = GRPOTrainer._generate_and_score_completions(stub, [{"prompt": "p"}] * len(lengths))
    assert torch.equal(inputs["completion_mask"], x["mask"])
    assert torch.equal(inputs["old_per_token_logps"], x["old"])
    trl = _trl_loss(stub, x, inputs)
    engine = torch.where(x["mask"].bool(), x["engine"], 0)  # [R, T] as a Rollouts holds them
    loss_fn = _coscale(loss, 0.04, 0.01, mismatch)
    *ours, metrics = _coscale_loss(loss_fn, x, inputs["advantages"], engine)
    assert 0 < metrics["is_capped"] < 1, metrics  # the cap acts on some tokens, not all
    plain = _coscale_loss(loss_fn, x, inputs["advantages"])  # the correction matters
    assert float((plain[1] - ours[1]).abs().max()) > 1e-3
    if loss == "gspo" and level == "token":
        # GSPO with token weights: the same loss, but coscale weights each token's gradient by
        # its own weight (the GSPO-token form: a token masked out gets none), while TRL's ratio
        # exp(mean log-ratio) spreads the row's weighted gradient evenly over its tokens. The
        # policy term's gradient of a row in TRL is then coscale's row mean; KL and entropy
        # terms are per token in both, the same.
        keep = x["mask"].bool()
        no_terms = _coscale(loss, 0.0, 0.0, mismatch)
        policy = _coscale_loss(no_terms, x, inputs["advantages"], engine)[1]  # [R, T]
        rows = policy.sum(1, keepdim=True) / keep.sum(1, keepdim=True)  # [R, 1]
        ours[1] = ours[1] - policy + torch.where(keep, rows, 0)  # [R, T]
        assert float((policy - torch.where(keep, rows, 0)).abs().max()) > 1e-3  # not the same
    _assert_same(trl, ours, f"{loss} {mode} {level}")


def test_trl_defaults_are_coscales_dapo_defaults():
    defaults = {k: f.default for k, f in GRPOConfig.__dataclass_fields__.items()}
    assert defaults["loss_type"] == DAPOLoss.name
    loss = DAPOLoss()
    trl_high = defaults["epsilon_high"] or defaults["epsilon"]
    assert (loss.epsilon, loss.epsilon_high) == (defaults["epsilon"], trl_high)
    assert (loss.beta, loss.entropy_coef) == (defaults["beta"], defaults["entropy_coef"])
    assert defaults["vllm_importance_sampling_correction"] is True
    level, mode = defaults["vllm_importance_sampling_mode"].split("_")
    assert loss.mismatch == MismatchSettings(
        mode, level, defaults["vllm_importance_sampling_clip_max"]
    )
    assert defaults["vllm_importance_sampling_clip_min"] is None  # coscale has no lower bound
