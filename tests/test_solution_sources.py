"""Tests for coscale.loop.solution_sources: the data set's own solutions and a verified teacher.

The teacher's model is replaced by a fake backend that returns scripted completions as real
``Rollouts``, and its verifier by a stub that accepts a completion when it boxes the problem's
answer, so which texts are kept can be worked out by hand. One test runs the real loading path
on the tiny model with greedy decoding.
"""

from __future__ import annotations

import pytest
import torch

from coscale.loop.solution_sources import DatasetSolutions, TeacherSolutions
from coscale.models.prompting import PromptSettings
from coscale.rollout.base import Rollouts, normalize_n_per_prompt
from coscale.tasks import Problem

P = Problem("p", "1+2", "3", solutions=("s1", "s2", "s3", "s4"))
Q = Problem("q", "2+2", "4")


def _known(bank: dict[str, list[str]]):
    calls: list[str] = []

    def known(pid: str) -> list[str]:
        calls.append(pid)
        return list(bank.get(pid, []))

    return known, calls


# ------------------------------------------------------------------------- DatasetSolutions
def test_dataset_solutions_in_file_order_without_known_ones():
    known, calls = _known({"p": ["s2"]})
    out = DatasetSolutions().propose([(P, 2), (Q, 3)], known)
    assert out == {"p": ["s1", "s3"], "q": []}  # s2 is in the bank; q has no own solutions
    assert sorted(calls) == ["p", "q"]


@pytest.mark.parametrize(("k", "expected"), [(0, []), (1, ["s1"]), (3, ["s1", "s3", "s4"])])
def test_dataset_solutions_at_most_k(k, expected):
    known, _ = _known({"p": ["s2"]})
    assert DatasetSolutions().propose([(P, k)], known) == {"p": expected}


def test_dataset_solutions_all_known_gives_nothing():
    known, _ = _known({"p": ["s4", "s3", "s2", "s1"]})
    assert DatasetSolutions().propose([(P, 4)], known) == {"p": []}


def test_dataset_solutions_never_proposes_a_repeat_of_its_own_list():
    twice = Problem("t", "1+1", "2", solutions=("a", "a", "b"))
    known, _ = _known({})
    assert DatasetSolutions().propose([(twice, 2)], known) == {"t": ["a", "b"]}


# ------------------------------------------------------------------------- TeacherSolutions
class FakeBackend:
    """Returns, per generate call, the next script: prompt -> its completions (N of them)."""

    tokenizer = None  # PromptSettings without chat never uses it

    def __init__(self, scripts: list[dict[str, list[str]]]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[list[str], object, object]] = []

    def generate(self, prompts, n_per_prompt, sampling) -> Rollouts:
        self.calls.append((list(prompts), n_per_prompt, sampling))
        script = self.scripts[len(self.calls) - 1]
        counts = normalize_n_per_prompt(n_per_prompt, len(prompts))
        texts, index = [], []
        for i, (prompt, n) in enumerate(zip(prompts, counts)):
            assert len(script[prompt]) == n
            texts += script[prompt]
            index += [i] * n
        r = len(texts)
        return Rollouts(
            prompt_index=torch.tensor(index),
            input_ids=torch.zeros(r, 2, dtype=torch.long),
            attention_mask=torch.ones(r, 2, dtype=torch.long),
            completion_mask=torch.ones(r, 1),
            logprobs=torch.zeros(r, 1),
            texts=texts,
            finish_reasons=["stop"] * r,
            prompt_length=1,
        )


class BoxedReward:
    """1.0 when the completion boxes the reference answer; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []

    def __call__(self, completions, answers):
        self.calls.append((list(completions), list(answers)))
        return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answers)]


FMT = PromptSettings(template="Q:{question}\nA:")
PP, PQ = "Q:1+2\nA:", "Q:2+2\nA:"
ROUND_1 = {
    PP: [
        "  1+2=3 \\boxed{3}\n",  # kept, stripped
        "wrong \\boxed{4}",  # q's answer: rejected for p
        "1+2=3 \\boxed{3}",  # the same text once stripped: not new
        "known \\boxed{3}",  # already in the bank
    ],
    PQ: ["a \\boxed{4}", "b \\boxed{4}", "c \\boxed{4}", "d \\boxed{4}"],  # d: beyond k=3
}
ROUND_2 = {PP: ["x \\boxed{3}", "y \\boxed{3}", "1+2=3 \\boxed{3}", "z"]}  # only p is short


def _teacher(scripts, rounds: int) -> tuple[TeacherSolutions, FakeBackend, BoxedReward]:
    reward = BoxedReward()
    teacher = TeacherSolutions(
        "unused/teacher",
        prompt=FMT,
        samples=4,
        rounds=rounds,
        max_new_tokens=32,
        temperature=0.5,
        reward=reward,
    )
    backend = FakeBackend(scripts)
    teacher._backend = backend  # in place of the loaded model; everything else runs for real
    return teacher, backend, reward


def test_teacher_keeps_verified_new_stripped_texts_up_to_k_over_rounds():
    teacher, backend, reward = _teacher([ROUND_1, ROUND_2], rounds=2)
    known, _ = _known({"p": ["known \\boxed{3}"]})
    out = teacher.propose([(P, 2), (Q, 3)], known)
    assert out == {
        "p": ["1+2=3 \\boxed{3}", "x \\boxed{3}"],
        "q": ["a \\boxed{4}", "b \\boxed{4}", "c \\boxed{4}"],
    }
    # Round 1 asks for both problems; round 2 only for p, which still had 1 of 2.
    assert [c[0] for c in backend.calls] == [[PP, PQ], [PP]]
    assert [c[1] for c in backend.calls] == [4, 4]
    sampling = backend.calls[0][2]
    assert (sampling.max_new_tokens, sampling.temperature) == (32, 0.5)
    # Each completion is checked against the answer of the prompt it answers.
    assert reward.calls[0][1] == ["3"] * 4 + ["4"] * 4
    assert reward.calls[1] == (ROUND_2[PP], ["3"] * 4)


def test_teacher_stops_after_its_rounds():
    teacher, backend, _ = _teacher([ROUND_1, ROUND_2], rounds=1)
    known, _ = _known({"p": ["known \\boxed{3}"]})
    out = teacher.propose([(P, 2), (Q, 3)], known)
    assert out == {"p": ["1+2=3 \\boxed{3}"], "q": ["a \\boxed{4}", "b \\boxed{4}", "c \\boxed{4}"]}
    assert len(backend.calls) == 1


def test_teacher_without_need_does_not_sample():
    teacher, backend, _ = _teacher([], rounds=3)
    known, _ = _known({})
    assert teacher.propose([(P, 0), (Q, 0)], known) == {"p": [], "q": []}
    assert teacher.propose([], known) == {}
    assert backend.calls == []


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"samples": 0}, ["samples", "got 0 and 1"]),
        ({"rounds": 0}, ["rounds", "got 16 and 0"]),
        ({"max_new_tokens": 0}, ["max_new_tokens must be an int >= 1, got 0"]),
        ({"temperature": -0.5}, ["temperature must be a number >= 0", "got -0.5"]),
    ],
)
def test_teacher_rejects_bad_settings(kwargs, names):
    with pytest.raises(ValueError) as err:
        TeacherSolutions("unused/teacher", **kwargs)
    for name in names:
        assert name in str(err.value)


def test_teacher_loads_its_model_lazily():
    teacher = TeacherSolutions("no/such-model-anywhere")  # not loaded: no error yet
    assert teacher.model_name == "no/such-model-anywhere"
    assert teacher.prompt == PromptSettings()


class OneTextReward:
    """Accepts exactly one text (``accept``); records every completion it was shown."""

    def __init__(self) -> None:
        self.accept: str | None = None
        self.seen: list[str] = []

    def __call__(self, completions, answers):
        self.seen += completions
        return [float(c == self.accept) for c in completions]


def test_teacher_on_the_tiny_model(tiny_model_dir):
    reward = OneTextReward()
    teacher = TeacherSolutions(
        str(tiny_model_dir),
        samples=2,
        rounds=2,
        max_new_tokens=6,
        temperature=0.0,
        reward=reward,
    )
    problem = Problem("g", "1+2", "3")
    assert teacher.propose([(problem, 2)], lambda pid: []) == {"g": []}  # nothing accepted
    assert len(reward.seen) == 4  # 2 rounds x 2 samples
    greedy = reward.seen[0]
    assert reward.seen == [greedy] * 4 and greedy.strip()  # greedy: one text, not blank
    reward.accept = greedy
    # Both samples are the accepted text: kept once, so p is still short and round 2 runs.
    assert teacher.propose([(problem, 2)], lambda pid: []) == {"g": [greedy.strip()]}
    assert len(reward.seen) == 8
    assert teacher.propose([(problem, 2)], lambda pid: [greedy.strip()]) == {"g": []}


def test_the_teachers_sampler_comes_from_the_backend_factory(tiny_model_dir):
    """`rollout` picks the teacher's backend as it picks a module's (HF generate by default);
    a bad one is refused naming the setting."""
    from coscale.rollout.cached.backend import CachedDecodeBackend
    from coscale.rollout.hf import HFGenerateBackend

    default = TeacherSolutions(str(tiny_model_dir), prompt=FMT, max_new_tokens=8)
    assert isinstance(default._load(), HFGenerateBackend)
    cached = TeacherSolutions(
        str(tiny_model_dir), prompt=FMT, max_new_tokens=8, samples=3,
        rollout={"backend": "cached", "options": {"batch_size": 4}},
    )  # fmt: skip
    known, _ = _known({})
    assert cached.propose([(P, 1)], known).keys() == {"p"}  # sampled, verified, kept or not
    assert isinstance(cached._backend, CachedDecodeBackend)
    with pytest.raises(ValueError, match=r"teacher rollout\.backend must be one of"):
        TeacherSolutions(str(tiny_model_dir), rollout={"backend": "vllm-cpu"})


def test_the_teachers_rollout_defaults_to_hf_and_names_a_bad_key_and_is_closed():
    assert TeacherSolutions("t", rollout={"options": {"batch_size": 4}}).rollout.backend == "hf"
    with pytest.raises(ValueError, match=r"teacher rollout: .*backnd.* \(it takes backend, opt"):
        TeacherSolutions("t", rollout={"backnd": "hf"})
    teacher, backend, _ = _teacher([ROUND_1], rounds=1)
    closed = []
    backend.close = lambda: closed.append(True)
    teacher.close()
    assert closed == [True] and teacher._backend is None  # loaded again when next asked
