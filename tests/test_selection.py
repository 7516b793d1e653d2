"""SFT checkpoint selection on the stage's own problems (coscale.measure.selection)."""

from __future__ import annotations

import re

import pytest
import torch
from counting import each_chunk
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_file
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.problem import Problem
from coscale.measure.selection import SelectionSettings, SelectOnProblems, selection_slice
from coscale.modules import SFTModule
from coscale.tasks import arithmetic


class Snapshots(Callback):
    """The policy's weights after every optimiser step (run after the selection's hook)."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        state = pl_module.policy.state_dict()
        self.at[trainer.global_step] = {k: v.detach().clone() for k, v in state.items()}


def _data() -> ProblemDataModule:
    rows = [
        p.to_dict() | {"solutions": arithmetic.solutions_of(p, 2)}
        for p in arithmetic.generate(8, (2,), 5, "s")
    ]
    dm = ProblemDataModule(train=rows, sft_batch_size=4, bank_solutions=2, curriculum={"seed": 1})
    dm.load()
    return dm


def _scripted(module: SFTModule, rates: list[float], k: int) -> list[int]:
    """Makes ``module.count_correct`` return counts giving ``rates`` in turn; returns the seeds
    it was sampled with."""
    calls, seeds = iter(rates), []

    def count_correct(problems, n, sampling):
        assert n == k
        seeds.append(sampling.seed)
        rate = next(calls)
        return [round(rate * n)] * len(problems)

    each_chunk(module, count_correct)
    return seeds


def _fit(module, dm, callbacks, steps: int) -> None:
    trainer = quiet_trainer(steps, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)


def test_the_stage_keeps_the_best_scoring_weights(tiny_model_dir, tmp_path):
    dm = _data()
    module = SFTModule(model=tiny_model_dir, optimizer={"lr": 1e-2})
    seeds = _scripted(module, [0.25, 0.75, 0.5], k=4)  # steps 2, 4 and the end (6)
    problems = selection_slice(dm.problems.values(), 4, seed=0)
    select = SelectOnProblems(problems, samples=4, every_n_steps=2, folder=str(tmp_path / "sel"))
    snaps = Snapshots()
    _fit(module, dm, [select, snaps], steps=6)
    assert select.scores == {2: 0.25, 4: 0.75, 6: 0.5}
    assert select.best_step == 4 and select.best == 0.75
    assert len(set(seeds)) == 1  # the same seeded samples at every scoring
    kept = load_file(f"{select.best_model()}/model.safetensors")
    for name, tensor in kept.items():
        assert torch.equal(tensor, snaps.at[4][name]), name
    assert any(not torch.equal(snaps.at[6][n], t) for n, t in kept.items())  # not the last
    assert sorted(p.name for p in (tmp_path / "sel").iterdir()) == ["step4"]  # others pruned


def test_ties_keep_the_earlier_step_and_the_state_round_trips(tiny_model_dir, tmp_path):
    dm = _data()
    module = SFTModule(model=tiny_model_dir, optimizer={"lr": 1e-2})
    _scripted(module, [0.5, 0.5], k=2)
    problems = selection_slice(dm.problems.values(), 3, 0)
    select = SelectOnProblems(problems, samples=2, every_n_steps=3, folder=str(tmp_path / "sel"))
    _fit(module, dm, [select], steps=6)
    assert select.best_step == 3
    again = SelectOnProblems(problems, samples=2, every_n_steps=3, folder=str(tmp_path / "sel"))
    again.load_state_dict(select.state_dict())
    assert again.scores == select.scores and again.best_model() == select.best_model()


def test_selection_slice_is_seeded_and_bounded():
    problems = list(arithmetic.generate(20, (2,), 1, "p"))
    a, b = selection_slice(problems, 5, seed=3), selection_slice(problems, 5, seed=3)
    assert a == b and len(a) == 5 and {"question", "answer"} <= set(a[0])
    assert selection_slice(problems, 5, seed=4) != a
    assert len(selection_slice(problems, 50, seed=0)) == 20


def test_selection_reads_validation_unless_told_to_read_the_training_problems():
    dm = _data()
    val = [Problem("v1", "1+1", "2")]
    assert SelectionSettings(problems=4).candidates(val, dm.curriculum) == [val[0].to_dict()]
    train = SelectionSettings(problems=4, source="train").candidates(val, dm.curriculum)
    assert [p["id"] for p in train] == list(dm.problems)
    assert [p["id"] for p in SelectionSettings(problems=4).candidates([], dm.curriculum)] == list(
        dm.problems
    )
    assert SelectionSettings(source="test").errors() == [
        "source must be one of val, train; got 'test'"
    ]


def test_pipeline_refuses_bad_selection_settings():
    from coscale.pipeline import PipelineSettings

    with pytest.raises(ValueError, match=r"selection\.every"):
        PipelineSettings(model="m", selection={"problems": 8, "every": 0})


@pytest.mark.slow
def test_pipeline_stages_export_their_selected_weights(tmp_path, capsys):
    """The small pipeline of the 2-process tests, one process, selection on validation problems
    (``data.val``): each SFT stage from the initial model exports the weights of its
    best-scoring step on them."""
    from pathlib import Path

    from coscale.app.run_config import pipeline_parser
    from coscale.pipeline import Pipeline

    config = Path(__file__).with_name("configs") / "two_ranks.yaml"
    args = ["--config", str(config), "--pipeline.run_dir", str(tmp_path / "run")]
    args += ["--pipeline.iterations", "1", "--pipeline.selection.problems", "6"]
    args += ["--pipeline.selection.every", "2"]
    args += ["--data.val", "builtin:tiers?T2=4&T3=4&side=val&seed=0"]
    parser = pipeline_parser()
    init = parser.instantiate(parser.parse_args(args))
    Pipeline(init.pipeline, init.data).run()
    printed = capsys.readouterr().out
    for stage in ("it1/sft", "final/retrain"):
        folder = tmp_path / "run" / stage / "select"
        (kept,) = list(folder.iterdir())  # pruned to the best step
        assert f"selection: {kept.name.replace('step', 'step ')} of 3 kept" in printed
        assert re.search(r"kept, pass@1 [\d.]+ on 6 problems \(first: T[23]-val-\d\)", printed)
        model = tmp_path / "run" / stage / "model" / "model.safetensors"
        ours, best = load_file(model), load_file(kept / "model.safetensors")
        assert all(torch.equal(ours[k], best[k]) for k in best), stage
