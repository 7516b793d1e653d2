"""The commands of ``coscale``, one line each: what ``coscale --help`` shows and what an unknown
command is told. Kept free of heavy imports so that the top-level help answers at once.

Only the commands that run with the coscale modules are listed: LightningCLI also offers
``test`` and ``predict``, but no coscale module has a ``test_step`` or ``predict_step``.
"""

from __future__ import annotations

PROG = "coscale"
DESCRIPTION = "CoScale-RL post-training: SFT and GRPO over problem pools, on PyTorch Lightning."

COMMANDS: dict[str, str] = {
    "run": "the whole CoScale-RL pipeline (--config configs/run/tiny.yaml: a few minutes on 2 CPU cores)",
    "demo": "the pipeline on the built-in task and model, then a held-out report (--quick: ~45 s)",
    "eval": "pass@1 / pass@k of a model on named benchmarks (--config an eval YAML)",
    "fit": "one Lightning fit of one module, SFT or GRPO (--config configs/fit/sft_tiny.yaml)",
    "validate": "one validation pass of one module (LightningCLI, the same YAML as fit)",
}
LIGHTNING_COMMANDS = ("fit", "validate")
HELP_FLAGS = ("-h", "--help")


def top_help() -> str:
    """The text of ``coscale``, ``coscale -h`` and ``coscale --help``."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "\n".join(
        [
            f"usage: {PROG} <command> [options]",
            "",
            DESCRIPTION,
            "",
            "commands:",
            *lines,
            "",
            f"Run '{PROG} <command> --help' for the settings of one command.",
        ]
    )


def unknown_command(name: str) -> str:
    """One line for a first argument that is not a command (exit status 2)."""
    choices = ", ".join(COMMANDS)
    if name.startswith("-"):
        return f"{PROG}: error: put a command before '{name}'; the commands are: {choices}"
    return f"{PROG}: error: unknown command '{name}'; the commands are: {choices}"
