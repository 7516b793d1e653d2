"""The README and docs/ stay true to the repository: short README, no broken links or paths.

Checked in README.md and docs/*.md: the README is at most 300 lines; every relative link points
to a file that exists (and its ``#anchor`` to a heading there); every repository path they name
(``configs/...``, ``benchmarks/...``, ...) exists; every ``coscale <command>`` is a command of
the CLI; every flag given to a ``benchmarks/*.py`` script is one the script parses; every
``--pipeline.<key>`` is a field of ``PipelineConfig``. The checkers are tested on a broken page
first, so that a check which can never fail is caught.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
COMMANDS = {"run", "demo", "eval", "fit", "validate", "test", "predict"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(
    r"(?<![\w./-])((?:configs|coscale|benchmarks|tests|docs|requirements|scripts)/[\w./*-]*)"
)
CODE = re.compile(r"```.*?```|`[^`]+`", re.S)
COMMAND = re.compile(r"(?:^|[\s/])coscale\s+([a-z][\w-]*)", re.M)
SCRIPT = re.compile(r"benchmarks/(\w+)\.py((?:[ \t]+[^\s`|;&]+)*)")
PIPELINE_KEY = re.compile(r"--pipeline\.(\w+)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE.sub("", page.read_text()) if page.suffix == ".md" else ""
    return {slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def link_errors(page: Path) -> list[str]:
    errors = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            errors.append(f"{page.name}: link to {target}: no such file")
        elif anchor and file.is_file() and anchor not in anchors(file):
            errors.append(f"{page.name}: link to {target}: no heading with that anchor")
    return errors


def path_errors(page: Path, root: Path = ROOT) -> list[str]:
    errors = []
    for raw in PATH.findall(page.read_text()):
        name = raw.split("::")[0].rstrip(".,:")
        if not name or (name.endswith("/") and (root / name).is_dir()):
            continue
        found = list(root.glob(name)) if "*" in name else [root / name]
        if not any(p.exists() for p in found):
            errors.append(f"{page.name}: {name} does not exist")
    return errors


def script_flags(script: Path) -> set[str]:
    """Flags a benchmark script parses, its sibling modules' ``add_flags`` included."""
    sources = [script.read_text()]
    for module in re.findall(r"^import (\w+)$|^from (\w+) import", sources[0], re.M):
        sibling = script.with_name(f"{module[0] or module[1]}.py")
        if sibling.exists():
            sources.append(sibling.read_text())
    flags = set()
    for source in sources:
        for flag in re.findall(r"[\"'](--[a-z0-9][\w-]*)[\"']", source):
            flags |= {flag, "--no-" + flag[2:]}  # BooleanOptionalAction adds --no-<flag>
    return flags


def command_errors(page: Path, root: Path = ROOT) -> list[str]:
    errors = []
    code = "\n".join(CODE.findall(page.read_text()))
    for command in COMMAND.findall(code):
        if command not in COMMANDS:
            errors.append(f"{page.name}: `coscale {command}` is not a command")
    for name, args in SCRIPT.findall(code):
        script = root / "benchmarks" / f"{name}.py"
        if not script.exists():
            continue  # path_errors reports it
        known = script_flags(script)
        for flag in re.findall(r"(?<![\w-])--[a-z0-9][\w-]*", args):
            if flag not in known:
                errors.append(f"{page.name}: benchmarks/{name}.py has no flag {flag}")
    return errors


def pipeline_key_errors(page: Path) -> list[str]:
    from coscale.pipeline import PipelineConfig

    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    keys = PIPELINE_KEY.findall("\n".join(CODE.findall(page.read_text())))
    return [
        f"{page.name}: --pipeline.{k} is no PipelineConfig field" for k in keys if k not in fields
    ]


def test_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_readme_test_command_is_the_one_ci_runs():
    assert "./run.sh test" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_paths_and_commands_exist(page):
    errors = link_errors(page) + path_errors(page) + command_errors(page)
    errors += pipeline_key_errors(page)
    assert not errors, "\n".join(errors)


def test_the_checks_fail_on_a_broken_page(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench.py").write_text('p.add_argument("--pairs")\n')
    (tmp_path / "docs" / "ok.md").write_text("# A heading, here\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[fine](docs/ok.md#a-heading-here) [gone](docs/missing.md) [bad](docs/ok.md#nope)\n"
        "See `configs/missing.yaml` and `benchmarks/bench.py`.\n"
        "```bash\ncoscale frobnicate\npython benchmarks/bench.py --pairs 3 --rounds 2\n```\n"
    )
    assert link_errors(page) == [
        "README.md: link to docs/missing.md: no such file",
        "README.md: link to docs/ok.md#nope: no heading with that anchor",
    ]
    assert path_errors(page, tmp_path) == [
        "README.md: docs/missing.md does not exist",
        "README.md: configs/missing.yaml does not exist",
    ]
    assert command_errors(page, tmp_path) == [
        "README.md: `coscale frobnicate` is not a command",
        "README.md: benchmarks/bench.py has no flag --rounds",
    ]
