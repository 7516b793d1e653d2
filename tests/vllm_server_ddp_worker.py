"""Run by tests/test_vllm_server.py as a script: a GRPO fit with ``rollout.backend:
vllm-server``, strategy=ddp on 2 CPU processes, one server for both ranks (rank 0 starts it).

Each rank writes to ``<out>/rank<r>.json``: the server's URL, whether this rank started it, its
parity checks (sync number, mean |diff|), the weight version the server reports after the last
sync, and a checksum of its weights. Lightning launches rank 1 by running this script again.
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from ddp_worker import _trainer, digit_grpo, loaded_data, mark_solvable, write_rank


class Record(L.Callback):
    """The server, every parity check, and the weight version read after the last step."""

    def __init__(self) -> None:
        self.parity: list[tuple[int, float]] = []
        self.server: dict = {}

    def on_train_start(self, trainer, module) -> None:
        backend = module.backend
        check = backend.check_parity

        def checked():
            result = check()
            self.parity.append((backend.book.version, result.mean_abs))
            return result

        backend.check_parity = checked

    def on_train_batch_end(self, trainer, module, *args) -> None:
        engine = module.backend.engine
        self.server = {
            "url": engine.client.url,
            "started_here": engine.process is not None,
            "reported_version": engine.client.weight_version(),
            "syncs": module.backend.book.version,
        }


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dm = loaded_data(8)
    mark_solvable(dm)
    server = {"backend": "vllm-server", "options": {"engine": {"dtype": "float32"}}}
    grpo = digit_grpo(model_dir, micro_batch_size=4, rollout=server)
    record = Record()
    _trainer(max_steps=2, callbacks=[record]).fit(grpo, datamodule=dm)
    state = {
        "parity": record.parity,
        "server": record.server,
        "grpo_sum": float(sum(p.double().sum() for p in grpo.policy.parameters())),
    }
    write_rank(out, state)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
