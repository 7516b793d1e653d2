"""Several ``--config`` files: a later file's mappings add to an earlier one's (coscale run)."""

from __future__ import annotations

from pathlib import Path

from coscale.app.config_files import merged
from coscale.app.run_config import pipeline_parser

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_file_adds_to_the_first_files_mappings(tmp_path):
    fast = tmp_path / "fast.yaml"
    fast.write_text(
        "pipeline:\n  grpo:\n    optimizer: {warmup_steps: 3}\n  trainer:\n    max_time: null\n"
    )
    cfg = pipeline_parser().parse_args(["--config", str(ROOT / "configs/run/tiny.yaml")])
    both = pipeline_parser().parse_args(
        ["--config", str(ROOT / "configs/run/tiny.yaml"), "--config", str(fast)]
    )
    assert both.pipeline.grpo.optimizer.warmup_steps == 3
    assert cfg.pipeline.grpo.optimizer.warmup_steps == 0  # tiny.yaml leaves the default
    assert both.pipeline.grpo.optimizer.lr == cfg.pipeline.grpo.optimizer.lr == 5.0e-4
    both.pipeline.grpo.optimizer.warmup_steps = 0
    assert both.pipeline.grpo == cfg.pipeline.grpo  # the rest kept (lr, update), not defaulted
    assert both.pipeline.sft == cfg.pipeline.sft  # untouched by the second file
    assert both.pipeline.sampling == cfg.pipeline.sampling  # the run's prompt, kept
    assert both.pipeline.trainer == {**cfg.pipeline.trainer, "max_time": None}


def test_nested_mappings_merge_and_another_class_path_replaces():
    old = {
        "optimizer": {"lr": 1e-3, "warmup_steps": 4},
        "loss": {"class_path": "a.A", "init_args": {"x": 1}},
    }
    new = {"optimizer": {"lr": 5e-4}, "loss": {"class_path": "b.B", "init_args": {"y": 2}}}
    assert merged(old, new) == {
        "optimizer": {"lr": 5e-4, "warmup_steps": 4},
        "loss": {"class_path": "b.B", "init_args": {"y": 2}},
    }
    same = {"loss": {"class_path": "a.A", "init_args": {"y": 2}}}
    assert merged(old, same)["loss"] == {"class_path": "a.A", "init_args": {"x": 1, "y": 2}}
    assert merged({"a": 1}, [1, 2]) == [1, 2]
