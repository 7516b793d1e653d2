"""Solution bank and replay buffer: the data side of CoScale-RL.

* The **bank** holds verified solutions per problem in a stable insertion order; SFT takes
  the first k of a problem (data scaling, docs/method.md).
* The **replay buffer** keeps, per problem, the most recent correct RL rollouts with the step
  that produced them; :meth:`SolutionBank.redistill_set` turns it into the re-distillation set
  (docs/method.md, re-distillation: latest correct solution per problem, capped, shuffled with
  a fixed seed).

Everything is JSON-serialisable so it can be saved in a Lightning checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from coscale.checks import at_least
from coscale.loop.pools import check_id, warn_if_config_differs

_FORMAT = 1


@dataclass
class _Entry:
    """One correct rollout in the replay buffer; ``seq`` orders rollouts of the same step."""

    text: str
    step: int
    seq: int


def _config_errors(replay_capacity: Any, replay_per_problem: Any) -> list[str]:
    """Every bad config value, as messages (empty when valid)."""
    errors = at_least(1, optional=True, replay_capacity=replay_capacity)
    return errors + at_least(1, replay_per_problem=replay_per_problem)


def _check_text(text: Any) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty, non-whitespace str, got {text!r}")


class SolutionBank:
    """Verified solutions per problem, plus a replay buffer of correct RL rollouts.

    Args:
        replay_capacity: Most correct rollouts the replay buffer holds over all problems;
            beyond it the oldest (lowest step, then earliest recorded) is dropped.
            ``None``: unbounded.
        replay_per_problem: Most correct rollouts kept per problem (the most recent ones).

    Raises:
        ValueError: When a parameter is not an int >= 1 (``replay_capacity`` may be None).
    """

    def __init__(self, replay_capacity: int | None = None, replay_per_problem: int = 8) -> None:
        if errors := _config_errors(replay_capacity, replay_per_problem):
            raise ValueError("SolutionBank: " + "; ".join(errors))
        self.replay_capacity = replay_capacity
        self.replay_per_problem = replay_per_problem
        self._solutions: dict[str, list[str]] = {}
        self._replay: dict[str, list[_Entry]] = {}  # each list oldest first
        self._seq = 0
        self._recorded = 0
        self._correct = 0

    # ----------------------------------------------------------------- bank
    def add(self, problem_id: str, text: str) -> bool:
        """Append a verified solution; returns False (and keeps the bank) for a duplicate."""
        check_id(problem_id)
        _check_text(text)
        texts = self._solutions.setdefault(problem_id, [])
        if text in texts:
            return False
        texts.append(text)
        return True

    def add_many(self, problem_id: str, texts: list[str]) -> int:
        """Add several solutions (all validated first); returns how many were new."""
        check_id(problem_id)
        texts = list(texts)
        for text in texts:
            _check_text(text)
        return sum(self.add(problem_id, text) for text in texts)

    def take(self, problem_id: str, k: int) -> list[str]:
        """The first ``k`` solutions of the problem (fewer if it has fewer; [] if unknown)."""
        if errors := at_least(0, k=k):
            raise ValueError("SolutionBank.take: " + errors[0])
        return list(self._solutions.get(problem_id, [])[:k])

    def count(self, problem_id: str) -> int:
        """Number of solutions of the problem (0 if unknown)."""
        return len(self._solutions.get(problem_id, []))

    def ids(self) -> list[str]:
        """Problems with at least one solution, in order of their first solution."""
        return list(self._solutions)

    def total(self) -> int:
        """Number of solutions over all problems."""
        return sum(len(texts) for texts in self._solutions.values())

    # ----------------------------------------------------------------- replay
    def record_rollout(self, problem_id: str, text: str, correct: bool, step: int) -> None:
        """Count an RL rollout; a correct one is kept in the problem's replay buffer.

        A correct text already in the buffer is kept once, at the later of its two steps.
        """
        check_id(problem_id)
        errors = at_least(0, step=step)
        if correct not in (True, False):
            errors.append(f"correct must be a bool, got {correct!r}")
        if errors:
            raise ValueError("SolutionBank.record_rollout: " + "; ".join(errors))
        if correct:
            _check_text(text)
        self._recorded += 1
        if not correct:
            return
        self._correct += 1
        buf = self._replay.setdefault(problem_id, [])
        for old in [e for e in buf if e.text == text]:
            buf.remove(old)
            step = max(step, old.step)
        self._seq += 1
        buf.append(_Entry(text, step, self._seq))
        buf.sort(key=lambda e: (e.step, e.seq))  # steps may arrive out of order
        del buf[: max(0, len(buf) - self.replay_per_problem)]
        self._evict()

    def latest_correct(self, problem_id: str) -> str | None:
        """The problem's most recent correct rollout, or None."""
        buf = self._replay.get(problem_id)
        return buf[-1].text if buf else None

    def replay_ids(self) -> list[str]:
        """Problems in the replay buffer, in order of their first kept correct rollout."""
        return list(self._replay)

    def replay_stats(self) -> dict[str, int]:
        """Rollouts ``recorded``, of which ``correct``, and correct ones ``kept`` now."""
        kept = sum(len(buf) for buf in self._replay.values())
        return {"recorded": self._recorded, "correct": self._correct, "kept": kept}

    def redistill_set(
        self,
        max_per_problem: int = 1,
        max_total: int | None = None,
        seed: int = 0,
        since_step: int | None = None,
    ) -> list[tuple[str, str]]:
        """The re-distillation set as ``(problem_id, text)`` pairs, latest first.

        Each problem gives its latest ``max_per_problem`` correct rollouts (latest first),
        only those with ``step >= since_step`` when it is set. Problems are ordered by the step
        of their latest correct rollout, latest first, ties by id. Beyond ``max_total`` pairs a
        subset drawn with ``random.Random(seed)`` is kept, still in that order.
        """
        errors = at_least(1, max_per_problem=max_per_problem)
        errors += at_least(1, optional=True, max_total=max_total)
        errors += at_least(0, optional=True, since_step=since_step)
        if isinstance(seed, bool) or not isinstance(seed, int):
            errors.append(f"seed must be an int, got {seed!r}")
        if errors:
            raise ValueError("SolutionBank.redistill_set: " + "; ".join(errors))
        groups = []
        for pid, buf in self._replay.items():
            fresh = [e for e in buf if since_step is None or e.step >= since_step]
            if fresh:
                picked = fresh[::-1][:max_per_problem]
                groups.append((-picked[0].step, pid, picked))
        groups.sort(key=lambda g: (g[0], g[1]))
        pairs = [(pid, e.text) for _, pid, picked in groups for e in picked]
        if max_total is not None and len(pairs) > max_total:
            keep = sorted(random.Random(seed).sample(range(len(pairs)), max_total))
            pairs = [pairs[i] for i in keep]
        return pairs

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of bank, replay buffer, counters and config."""
        replay = [
            {"id": pid, "entries": [[e.text, e.step, e.seq] for e in buf]}
            for pid, buf in self._replay.items()
        ]
        return {
            "format": _FORMAT,
            "config": self._config(),
            "solutions": [{"id": pid, "texts": list(t)} for pid, t in self._solutions.items()],
            "replay": replay,
            "seq": self._seq,
            "stats": {"recorded": self._recorded, "correct": self._correct},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the whole state with ``state`` (from :meth:`state_dict`, maybe via JSON).

        The saved config wins over the constructor's (the saved buffer was trimmed with it);
        a ``UserWarning`` says when they differ.
        """
        config = state["config"]
        if errors := _config_errors(config["replay_capacity"], config["replay_per_problem"]):
            raise ValueError("SolutionBank.load_state_dict: " + "; ".join(errors))
        solutions = {item["id"]: [str(t) for t in item["texts"]] for item in state["solutions"]}
        replay = {
            item["id"]: [_Entry(str(t), int(s), int(q)) for t, s, q in item["entries"]]
            for item in state["replay"]
        }
        warn_if_config_differs("SolutionBank.load_state_dict", config, self._config())
        self.replay_capacity = config["replay_capacity"]
        self.replay_per_problem = config["replay_per_problem"]
        self._solutions, self._replay = solutions, replay
        self._seq = int(state["seq"])
        self._recorded = int(state["stats"]["recorded"])
        self._correct = int(state["stats"]["correct"])

    # ----------------------------------------------------------------- internals
    def _config(self) -> dict[str, Any]:
        return {
            "replay_capacity": self.replay_capacity,
            "replay_per_problem": self.replay_per_problem,
        }

    def _evict(self) -> None:
        """Drop the globally oldest correct rollouts until the buffer fits its capacity."""
        if self.replay_capacity is None:
            return
        kept = sum(len(buf) for buf in self._replay.values())
        for _ in range(kept - self.replay_capacity):
            oldest = min(
                self._replay, key=lambda p: (self._replay[p][0].step, self._replay[p][0].seq)
            )
            del self._replay[oldest][0]
            if not self._replay[oldest]:
                del self._replay[oldest]
