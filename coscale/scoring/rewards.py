"""Math answer reward: 1.0 when a completion's answer verifies against the gold one, else 0.0.

`MathReward` extracts the answer from each completion (a small, named strategy: `EXTRACTORS`),
and checks it with math-verify (`verify(gold, pred)`, gold first) in a pool of killable child
processes with a hard per-answer timeout. math-verify's own timeout uses `signal.alarm`, which
fails off the main thread (and one framework scored everything 0 because of it); without it a
pathological answer such as a power tower `9^{9^{9^{9}}}` hangs for minutes. Here the parent
kills a child that overruns: that answer scores 0.0 and is counted (`MathReward.stats`).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

from coscale.scoring import verify_worker as vw

Extractor = Callable[[str], "str | None"]
EXTRACTORS: dict[str, Extractor] = {}
"""Answer extractors by name: completion -> text for math-verify's `parse`, or None if absent."""

STAT_KEYS = ("checked", "correct", "timeouts", "unparseable_gold", "unparseable_pred")
_STAT_OF_CODE = {
    vw.CORRECT: "correct",
    vw.TIMEOUT: "timeouts",
    vw.BAD_GOLD: "unparseable_gold",
    vw.BAD_PRED: "unparseable_pred",
}
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_DELIMITED = re.compile(r"(?<!\\)\$|\\boxed|\\\(|\\\[")


def register_extractor(name: str) -> Callable[[Extractor], Extractor]:
    """Decorator that makes an extractor selectable as `MathReward(extract=name)`."""

    def add(fn: Extractor) -> Extractor:
        EXTRACTORS[name] = fn
        return fn

    return add


def _closing_brace(text: str, open_at: int) -> int | None:
    """Index of the `}` matching the `{` at `open_at` (escaped `\\{`, `\\}` skipped), or None."""
    depth, i = 0, open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return i
        i += 1
    return None


@register_extractor("boxed")
def extract_boxed(completion: str) -> str | None:
    """The last `\\boxed{...}` whose braces balance, as `\\boxed{content}`; None if there is none.

    A box cut off by the length limit is skipped in favour of an earlier complete one.
    """
    for match in reversed(list(re.finditer(r"\\boxed\s*\{", completion))):
        end = _closing_brace(completion, match.end() - 1)
        if end is not None:
            content = completion[match.end() : end].strip()
            return f"\\boxed{{{content}}}" if content else None
    return None


@register_extractor("last_number")
def extract_last_number(completion: str) -> str | None:
    """The last number in the text (`-1,000.5` -> `$-1000.5$`); None if there is none."""
    numbers = _NUMBER.findall(completion)
    return f"${numbers[-1].replace(',', '')}$" if numbers else None


@register_extractor("none")
def extract_none(completion: str) -> str | None:
    """The whole completion: math-verify finds the answer itself (boxes, `$...$`, expressions)."""
    return completion if completion.strip() else None


def wrap_latex(answer: str) -> str:
    """`answer` in `$...$` unless it is already delimited: bare LaTeX (`\\sqrt{122}`) fails to parse."""
    answer = answer.strip()
    return answer if _DELIMITED.search(answer) else f"${answer}$"


class MathReward:
    """Reward 1.0 per completion whose extracted answer math-verifies against the gold answer.

    Checks run in `num_workers` child processes (started at the first call, each a bare
    interpreter that imports only math-verify) with a hard bound of `timeout` seconds per answer:
    a child that overruns is killed and replaced, the answer scores 0.0 and `stats["timeouts"]`
    grows. Safe to call from any thread (calls are serialised). `num_workers=0` checks in the
    calling process instead: no start-up cost, but nothing bounds the time of a pathological
    answer (math-verify's own timeout is off so that it works off the main thread).

    `stats` counts answers: `checked` (all scored), `correct`, `timeouts`, `unparseable_gold`,
    `unparseable_pred` (no answer found, e.g. no `\\boxed{}`, or math-verify parsed nothing from it;
    malformed LaTeX is not "unparseable" to math-verify: it compares the raw strings instead).
    Results are cached per (gold, prediction) in a bounded LRU; a cache hit counts like the first.

    Args:
        extract: name of the answer extractor, one of `EXTRACTORS` ("boxed", "last_number", "none").
        timeout: seconds one answer may take (> 0).
        num_workers: child processes (>= 0; 0 = in-process, unbounded).
        answer_wrap: wrap gold answers given as bare LaTeX in `$...$` before parsing.
        cache_size: most cached (gold, prediction) results (>= 0; 0 = no cache).
        chunk_size: most answers queued at one child at a time (>= 1).
    """

    needs_answer = True  # it checks completions against the gold answer (scoring.answers)

    def __init__(
        self,
        extract: str = "boxed",
        timeout: float = 5.0,
        num_workers: int = 2,
        answer_wrap: bool = True,
        cache_size: int = 4096,
        chunk_size: int = 16,
    ) -> None:
        _validate(extract, timeout, num_workers, cache_size, chunk_size)
        self.extract, self.timeout, self.num_workers = extract, float(timeout), num_workers
        self.answer_wrap, self.cache_size, self.chunk_size = answer_wrap, cache_size, chunk_size
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: vw.VerifyPool | None = None
        self._finalizer: weakref.finalize | None = None
        self._owner_pid = os.getpid()

    def __call__(self, completions: list[str], answers: list[str], **unused_columns) -> list[float]:
        """Scores completions [R] against gold answers [R]; extra dataset columns are ignored."""
        if len(completions) != len(answers):
            raise ValueError(
                f"completions and answers must have the same length, got "
                f"len(completions)={len(completions)} and len(answers)={len(answers)}"
            )
        extractor = EXTRACTORS[self.extract]
        keys = [(self._gold_text(a), extractor(c)) for c, a in zip(completions, answers)]
        with self._lock:
            codes = self._codes(keys)
            self.stats["checked"] += len(codes)
            for code in codes:
                if code in _STAT_OF_CODE:
                    self.stats[_STAT_OF_CODE[code]] += 1
        return [1.0 if code == vw.CORRECT else 0.0 for code in codes]

    def _gold_text(self, answer: str) -> str:
        return wrap_latex(str(answer)) if self.answer_wrap else str(answer)

    def _codes(self, keys: list[tuple[str, str | None]]) -> list[str]:
        """Result code per key: no answer, cached, or checked (each distinct pair once)."""
        known = {k: self._cache[k] for k in dict.fromkeys(keys) if k in self._cache}
        todo = [k for k in dict.fromkeys(keys) if k[1] is not None and k not in known]
        known.update(zip(todo, self._check(todo)))
        codes = [vw.BAD_PRED if key[1] is None else known[key] for key in keys]
        for key, code in zip(keys, codes):
            self._remember(key, code)
        return codes

    def _check(self, pairs: list[tuple[str, str]]) -> list[str]:
        if not pairs:
            return []
        if self.num_workers == 0:
            return [vw.check_pair(gold, pred) for gold, pred in pairs]
        if self._pool is not None and self._owner_pid != os.getpid():
            self._finalizer.detach()  # a forked copy: those children belong to the parent process
            self._pool = None
        if self._pool is None:
            self._pool = vw.VerifyPool(self.num_workers, self.timeout, self.chunk_size)
            self._owner_pid = os.getpid()
            self._finalizer = weakref.finalize(self, _close_if_owner, self._pool, self._owner_pid)
        return self._pool.run(pairs)

    def _remember(self, key: tuple[str, str | None], code: str) -> None:
        if self.cache_size == 0 or key[1] is None:
            return
        self._cache[key] = code
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def reset_stats(self) -> None:
        """Sets every counter in `stats` back to 0."""
        with self._lock:
            self.stats = dict.fromkeys(STAT_KEYS, 0)

    def close(self) -> None:
        """Kills the child processes; a later call starts new ones."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()  # runs pool.close() once and detaches the exit hook
            self._pool, self._finalizer = None, None

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        """Pickles the configuration only: no processes, locks or cache travel."""
        keys = ("extract", "timeout", "num_workers", "answer_wrap", "cache_size", "chunk_size")
        return {k: getattr(self, k) for k in keys}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)


def _close_if_owner(pool: vw.VerifyPool, owner_pid: int) -> None:
    """Finalizer (also at exit): closes `pool`, unless this is a forked copy of its owner."""
    if os.getpid() == owner_pid:
        pool.close()


def _validate(extract, timeout, num_workers, cache_size, chunk_size) -> None:
    """Raises one ValueError listing every bad constructor argument."""
    problems = []
    if extract not in EXTRACTORS:
        problems.append(f"extract={extract!r} is not one of {sorted(EXTRACTORS)}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        problems.append(f"timeout={timeout!r} must be > 0 seconds")
    ints = (
        ("num_workers", num_workers, 0),
        ("cache_size", cache_size, 0),
        ("chunk_size", chunk_size, 1),
    )
    for name, value, low in ints:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name}={value!r} must be an integer >= {low}")
    if problems:
        raise ValueError("MathReward: " + "; ".join(problems))
