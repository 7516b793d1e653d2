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
TINY = ROOT / "configs" / "run" / "tiny.yaml"


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
    # the whole version before it is kept, each with its manifest
    assert sorted(os.listdir(folder)) == sorted(["latest", *_version(1), *_version(2)])
    os.makedirs(os.path.join(folder, "v000003.ckpt"))  # killed before its switch
    assert store.last_checkpoint(folder) == second  # resume reads the whole one
    assert store.remove_leftovers(folder) == ["v000003.ckpt"]
    third = store.next_version(folder)
    Path(third).write_text("whole")
    store.switch_to(third)
    assert sorted(os.listdir(folder)) == sorted(["latest", *_version(2), *_version(3)])
    os.remove(third)
    with pytest.raises(FileNotFoundError, match=r"names v000003\.ckpt, which is missing"):
        store.last_checkpoint(folder)


def _version(k: int) -> list[str]:
    return [f"v{k:06d}.ckpt", f"v{k:06d}.ckpt.manifest.json"]


def _save(folder: str, text: str, what: str) -> str:
    path = store.next_version(folder)
    Path(path).write_text(text)
    store.switch_to(path, what)
    return path


def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(tmp_path, capsys):
    folder = str(tmp_path)
    first = _save(folder, "step three", "step 3")
    second = _save(folder, "step four", "step 4")
    with open(second, "r+") as f:
        f.truncate(4)  # storage that lost the end of the write
    assert store.last_checkpoint(folder) == first
    err = capsys.readouterr().err
    assert f"checkpoint {second} is damaged (v000002.ckpt holds 4 of its 9 bytes)" in err
    assert "resuming from v000001.ckpt (step 3), the commit point before it" in err
    assert store.last_checkpoint(folder) == first and capsys.readouterr().err == ""  # said once
    third = _save(folder, "step four again", "step 4")  # the redone step replaces the damaged
    assert store.last_checkpoint(folder) == third
    assert sorted(os.listdir(folder)) == sorted(["latest", *_version(1), *_version(3)])


def test_a_missing_shard_is_found_and_no_whole_version_restarts_the_stage(tmp_path, capsys):
    folder = str(tmp_path)
    path = store.next_version(folder)
    os.makedirs(path)  # FSDP2's folder: a shard per rank, metadata
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        (Path(path) / name).write_text(name)
    store.switch_to(path, "step 1")
    assert store.damage(path) is None
    os.remove(Path(path) / "__1_0.distcp")
    assert store.damage(path) == "__1_0.distcp is missing"
    assert store.last_checkpoint(folder) is None  # the stage starts again from its start
    assert "no whole checkpoint is left before it" in capsys.readouterr().err


def test_a_run_saved_before_versions_resumes_from_its_last_ckpt(tmp_path):
    (tmp_path / "last.ckpt").write_text("old")
    assert store.last_checkpoint(str(tmp_path)) == str(tmp_path / "last.ckpt")
    assert store.next_version(str(tmp_path)).endswith("v000001.ckpt")


def test_finished_stages_checkpoints_are_removed_unless_kept(tmp_path):
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineSettings

    rows = [{"id": i, "question": f"{i}+1", "answer": "2"} for i in "abc"]
    for keep in (False, True):
        run_dir = tmp_path / str(keep)
        cfg = PipelineSettings(
            model="m", run_dir=str(run_dir), logger="none", keep_checkpoints=keep
        )
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
    assert sorted(os.listdir(folder)) == ["latest", *_version(1)]  # the half one removed
    assert torch.load(folder / "v000001.ckpt", weights_only=False)["global_step"] == 1
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"] == ["warmup", "it1/scale"]

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", save)  # space freed
    assert main(argv) == 0
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"][-1] == "final" and "it1/sft" in state["models"]
    assert not list(run_dir.glob("**/ckpt"))  # every done stage's checkpoints removed
