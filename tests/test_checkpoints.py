"""Stage checkpoints on disk (coscale.loop.checkpoint_store): versions behind a pointer, a full
disk during a write, and the removal of a finished stage's checkpoints."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from coscale.loop import checkpoint_store as store

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


def test_a_save_is_a_new_version_and_the_pointer_switches_to_it(tmp_path):
    folder = str(tmp_path)
    assert store.last_checkpoint(folder) is None
    first = store.next_version(folder)
    assert first == os.path.join(folder, "v000001.ckpt")
    os.makedirs(first)  # a folder of shards, as FSDP2 writes it
    (Path(first) / "__0_0.distcp").write_text("shard")
    store.switch_to(first)
    assert store.last_checkpoint(folder) == first
    second = store.next_version(folder)
    Path(second).write_text("whole")  # a file, as one process or DDP writes it
    half = store.next_version(folder)  # not switched to: a save killed halfway
    assert half == second
    store.switch_to(second)
    assert sorted(os.listdir(folder)) == ["latest", "v000002.ckpt"]  # the old folder removed
    os.makedirs(os.path.join(folder, "v000003.ckpt"))  # killed before its switch
    assert store.last_checkpoint(folder) == second  # resume reads the whole one
    assert store.remove_leftovers(folder) == ["v000003.ckpt"]
    os.remove(second)
    with pytest.raises(FileNotFoundError, match=r"names v000002\.ckpt, which is missing"):
        store.last_checkpoint(folder)


def test_a_run_saved_before_versions_resumes_from_its_last_ckpt(tmp_path):
    (tmp_path / "last.ckpt").write_text("old")
    assert store.last_checkpoint(str(tmp_path)) == str(tmp_path / "last.ckpt")
    assert store.next_version(str(tmp_path)).endswith("v000001.ckpt")


def test_finished_stages_checkpoints_are_removed_unless_kept(tmp_path):
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineConfig

    rows = [{"id": i, "question": f"{i}+1", "answer": "2"} for i in "abc"]
    for keep in (False, True):
        run_dir = tmp_path / str(keep)
        cfg = PipelineConfig(model="m", run_dir=str(run_dir), logger="none", keep_checkpoints=keep)
        pipe = Pipeline(cfg, ProblemDataModule(train=rows))
        ckpt = run_dir / "it1" / "sft" / "ckpt"
        (ckpt / "v000001.ckpt").mkdir(parents=True)
        store.switch_to(str(ckpt / "v000001.ckpt"))
        pipe.stage("it1/sft", lambda name: None)
        assert json.loads((run_dir / "pipeline_state.json").read_text())["done"] == ["it1/sft"]
        assert ckpt.exists() == keep


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_full_disk_stops_the_run_naming_the_folder_and_the_same_command_resumes(
    tmp_path, monkeypatch, capsys
):
    """The second checkpoint write of it1/sft runs out of space halfway: the run stops with one
    line naming the folder; the pointer still names a whole checkpoint, the state file is that
    of the stages before; the same command then finishes, and each done stage's checkpoints
    are gone (a kept setting is tested above)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from coscale.app.cli import main

    run_dir = tmp_path / "run"
    argv = ["run", "--config", str(TINY), "--pipeline.run_dir", str(run_dir)]
    argv += ["--pipeline.logger", "none", "--pipeline.sft_epochs", "3"]
    argv += ["--pipeline.warmup_problems", "8", "--pipeline.rl_epochs", "1"]
    save, writes = TorchCheckpointIO.save_checkpoint, []

    def full_disk(self, checkpoint, path, storage_options=None):
        if "it1/sft" in str(path) and len(writes) == 1:
            Path(path).write_bytes(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        writes.extend(["it1/sft"] if "it1/sft" in str(path) else [])
        return save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", full_disk)
    assert main(argv) == 1
    folder = run_dir / "it1" / "sft" / "ckpt"
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"In {folder}, the last whole checkpoint, {folder / 'v000001.ckpt'}," in err
    assert "the disk is full" in err and "run the same command to resume" in err
    assert sorted(os.listdir(folder)) == ["latest", "v000001.ckpt"]  # the half one removed
    assert torch.load(folder / "v000001.ckpt", weights_only=False)["global_step"] == 1
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"] == ["warmup", "it1/scale"]

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", save)  # space freed
    assert main(argv) == 0
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"][-1] == "final" and "it1/sft" in state["models"]
    assert not list(run_dir.glob("**/ckpt"))  # every done stage's checkpoints removed
