"""The ``coscale`` command.

- ``coscale fit|validate|test --config x.yaml``: one Lightning run of one module (LightningCLI;
  ``${...}`` interpolation, ``--print_config``).
- ``coscale run --config x.yaml``: the whole CoScale-RL pipeline (:mod:`coscale.pipeline`).
- ``coscale demo [--quick]``: the pipeline on the built-in task and model.
- ``coscale eval --config eval.yaml``: pass@1 / pass@k per benchmark (:mod:`coscale.app.evaluate`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from coscale.app.run_config import build_run, pipeline_parser
from coscale.loop.checkpoint_store import CheckpointWriteError

PIPELINE_COMMANDS = ("run", "demo")
__all__ = ["main", "pipeline_parser"]


def _offline_defaults() -> None:
    """W&B without an API key runs offline instead of failing."""
    from coscale.modules.wandb_mode import wandb_mode

    os.environ["WANDB_MODE"] = wandb_mode()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _offline_defaults()
    try:
        if argv and argv[0] == "eval":
            from coscale.app.evaluate import eval_command

            eval_command(argv[1:])
        elif argv and argv[0] in PIPELINE_COMMANDS:
            run_command(argv)
        else:
            lightning_cli(argv)
    except (ValueError, FileNotFoundError, TypeError) as err:
        if os.environ.get("COSCALE_TRACEBACK"):
            raise
        # one line that says what to change; COSCALE_TRACEBACK=1 shows where it came from
        print(f"coscale: error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except CheckpointWriteError as err:  # a full disk: what is left whole, and how to go on
        print(f"coscale: error: {err.strerror}", file=sys.stderr)
        return 1
    return 0


def lightning_cli(argv: list[str], run: bool = True) -> Any:
    """``coscale fit|validate|test``: LightningCLI over the coscale modules and DataModule."""
    import lightning as L
    from lightning.pytorch.cli import LightningCLI

    from coscale.datamodules import ProblemDataModule

    return LightningCLI(
        L.LightningModule,
        ProblemDataModule,
        subclass_mode_model=True,
        args=argv,
        parser_kwargs={"parser_mode": "omegaconf"},
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        run=run,
    )


def run_command(argv: list[str]) -> dict[str, Any]:
    """``coscale run`` and ``coscale demo``."""
    if argv[0] == "demo":
        from coscale.app.demo import run_demo

        run_demo(argv[1:])
        return {}
    from coscale.pipeline import Pipeline

    config, data = build_run(argv[1:])
    results = Pipeline(config, data).run()
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    final = results.get("final", {})
    print("\n[coscale] pools:", results.get("pools"))
    for key, value in final.items():
        if isinstance(value, float):
            print(f"[coscale] {key}: {value:.4f}")


if __name__ == "__main__":
    sys.exit(main())
