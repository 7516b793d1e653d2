"""One W&B run per `coscale run` (offline here): WandbLogger's own arguments passed through
`pipeline.wandb`, the run id kept in the logs folder so a restarted run goes on in the same W&B
run, and the whole resolved config in `<run_dir>/config.yaml` and in the run's config. Read back
through wandb's own run object and the offline folders it writes, not mocks."""

from __future__ import annotations

import json

import pytest

from coscale.app.run_config import keep_config
from coscale.modules.loggers import finish, make_logger


def test_one_run_id_across_restarts_with_the_users_wandb_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logs = tmp_path / "logs"
    ids = []
    for _ in range(2):  # the run, then the same command restarted
        logger = make_logger("wandb", str(logs), "coscale-test", name="n", tags=["a"], group="g")
        run = logger.experiment
        logger.log_hyperparams({"run": {"pipeline": {"iterations": 3}}})
        assert (run.name, tuple(run.tags), run.group) == ("n", ("a",), "g")
        assert run.config["run"]["pipeline"]["iterations"] == 3
        ids.append(run.id)
        finish(logger)
    assert ids[0] == ids[1] == (logs / "wandb_run_id").read_text().strip()
    folders = sorted(p.name for p in (logs / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(ids[0] in f for f in folders)  # a second in one: "-1"


def test_unknown_wandb_arguments_are_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match=r"pipeline\.wandb: unknown keys \['nme'\]"):
        make_logger("wandb", str(tmp_path), nme="x")


def test_the_resolved_config_is_kept_and_a_resumed_run_says_what_changed(tmp_path, capsys):
    first = "pipeline:\n  iterations: 2\n  sft: {optimizer: {lr: 0.1}}\ndata: {batch_size: 8}\n"
    assert keep_config(first, str(tmp_path)) == {
        "pipeline": {"iterations": 2, "sft": {"optimizer": {"lr": 0.1}}},
        "data": {"batch_size": 8},
    }
    assert capsys.readouterr().out == ""
    second = first.replace("lr: 0.1", "lr: 0.2").replace("batch_size: 8", "batch_size: 4")
    keep_config(second, str(tmp_path))
    out = capsys.readouterr().out
    assert "differ from the saved run's: data.batch_size, pipeline.sft.optimizer.lr" in out
    assert (tmp_path / "config.yaml").read_text() == second


def test_log_model_logs_the_final_model_folder_as_a_model_artifact_with_its_scores(tmp_path):
    from coscale.modules.artifacts import log_model_folder
    from coscale.modules.wandb_file import artifacts

    model = tmp_path / "final" / "model"
    (model / "adapter").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "adapter" / "adapter_config.json").write_text("{}")
    assert not log_model_folder(make_logger("csv", str(tmp_path / "csv")), str(model))
    logger = make_logger("wandb", str(tmp_path / "logs"), "coscale-test", log_model=True)
    assert logger.log_final_model and not logger._log_model  # not Lightning's checkpoint logging
    scores = {"val/final_after_pass@1": 0.25, "val/final_kept_retrained": 1.0, "notes": [1]}
    assert log_model_folder(logger, str(model), scores)
    run_id = logger.experiment.id
    finish(logger)
    (path,) = (tmp_path / "logs" / "wandb").glob("offline-run-*/*.wandb")
    (artifact,) = _settled(path, artifacts, 1)()
    assert (artifact.type, artifact.name) == ("model", f"model-{run_id}")
    assert set(artifact.aliases) == {"latest", "final"}
    assert json.loads(artifact.metadata) == {k: v for k, v in scores.items() if k != "notes"}
    files = {entry.path for entry in artifact.manifest.contents}
    assert files == {"config.json", "adapter/adapter_config.json"}


def test_an_offline_run_file_cut_mid_record_reads_up_to_the_cut(tmp_path):
    """A killed writer can leave half a chunk at the end: the reader stops there."""
    from coscale.modules.wandb_file import history

    logger = make_logger("wandb", str(tmp_path / "logs"), "coscale-test")
    for step in range(50):
        logger.log_metrics({"x": float(step), "pad": "y" * 2000}, step=step)
    finish(logger)
    (path,) = (tmp_path / "logs" / "wandb").glob("offline-run-*/*.wandb")
    read = _settled(path, lambda p: [row["x"] for row in history(p) if "x" in row], 50)
    whole = read()
    assert whole == [float(s) for s in range(50)]
    cut = tmp_path / "cut.wandb"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    got = [row["x"] for row in history(cut) if "x" in row]
    assert 10 < len(got) < 50 and got == whole[: len(got)]


def _settled(path, read, count: int, wait_s: float = 30.0):
    """``read`` of the run file at ``path``, once it returns ``count`` items: W&B's service
    process may still be writing the file after ``finish`` returns."""
    import time

    deadline = time.monotonic() + wait_s
    while len(read(path)) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    return lambda: read(path)
