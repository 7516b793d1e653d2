"""The ``coscale`` command: reads the command name, then hands the rest to that command's parser.

- ``coscale`` / ``coscale --help``: every command, one line each (:mod:`coscale.app.commands`).
- ``coscale fit|validate --config x.yaml``: one Lightning run of one module (LightningCLI;
  ``${...}`` interpolation, ``--print_config``).
- ``coscale run --config x.yaml``: the whole CoScale-RL pipeline (:mod:`coscale.pipeline`).
- ``coscale demo [--quick]``: the pipeline on the built-in task and model.
- ``coscale eval --config eval.yaml``: pass@1 / pass@k per benchmark (:mod:`coscale.app.evaluate`).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from coscale.app.commands import (
    COMMANDS,
    DESCRIPTION,
    HELP_FLAGS,
    LIGHTNING_COMMANDS,
    PROG,
    top_help,
    unknown_command,
)
from coscale.app.refusal import refusal_line
from coscale.app.run_config import keep_config, pipeline_parser, resolved_run
from coscale.loop.checkpoint_store import CheckpointWriteError

__all__ = ["main", "pipeline_parser"]


def _offline_defaults() -> None:
    """W&B without an API key runs offline instead of failing."""
    from coscale.modules.loggers import wandb_mode

    os.environ["WANDB_MODE"] = wandb_mode()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status (never raises SystemExit)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a usage error, as argparse treats a missing command
        print(top_help(), file=sys.stderr)
        return 2
    if argv[0] in HELP_FLAGS:
        print(top_help())
        return 0
    if argv[0] not in COMMANDS:
        print(unknown_command(argv[0]), file=sys.stderr)
        return 2
    _offline_defaults()
    try:
        dispatch(argv)
    except SystemExit as exit_:  # a parser's --help (0) or its refusal (2)
        return _exit_status(exit_)
    except StageFailed as err:  # during work: where it came from, then how to go on
        traceback.print_exception(err.__cause__, file=sys.stderr)
        print(f"coscale: error: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, TypeError) as err:  # a refusal, before any work
        if os.environ.get("COSCALE_TRACEBACK"):
            raise
        # one line that says what to change; COSCALE_TRACEBACK=1 shows where it came from
        print(f"coscale: error: {refusal_line(str(err))}", file=sys.stderr)
        return 2
    except CheckpointWriteError as err:  # a full disk: what is left whole, and how to go on
        print(f"coscale: error: {err.strerror}", file=sys.stderr)
        return 1
    return 0


def dispatch(argv: list[str]) -> None:
    """Runs ``argv[0]``, one of `COMMANDS`, on the arguments after it."""
    if argv[0] == "eval":
        from coscale.app.evaluate import eval_command

        eval_command(argv[1:])
    elif argv[0] == "demo":
        from coscale.app.demo import run_demo

        run_demo(argv[1:])
    elif argv[0] == "run":
        run_command(argv)
    elif argv[0] in LIGHTNING_COMMANDS:
        lightning_cli(argv)


def _exit_status(exit_: SystemExit) -> int:
    """The status ``sys.exit(code)`` would give: None is 0, a message is printed and is 1."""
    if exit_.code is None or isinstance(exit_.code, int):
        return exit_.code or 0
    print(exit_.code, file=sys.stderr)
    return 1


def lightning_cli(argv: list[str], run: bool = True) -> Any:
    """``coscale fit|validate``: LightningCLI over the coscale modules and DataModule."""
    import lightning as L
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from coscale.app.refusal import OneLineRefusals
    from coscale.datamodules import ProblemDataModule

    class FitParser(OneLineRefusals, LightningArgumentParser):
        """LightningCLI's parser, its refusals in one line."""

    class FitCLI(LightningCLI):
        """LightningCLI whose top-level ``optimizer`` and ``lr_scheduler`` (its own keys, by
        ``class_path``) become the module's ``custom_optimizer`` and ``lr_scheduler``: the module
        builds them over its trainable parameters after sharding, and steps the scheduler after
        every optimiser step (:mod:`coscale.modules.optimizer_choice`)."""

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_optimizer_args(link_to="model.init_args.custom_optimizer")
            parser.add_lr_scheduler_args(link_to="model.init_args.lr_scheduler")

    return FitCLI(
        L.LightningModule,
        ProblemDataModule,
        parser_class=FitParser,
        subclass_mode_model=True,
        args=_lightning_args(argv),
        parser_kwargs={
            "parser_mode": "omegaconf",
            "prog": PROG,
            "description": DESCRIPTION,
            **{name: {"description": COMMANDS[name]} for name in LIGHTNING_COMMANDS},
        },
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        run=run,
    )


def _lightning_args(argv: list[str]) -> list[str] | None:
    """None when ``argv`` is the command line itself: LightningCLI then reads ``sys.argv``, and
    does not warn that both were given (its warning is meant for ``args`` set from Python)."""
    return None if argv == sys.argv[1:] else argv


class StageFailed(RuntimeError):
    """An error raised inside a stage of ``coscale run`` (its cause keeps the traceback)."""


def run_command(argv: list[str]) -> dict[str, Any]:
    """``coscale run``. Settings are refused before any work in one line; an error raised
    inside a stage keeps its traceback and ends with a line naming the stage and how to go on."""
    from coscale.pipeline import Pipeline

    config, data, text = resolved_run(argv[1:])
    resolved = keep_config(text, config.run_dir)  # <run_dir>/config.yaml: every setting
    pipeline = Pipeline(config, data)
    if pipeline.logger:  # the run's whole config, beside each fit's module settings
        pipeline.logger.log_hyperparams({"run": resolved})
    try:
        results = pipeline.run()
    except CheckpointWriteError:  # a full disk: said in one line, with what is left whole
        raise
    except Exception as err:
        if pipeline.running is None:  # refused before the first stage
            raise
        raise StageFailed(
            f"stage {pipeline.running} failed (the traceback above); once its cause is fixed, "
            f"the same command resumes the run in {config.run_dir} from that stage's last "
            f"checkpoint"
        ) from err
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    print("\n[coscale] pools:", results.get("pools"))
    for key, value in results.get("final", {}).items():
        if isinstance(value, float):
            print(f"[coscale] {key}: {value:.4f}")


if __name__ == "__main__":
    sys.exit(main())
