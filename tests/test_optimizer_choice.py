"""An optimiser and a scheduler by class path, as a Lightning user gives them: LightningCLI's
top-level ``optimizer`` / ``lr_scheduler`` keys in ``coscale fit`` (SFT's automatic and GRPO's
manual optimisation), the modules' ``custom_optimizer`` / ``lr_scheduler`` in Python and in
``pipeline.sft`` / ``pipeline.grpo``, and the settings they would silently override refused."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from coscale.app.cli import lightning_cli
from coscale.modules import GRPOModule, SFTModule
from coscale.modules.grpo import settings_errors as grpo_errors
from coscale.modules.sft import settings_errors as sft_errors
from coscale.run.settings import instantiate, typed_errors

ROOT = Path(__file__).resolve().parents[1]
SGD = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05, "momentum": 0.9}}
HALVING = {
    "class_path": "torch.optim.lr_scheduler.StepLR",
    "init_args": {"step_size": 1, "gamma": 0.5},
}
CHOSEN = ["--optimizer", str(SGD), "--lr_scheduler", str(HALVING), "--trainer.logger", "false"]


def _fit(name: str, extra: list[str], tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = lightning_cli(
        ["--config", str(ROOT / "configs" / "fit" / name), *CHOSEN, *extra], run=False
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def _checkpoint(cli, tmp_path) -> Path:
    path = tmp_path / "last.ckpt"
    cli.trainer.save_checkpoint(path)
    return path


def test_coscale_fit_takes_lightning_cli_s_optimizer_and_lr_scheduler_keys(tmp_path, monkeypatch):
    default_group = ["--model.init_args.optimizer", "{lr: 1.0e-5}"]  # sft_tiny sets lr 3e-3
    cli = _fit("sft_tiny.yaml", default_group, tmp_path, monkeypatch)
    (opt,) = cli.trainer.optimizers
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["momentum"] == 0.9
    assert cli.trainer.global_step == 4
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**4)  # stepped every step
    saved = cli.model.hparams["custom_optimizer"]  # a class_path mapping: it loads back
    assert saved["class_path"] == "torch.optim.sgd.SGD" and saved["init_args"]["momentum"] == 0.9
    again = type(cli.model).load_from_checkpoint(_checkpoint(cli, tmp_path))
    assert type(again.configure_optimizers()["optimizer"]) is torch.optim.SGD


@pytest.mark.slow
def test_grpo_s_manual_steps_use_the_chosen_optimizer_and_step_its_scheduler(tmp_path, monkeypatch):
    cli = _fit(
        "grpo_tiny.yaml", ["--model.init_args.optimizer", "{lr: 1.0e-6}"], tmp_path, monkeypatch
    )
    (opt,) = cli.trainer.optimizers
    steps = cli.trainer.global_step
    assert type(opt) is torch.optim.SGD and steps >= 1
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**steps)
    assert cli.model.lr == 0.05  # the Rollout N theory reads the chosen optimiser's rate


def test_the_modules_take_a_mapping_or_a_partial_and_refuse_what_they_would_override():
    model = "builtin:tiny?hidden_size=32&num_layers=1&seed=0"
    grpo = GRPOModule(model=model, custom_optimizer=SGD, lr_scheduler=HALVING)
    conf = grpo.configure_optimizers()
    trainable = {id(p) for p in grpo.policy.parameters() if p.requires_grad}
    assert {id(p) for p in conf["optimizer"].param_groups[0]["params"]} == trainable
    assert conf["lr_scheduler"]["interval"] == "step"
    sft = SFTModule(
        model=model, lr_scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3)
    )
    assert (
        type(sft.configure_optimizers()["optimizer"]) is torch.optim.AdamW
    )  # coscale's, scheduled
    with pytest.raises(ValueError) as err:
        GRPOModule(model=model, optimizer={"lr": 1e-4, "decay": "cosine"}, custom_optimizer=SGD,
                   lr_scheduler={"class_path": "torch.optim.nope.Sched"})  # fmt: skip
    assert str(err.value) == (
        "GRPOModule: lr_scheduler.class_path='torch.optim.nope.Sched' cannot be imported "
        "(No module named 'torch.optim.nope'); "
        "custom_optimizer replaces the optimizer group (coscale's AdamW): leave optimizer at its "
        "default, got AdamWSettings(lr=0.0001, betas=(0.9, 0.999), weight_decay=0.0, warmup_steps=0, "
        "decay='cosine')"
    )


def test_coscale_run_checks_them_before_work_and_hands_them_to_the_module_unbuilt():
    sft = {"custom_optimizer": SGD, "lr_scheduler": HALVING}
    assert typed_errors("sft", SFTModule, sft, sft_errors) == []
    assert instantiate({"sft": sft})["sft"] == sft  # classes to call later, not objects
    bad = {"optimizer": {"warmup_steps": 10}, "lr_scheduler": HALVING}
    assert typed_errors("grpo", GRPOModule, bad, grpo_errors) == [
        "grpo.lr_scheduler replaces optimizer.warmup_steps and optimizer.decay: leave them at 0 "
        "and constant, got 10 and 'constant'"
    ]
