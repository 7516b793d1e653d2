"""The demo report's list of where the run leaves the paper's loop, read from the run's settings."""

from __future__ import annotations

from types import SimpleNamespace

from coscale.app import demo_changes
from coscale.app.demo import demo_config, demo_parser


def settings(**changed):
    """Pipeline settings shaped like ``PipelineSettings``: the paper's loop (and the values the
    demo's open settings were measured against), then ``changed`` (dotted names with ``__``)."""
    before = {name: measured for name, (_, measured, _) in demo_changes.CHOSEN.items()}
    values = {**demo_changes.PAPER_LOOP, **before}
    values |= {k.replace("__", "."): v for k, v in changed.items()}
    final = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("final.")}
    top = {k: v for k, v in values.items() if "." not in k}
    return SimpleNamespace(**top, final=SimpleNamespace(**final))


def test_the_papers_loop_is_named_as_such():
    assert demo_changes.changes(settings()) == []
    assert demo_changes.section(settings()) == (
        f"The loop: the paper's (docs/method.md), no setting changed. {demo_changes.TODAY}."
    )


def test_each_change_is_listed_with_its_figure_or_with_none_on_record():
    lines = demo_changes.changes(settings(final__rl=True, rl_measure_every=0))
    assert lines[0].startswith("- `rl_measure_every: 0` (the paper: `1`): no validation figure")
    assert lines[1].startswith("- `final.rl: true` (the paper: `false`): the final retrain's own")
    assert len(lines) == 2


def test_an_open_setting_is_listed_with_its_figure_only_at_the_value_measured():
    assert demo_changes.changes(settings(iterations=2)) == []
    (line,) = demo_changes.changes(settings(iterations=1))
    assert line.startswith("- `iterations: 1` (the paper sets none; measured against `2`): one")
    (line,) = demo_changes.changes(settings(iterations=3))
    assert line.endswith(f"): {demo_changes.NONE_ON_RECORD}.")


def test_the_shipped_demo_config_lists_its_changes_with_their_figures():
    cfg = demo_parser().parse_args(["--config", demo_config()]).pipeline
    lines = demo_changes.changes(cfg)
    assert len(lines) == 2 and lines[0].startswith("- `final.rl: true` (the paper: `false`)")
    assert "paired 95% [3.2, 6.0]" in lines[0]
    assert lines[1].startswith("- `iterations: 1`") and "paired 95% [-1.4, 4.1]" in lines[1]
    assert demo_changes.section(cfg).endswith(f"{demo_changes.TODAY}.")
    # a flag that leaves the loop further adds its own line
    cfg = demo_parser().parse_args(["--config", demo_config(), "--pipeline.final.source", "bank"])
    assert len(demo_changes.changes(cfg.pipeline)) == 3
