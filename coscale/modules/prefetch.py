"""Asynchronous GRPO (``update.max_staleness: k``): the rollouts of an epoch's next k batches
are requested while the current batch trains, from a backend that samples on its own weights
in the background (`VLLMServerBackend.submit`).

Bound: at the step of batch i the requests of batches up to i + k go out, sampled by the
weights of sync v_i; before the step's own weight sync the module waits until every request
out is sampled (`Prefetch.wait`), so no request straddles a sync and batch j, trained at
step j <= i + k, is at most k optimiser steps old. That wait also keeps a seeded run
reproducible: which weights sample a batch never depends on timing.

What is sampled ahead is not counted anywhere until its batch trains: the step that trains
it scores it, reports it to the curriculum and logs its staleness. Nothing ahead crosses an
epoch's end (the next epoch's batches come from the pools its start builds). What is out at a
checkpoint is saved in it, sampled (the step waited for it before its sync), with its
staleness, every rank's (`Prefetch.state_dict`): a fit resumed from it trains those batches
on the rollouts the older weights sampled, as the fit never stopped would, not on new requests
sampled by the resumed weights (TRL's asynchronous trainer loses them, trl#7274).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from coscale.clock import timed
from coscale.modules.fit_data import batch_position, upcoming_batches
from coscale.rollout.base import Rollouts, SamplingParams
from coscale.seeds import derive_seed

Key = tuple[int, int]  # (epoch, batch index in it)


class Pending(Protocol):
    """Rollouts being sampled (`coscale.rollout.vllm.server.backend.PendingRollouts`)."""

    version: int

    def result(self) -> Any: ...


def batch_ids(batch: Sequence[dict]) -> tuple[str, ...]:
    """What identifies a batch's contents: its problems' ids and their N, in order."""
    return tuple(f"{p['id']}:{p.get('n')}" for p in batch)


@dataclass
class Sampled:
    """Rollouts sampled ahead before a checkpoint, restored from it: already done, ``lag``
    weight syncs old when saved (their ``version`` is set from it once the resumed fit's
    first sync is made, `Prefetch.rebase`)."""

    rollouts: Rollouts
    lag: int
    version: int = 0

    def result(self) -> Rollouts:
        return self.rollouts


class Prefetch:
    """The requests out for batches ahead, by position, each with its batch's ids."""

    def __init__(self) -> None:
        self._out: dict[Key, tuple[tuple[str, ...], Pending]] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._out

    def __len__(self) -> int:
        return len(self._out)

    def add(self, key: Key, batch: Sequence[dict], pending: Pending) -> None:
        self._out[key] = (batch_ids(batch), pending)

    def take(self, key: Key, batch: Sequence[dict]) -> Pending | None:
        """The requests out for the batch at `key`, if they were for these very problems;
        requests out for earlier positions are dropped (a position skipped or a new epoch)."""
        for old in [k for k in self._out if k < key]:
            del self._out[old]
        found = self._out.pop(key, None)
        if found is None or found[0] != batch_ids(batch):
            return None
        return found[1]

    def wait(self) -> None:
        """Until every request out is sampled (before a weight sync)."""
        for _, pending in self._out.values():
            future = getattr(pending, "future", None)
            if future is not None:
                future.exception()  # waits; an error is raised when its batch takes it

    def clear(self) -> None:
        self.wait()
        self._out.clear()

    def state_dict(self, version: int) -> list[dict[str, Any]]:
        """What is out, sampled, for a checkpoint (``version``: the backend's sync count now).
        A request that failed is left out: the resumed fit requests it again."""
        self.wait()
        state = []
        for (epoch, index), (ids, pending) in sorted(self._out.items()):
            future = getattr(pending, "future", None)
            if future is not None and future.exception() is not None:
                continue
            rollouts = asdict(pending.result())  # tensors and lists: a safe load reads them
            lag = version - pending.version
            state.append(
                {"key": [epoch, index], "ids": list(ids), "rollouts": rollouts, "lag": lag}
            )
        return state

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Puts back what a checkpoint's `state_dict` holds (replacing what is out)."""
        self._out = {
            (int(e["key"][0]), int(e["key"][1])): (
                tuple(e["ids"]),
                Sampled(Rollouts(**e["rollouts"]), int(e["lag"])),
            )
            for e in state
        }

    def rebase(self, version: int) -> None:
        """Restored rollouts are ``lag`` syncs older than the backend's sync ``version`` (the
        resumed fit's first sync: the checkpoint's weights)."""
        for _, pending in self._out.values():
            if isinstance(pending, Sampled):
                pending.version = version - pending.lag


def sample_ahead(module: Any, batch: list[dict]) -> tuple[Any, Any, int]:
    """The rollouts of the batch `module` (a GRPOModule) trains now, sampled ahead where they
    were, with their scores and staleness (syncs since the weights that sampled them); the
    requests of the next ``update.max_staleness`` batches go out first.

    Raises:
        ValueError: When the backend cannot sample in the background, the fit's loader is not
            coscale's (the batches ahead are unknown), or the rollouts' log-probs are not the
            engine's (stale samples need them for the mismatch correction); each names
            ``update.max_staleness``.
    """
    backend = module.backend
    if not hasattr(backend, "submit"):
        raise ValueError(
            f"update.max_staleness={module.update_settings.max_staleness} needs a backend that "
            f"samples in the background (rollout.backend: vllm-server), got {backend.name!r}"
        )
    here = batch_position(module.trainer)
    if here is None:
        raise ValueError(
            "update.max_staleness > 0 needs a fit on coscale's data modules (ProblemDataModule, "
            "CurriculumDataModule): with another loader the batches ahead are unknown"
        )
    pending = module.prefetched.take(here, batch) or _submit(module, here, batch)
    for key, ahead in upcoming_batches(module.trainer, module.update_settings.max_staleness):
        if key not in module.prefetched:
            module.prefetched.add(key, ahead, _submit(module, key, ahead))
    with timed("sampling"):  # the wait: what sampling ahead did not hide
        rollouts = pending.result()
    if rollouts.logprob_source != "engine":
        raise ValueError(
            "update.max_staleness > 0 needs the engine's log-probs (rollout.options.logprobs: "
            "auto or engine, with sampling.top_k 0 and top_p 1): the trainer's, computed now, "
            "are not those of the weights that sampled"
        )
    module.record_spend(rollouts.num_rollouts)
    prompts = module.prompts_for([p["question"] for p in batch])
    scores = module.rewards.score(module.reward_inputs(batch, prompts, rollouts))
    return rollouts, scores, backend.book.version - pending.version


def _submit(module: Any, key: Key, batch: list[dict]) -> Pending:
    """The requests of the batch at `key`, seeded by its position (not by the step that
    happens to send them), so a resumed fit sends the same."""
    epoch, index = key
    seed = derive_seed("batch", module.seed, epoch, index, module.global_rank)
    sampling = SamplingParams(**{**module.sampling.__dict__, "seed": seed})
    prompts = module.prompts_for([p["question"] for p in batch])
    return module.backend.submit(prompts, [p["n"] for p in batch], sampling)
