"""The README and docs/ stay true to the repository: short README, no broken links or paths.

Checked in README.md and docs/*.md: the README is under 200 lines; every relative link points
to a file that exists (and its ``#anchor`` to a heading there); every repository path they name
(``configs/...``, ``benchmarks/...``, ...) exists; every ``coscale <command>`` is a command of
the CLI; every flag given to a ``benchmarks/*.py`` script is one the script parses; every
``--pipeline.*`` / ``--data.*`` flag is one ``coscale run`` takes. The checkers are tested on a broken page
first, so that a check which can never fail is caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 199
COMMANDS = {"run", "demo", "eval", "fit", "validate", "test", "predict"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(
    r"(?<![\w./-])((?:configs|coscale|benchmarks|tests|docs|requirements|scripts)/[\w./*-]*)"
)
CODE = re.compile(r"```.*?```|`[^`]+`", re.S)
COMMAND = re.compile(r"(?:^|[\s/])coscale\s+([a-z][\w-]*)", re.M)
SCRIPT = re.compile(r"benchmarks/(\w+)\.py((?:[ \t]+[^\s`|;&]+)*)")
RUN_FLAG = re.compile(r"--((?:pipeline|data)\.[\w.]*\w)")


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
        passes_on = "parse_known_args" in script.read_text()  # --pipeline.x to the run's CLI
        for flag in re.findall(r"(?<![\w-])--[a-z0-9][\w.-]*", args):
            if flag not in known and not (passes_on and flag.startswith("--pipeline.")):
                errors.append(f"{page.name}: benchmarks/{name}.py has no flag {flag}")
    return errors


def run_flag_errors(page: Path) -> list[str]:
    """Each ``--pipeline.*`` / ``--data.*`` flag in code that ``coscale run`` does not take."""
    from coscale.app.run_config import pipeline_parser

    actions = pipeline_parser()._option_string_actions  # every --flag it parses
    # a dict-typed setting (pipeline.trainer) also takes its keys as flags: --pipeline.trainer.x
    dicts = {k for k, a in actions.items() if str(getattr(a, "_typehint", "")).startswith("dict[")}
    flags = RUN_FLAG.findall("\n".join(CODE.findall(page.read_text())))
    return [
        f"{page.name}: --{f} is not a flag of coscale run"
        for f in flags
        if f"--{f}" not in actions and f"--{f}".rsplit(".", 1)[0] not in dicts
    ]


def test_readme_is_under_200_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_readme_test_command_is_the_one_ci_runs():
    assert "./run.sh test" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_paths_and_commands_exist(page):
    errors = link_errors(page) + path_errors(page) + command_errors(page)
    errors += run_flag_errors(page)
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
        "`--pipeline.final.rl true` `--pipeline.final_rl true` `--data.curriculum.low 0.1`\n"
        "`--pipeline.trainer.precision 32-true` `--pipeline.final.rl.x 1`\n"
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
    assert run_flag_errors(page) == [  # a key of the dict pipeline.trainer is a flag
        "README.md: --pipeline.final_rl is not a flag of coscale run",
        "README.md: --pipeline.final.rl.x is not a flag of coscale run",
    ]


def test_the_readme_plug_in_example_runs_as_written(tiny_model_dir, tmp_path, monkeypatch):
    """The README's plug-in code, run as a user copies it: only the model (a tiny one), the
    data file and the trainers' quiet CPU settings are put in."""
    import json

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Plugging into your own Lightning project") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    base = 'base = "Qwen/Qwen2.5-0.5B-Instruct"'
    assert base in code and code.count("L.Trainer(") == 2
    code = code.replace(base, f"base = {str(tiny_model_dir)!r}")
    quiet = "accelerator='cpu', logger=False, enable_checkpointing=False, enable_progress_bar=False"
    code = code.replace("L.Trainer(", f"L.Trainer({quiet}, ")
    rows = [
        {"problem": f"{a}+1", "final": str(a + 1), "sols": [f"\\boxed{{{a + 1}}}"]}
        for a in range(4)
    ]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scope: dict = {}
    exec(compile(code, "README.md (plug-in example)", "exec"), scope)
    data = scope["data"]
    assert data.curriculum.schedule is not None  # RolloutNSchedule installed itself
    assert all(data.curriculum.pools.history(p) for p in data.problems)  # measured at fit start


def test_the_from_trl_page_runs_both_sides_as_written(tmp_path, monkeypatch):
    """docs/from-trl.md's TRL script and its coscale twin, run in one scope as a user pastes
    them: the shipped demo model replaces Qwen2.5 (an arithmetic model: its rewards vary, so
    steps are not skipped), TRL gets its CPU settings, the Lightning Trainer its quiet ones."""
    import json

    from coscale.models.policy import resolve_model_path

    text = (ROOT / "docs" / "from-trl.md").read_text()
    section = text[text.index("## Side by side") : text.index("## What differs")]
    trl_code, coscale_code = re.findall(r"```python\n(.*?)```", section, re.S)
    qwen, demo = '"Qwen/Qwen2.5-0.5B-Instruct"', repr(resolve_model_path("builtin:demo"))
    assert qwen in trl_code and qwen in coscale_code and "from_grpo_config(args)" in coscale_code
    cpu = "use_cpu=True, bf16=False, gradient_checkpointing=False, "
    trl_code = trl_code.replace(qwen, demo).replace("GRPOConfig(", f"GRPOConfig({cpu}")
    quiet = "logger=False, enable_checkpointing=False, enable_progress_bar=False, max_epochs=4, "
    coscale_code = coscale_code.replace(qwen, demo).replace("L.Trainer(", f"L.Trainer({quiet}")
    rows = [  # 12 problems: 6 steps an epoch, whatever steps lack signal or problems retire
        {"prompt": f"Q:{a}+{b}\nA:", "solution": str(a + b)}
        for a in (2, 3, 4, 6)
        for b in (4, 5, 7)
    ]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scope: dict = {}
    exec(compile(trl_code, "docs/from-trl.md (TRL)", "exec"), scope)
    assert scope["trainer"].state.global_step == 2
    exec(compile(coscale_code, "docs/from-trl.md (coscale)", "exec"), scope)
    module, trainer = scope["module"], scope["trainer"]
    assert trainer.global_step == 2  # TRL's max_steps, in optimiser steps
    assert module.rewards.names == ["correct", "soft_overlong_punishment_reward"]
    assert module.rewards.weights.tolist() == [1.0, 0.5] and type(module.loss_fn).__name__ == (
        "DAPOLoss"
    )


def test_the_from_trl_conversational_example_runs_as_written(
    model_folder, tiny_model, char_tokenizer, tmp_path, monkeypatch
):
    """docs/from-trl.md's conversational example on the tiny model, whose tokenizer gets a
    chat template that reads ``enable_thinking``: the rows stay messages, the kwargs reach the
    template, the fit runs."""
    import copy
    import json

    text = (ROOT / "docs" / "from-trl.md").read_text()
    section = text[text.index("## Conversational prompts") :]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}a:{% if not enable_thinking %}[no think]{% endif %}"
        "{% endif %}"
    )
    folder = model_folder("tiny_chat_docs", tiny_model, tok)
    assert '"Qwen/Qwen3-0.6B"' in code
    code = code.replace('"Qwen/Qwen3-0.6B"', repr(str(folder)))
    code = code.replace("GRPOConfig(", "GRPOConfig(use_cpu=True, bf16=False, ")
    quiet = "logger=False, enable_checkpointing=False, enable_progress_bar=False, "
    code = code.replace("L.Trainer(", f"L.Trainer({quiet}")
    system = {"role": "system", "content": "Put the final answer in \\boxed{}."}
    rows = [
        {
            "prompt": [system, {"role": "user", "content": f"What is {a} + 3?"}],
            "solution": str(a + 3),
        }
        for a in range(4)
    ]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scope: dict = {}
    exec(compile(code, "docs/from-trl.md (conversational)", "exec"), scope)
    module, data = scope["module"], scope["data"]
    question = next(iter(data.problems.values())).question
    assert list(question) == rows[0]["prompt"]
    assert module.prompt.chat_template_kwargs == {"enable_thinking": False}
    assert module.prompt(question, module.tokenizer).endswith("</s>a:[no think]")


def test_the_rollout_n_table_in_method_md_holds():
    """Each cell of docs/method.md's table sets the N it says, and the default it names is the
    code's one default."""
    import yaml

    from coscale.callbacks import RolloutNSchedule
    from coscale.loop.schedule import N_INIT
    from coscale.pipeline import PipelineSettings

    text = (ROOT / "docs" / "method.md").read_text()
    assert f"every problem gets N = {N_INIT}, the one default" in " ".join(text.split())
    rows = re.findall(
        r"^\| (?:a fixed N: )?`(pipeline: .*?)` \| (?:a fixed N: )?`(.*?)` \|$", text, re.M
    )
    assert len(rows) == 2
    for run_yaml, trainer_code in rows:
        in_run = yaml.safe_load(run_yaml)["pipeline"]["schedule"]
        PipelineSettings(model="m", schedule=in_run)  # nothing refused
        call = re.search(r"RolloutNSchedule\((.*?)\)", trainer_code).group(1)
        in_trainer = eval(f"dict({call})")  # the page's own arguments
        assert in_run == in_trainer and RolloutNSchedule(**in_trainer).schedule.n_init == 4


def test_the_architecture_page_names_every_room_and_only_files_there():
    page = (ROOT / "docs" / "architecture.md").read_text()
    rooms = [
        p
        for p in sorted((ROOT / "coscale").iterdir())
        if (p / "__init__.py").exists() or (p.suffix == ".py" and not p.name.startswith("_"))
    ]
    missing = [p.name for p in rooms if f"`coscale/{p.name}{'/' * p.is_dir()}`" not in page]
    assert not missing, f"rooms missing from docs/architecture.md: {missing}"
    for row in re.findall(r"^\| `coscale/(\w+)/` \|(.*)$", page, re.M):
        room, text = row
        named = re.findall(r"`(\w+\.py)`", text)
        assert all((ROOT / "coscale" / room / n).exists() for n in named), (room, named)
    paths = re.findall(r"`(coscale/[\w/]+(?:\.py|/))`", page)  # the rooms and the traces' files
    assert len(paths) > 20 and not [p for p in paths if not (ROOT / p).exists()]


def test_the_study_tables_in_results_md_are_what_the_one_command_writes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import study

    doc, kept = tmp_path / "results.md", ROOT / "benchmarks" / "results" / "study"
    doc.write_text((ROOT / "docs" / "results.md").read_text())
    tables = {s: text for s in study.STEPS if (text := study.tables(s, str(kept))) is not None}
    for step, text in tables.items():
        study.write_into(str(doc), step, text)
    assert "full" in tables and doc.read_text() == (ROOT / "docs" / "results.md").read_text()
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match=r"results\.md: needs the markers '<!-- study full: begin"):
        study.write_into(str(doc), "full", "table")
