"""`coscale fit --config configs/fit/sft_tiny.yaml` and `grpo_tiny.yaml` train the steps the README
states (they used to end with "No training batches" and exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coscale.app.cli import lightning_cli

ROOT = Path(__file__).resolve().parents[1]


def _fit(name: str, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = lightning_cli(["--config", str(ROOT / "configs" / "fit" / name)], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def test_sft_tiny_trains_four_steps_on_the_files_solutions(tmp_path, monkeypatch):
    cli = _fit("sft_tiny.yaml", tmp_path, monkeypatch)
    assert cli.datamodule.curriculum.bank.total() == 24  # the file's solutions, at load
    assert cli.trainer.global_step == 4  # 24 pairs -> 2 batches of <= 16, 2 epochs


@pytest.mark.slow
def test_grpo_tiny_trains_two_epochs_of_four_batches(tmp_path, monkeypatch):
    cli = _fit("grpo_tiny.yaml", tmp_path, monkeypatch)
    cur = cli.datamodule.curriculum
    assert cli.trainer.current_epoch == 2
    assert all(len(cur.pools.history(i)) == 2 for i in cur.problems)  # each epoch, every problem
    # every batch with signal takes a step: at least one of the 8 (a random-free count would
    # pin float rounding, which changes with the thread count)
    assert 1 <= cli.trainer.global_step <= 8 and cli.datamodule.cursor.consumed == 4
