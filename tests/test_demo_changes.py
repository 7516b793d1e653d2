"""The demo report's list of where the run leaves the paper's loop, read from the run's settings."""

from __future__ import annotations

from types import SimpleNamespace

from coscale.app import demo_changes
from coscale.app.demo import demo_config, demo_parser


def settings(**changed):
    """A parsed config's shape (``cfg.pipeline``, ``cfg.data``): the paper's loop and the values
    the demo's open settings were measured against, then ``changed`` (dotted names, ``__``)."""
    values = dict(demo_changes.PAPER_LOOP)
    for choice in demo_changes.CHOSEN:
        values |= choice.before
    values |= {k.replace("__", "."): v for k, v in changed.items()}
    return nested(values)


def nested(values: dict) -> SimpleNamespace:
    tree: dict = {}
    for dotted, value in values.items():
        *groups, last = dotted.split(".")
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        node[last] = value
    return _namespace(tree)


def _namespace(tree):
    if not isinstance(tree, dict):
        return tree
    return SimpleNamespace(**{k: _namespace(v) for k, v in tree.items()})


def test_the_papers_loop_is_named_as_such():
    assert demo_changes.changes(settings()) == []
    assert demo_changes.section(settings()) == (
        f"The loop: the paper's (docs/method.md), no setting changed. {demo_changes.TODAY}."
    )


def test_each_change_is_listed_with_its_figure_or_with_none_on_record():
    lines = demo_changes.changes(settings(pipeline__final__rl=True, pipeline__rl_measure_every=0))
    assert lines[0].startswith(
        "- `pipeline.rl_measure_every: 0` (the paper: `1`): no validation figure"
    )
    assert lines[1].startswith(
        "- `pipeline.final.rl: true` (the paper: `false`): the final retrain's own"
    )
    assert len(lines) == 2


def test_an_open_choice_is_listed_with_its_figure_only_at_the_values_measured():
    one = {"pipeline__iterations": 1, "data__curriculum__solutions_per_round": 11}
    assert demo_changes.changes(settings(pipeline__iterations=2)) == []
    (line,) = demo_changes.changes(settings(**one))
    assert line.startswith(
        "- `pipeline.iterations: 1`, `data.curriculum.solutions_per_round: 11` (the paper sets "
        "none; measured against `pipeline.iterations: 2`, `data.curriculum.solutions_per_round: "
        "6`): one iteration"
    )
    # one of the choice's settings at another value: the figure does not hold
    for other in ({**one, "data__curriculum__solutions_per_round": 6}, {"pipeline__iterations": 3}):
        (line,) = demo_changes.changes(settings(**other))
        assert line.endswith(f"): {demo_changes.NONE_ON_RECORD}.")


def test_the_shipped_demo_config_lists_its_changes_with_their_figures():
    cfg = demo_parser().parse_args(["--config", demo_config()])
    lines = demo_changes.changes(cfg)
    assert len(lines) == 2 and lines[0].startswith("- `pipeline.final.rl: true` (the paper")
    assert "paired 95% [3.2, 6.0]" in lines[0]
    assert lines[1].startswith("- `pipeline.iterations: 1`") and "[-3.1, 2.8]" in lines[1]
    assert demo_changes.section(cfg).endswith(f"{demo_changes.TODAY}.")
    # a flag that leaves the loop further adds its own line
    cfg = demo_parser().parse_args(["--config", demo_config(), "--pipeline.final.source", "bank"])
    assert len(demo_changes.changes(cfg)) == 3
