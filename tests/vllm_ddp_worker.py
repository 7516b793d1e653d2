"""Run by tests/test_vllm_engine.py as a script: a GRPO fit with vLLM rollouts, strategy=ddp on
2 CPU processes, one engine per rank (vLLM's ``external_launcher``), twice in a row.

Each rank writes to ``<out>/rank<r>.json``: every parity check (sync number, mean |diff|), the
completions its engine sampled, and a checksum of its weights. The second fit builds a new engine
after the first one's shutdown: that shutdown must leave the trainer's process group alive.
Lightning launches rank 1 by running this script again with the same arguments.
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from ddp_worker import _trainer, digit_grpo, loaded_data, mark_solvable, write_rank


class Record(L.Callback):
    """Every parity check and every sampled completion of the module's backend."""

    def __init__(self) -> None:
        self.parity: list[tuple[int, float]] = []
        self.texts: list[str] = []

    def on_train_start(self, trainer, module) -> None:
        backend = module.backend
        check, generate = backend.check_parity, backend.generate

        def checked():
            result = check()
            self.parity.append((backend.book.version, result.mean_abs))
            return result

        def sampled(*args, **kwargs):
            rollouts = generate(*args, **kwargs)
            self.texts += rollouts.texts
            return rollouts

        backend.check_parity, backend.generate = checked, sampled
        self._originals = (backend, check, generate)

    def on_train_end(self, trainer, module) -> None:
        backend, check, generate = self._originals
        backend.check_parity, backend.generate = check, generate


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dm = loaded_data(8)
    mark_solvable(dm)
    vllm = {"backend": "vllm", "options": {"engine": {"dtype": "float32"}}}
    grpo = digit_grpo(model_dir, micro_batch_size=4, rollout=vllm)
    records = [Record(), Record()]
    for record in records:  # the first fit's teardown shuts its engine down
        _trainer(max_steps=2, callbacks=[record]).fit(grpo, datamodule=dm)
    state = {
        "parity": [r.parity for r in records],
        "texts": [r.texts for r in records],
        "grpo_sum": float(sum(p.double().sum() for p in grpo.policy.parameters())),
        "syncs": grpo.backend.book.version,
    }
    write_rank(out, state)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
