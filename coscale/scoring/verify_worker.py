"""Math-verify checks in killable child processes, for `coscale.scoring.rewards.MathReward`.

Child side (`check_pair`, `serve`): a fresh interpreter runs this file as a script, imports only
math-verify (no coscale package, no torch), reads one JSON line `[gold, pred]` per check on stdin
and writes one result code per line on stdout, in order. Parent side (`VerifyPool`): starts the
children, hands them work in chunks, tracks a deadline for the item each child is on, and kills
and replaces a child that misses it.

Children are started by `subprocess` (fork + exec), not by a `multiprocessing` spawn/forkserver
context: both of those re-import the caller's `__main__` in the child (a script importing torch
made a spawned child take ~2.3 s to start vs ~0.7 s for a bare interpreter with math-verify), on
every replacement after a kill too. Exec is also safe from any thread of a torch process.

Codes: "1" verified, "0" not equal, "g" gold unparseable, "p" prediction unparseable, "t" no
answer within the timeout (hung, or the child died).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import time
from collections import deque
from functools import lru_cache

CORRECT, WRONG, BAD_GOLD, BAD_PRED, TIMEOUT = "1", "0", "g", "p", "t"
START_TIMEOUT_S = 60.0  # a child that is not ready by then is a broken set-up, not a slow answer
# `python -c` puts "" (the working directory) on sys.path: drop it, so no local file shadows a module
_BOOT = "import runpy, sys; sys.path = [p for p in sys.path if p]; runpy.run_path(sys.argv[1])"


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple:
    """Parses `text` with math-verify, without its signal-based timeout (safe off the main thread)."""
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=None))


def check_pair(gold: str, pred: str) -> str:
    """Checks one parse-ready (gold, prediction) pair; returns a result code (module docstring).

    Neither math-verify call is bounded in time here: the caller bounds it (a child process that
    is killed), or accepts the risk (`MathReward(num_workers=0)`).
    """
    from math_verify import verify

    try:
        gold_parsed = _parse(gold)
        if not gold_parsed:
            return BAD_GOLD
        pred_parsed = _parse(pred)
        if not pred_parsed:
            return BAD_PRED
        ok = verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None)
    except Exception:  # math-verify swallows most errors itself; never let one kill the child
        return WRONG
    return CORRECT if ok else WRONG


def serve() -> None:
    """Child main loop: protocol on the original stdout, anything printed goes to stderr."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": we bound it
    check_pair("$1$", "$1$")  # import and warm up before saying ready, so start-up is not billed
    out.write(b"ready\n")
    for line in sys.stdin.buffer:
        out.write(check_pair(*json.loads(line)).encode() + b"\n")


class _Worker:
    """One child process and the parent's book-keeping for it."""

    def __init__(self, sel: selectors.BaseSelector) -> None:
        cmd = [sys.executable, "-c", _BOOT, os.path.abspath(__file__)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.sel, self.watching_write = sel, False
        sel.register(self.proc.stdout, selectors.EVENT_READ, (self, "r"))
        self.ready = False
        self.since = time.monotonic()  # start of start-up, or of the item at the head of `inflight`
        self.inflight: deque[int] = deque()
        self.outbuf = bytearray()
        self.inbuf = bytearray()

    def send(self, items: list[tuple[int, str, str]]) -> None:
        """Queues items (index, gold, pred) for this child; its deadline starts if it was idle."""
        if not self.inflight:
            self.since = time.monotonic()
        for index, gold, pred in items:
            self.outbuf += json.dumps([gold, pred]).encode() + b"\n"
            self.inflight.append(index)
        self.flush()

    def flush(self) -> None:
        """Writes what the pipe takes now, never blocking; watches for space while input is left."""
        try:
            del self.outbuf[: os.write(self.proc.stdin.fileno(), self.outbuf)]
        except BlockingIOError:
            pass  # pipe full: retried when the selector says it is writable
        except BrokenPipeError:
            self.outbuf.clear()  # the child died; its read side reports end of file
        if bool(self.outbuf) != self.watching_write:
            self.watching_write = bool(self.outbuf)
            if self.watching_write:
                self.sel.register(self.proc.stdin, selectors.EVENT_WRITE, (self, "w"))
            else:
                self.sel.unregister(self.proc.stdin)

    def read_lines(self) -> list[bytes] | None:
        """Returns the complete lines the child wrote, or None at end of file (child gone)."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.inbuf += data
        *lines, rest = self.inbuf.split(b"\n")
        self.inbuf = bytearray(rest)
        return lines

    def stop(self) -> None:
        """Kills the child (idle or stuck alike: it holds no state worth saving) and reaps it."""
        self.sel.unregister(self.proc.stdout)
        if self.watching_write:
            self.sel.unregister(self.proc.stdin)
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


class VerifyPool:
    """Children that check (gold, pred) pairs, each item bounded by `timeout` seconds.

    Items go out in chunks (one write each) and children answer item by item, so the deadline of
    a child's current item starts when its previous answer arrived (or when work reached it idle).
    A child past it is killed, the item scores TIMEOUT, its unstarted items go back in line and a
    fresh child takes its place. Not thread-safe: the caller serialises calls.

    Args:
        num_workers: number of children (>= 1).
        timeout: seconds one item may take in a child.
        chunk_size: most items queued at one child at a time.
    """

    def __init__(self, num_workers: int, timeout: float, chunk_size: int = 16) -> None:
        self.num_workers, self.timeout, self.chunk_size = num_workers, timeout, chunk_size
        self._workers: list[_Worker] = []
        self._sel: selectors.BaseSelector | None = None

    def run(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Checks parse-ready (gold, pred) pairs; returns one result code per pair, in order."""
        results: list[str] = [TIMEOUT] * len(pairs)
        pending = deque(range(len(pairs)))
        self._start()
        try:
            while pending or any(w.inflight for w in self._workers):
                self._dispatch(pairs, pending)
                self._wait(results, pending)
                self._expire(results, pending)
        except BaseException:
            self.close()  # children may hold items of this call: never reuse them
            raise
        return results

    def pids(self) -> list[int]:
        """Process ids of the live children (for tests and monitoring)."""
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        """Kills and reaps every child; a later `run` starts new ones."""
        for worker in self._workers:
            worker.stop()
        self._workers = []
        if self._sel is not None:
            self._sel.close()
            self._sel = None

    def _start(self) -> None:
        if self._sel is None:
            self._sel = selectors.DefaultSelector()
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._sel))

    def _dispatch(self, pairs: list[tuple[str, str]], pending: deque[int]) -> None:
        """Tops up ready children down to half a chunk; chunks shrink as the work runs out, so
        the tail spreads over all children instead of queueing behind one that may be stuck."""
        for worker in self._workers:
            size = min(self.chunk_size, -(-len(pending) // (2 * self.num_workers)))
            if not pending or not worker.ready or len(worker.inflight) > size // 2:
                continue
            items = [pending.popleft() for _ in range(size)]
            worker.send([(i, *pairs[i]) for i in items])

    def _deadline(self, worker: _Worker) -> float:
        return worker.since + (self.timeout if worker.ready else START_TIMEOUT_S)

    def _wait(self, results: list[str], pending: deque[int]) -> None:
        """Waits for answers or pipe space until the nearest deadline, and handles them."""
        busy = [w for w in self._workers if w.inflight or not w.ready]
        wait_s = min((self._deadline(w) for w in busy), default=time.monotonic() + 1.0)
        for key, _ in self._sel.select(max(0.0, wait_s - time.monotonic())):
            worker, kind = key.data
            if worker not in self._workers:
                continue  # replaced earlier in this batch of events
            if kind == "w":
                worker.flush()
                continue
            lines = worker.read_lines()
            if lines is None:
                self._replace(worker, results, pending)
                continue
            for line in lines:
                self._on_line(worker, line, results)

    def _on_line(self, worker: _Worker, line: bytes, results: list[str]) -> None:
        worker.since = time.monotonic()
        if line == b"ready":
            worker.ready = True
            return
        results[worker.inflight.popleft()] = line.decode()  # answers come in the order sent

    def _expire(self, results: list[str], pending: deque[int]) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if (worker.inflight or not worker.ready) and now >= self._deadline(worker):
                self._replace(worker, results, pending)

    def _replace(self, worker: _Worker, results: list[str], pending: deque[int]) -> None:
        """Kills a stuck or dead child: its current item times out, the rest go back in line."""
        if not worker.ready:  # `run` closes the pool on the way out
            raise RuntimeError(
                f"a math-verify worker did not start within {START_TIMEOUT_S:.0f} s or exited "
                "during start-up (is math-verify installed in this interpreter?)"
            )
        if worker.inflight:
            results[worker.inflight.popleft()] = TIMEOUT
            pending.extendleft(reversed(worker.inflight))
        self._workers.remove(worker)
        worker.stop()
        self._start()


if __name__ in ("__main__", "<run_path>"):
    serve()
