"""The ``coscale`` command as a newcomer meets it: the top-level help lists every command, an
unknown command is told the list, each command's help names it, no launch prints LightningCLI's
"args ... intended to run from within Python" warning, and ``main`` returns the exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coscale.app.cli import _lightning_args, main

ROOT = Path(__file__).resolve().parents[1]
# what a user can run; a command dropped from the help (or never added to it) fails here
EXPECTED = ("run", "demo", "eval", "fit", "validate")
WARNING = "intended to run from within Python"


def command_lines(text: str) -> dict[str, str]:
    """{command: its one line} from the 'commands:' block of the top-level help."""
    block = text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(maxsplit=1) for line in block.splitlines()]
    return {row[0]: row[1] for row in rows}


def launch(*args: str) -> subprocess.CompletedProcess:
    """``python -m coscale ARGS`` as a shell runs it: the arguments are on ``sys.argv``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "coscale", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_top_level_help_lists_every_command_once_with_what_it_does(flag, capsys):
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: coscale <command>")
    assert "Lightning Trainer command line tool" not in out
    lines = command_lines(out)
    assert list(lines) == list(EXPECTED)
    assert all(len(what) > 20 for what in lines.values())  # a description, not a bare name


def test_no_arguments_prints_the_help_and_exits_2(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert list(command_lines(captured.err)) == list(EXPECTED)
    assert captured.out == ""


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["trian", "--config", "x.yaml"], "unknown command 'trian'"), (["-c", "x"], "before '-c'")],
)
def test_an_unknown_command_gets_one_line_naming_it_and_the_commands(argv, named, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("coscale: error: ")
    assert named in err
    assert err.rstrip().endswith("the commands are: " + ", ".join(EXPECTED))


@pytest.mark.parametrize(
    ("command", "usage", "said"),
    [
        ("run", "usage: coscale run ", "The whole CoScale-RL pipeline"),
        ("demo", "usage: coscale demo ", "built-in task"),
        ("eval", "usage: coscale eval ", "pass@1 / pass@k"),
        ("fit", "usage: coscale [options] fit ", "one Lightning fit of one module"),
        ("validate", "usage: coscale [options] validate ", "one validation pass"),
    ],
)
def test_each_listed_command_answers_help_with_its_name_and_what_it_does(
    command, usage, said, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["coscale", command, "--help"])  # as a shell launches it
    assert main() == 0  # the parser's SystemExit(0) becomes the status
    out = capsys.readouterr().out
    assert out.startswith(usage)
    assert said in " ".join(out.split())  # the description, rewrapped to the terminal


def test_demo_help_shows_quick(capsys):
    assert main(["demo", "--help"]) == 0
    assert "--quick" in capsys.readouterr().out


def test_a_refused_setting_exits_2(capsys):
    assert main(["run", "--pipeline.no_such_key", "1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def _refusal(capsys, *argv: str) -> str:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "usage" not in err, err  # one line, no usage
    return err.strip()


def test_refusals_are_one_line_naming_the_file_line_and_the_nearest_keys(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("pipeline:\n  model: builtin:tiny\n  iteratons: 3\n  sft:\n    optimizr: {}\n")
    assert _refusal(capsys, "--config", str(typo)) == (
        f"coscale run: error: {typo}:3: pipeline.iteratons is not a setting of coscale run; "
        "did you mean pipeline.iterations?"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("pipeline:\n  sft:\n    optimizr:\n      lr: 1.0\n")
    assert _refusal(capsys, "--config", str(nested)).endswith(
        f"{nested}:4: pipeline.sft.optimizr.lr is not a setting of coscale run; "
        "did you mean pipeline.sft.optimizer.lr?"
    )
    assert _refusal(capsys, "--data.batchsize", "3").endswith(  # a flag: no file
        "error: data.batchsize is not a setting of coscale run; did you mean data.batch_size "
        "or data.val_batch_size?"
    )
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("pipeline:\n  model: m\n  iterations: three\n")
    err = _refusal(capsys, "--config", str(wrong))
    assert err.startswith(f"coscale run: error: {wrong}:3: ") and "pipeline.iterations" in err
    assert "Got value: three" in err


def test_a_fit_config_given_to_run_is_named(capsys):
    fit = str(ROOT / "configs" / "fit" / "grpo_tiny.yaml")
    assert _refusal(capsys, "--config", fit) == (
        f"coscale run: error: {fit} is a coscale fit config (top-level model/trainer sections): "
        f"coscale run takes pipeline and data sections; run it with coscale fit --config {fit}"
    )


def test_lightning_cli_reads_sys_argv_itself_when_argv_is_the_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["coscale", "fit", "--help"])
    assert _lightning_args(["fit", "--help"]) is None
    assert _lightning_args(["fit", "--config", "x.yaml"]) == ["fit", "--config", "x.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["fit", "--help"], "usage: coscale [options] fit"),
        (["run", "--help"], "usage: coscale run"),
    ],
)
def test_a_launch_prints_no_lightning_cli_args_warning(argv, usage):
    done = launch(*argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert WARNING not in done.stdout + done.stderr
    assert done.stdout.startswith(usage)


def test_an_error_inside_a_stage_keeps_its_traceback_and_names_the_stage(
    tmp_path, monkeypatch, capsys
):
    import coscale.pipeline

    def broken(ctx, name, *args, **kwargs):
        raise ValueError("deep inside a fit")

    monkeypatch.setattr(coscale.pipeline, "sft_stage", broken)
    run_dir = tmp_path / "run"
    argv = ["run", "--config", str(ROOT / "configs" / "run" / "tiny.yaml")]
    assert main([*argv, "--pipeline.run_dir", str(run_dir), "--pipeline.logger", "none"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback (most recent call last):" in err and "ValueError: deep inside a fit" in err
    assert err[-1] == (
        f"coscale: error: stage warmup failed (the traceback above); once its cause is fixed, "
        f"the same command resumes the run in {run_dir} from that stage's last checkpoint"
    )


def test_fit_refusals_are_one_line_too(tmp_path, capsys):
    run_config = tmp_path / "run.yaml"
    run_config.write_text("pipeline:\n  model: builtin:tiny\n")
    assert main(["fit", "--config", str(run_config)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"coscale fit: error: {run_config} is a coscale run config (top-level pipeline section): "
        f"run it with coscale run --config {run_config}"
    )
    fit = str(ROOT / "configs" / "fit" / "grpo_tiny.yaml")
    assert main(["fit", "--config", fit, "--trainer.max_epohcs", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.strip().endswith(
        "trainer.max_epohcs is not a setting of coscale fit; did you mean trainer.max_epochs or "
        "trainer.max_steps?"
    )
    assert main(["fit", "--config", fit, "--model.init_args.log_completion_every", "1"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(  # inside the module's class_path
            "model.init_args.log_completion_every is not a setting of coscale fit; did you mean "
            "model.init_args.log_completions_every?"
        )
    )
