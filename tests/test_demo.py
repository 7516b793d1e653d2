"""`coscale demo --quick` end to end: the table, the plots and the W&B offline run exist."""

from __future__ import annotations

import json
import re

import pytest

from coscale.app.cli import main
from coscale.app.demo import SETS


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_demo_writes_table_plots_and_wandb_run(tmp_path, capsys, wandb_log):
    run_dir = tmp_path / "demo"
    assert main(["demo", "--quick", "--pipeline.run_dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "== stage it1/rl |" in out and "== stage final |" in out
    table = (run_dir / "results.md").read_text()
    for label in ("| base |", "| final |"):
        assert label in table
    # choices read the validation side, the report scores the test side
    assert "Validation (checkpoint selection, final keep rule): `builtin:tiers?" in table
    assert "&side=val`. Test (scored once, here): 16 test-side problems" in table
    # the machine and precision its figures come from
    assert re.search(
        r"\nMeasured on: CPU: .+; native bf16: .+; precision (32-true|bf16-mixed)\.", table
    )
    assert re.search(r"selection: step \d+ of \d+ kept, .* on 16 problems \(first: T3\w*-val-", out)
    for name in SETS:
        assert f"{name} pass@1" in table
    # demo.yaml's one change to the paper's loop, with its figure
    assert (
        "- `pipeline.final.rl: true` (the paper: `false`): the final retrain's own RL stage"
        in table
    )
    report = json.loads((run_dir / "results.json").read_text())["report"]
    assert set(report["curve"]) == {"base", "iteration 1", "final"}
    base = report["base"]["T3"]["pass@1"]
    assert 0 <= base["low"] <= base["mean"] <= base["high"] <= 1
    for png in ("pools.png", "accuracy.png", "n_per_group.png"):
        assert (run_dir / png).stat().st_size > 5_000
    data = wandb_log(run_dir / "logs" / "wandb", [b"val/demo_results", b"demo-report"])
    assert b"val/demo_results" in data and b"pool/solvable" in data
    # the plots as images, the report's files as an artifact, read back from the run file
    from coscale.modules.wandb_file import artifacts, history

    (path,) = (run_dir / "logs" / "wandb").glob("offline-run-*/*.wandb")
    logged = {key for row in history(path) for key in row}
    assert {"val/pools", "val/accuracy", "val/n_per_group"} <= logged
    (report_files,) = [a for a in artifacts(path) if a.name == "demo-report"]
    files = {entry.path for entry in report_files.manifest.contents}
    assert {"results.md", "results.json", "pools.png", "accuracy.png"} <= files
