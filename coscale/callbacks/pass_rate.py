"""PassRateEvaluation: re-measures problems' accuracy with K samples and relabels the pools.

The pools decide what each stage trains on (METHOD.md, "Problem pools"), so their labels must
come from a fresh measurement: K samples per problem, pass@1 = correct / K. The problems are
split into chunks dealt round-robin to the ranks and the counts gathered, so every rank
records exactly the same outcomes and the pools agree everywhere.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.callbacks.sft_stage import datamodule_or_warn, log_to_loggers
from coscale.metrics import PassAtK
from coscale.modules.distributed import all_gather_objects
from coscale.pools import Pool
from coscale.rollout.base import SamplingParams

_POOLS = tuple(p.value for p in Pool)


class PassRateEvaluation(Callback):
    """Samples ``k`` completions per problem of ``pools`` and records the accuracy in the pools.

    Runs at every ``every_n_epochs``-th training epoch end (and at the start of a fresh fit when
    asked). Logs ``pool/<name>`` for all four pools, ``pool/pass@1`` and ``pool/pass@<k>`` over
    the evaluated problems, and a per-problem table (id, pool, acc, evaluations) to loggers
    that have ``log_table`` (W&B).

    Args:
        k: Samples per problem.
        every_n_epochs: Evaluate when ``(epoch + 1) % every_n_epochs == 0``.
        pools: Pools whose problems are evaluated.
        max_problems: Evaluate a seeded random subset of at most this many problems (a new
            subset each evaluation); ``None`` evaluates all.
        temperature: Sampling temperature (overrides the module's ``val_sampling``).
        max_new_tokens: Token limit per sample; ``None`` keeps the module's ``val_sampling``.
        on_fit_start: Also evaluate at the start of a fresh fit (``global_step == 0``).
        log_table: Log the per-problem table.
        batch_size: Problems per ``count_correct`` call.
        seed: Base seed of sampling and of the subset; ``None`` uses the ambient RNG.
    """

    def __init__(
        self,
        k: int = 16,
        every_n_epochs: int = 1,
        pools: tuple[str, ...] = ("unsolvable", "solvable", "solved"),
        max_problems: int | None = None,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        on_fit_start: bool = False,
        log_table: bool = True,
        batch_size: int = 16,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        pools = (pools,) if isinstance(pools, str) else tuple(pools)
        errors = [f"{name} must be an int >= 1, got {value!r}" for name, value, optional in [
            ("k", k, False), ("every_n_epochs", every_n_epochs, False), ("batch_size", batch_size, False),
            ("max_problems", max_problems, True), ("max_new_tokens", max_new_tokens, True),
        ] if not (_positive_int(value) or (optional and value is None))]
        if not pools or any(p not in _POOLS for p in pools):
            errors.append(f"pools must be a non-empty list from {list(_POOLS)}, got {list(pools)}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            errors.append(f"temperature must be a number >= 0, got {temperature!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            errors.append(f"seed must be an int or None, got {seed!r}")
        if errors:
            raise ValueError("PassRateEvaluation: " + "; ".join(errors))
        self.k, self.every_n_epochs, self.pools = k, every_n_epochs, pools
        self.max_problems, self.temperature, self.max_new_tokens = max_problems, temperature, max_new_tokens
        self.at_fit_start, self.log_table, self.batch_size, self.seed = on_fit_start, log_table, batch_size, seed
        self.evaluations = 0
        self.last_metrics: dict[str, float] = {}

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.at_fit_start and trainer.global_step == 0:
            self.evaluate(trainer, pl_module, tag="fit_start")

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs or datamodule_or_warn(trainer, self) is None:
            return
        self.evaluate(trainer, pl_module, tag=f"epoch_{epoch}", log_scalars=False)
        pl_module.log_dict(self.last_metrics, rank_zero_only=True)  # also feeds callback_metrics

    def evaluate(self, trainer: Any, pl_module: Any, tag: str | None = None, log_scalars: bool = True) -> dict[str, dict]:
        """Measures the chosen problems now and records them in the pools (same on every rank).

        Args:
            trainer: Gives the datamodule, the rank / world size and the loggers.
            pl_module: Has ``count_correct(problems, n, sampling)`` (and ``val_sampling``).
            tag: Key suffix of the table (default ``eval_<number>``).
            log_scalars: Log ``last_metrics`` straight to the loggers.

        Returns:
            ``{problem_id: {"n", "c", "pool"}}`` of the evaluated problems ({} without pools).
        """
        dm = datamodule_or_warn(trainer, self)
        if dm is None:
            return {}
        dm.close_rl_epoch()  # the epoch's RL tally first, so this measurement is the last word
        ids = self._chosen(dm)
        problems = [{"id": i, "question": dm.problems[i].question, "answer": dm.problems[i].answer} for i in ids]
        counts = sample_counts(trainer, pl_module, problems, self.k, self._sampling(pl_module), self.batch_size)
        results = {pid: {"n": self.k, "c": c, "pool": dm.pools.record(pid, self.k, c).value}
                   for pid, c in zip(ids, counts)}
        self.evaluations += 1
        self.last_metrics = {f"pool/{name}": float(n) for name, n in dm.pools.counts().items()}
        if counts:
            metric = PassAtK(k=sorted({1, self.k}), sync_on_compute=False)
            metric.update([self.k] * len(counts), counts)
            self.last_metrics |= {f"pool/{key}": float(v) for key, v in metric.compute().items()}
        if self.log_table:
            self._log_table(trainer, dm, tag or f"eval_{self.evaluations}")
        if log_scalars:
            log_to_loggers(trainer, self.last_metrics)
        return results

    def _chosen(self, dm: Any) -> list[str]:
        ids = [i for i in dm.pools.ids() if i in dm.problems and dm.pools.pool_of(i).value in self.pools]
        if self.max_problems is None or len(ids) <= self.max_problems:
            return ids
        rng = random.Random(None if self.seed is None else self.seed * 7_919 + self.evaluations)
        return [ids[i] for i in sorted(rng.sample(range(len(ids)), self.max_problems))]

    def _sampling(self, pl_module: Any) -> SamplingParams:
        base = getattr(pl_module, "val_sampling", None) or SamplingParams()
        seed = None if self.seed is None else self.seed * 1_000_003 + self.evaluations * 10_007
        tokens = self.max_new_tokens or base.max_new_tokens
        return replace(base, temperature=self.temperature, max_new_tokens=tokens, seed=seed)

    def _log_table(self, trainer: Any, dm: Any, tag: str) -> None:
        loggers = [lg for lg in getattr(trainer, "loggers", []) if hasattr(lg, "log_table")]
        if not loggers or not getattr(trainer, "is_global_zero", True):
            return
        rows = [[i, dm.pools.pool_of(i).value, dm.pools.accuracy(i), len(dm.pools.history(i))] for i in dm.pools.ids()]
        for lg in loggers:
            lg.log_table(key=f"pool/problems_{tag}", columns=["id", "pool", "acc", "evaluations"], data=rows)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.evaluations = int(state_dict.get("evaluations", 0))


def sample_counts(trainer: Any, pl_module: Any, problems: list[dict], n: int, sampling: SamplingParams,
                  batch_size: int = 16) -> list[int]:
    """Correct samples out of ``n`` per problem, measured by all ranks together.

    Chunks of ``batch_size`` problems are dealt round-robin to the ranks; chunk ``j`` samples
    with ``sampling.seed + j``, so the counts do not depend on the number of ranks. Every rank
    returns the full list, in the order of ``problems``.
    """
    chunks = [problems[i : i + batch_size] for i in range(0, len(problems), batch_size)]
    rank, world = getattr(trainer, "global_rank", 0), getattr(trainer, "world_size", 1)
    mine = []
    for j in range(rank, len(chunks), world):
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + j)
        mine.append((j, list(pl_module.count_correct(chunks[j], n, params))))
    done = dict(all_gather_objects(mine))
    return [c for j in range(len(chunks)) for c in done[j]]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
