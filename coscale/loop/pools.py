"""Problem pools: which stage of CoScale-RL every training problem is in.

Each problem sits in exactly one :class:`Pool`, decided from its latest measured accuracy
(pass@1 over K samples) and the budgets it has spent (docs/method.md, "Problem pools"):

* ``acc >= high`` -> SOLVED (leaves RL);
* ``low <= acc < high`` -> SOLVABLE (goes to RL), or FAILED once its RL budget is spent;
* ``acc < low`` (or never measured) -> UNSOLVABLE (gets more SFT solutions), or FAILED once
  ``solutions >= max_solutions`` or ``rl_rounds >= max_rl_rounds``.

The label is a pure function of (latest accuracy, solutions used, RL rounds) and the config:
a FAILED problem later measured solvable with RL budget left moves back to SOLVABLE.

Every move between pools is counted by what caused it (:data:`CAUSES`: a measurement, an RL
epoch's own rollouts, a spent solution or RL budget) in :attr:`ProblemPools.moves`, saved with
the rest, so a run can say which rule moved how many problems where.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from coscale.checks import at_least, within
from coscale.renamed import old_names

_FORMAT = 1


CAUSES = ("measurement", "rl_epoch", "solutions_budget", "rl_budget")
"""What relabels a problem: a measurement's accuracy, an RL epoch's accuracy (its rollouts), a
solution count or an RL round that spends a budget."""


def move_key(old: str, new: str, cause: str) -> str:
    """The key a move is counted under in :attr:`ProblemPools.moves`."""
    return f"{old}->{new} by {cause}"


class Pool(str, Enum):
    """The four pools of CoScale-RL; the values are the keys of :meth:`ProblemPools.counts`."""

    UNSOLVABLE = "unsolvable"
    SOLVABLE = "solvable"
    SOLVED = "solved"
    FAILED = "failed"


@dataclass
class _Record:
    """Everything the pools know about one problem."""

    pool: Pool = Pool.UNSOLVABLE
    history: list[float] = field(default_factory=list)
    solutions: int = 0
    rl_rounds: int = 0


def check_id(problem_id: Any) -> None:
    """Raises unless ``problem_id`` is a non-empty str (the pools' and the bank's key)."""
    if not isinstance(problem_id, str) or not problem_id:
        raise ValueError(f"problem_id must be a non-empty str, got {problem_id!r}")


def warn_if_config_differs(where: str, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """The warning of a ``load_state_dict`` whose saved config wins over the constructor's."""
    if saved != current:
        warnings.warn(
            f"{where}: saved config {saved} differs from the constructor's {current}; "
            "keeping the saved values",
            UserWarning,
            stacklevel=3,
        )


def _config_errors(low: Any, high: Any, max_solutions: Any, max_rl_rounds: Any) -> list[str]:
    """Every problem with a pools config, as messages (empty when valid)."""
    errors = within(0.0, 1.0, float, low=low, high=high)
    if not errors and low >= high:
        errors.append(f"low must be < high, got low={low!r}, high={high!r}")
    return errors + at_least(1, max_solutions=max_solutions, max_rl_rounds=max_rl_rounds)


@dataclass(frozen=True)
class PoolSettings:
    """The pools' thresholds and budgets (part of ``data.curriculum:`` in YAML).

    Attributes:
        low: Accuracy from which a problem counts as solvable (inclusive).
        high: Accuracy from which a problem counts as solved (inclusive).
        max_solutions: SFT solution budget; an unsolvable problem given this many is FAILED.
        max_rl_rounds: RL budget in rounds (epochs); a problem that spent it without being
            solved is FAILED (documented choice: this applies to SOLVABLE problems too).
    """

    low: float = 0.05
    high: float = 0.70
    max_solutions: int = 64
    max_rl_rounds: int = 8


class ProblemPools:
    """Pool membership, accuracy history and spent budgets of every training problem.

    Args:
        rules: The thresholds and budgets (any :class:`PoolSettings`, e.g. the curriculum's
            settings).

    Raises:
        ValueError: Naming every bad rule at once.
    """

    def __init__(self, rules: PoolSettings = PoolSettings()) -> None:
        config = {f.name: getattr(rules, f.name) for f in fields(PoolSettings)}
        self._apply_config(config, "ProblemPools")
        self._records: dict[str, _Record] = {}  # insertion order == registration order
        self.moves: dict[str, int] = {}  # move_key(old, new, cause) -> problems moved so far

    def add(self, problem_id: str) -> None:
        """Register ``problem_id`` as UNSOLVABLE; a no-op when it is already known."""
        self._ensure(problem_id)

    def record(
        self, problem_id: str, n_samples: int, n_correct: int, cause: str = "measurement"
    ) -> Pool:
        """Append the accuracy ``n_correct / n_samples`` and relabel; registers unknown ids.
        ``cause``: what sampled it (``measurement`` or ``rl_epoch``, :data:`CAUSES`).

        Returns:
            The problem's pool after the update.
        """
        errors = at_least(1, n_samples=n_samples)
        errors += within(0, math.inf if errors else n_samples, n_correct=n_correct)
        if errors:
            raise ValueError("ProblemPools.record: " + "; ".join(errors))
        rec = self._ensure(problem_id)
        rec.history.append(n_correct / n_samples)
        return self._relabel(rec, cause)

    def note_solutions(self, problem_id: str, total: int) -> Pool:
        """Set the number of SFT solutions given to the problem so far; registers unknown ids."""
        if errors := at_least(0, total=total):
            raise ValueError("ProblemPools.note_solutions: " + errors[0])
        rec = self._ensure(problem_id)
        rec.solutions = total
        return self._relabel(rec, "solutions_budget")

    def note_rl_round(self, problem_id: str) -> Pool:
        """Count one more RL round (epoch) spent on the problem; registers unknown ids."""
        rec = self._ensure(problem_id)
        rec.rl_rounds += 1
        return self._relabel(rec, "rl_budget")

    def moves_since(self, before: dict[str, int]) -> dict[str, int]:
        """The moves counted since ``before`` (an earlier copy of :attr:`moves`)."""
        now = sorted(self.moves.items())
        return {k: n - before.get(k, 0) for k, n in now if n > before.get(k, 0)}

    def pool_of(self, problem_id: str) -> Pool:
        """The problem's current pool."""
        return self._get(problem_id).pool

    def members(self, pool: Pool | str) -> list[str]:
        """Ids in ``pool`` (a :class:`Pool` or its value), in registration order."""
        try:
            wanted = Pool(pool)
        except ValueError:
            choices = [p.value for p in Pool]
            raise ValueError(f"pool must be one of {choices}, got {pool!r}") from None
        return [pid for pid, rec in self._records.items() if rec.pool is wanted]

    def counts(self) -> dict[str, int]:
        """Number of problems per pool; always has all four keys."""
        out = {p.value: 0 for p in Pool}
        for rec in self._records.values():
            out[rec.pool.value] += 1
        return out

    def history(self, problem_id: str) -> list[float]:
        """Every accuracy recorded for the problem, oldest first (a copy)."""
        return list(self._get(problem_id).history)

    def accuracy(self, problem_id: str) -> float | None:
        """The latest accuracy, or ``None`` when the problem was never measured."""
        hist = self._get(problem_id).history
        return hist[-1] if hist else None

    def solutions_used(self, problem_id: str) -> int:
        """SFT solutions given to the problem so far."""
        return self._get(problem_id).solutions

    def rl_rounds(self, problem_id: str) -> int:
        """RL rounds spent on the problem so far."""
        return self._get(problem_id).rl_rounds

    def ids(self) -> list[str]:
        """All registered ids, in registration order."""
        return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, problem_id: object) -> bool:
        return problem_id in self._records

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (for checkpoints): config plus every problem, in order."""
        problems = [
            {"id": pid, **asdict(rec), "pool": rec.pool.value} for pid, rec in self._records.items()
        ]
        state = {"format": _FORMAT, "config": self._config(), "problems": problems}
        return state | {"moves": dict(self.moves)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the whole state with ``state`` (from :meth:`state_dict`, maybe via JSON).

        The saved config (thresholds and budgets) wins over the constructor's, because the
        saved pool labels were computed with it; a ``UserWarning`` says when they differ.
        """
        config = state["config"]
        records = {}
        for item in state["problems"]:
            check_id(item["id"])
            records[item["id"]] = _Record(
                pool=Pool(item["pool"]),
                history=[float(a) for a in item["history"]],
                solutions=int(item["solutions"]),
                rl_rounds=int(item["rl_rounds"]),
            )
        before = self._config()
        self._apply_config(config, "ProblemPools.load_state_dict")
        warn_if_config_differs("ProblemPools.load_state_dict", config, before)
        self._records = records
        self.moves = {
            k: int(v) for k, v in state.get("moves", {}).items()
        }  # earlier releases saved none

    def _apply_config(self, config: dict[str, Any], where: str) -> None:
        if errors := _config_errors(**config):
            raise ValueError(f"{where}: " + "; ".join(errors))
        self.low, self.high = float(config["low"]), float(config["high"])
        self.max_solutions, self.max_rl_rounds = config["max_solutions"], config["max_rl_rounds"]

    def _config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(PoolSettings)}

    def _ensure(self, problem_id: str) -> _Record:
        check_id(problem_id)
        if problem_id not in self._records:
            self._records[problem_id] = _Record()
        return self._records[problem_id]

    def _get(self, problem_id: str) -> _Record:
        if problem_id not in self._records:
            raise KeyError(f"unknown problem_id {problem_id!r}")
        return self._records[problem_id]

    def _relabel(self, rec: _Record, cause: str) -> Pool:
        old, rec.pool = rec.pool, self._label(rec)
        if rec.pool is not old:
            key = move_key(old.value, rec.pool.value, cause)
            self.moves[key] = self.moves.get(key, 0) + 1
        return rec.pool

    def _label(self, rec: _Record) -> Pool:
        """The pool a record belongs in; see the module docstring for the rule."""
        acc = rec.history[-1] if rec.history else None
        rl_spent = rec.rl_rounds >= self.max_rl_rounds
        if acc is not None and acc >= self.high:
            return Pool.SOLVED
        if acc is not None and acc >= self.low:
            return Pool.FAILED if rl_spent else Pool.SOLVABLE
        if rl_spent or rec.solutions >= self.max_solutions:
            return Pool.FAILED
        return Pool.UNSOLVABLE


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"PoolRules": PoolSettings})
