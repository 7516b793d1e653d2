"""Tests for coscale.log: one logger for every library message, shown as the console showed it."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coscale.log import EVERY_RANK, LEVEL_ENV, get_logger, level_from_env, logger

PACKAGE = Path(__file__).resolve().parents[1] / "coscale"


def test_info_goes_to_stdout_and_warnings_to_stderr_with_the_prefix(capsys):
    logger.info("it1/sft: no SFT pairs, stage skipped")
    get_logger("coscale.loop.checkpoint_store").warning("checkpoint v2 is damaged")
    out, err = capsys.readouterr()
    assert out == "[coscale] it1/sft: no SFT pairs, stage skipped\n"
    assert err == "[coscale] checkpoint v2 is damaged\n"


def test_a_rank_other_than_zero_shows_only_its_every_rank_messages(monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    logger.info("== stage it1/sft ==")
    logger.info("vLLM engine started", extra=EVERY_RANK)
    assert capsys.readouterr().out == "[coscale] vLLM engine started\n"
    monkeypatch.setenv("LOCAL_RANK", "0")
    logger.info("== stage it1/rl ==")
    assert capsys.readouterr().out == "[coscale] == stage it1/rl ==\n"


def test_a_program_routes_the_messages_to_its_own_handlers():
    ours, root = logging.getLogger("coscale"), logging.getLogger()
    handler = ours.handlers[0]
    assert handler.get_name() == "coscale"
    seen: list[logging.LogRecord] = []
    theirs = logging.Handler()
    theirs.emit = seen.append
    ours.removeHandler(handler)
    ours.propagate = True
    root.addHandler(theirs)
    try:
        get_logger("coscale.measure.selection").info("selection: step 4 kept")
    finally:
        root.removeHandler(theirs)
        ours.addHandler(handler)
        ours.propagate = False
    assert [(r.name, r.getMessage()) for r in seen] == [
        ("coscale.measure.selection", "selection: step 4 kept")
    ]


def test_the_environment_variable_sets_the_level_at_import():
    code = "from coscale.log import logger; logger.info('shown?'); logger.warning('kept')"
    env = {**os.environ, LEVEL_ENV: "warning"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "[coscale] kept\n"


def test_an_unknown_level_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(LEVEL_ENV, "LOUD")
    with pytest.raises(ValueError, match=f"{LEVEL_ENV}='LOUD' is not a logging level"):
        level_from_env()


def _print_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call))
    return [c.lineno for c in calls if isinstance(c.func, ast.Name) and c.func.id == "print"]


def test_no_print_outside_the_commands():
    """The library logs; only the commands (coscale/app) print what a user asked for."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "app" not in path.relative_to(PACKAGE).parts[:1]
        for line in _print_calls(path)
    ]
    assert found == [], "print() in library code (use coscale.log.logger): " + ", ".join(found)
