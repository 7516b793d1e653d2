"""Every shipped YAML parses and instantiates (models built offline from ``builtin:`` specs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coscale.app.cli import lightning_cli, pipeline_parser
from coscale.datamodules import ProblemDataModule
from coscale.pipeline import PipelineConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*ROOT.glob("configs/**/*.yaml"), *ROOT.glob("coscale/configs/*.yaml")])


def _is_pipeline(path: Path) -> bool:
    return "\npipeline:" in "\n" + path.read_text()


def test_there_are_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ROOT)) for p in CONFIGS])
def test_config_parses_and_instantiates(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert path.read_text().startswith("#"), (
        "every config opens with what it trains and how to launch it"
    )
    if "\neval:" in "\n" + path.read_text():
        from coscale.app.evaluate import EvalConfig, eval_parser

        parser = eval_parser()
        init = parser.instantiate(parser.parse_args(["--config", str(path)]))
        assert isinstance(init.eval, EvalConfig)
        return
    if _is_pipeline(path):
        parser = pipeline_parser()
        init = parser.instantiate(parser.parse_args(["--config", str(path)]))
        assert isinstance(init.pipeline, PipelineConfig)
        assert isinstance(init.data, ProblemDataModule)
        if str(init.data.train_source).startswith("builtin:"):  # hub data sets are not fetched
            init.data.load()
            assert init.data.problems
    else:
        cli = lightning_cli(["--config", str(path), "--trainer.logger=false"], run=False)
        assert cli.model.policy is not None
        assert isinstance(cli.datamodule, ProblemDataModule)
