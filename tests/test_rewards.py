"""Tests for coscale.scoring.rewards: extraction, gold formats, stats, threads, hard timeout, no leaks."""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

import pytest

from coscale.scoring.rewards import (
    EXTRACTORS,
    MathReward,
    extract_boxed,
    extract_last_number,
    wrap_latex,
)

# 9^(9^(9^...)): parsing is fast, but math-verify's comparison then tries to evaluate the tower
# and did not finish within 60 s (measured with math-verify 0.9.0): a genuine hang, no test hook.
TOWER = r"The answer is \boxed{9^{9^{9^{9^{9^{9^{9^{9}}}}}}}}."


@pytest.fixture(scope="module")
def reward():
    """One shared pool (child start-up costs ~1 s); tests that count call `reset_stats` first."""
    with MathReward(timeout=5.0, num_workers=2) as shared:
        yield shared


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_extract_boxed_takes_last_balanced_box() -> None:
    assert extract_boxed(r"first \boxed{1}, then \boxed{2}") == r"\boxed{2}"
    assert extract_boxed(r"\boxed{\frac{1}{\sqrt{4}}} end") == r"\boxed{\frac{1}{\sqrt{4}}}"
    assert extract_boxed(r"\boxed{\{1,2\}}") == r"\boxed{\{1,2\}}"  # escaped braces skipped
    assert extract_boxed(r"\boxed{3} but then \boxed{\frac{1}{2") == r"\boxed{3}"  # cut off
    assert extract_boxed(r"\boxed { 7 }") == r"\boxed{7}"
    assert extract_boxed("no box here, 42") is None
    assert extract_boxed(r"\boxed{}") is None


def test_extract_last_number_and_wrap_latex() -> None:
    assert extract_last_number("2 apples, then 1,000.5 and -3 left") == "$-3$"
    assert extract_last_number("total 1,000") == "$1000$"
    assert extract_last_number("none") is None
    assert wrap_latex(r" \sqrt{122} ") == r"$\sqrt{122}$"
    assert wrap_latex("$5$") == "$5$" and wrap_latex(r"\boxed{5}") == r"\boxed{5}"
    assert wrap_latex(r"\$5") == r"$\$5$"  # an escaped dollar is not a delimiter
    assert set(EXTRACTORS) >= {"boxed", "last_number", "none"}


def test_correct_incorrect_and_missing_box(reward: MathReward) -> None:
    reward.reset_stats()
    completions = [r"so \boxed{42}", r"so \boxed{41}", "so 42, no box"]
    assert reward(completions, ["42", "42", "42"]) == [1.0, 0.0, 0.0]
    assert reward.stats == {
        "checked": 3,
        "correct": 1,
        "timeouts": 0,
        "unparseable_gold": 0,
        "unparseable_pred": 1,
    }


def test_nested_braces_in_box(reward: MathReward) -> None:
    completions = [r"\boxed{\frac{1}{\sqrt{4}}}", r"\boxed{\frac{\sqrt{8}}{2}}"]
    assert reward(completions, [r"\frac{1}{2}", r"\sqrt{2}"]) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("gold", "right", "wrong"),
    [
        ("42", "42", "24"),
        (r"\frac{1}{2}", r"\frac{1}{2}", r"\frac{1}{3}"),
        (r"\sqrt{122}", r"\sqrt{122}", r"\sqrt{121}"),
        ("x=2", "x=2", "x=3"),
        ("0.5", "0.5", "0.6"),
    ],
)
def test_plain_string_gold_formats(reward: MathReward, gold: str, right: str, wrong: str) -> None:
    reward.reset_stats()
    out = reward([rf"\boxed{{{right}}}", rf"\boxed{{{wrong}}}"], [gold, gold])
    assert out == [1.0, 0.0]
    assert reward.stats["unparseable_gold"] == 0 and reward.stats["unparseable_pred"] == 0


def test_equivalent_forms(reward: MathReward) -> None:
    preds = [r"\boxed{0.5}", r"\boxed{\dfrac12}", r"\boxed{1/2}", r"\boxed{\frac{2}{4}}"]
    assert reward(preds, [r"\frac{1}{2}"] * 4) == [1.0] * 4
    assert reward([r"\boxed{\frac12}", r"\boxed{2}"], ["0.5", "x=2"]) == [1.0, 1.0]
    assert reward([r"\boxed{2\sqrt{3}}"], [r"\sqrt{12}"]) == [1.0]


def test_stats_count_every_outcome_and_cache_hits(reward: MathReward) -> None:
    reward.reset_stats()
    # math-verify parses nothing from an empty gold or from `\text{}`; malformed LaTeX such as
    # `\frac{1}{2` is NOT unparseable for it: it falls back to comparing the raw strings.
    completions = [
        r"\boxed{3}",
        r"\boxed{3}",
        r"\boxed{4}",
        "nothing",
        r"\boxed{\text{}}",
        r"\boxed{1}",
    ]
    answers = ["3", "3", "3", "3", "3", ""]
    assert reward(completions, answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert reward(completions[:1], answers[:1]) == [1.0]  # served from the cache, counted again
    expected = dict(checked=7, correct=3, timeouts=0, unparseable_gold=1, unparseable_pred=2)
    assert reward.stats == expected


def test_other_extractors() -> None:
    with MathReward(extract="last_number", num_workers=0) as by_number:
        assert by_number(["first 3, finally 7", "no digits"], ["7", "7"]) == [1.0, 0.0]
    with MathReward(extract="none", num_workers=0) as whole:
        assert whole([r"It is $\frac{1}{2}$.", r"It is $\frac{1}{3}$."], ["0.5", "0.5"]) == [1, 0]


def test_called_from_a_thread(reward: MathReward) -> None:
    in_process = MathReward(num_workers=0)
    out: dict[str, list[float]] = {}

    def work() -> None:  # math-verify's signal-based timeout would raise here
        out["pool"] = reward([r"\boxed{\sqrt{122}}", r"\boxed{1}"], [r"\sqrt{122}", "2"])
        out["in_process"] = in_process([r"\boxed{\pi}"], [r"\pi"])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert out == {"pool": [1.0, 0.0], "in_process": [1.0]}


def _pids(reward: MathReward) -> list[int]:
    """The live child processes of ``reward`` (none before its first call and after close)."""
    return reward._pool.pids() if reward._pool is not None else []


def test_pathological_answer_times_out_and_worker_is_replaced() -> None:
    with MathReward(timeout=1.0, num_workers=2) as reward:
        assert reward([r"\boxed{1}"], ["1"]) == [1.0]  # start-up is not part of the bound
        before = set(_pids(reward))
        start = time.monotonic()
        out = reward([TOWER, r"\boxed{2}", r"\boxed{3}"], ["1", "2", "4"])
        elapsed = time.monotonic() - start
        assert out == [0.0, 1.0, 0.0]
        assert elapsed < 2.5, f"scored in {elapsed:.2f} s, bound is timeout 1 s + 1 s"
        assert reward.stats["timeouts"] == 1
        after = set(_pids(reward))
        assert len(after) == 2 and len(before - after) == 1  # the stuck child was replaced
        assert not any(_alive(pid) for pid in before - after)
        assert reward([r"\boxed{5}", r"\boxed{6}"], ["5", "7"]) == [1.0, 0.0]


def test_answers_longer_than_a_pipe_buffer() -> None:
    long_text = "step " * 30_000 + r"so the answer is $\frac{1}{2}$"  # ~150 kB per message
    with MathReward(extract="none", num_workers=1) as reward:
        assert reward([long_text, long_text + "."], ["0.5", "2"]) == [1.0, 0.0]


def test_close_and_finalizer_leave_no_children() -> None:
    with MathReward(num_workers=2) as reward:
        assert reward([r"\boxed{1}"], ["1"]) == [1.0]
        pids = _pids(reward)
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    assert _pids(reward) == [] and not any(_alive(pid) for pid in pids)
    assert reward([r"\boxed{1}"], ["1"]) == [1.0]  # a later call starts new children
    pids = _pids(reward)
    del reward
    gc.collect()
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_copy_starts_its_own_children(reward: MathReward) -> None:
    assert reward([r"\boxed{1}"], ["1"]) == [1.0]
    parent_pids = _pids(reward)
    pid = os.fork()
    if pid == 0:  # child: must not talk to, nor kill, the parent's children
        ok = False
        try:
            ok = reward([r"\boxed{2}"], ["2"]) == [1.0] and not set(_pids(reward)) & set(
                parent_pids
            )
            reward.close()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _pids(reward) == parent_pids and all(_alive(p) for p in parent_pids)
    assert reward([r"\boxed{3}"], ["3"]) == [1.0]


def test_pickles_config_only_and_starts_lazily() -> None:
    reward = MathReward(extract="last_number", timeout=2.0, num_workers=1, answer_wrap=False)
    clone = pickle.loads(pickle.dumps(reward))
    assert (clone.extract, clone.timeout, clone.num_workers, clone.answer_wrap) == (
        "last_number",
        2.0,
        1,
        False,
    )
    assert _pids(clone) == [] and clone([], []) == [] and _pids(clone) == []


def test_bad_arguments_name_the_values() -> None:
    with pytest.raises(ValueError, match=r"len\(completions\)=2.*len\(answers\)=1"):
        MathReward(num_workers=0)(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"extract='first'.*'boxed', 'last_number', 'none'"):
        MathReward(extract="first")
    with pytest.raises(ValueError, match=r"timeout=0.*num_workers=-1"):
        MathReward(timeout=0, num_workers=-1)
