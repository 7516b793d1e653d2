"""Run by tests/test_multiprocess.py as a script, on 2 CPU processes over gloo.

``fits <model_dir> <out>``: one ``Trainer.fit`` of an SFTModule and one of a GRPOModule with a
ReDistillation callback under FSDP2 (Lightning's ``ModelParallelStrategy``, ``fully_shard`` per
decoder layer), each followed by an export; rank 0 saves the gathered weights
(``<out>/{sft,grpo}_gathered.pt``) and every rank writes what it saw to ``<out>/rank<r>.json``. Lightning launches rank 1 by running this script again.

``lora <model_dir> <out> [ddp|fsdp2|single]``: an SFT fit of a LoRA adapter and its export
(merged weights plus ``adapter/``), with the gathered weights of the adapted policy beside it,
then a GRPO fit of a new adapter with a KL term to the base and its export; under FSDP2
(default), DDP, or in one process with the 2 ranks' SFT batch (``single``).

``lockstep <model_dir> <out>``: the cached-decode backend on a ``fully_shard``ed policy, where
every row of rank 0 ends at its first token and rank 1 decodes to the token limit; rank 1's
completions must equal those of the unsharded model. Without lockstep rank 0 stops stepping,
rank 1 waits in its next forward's all-gather, and the gloo timeout (30 s) fails the run.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import lightning as L
import torch
from ddp_worker import _trainer as ddp_trainer
from ddp_worker import digit_grpo, loaded_data, mark_solvable, write_rank

from coscale.callbacks import ReDistillation
from coscale.models.full_state import full_state_dict
from coscale.modules import SFTModule


def _trainer(**kw) -> L.Trainer:
    from lightning.pytorch.strategies import ModelParallelStrategy

    fsdp2 = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    return ddp_trainer(strategy=fsdp2, **kw)


def _single(**kw) -> L.Trainer:
    return ddp_trainer(strategy="auto", devices=1, **kw)


def _gathered(module, path: str) -> int:
    """Gathers the policy's whole weights (every rank calls); rank 0 saves them to ``path``.
    Returns how many tensors this rank got (0 on rank 1: only rank 0 receives them)."""
    state = full_state_dict(module.policy)
    if state:
        torch.save(state, path)
    return len(state)


def fits(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dm = loaded_data(8)
    sft = SFTModule(model=model_dir, optimizer={"lr": 1e-2})
    _trainer(max_steps=2).fit(sft, datamodule=dm)
    sft_tensors = _gathered(sft, os.path.join(out, "sft_gathered.pt"))
    sft.export(os.path.join(out, "sft"))
    mark_solvable(dm)
    grpo = digit_grpo(model_dir)
    redistill = ReDistillation(
        max_per_problem=2,
        sft={"optimizer": {"lr": 1e-2}, "batch_size": 4},
        trainer={"max_steps": 2},
        export_dir=os.path.join(out, "redistilled"),
    )
    _trainer(max_epochs=1, callbacks=[redistill]).fit(grpo, datamodule=dm)
    state = {
        "sft_tensors": sft_tensors,
        "grpo_tensors": _gathered(grpo, os.path.join(out, "grpo_gathered.pt")),
        "redistill_runs": redistill.runs,
        "sharded": type(next(grpo.policy.parameters())).__name__,
    }
    write_rank(out, state)


def lora(model_dir: str, out: str, strategy: str = "fsdp2") -> None:
    """An SFT fit of a LoRA adapter, its export, then a GRPO fit of a new adapter with the KL
    to the base (the policy with its adapter off) and its export, under ``strategy`` (``ddp``
    or ``fsdp2``; ``single``: one process, each SFT step on the pairs of both ranks' steps);
    rank 0 saves the gathered weights of the SFT policy (``lora_gathered.pt``)."""
    import peft

    from coscale.rl.losses import GRPOLoss

    torch.set_num_threads(1)
    trainer = {"fsdp2": _trainer, "ddp": ddp_trainer, "single": _single}[strategy]
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    dm = loaded_data(8, sft_batch_size=8 if strategy == "single" else 4)
    sft = SFTModule(model=model_dir, optimizer={"lr": 1e-2}, peft=config)
    trainer(max_steps=2).fit(sft, datamodule=dm)
    tensors = _gathered(sft, os.path.join(out, "lora_gathered.pt"))
    sft.export(os.path.join(out, "lora"))
    mark_solvable(dm)
    grpo = digit_grpo(model_dir, peft=config, loss=GRPOLoss(beta=0.1))
    trainer(max_epochs=1).fit(grpo, datamodule=dm)
    grpo.export(os.path.join(out, "lora_grpo"))
    sharded = type(next(sft.policy.parameters())).__name__
    write_rank(out, {"tensors": tensors, "sharded": sharded, "kl_on_base": grpo.base_is_reference})


def _lockstep_rank(rank: int, model_dir: str, out: str, port: int) -> None:
    from torch.distributed.fsdp import fully_shard

    from coscale.models.policy import load_policy
    from coscale.rollout.base import SamplingParams
    from coscale.rollout.cached.backend import CachedDecodeBackend

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=30)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, timeout=timeout)
    torch.set_num_threads(1)
    model, tok = load_policy(model_dir)
    prompts, sampling = (
        ["12+7=", "3+4=", "40-2="],
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=3),
    )
    plain = CachedDecodeBackend(model, tok).generate(prompts, 2, sampling).texts
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    backend = CachedDecodeBackend(model, tok)
    if rank == 0:  # every token ends a row: rank 0 is done after one step
        backend.eos_token_ids = tuple(range(len(tok)))
    texts = backend.generate(prompts, 2, sampling).texts
    with open(os.path.join(out, f"lockstep{rank}.json"), "w") as f:
        json.dump({"plain": plain, "sharded": texts}, f)
    torch.distributed.destroy_process_group()


def lockstep(model_dir: str, out: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_lockstep_rank, args=(model_dir, out, port), nprocs=2)


if __name__ == "__main__":
    {"fits": fits, "lora": lora, "lockstep": lockstep}[sys.argv[1]](*sys.argv[2:])
