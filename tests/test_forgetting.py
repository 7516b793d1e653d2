"""Forgetting guard: hand-worked masks, the first-order promise of a masked SGD step, the mastered
set, and SFTModule's ``forgetting_guard`` option (off: the same weights as without the option)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.curriculum import Curriculum
from coscale.loop.problem import Problem
from coscale.modules import SFTModule
from coscale.modules import sft as sft_module
from coscale.sft.batch import token_mean_loss, tokenize_pairs
from coscale.sft.forgetting import (
    ForgettingGuard,
    guarded_parameters,
    keep_mask,
    reference_gradient,
)
from coscale.tasks import arithmetic

T, F = True, False


def conflict_masks(g_new, g_old, granularity) -> dict[str, torch.Tensor]:
    """:func:`keep_mask` of every name both gradients have (as ``ForgettingGuard`` masks)."""
    return {
        name: keep_mask(g, g_old[name], granularity) for name, g in g_new.items() if name in g_old
    }


def masked_fraction(masks, total=None) -> float:
    """Share of coordinates frozen by ``masks``, over ``total`` (default: theirs)."""
    frozen = sum(int((~m).sum()) for m in masks.values())
    total = sum(m.numel() for m in masks.values()) if total is None else total
    return frozen / total if total else 0.0


def test_parameter_mask_hand_worked():
    g_new = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
    g_old = torch.tensor([[2.0, 1.0], [-1.0, 5.0]])
    # products [[2, -2], [-3, 0]]: keep where >= 0 (a zero product is not a conflict)
    mask = keep_mask(g_new, g_old, "parameter")
    assert mask.tolist() == [[T, F], [F, T]]
    assert masked_fraction({"w": mask}) == 0.5


def test_neuron_mask_hand_worked():
    g_new = torch.tensor([[1.0, -2.0], [3.0, 1.0], [1.0, 1.0]])
    g_old = torch.tensor([[2.0, 1.0], [-1.0, 5.0], [-1.0, -1.0]])
    # row sums of the products: 2-2=0 (kept), -3+5=2 (kept), -1-1=-2 (frozen)
    mask = keep_mask(g_new, g_old, "neuron")
    assert mask.tolist() == [[T, T], [T, T], [F, F]]
    assert masked_fraction({"w": mask}) == pytest.approx(2 / 6, abs=1e-12)
    # a conv-like [out=2, in=1, k=2] weight: row sums 1*1+1*(-3)=-2 (frozen), 2*1+(-1)*1=1 (kept)
    conv = keep_mask(
        torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]]]),
        torch.tensor([[[1.0, -3.0]], [[1.0, 1.0]]]),
        "neuron",
    )
    assert conv.tolist() == [[[F, F]], [[T, T]]]


def test_one_dimensional_params_are_masked_per_entry_at_both_granularities():
    g_new, g_old = torch.tensor([1.0, -1.0, 0.0]), torch.tensor([-1.0, -1.0, 3.0])
    # products [-1, 1, 0]: each entry of a bias / norm scale is its own output unit
    for granularity in ("parameter", "neuron"):
        assert keep_mask(g_new, g_old, granularity).tolist() == [F, T, T]


def test_conflict_masks_over_names_and_fraction_over_a_total():
    g_new = {"a": torch.tensor([1.0, -1.0]), "b": torch.tensor([2.0])}
    masks = conflict_masks(g_new, {"a": torch.tensor([1.0, 1.0])}, "parameter")
    assert list(masks) == ["a"] and masks["a"].tolist() == [T, F]  # no g_old for b: not masked
    assert masked_fraction(masks, total=3) == pytest.approx(1 / 3, abs=1e-12)


def test_bad_granularity_and_shape_are_rejected():
    with pytest.raises(
        ValueError, match=r"granularity must be one of parameter, neuron; got 'row'"
    ):
        keep_mask(torch.ones(2), torch.ones(2), "row")
    with pytest.raises(ValueError, match=r"g_new \(2,\) and g_old \(3,\) differ"):
        keep_mask(torch.ones(2), torch.ones(3), "parameter")
    with pytest.raises(ValueError, match="call set_reference first"):
        ForgettingGuard(torch.nn.Linear(1, 1), "parameter").mask_gradients()


def _two_layers() -> torch.nn.Sequential:
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1, bias=False))
    net[0].weight.requires_grad_(False)  # frozen: never guarded, even with a grad set
    return net


def test_frozen_params_and_params_without_grad_are_skipped():
    net = _two_layers()
    assert list(guarded_parameters(net)) == ["0.bias", "1.weight"]
    net[0].weight.grad = torch.full((2, 2), -1.0)
    net[1].weight.grad = torch.tensor([[1.0, -1.0]])  # 0.bias has no grad: skipped
    guard = ForgettingGuard(net, "parameter")
    guard.set_reference({"0.weight": torch.ones(2, 2), "1.weight": torch.tensor([[1.0, 1.0]])})
    assert guard.mask_gradients() == 0.5  # 1 of the 2 coordinates of 1.weight
    assert net[1].weight.grad.tolist() == [[1.0, 0.0]]
    assert net[0].weight.grad.tolist() == [[-1.0, -1.0], [-1.0, -1.0]]  # untouched


def test_masked_coordinates_stay_frozen_through_an_adamw_step():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, weight_decay=0.5)
    lin.weight.grad = torch.ones(2, 3)
    opt.step()  # momentum that would move every coordinate on the next step
    before = lin.weight.detach().clone()
    lin.weight.grad = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 1.0]])
    guard = ForgettingGuard(lin, "parameter")
    guard.set_reference({"weight": torch.tensor([[1.0, -1.0, 1.0], [1.0, 1.0, 1.0]])})
    assert guard.mask_gradients() == pytest.approx(2 / 6, abs=1e-12)
    opt.step()
    guard.restore()
    moved = lin.weight.detach() != before
    assert moved.tolist() == [[T, F, T], [T, F, T]]


def _loss_sum(model, tok, question: str, solution: str):
    """The SFT loss (sum over solution tokens, no EOS) of one pair."""

    def loss_sum(_batch):
        enc = tokenize_pairs(tok, [f"Q:{question}\nA:"], [solution], 64, add_eos=False)
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        loss, n = token_mean_loss(out.logits, enc["labels"])
        return loss * n, n

    return loss_sum


@pytest.mark.parametrize("granularity", [None, "parameter", "neuron"])
def test_masked_sgd_step_does_not_raise_the_mastered_loss(tiny_model, char_tokenizer, granularity):
    # mastered: "12+3" -> "1"; new: the same prompt -> "7". Raising "7" lowers "1" through the
    # softmax: the two gradients conflict (g_new . g_old < 0), so an unmasked step raises the
    # mastered loss; a masked one keeps only terms with g_new * g_old >= 0 (first order: <= 0).
    model = copy.deepcopy(tiny_model).double().train()
    params, lr = guarded_parameters(model), 1e-5
    old = _loss_sum(model, char_tokenizer, "12+3", "1")
    g_old, before = reference_gradient(params, [None], old)
    g_new, _ = reference_gradient(params, [None], _loss_sum(model, char_tokenizer, "12+3", "7"))
    masks = (
        conflict_masks(g_new, g_old, granularity)
        if granularity
        else {k: torch.ones_like(v, dtype=torch.bool) for k, v in g_new.items()}
    )
    first_order = -lr * sum(float((g_new[k] * g_old[k])[masks[k]].sum()) for k in g_new)
    with torch.no_grad():
        for name, p in params.items():
            p -= lr * g_new[name] * masks[name]
    change = reference_gradient(params, [None], old)[1] - before
    if granularity is None:
        assert change > 1e-6 and first_order > 0  # forgetting
    else:
        assert change < -1e-6 and 0.3 < masked_fraction(masks) < 0.6
    assert change == pytest.approx(first_order, rel=0.02)  # the step is in the linear regime


def test_reference_gradient_is_the_token_mean_over_batches():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    # batch (c, n): loss summed over its n tokens = c * (w0 + w1), gradient [c, c];
    # batches (1, 1) and (4, 3): gradient ([1, 1] + [4, 4]) / 4 tokens, loss (3 + 12) / 4
    grads, loss = reference_gradient(
        {"w": w}, [(1.0, 1), (4.0, 3)], lambda b: ((b[0] * w).sum(), b[1])
    )
    assert grads["w"].tolist() == pytest.approx([1.25, 1.25], abs=1e-6)
    assert loss == pytest.approx(3.75, abs=1e-6)
    assert w.grad is None  # autograd.grad: .grad (the new-data gradient) is left alone


def test_mastered_items_are_solved_problems_with_latest_correct_else_first_bank_solution():
    problems = {p.id: p for p in arithmetic.generate(4, (2,), 0, "m")}
    cur = Curriculum()
    cur.add_problems([*problems.values(), Problem("m-9", "9+9", "18")])
    pools, bank = cur.pools, cur.bank
    for i, pid in enumerate(problems):
        pools.record(pid, 10, [9, 9, 1, 8][i])  # m-2 unsolvable, the rest solved
        bank.add(pid, f"bank {i} a")
        bank.add(pid, f"bank {i} b")
    bank.record_rollout("m-1", "rl 1 old", True, step=1)
    bank.record_rollout("m-1", "rl 1 new", True, step=2)
    pools.record("m-9", 10, 10)  # solved but with no solution at all: left out
    got = cur.mastered()
    assert [(r["id"], r["solution"]) for r in got] == [
        ("m-0", "bank 0 a"),
        ("m-1", "rl 1 new"),
        ("m-3", "bank 3 a"),
    ]
    assert got[0]["question"] == problems["m-0"].question


# ------------------------------------------------------------------------- SFTModule option
def _fit(module, rows, steps, **trainer_kw):
    trainer = quiet_trainer(steps, **trainer_kw)
    loader = DataLoader(rows, batch_size=2, shuffle=False, collate_fn=list)
    trainer.fit(module, loader)
    return trainer


def _rows(n=4):
    return [
        {"question": p.question, "solution": arithmetic.solutions_of(p, 1)[0]}
        for p in arithmetic.generate(n, (3,), 0, "n")
    ]


def _module(tiny_model, tok, optimizer=None, **kw):
    kw = dict(verifier=lambda c, a: [0.0] * len(c)) | kw
    optimizer = {"lr": 1e-2, "weight_decay": 0.1} | (optimizer or {})
    return SFTModule(model=copy.deepcopy(tiny_model), tokenizer=tok, optimizer=optimizer, **kw)


class _WithoutGuard(SFTModule):
    """SFTModule with the guard's hooks replaced by LightningModule's: the module before it."""

    on_train_start = L.LightningModule.on_train_start
    on_before_optimizer_step = L.LightningModule.on_before_optimizer_step
    optimizer_step = L.LightningModule.optimizer_step
    on_train_end = L.LightningModule.on_train_end


def test_guard_off_gives_the_same_weights_as_without_the_option(tiny_model, char_tokenizer):
    mastered = _rows(2)
    weights = []
    for cls in (SFTModule, _WithoutGuard):
        torch.manual_seed(0)
        module = cls(
            model=copy.deepcopy(tiny_model), tokenizer=char_tokenizer, optimizer={"lr": 1e-2},
            mastered=mastered,
        )  # fmt: skip
        _fit(module, _rows(), 3, gradient_clip_val=0.5)
        weights.append(module.policy.state_dict())
        assert module.guard_report == {}
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_guard_parameter_first_adamw_step_keeps_the_mastered_loss(tiny_model, char_tokenizer):
    # AdamW's first step is -lr * g / (|g| + eps) per coordinate (weight decay 0): it keeps the
    # sign of the masked gradient, so every kept coordinate moves with the mastered gradient.
    mastered = [{"question": "12+3", "solution": "15"}]
    module = _module(
        tiny_model, char_tokenizer, optimizer={"lr": 1e-4, "weight_decay": 0.0},
        forgetting_guard={"mode": "parameter"}, mastered=mastered,
    )  # fmt: skip
    trainer = _fit(module, [{"question": "12+3", "solution": "73"}], 1)
    report = module.guard_report
    assert report["mastered_examples"] == 1.0
    assert report["mastered_loss_end"] < report["mastered_loss_start"]
    assert 0.3 < float(trainer.callback_metrics["train/masked_frac"]) < 0.6
    assert report["masked_frac_mean"] == pytest.approx(
        float(trainer.callback_metrics["train/masked_frac"]), abs=1e-6
    )


def test_guard_refreshes_the_mastered_gradient_every_n_steps(
    tiny_model, char_tokenizer, monkeypatch
):
    calls = []
    real = sft_module.reference_gradient

    def counting(params, batches, loss_sum):
        calls.append(sum(len(b) for b in batches))
        return real(params, batches, loss_sum)

    monkeypatch.setattr(sft_module, "reference_gradient", counting)
    module = _module(
        tiny_model,
        char_tokenizer,
        forgetting_guard={"mode": "neuron", "refresh_every": 2, "batch_size": 2},
        mastered=_rows(3),
    )
    _fit(module, _rows(8), 4)
    assert calls == [2, 2]  # at steps 0 and 2, two pairs each (the cycle of 3 wraps around)
    assert set(module.guard_report) == {
        "mastered_examples",
        "mastered_loss_start",
        "mastered_loss_end",
        "masked_frac_mean",
    }


def test_default_mastered_set_comes_from_the_datamodule(tiny_model, char_tokenizer):
    rows = [
        p.to_dict() | {"solutions": arithmetic.solutions_of(p, 2)}
        for p in arithmetic.generate(6, (2, 3), 0, "d")
    ]
    # an SFTModule is served the bank's pairs (one own solution per problem)
    dm = ProblemDataModule(train=rows, sft_batch_size=2, bank_solutions=1)
    dm.load()
    for pid in ("d-0", "d-3"):
        dm.curriculum.pools.record(pid, 10, 10)  # solved
    module = _module(tiny_model, char_tokenizer, forgetting_guard={"mode": "parameter"})
    quiet_trainer(1).fit(module, datamodule=dm)
    assert module.guard_report["mastered_examples"] == 2.0
    assert [r["id"] for r in dm.curriculum.mastered()] == ["d-0", "d-3"]


def test_empty_mastered_set_warns_and_trains_unguarded(tiny_model, char_tokenizer):
    module = _module(tiny_model, char_tokenizer, forgetting_guard={"mode": "neuron"}, mastered=[])
    with pytest.warns(UserWarning, match="mastered set is empty"):
        _fit(module, _rows(), 1)
    assert module.guard_report == {}


def test_bad_guard_settings_are_rejected_together(tiny_model, char_tokenizer):
    with pytest.raises(ValueError) as err:
        _module(
            tiny_model, char_tokenizer,
            forgetting_guard={"mode": "layer", "refresh_every": 0, "batch_size": True},
        )  # fmt: skip
    message = str(err.value)
    assert "forgetting_guard.mode must be one of none, parameter, neuron; got 'layer'" in message
    assert "forgetting_guard.refresh_every must be an int >= 1, got 0" in message
    assert "forgetting_guard.batch_size must be an int >= 1, got True" in message


# ------------------------------------------------------------------------------------ DDP
_DDP_WORKER = """
import json, os, sys
import lightning as L, torch
from torch.utils.data import DataLoader
from coscale.sft.forgetting import guarded_parameters, reference_gradient
from coscale.modules import SFTModule
from coscale.distributed import rank_world
from tests.test_forgetting import ddp_rows

class Probe(SFTModule):
    def on_train_start(self):  # each rank's share of the mastered set, then all-reduced
        rank, world = rank_world()
        params = guarded_parameters(self.policy)
        grads, _ = reference_gradient(params, [self.mastered[rank::world]], self._loss_sum)
        single = torch.load(sys.argv[3])
        self.gap = max(float((grads[k] - single[k]).abs().max()) for k in grads)
        super().on_train_start()

torch.set_num_threads(1)
module = Probe(model=sys.argv[1], optimizer={"lr": 1e-2},
               forgetting_guard={"mode": "neuron", "batch_size": 3},
               mastered=ddp_rows(5, 2, 1), verifier=lambda c, a: [0.0] * len(c))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=3, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, limit_val_batches=0)
trainer.fit(module, DataLoader(ddp_rows(12, 3, 0), batch_size=2, collate_fn=list))
state = {"gap": module.gap, "report": module.guard_report,
         "sum": float(sum(p.double().sum() for p in module.policy.parameters()))}
with open(os.path.join(sys.argv[2], "rank%d.json" % trainer.global_rank), "w") as f:
    json.dump(state, f)
"""


def ddp_rows(n: int, terms: int, seed: int) -> list[dict]:
    """Pairs of the DDP worker (also imported by it)."""
    return [
        {"question": p.question, "solution": arithmetic.solutions_of(p, 1)[0]}
        for p in arithmetic.generate(n, (terms,), seed, "x")
    ]


@pytest.mark.slow
def test_ddp_mastered_gradient_is_averaged_and_ranks_agree(tiny_model_dir, tmp_path):
    single = SFTModule(model=str(tiny_model_dir), verifier=lambda c, a: [0.0] * len(c))
    params = guarded_parameters(single.policy)
    grads, _ = reference_gradient(params, [ddp_rows(5, 2, 1)], single._loss_sum)
    torch.save(grads, tmp_path / "single.pt")
    script = tmp_path / "worker.py"
    script.write_text(_DDP_WORKER)
    root = str(Path(__file__).resolve().parents[1])
    # the repo (for `tests.test_forgetting`) and tests/ (for its sibling imports, as pytest has it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")])}
    run = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), str(tmp_path), str(tmp_path / "single.pt")],
        env=env, cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # the all-reduced shares equal the whole set's gradient in one process (float32 sums)
    assert r0["gap"] < 1e-6 and r1["gap"] < 1e-6
    assert r0["report"] == r1["report"] and r0["report"]["mastered_examples"] == 5.0
    assert r0["sum"] == pytest.approx(r1["sum"], abs=1e-9)  # the same masks on both ranks


def test_the_option_is_set_from_yaml_through_the_cli(tmp_path, monkeypatch):
    from coscale.app.cli import lightning_cli

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "configs" / "fit" / "sft_tiny.yaml"
    flags = [
        "--model.init_args.forgetting_guard.mode=neuron",
        "--model.init_args.forgetting_guard.refresh_every=5",
    ]
    cli = lightning_cli(["--config", str(config), *flags, "--trainer.logger=false"], run=False)
    assert (cli.model.guard.mode, cli.model.guard.refresh_every) == ("neuron", 5)
    saved = cli.model.hparams["forgetting_guard"]
    assert saved == {"mode": "neuron", "refresh_every": 5, "batch_size": 16}
    assert "mastered" not in cli.model.hparams
