"""Run by tests/test_ddp.py as a script: SFT and GRPO fits with strategy=ddp on 2 CPU processes.

Each rank writes its curriculum's state and a checksum of its weights to ``<out>/rank<r>.json``.
What a fit is served follows the module: SFT pairs for the SFTModule, solvable problems for GRPO.
Lightning launches rank 1 by running this script again with the same arguments.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from reward_examples import HasDigit
from trainers import quiet_trainer

from coscale.callbacks import RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule, SFTModule
from coscale.tasks import arithmetic


def _trainer(strategy="ddp", devices=2, max_steps=-1, **kw) -> L.Trainer:
    """2 CPU processes, nothing but the fit (``tests/fsdp_worker.py`` passes FSDP2)."""
    return quiet_trainer(max_steps, devices=devices, strategy=strategy, limit_val_batches=0, **kw)


def loaded_data(problems: int, sft_batch_size: int = 4) -> ProblemDataModule:
    """``problems`` two-term sums with 2 bank solutions each, loaded (shared with fsdp_worker);
    ``sft_batch_size`` pairs per rank and step."""
    rows = [
        p.to_dict() | {"solutions": arithmetic.solutions_of(p, 2)}
        for p in arithmetic.generate(problems, (2,), 5, "d")
    ]
    dm = ProblemDataModule(
        train=rows,
        sft_batch_size=sft_batch_size,
        batch_size=2,
        bank_solutions=2,
        curriculum={"seed": 1},
    )
    dm.load()
    return dm


def mark_solvable(dm: ProblemDataModule) -> None:
    """Records every problem with 2-5 of 10 right: all solvable, so GRPO is served them all."""
    for i, pid in enumerate(dm.problems):
        dm.curriculum.pools.record(pid, 10, 2 + i % 4)


def digit_grpo(model_dir: str, micro_batch_size: int = 3, **kw) -> GRPOModule:
    """The workers' GRPO module: `HasDigit`, 6 new tokens at temperature 1, lr 0.005."""
    return GRPOModule(
        model=model_dir,
        reward=HasDigit(),
        optimizer={"lr": 0.005},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
        update={"micro_batch_size": micro_batch_size},
        **kw,
    )


def write_rank(out: str, state: dict) -> None:
    """``state`` as this rank's ``<out>/rank<r>.json``."""
    rank = int(os.environ.get("LOCAL_RANK", 0))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(state, f, default=str)


def sharded_evaluation(model_dir: str) -> dict:
    """``benchmark_eval.evaluate`` under the process group (the ranks share its calls) and the
    same calls made by this rank alone: 5 problems in calls of 2, so rank 0 makes two of the
    three; a reward that takes even-length completions, so the counts vary."""
    from unittest import mock

    from coscale.app import benchmark_eval
    from coscale.loop.problem import Problem
    from coscale.models.policy import load_policy
    from coscale.rollout.base import SamplingParams
    from coscale.rollout.cached.backend import CachedDecodeBackend

    model, tok = load_policy(model_dir)
    backend = CachedDecodeBackend(model, tok)
    problems = {"set": [Problem(f"p{i}", f"{i}+{i}=", str(2 * i)) for i in range(5)]}

    def even(texts: list[str], _: list[str]) -> list[float]:
        return [float(len(t) % 2 == 0) for t in texts]

    def run() -> dict:
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
        (result,) = benchmark_eval.evaluate(
            backend, lambda qs: qs, problems, even, 4, [1], sampling, 2
        )
        return {"correct": result.correct, "mean_tokens": result.mean_tokens}

    calls, generate_many = [], backend.generate_many
    backend.generate_many = lambda batch: calls.append(len(batch)) or generate_many(batch)
    shared = run()
    made = len(calls)
    alone_world = mock.patch.object(benchmark_eval, "rank_world", return_value=(0, 1))
    no_gather = mock.patch.object(benchmark_eval, "all_gather_objects", side_effect=list)
    with alone_world, no_gather:
        alone = run()
    return {"shared": shared, "alone": alone, "calls": made}


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dm = loaded_data(10)
    cur = dm.curriculum
    sft = SFTModule(model=model_dir, optimizer={"lr": 1e-2})
    _trainer(max_steps=2).fit(sft, datamodule=dm)
    mark_solvable(dm)
    grpo = digit_grpo(model_dir)
    schedule = RolloutNSchedule(num_groups=2, n_init=2, factor=2.0, n_max=8, patience=1)
    closes, close = [], cur.close_epoch
    cur.close_epoch = lambda **kw: closes.append(kw) or close(**kw)  # counts the module's closes
    _trainer(max_epochs=3, callbacks=[schedule]).fit(grpo, datamodule=dm)
    state = {
        "data": cur.state_dict(),
        "closes": len(closes),
        "sft_sum": float(sum(p.double().sum() for p in sft.policy.parameters())),
        "grpo_sum": float(sum(p.double().sum() for p in grpo.policy.parameters())),
        "evaluation": sharded_evaluation(model_dir),
    }
    write_rank(out, state)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
