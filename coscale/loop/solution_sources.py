"""Where new solutions for unsolvable problems come from (the data-scaling half of CoScale-RL).

The data set's own solutions are used first; a :class:`SolutionSource` supplies the rest. A
teacher model's solutions are verified by a verifier before they may enter the bank: a wrong
solution in SFT data teaches the wrong answer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from coscale.loop.problem import Problem
from coscale.models.prompting import PromptSettings, as_prompt_format
from coscale.renamed import old_keyword
from coscale.rollout.base import SamplingParams
from coscale.rollout.factory import RolloutSettings
from coscale.scoring.answers import check_answers, reward_inputs
from coscale.scoring.reward_functions import RewardFunction
from coscale.scoring.reward_set import is_correct

Request = tuple[Problem, int]  # (problem, how many new solutions it needs)


class SolutionSource(ABC):
    """Proposes new, correct solutions for problems."""

    @abstractmethod
    def propose(
        self, requests: Sequence[Request], known: Callable[[str], list[str]]
    ) -> dict[str, list[str]]:
        """Returns up to ``k`` new solutions per requested problem.

        Args:
            requests: ``(problem, k)`` pairs.
            known: ``known(problem_id)`` lists the solutions already in the bank, so that a source
                never proposes a duplicate.
        """

    def adopt_verifier(self, verifier: Callable[..., Any]) -> None:  # noqa: B027
        """Takes the run's verifier (``coscale run`` calls it): a source that verifies what it
        proposes uses it unless it was given its own. Nothing by default."""

    def close(self) -> None:  # noqa: B027
        """Frees what the source holds between data-scaling rounds (the curriculum calls it
        after each round; a model-backed source loads again when next asked). Nothing by
        default."""


class DatasetSolutions(SolutionSource):
    """The problem's own ``solutions`` column, in file order."""

    def propose(
        self, requests: Sequence[Request], known: Callable[[str], list[str]]
    ) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for problem, k in requests:
            have = set(known(problem.id))
            fresh = [s for s in dict.fromkeys(problem.solutions) if s not in have]
            out[problem.id] = fresh[:k]
        return out


class TeacherSolutions(SolutionSource):
    """Samples a teacher model (any HF causal LM) and keeps the verified-correct, new solutions.

    Args:
        model: Hub name or local path of the teacher.
        prompt: How a question becomes the teacher's prompt (a ``PromptSettings`` or a bare
            template); ``PromptSettings(chat=True)`` for an instruct teacher, whose completions
            then end at its chat template's end-of-turn token.
        samples: Samples drawn per problem per round.
        samples_per_problem: Earlier name of ``samples`` (a warning names it).
        rounds: Rounds of sampling before giving up on a problem for this call.
        max_new_tokens: Token limit of one teacher solution.
        temperature: Sampling temperature (diverse solutions need > 0).
        dtype: Teacher weights' dtype (``float32``, ``bfloat16``, ``float16``).
        trust_remote_code: Allow custom model code from the model's folder (off by default).
        reward: Verifier: keeps a solution it scores >= 1.0; coscale-style or TRL-style
            (``docs/rewards.md``). None: the run's verifier under ``coscale run``
            (``pipeline.grpo.verifier``), else :class:`coscale.scoring.rewards.MathReward`.
        rollout: How the teacher is sampled, as a module's ``rollout``
            (:class:`~coscale.rollout.factory.RolloutSettings`, built by the one backend
            factory): ``hf`` (the default), ``cached``, ``vllm`` (an engine of the teacher's
            own, which loads its weights), ``vllm-server`` or ``auto``, with the backend's
            ``options``.
    """

    def __init__(
        self,
        model: str,
        prompt: PromptSettings | str | None = None,
        samples: int = 16,
        rounds: int = 1,
        max_new_tokens: int = 1024,
        temperature: float = 0.8,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        reward: Callable[..., Any] | None = None,
        rollout: RolloutSettings | dict[str, Any] | None = None,
        samples_per_problem: int | None = None,
    ) -> None:
        samples = old_keyword(
            "TeacherSolutions", "samples_per_problem", "samples", samples_per_problem, samples, 16
        )
        if samples < 1 or rounds < 1:
            raise ValueError(f"teacher samples and rounds must be >= 1, got {samples} and {rounds}")
        self.rollout = _teacher_rollout(rollout)
        self.model_name, self.prompt = model, as_prompt_format(prompt)
        self.samples, self.rounds = samples, rounds
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
        self.dtype, self.trust_remote_code = dtype, trust_remote_code
        self._reward = reward
        self._backend: Any = None

    def propose(
        self, requests: Sequence[Request], known: Callable[[str], list[str]]
    ) -> dict[str, list[str]]:
        out = {p.id: [] for p, _ in requests}
        todo = [(p, k) for p, k in requests if k > 0]
        for _ in range(self.rounds):
            if not todo:
                break
            self._sample_round(todo, known, out)
            todo = [(p, k) for p, k in todo if len(out[p.id]) < k]
        return out

    def _sample_round(self, todo: Sequence[Request], known, out: dict[str, list[str]]) -> None:
        problems = [p for p, _ in todo]
        reward = RewardFunction(self.reward, "data.teacher's reward")
        check_answers(problems, [reward], FIX)  # before the teacher's model is loaded
        backend = self._load()
        prompts = [self.prompt(p.question, backend.tokenizer) for p in problems]
        rollouts = backend.generate(prompts, self.samples, self.sampling)
        inputs = reward_inputs(problems, prompts, rollouts, self.prompt, [reward], FIX)
        correct = is_correct(reward.score(inputs))
        for i, text, ok in zip(rollouts.prompt_index.tolist(), rollouts.texts, correct.tolist()):
            problem, k = todo[i]
            taken, text = out[problem.id], text.strip()
            if ok and len(taken) < k and text not in taken + known(problem.id):
                taken.append(text)

    def adopt_verifier(self, verifier: Callable[..., Any]) -> None:
        if self._reward is None:
            self._reward = verifier

    def close(self) -> None:
        """Closes the teacher's backend (an engine's memory, a server it started)."""
        from coscale.rollout.factory import close_backend

        close_backend(self._backend)
        self._backend = None

    @property
    def reward(self) -> Callable[..., Any]:
        if self._reward is None:
            from coscale.scoring.rewards import MathReward

            self._reward = MathReward()
        return self._reward

    def _load(self):
        """The teacher's backend, built on first use by the backend factory: an engine
        (``vllm``, ``vllm-server``) loads the weights itself, the others sample the model
        loaded here."""
        if self._backend is None:
            import torch

            from coscale.models.policy import load_policy, load_tokenizer
            from coscale.rollout.factory import build_backend, resolve_backend

            kind, _ = resolve_backend(self.rollout.backend, torch.cuda.is_available())
            remote = self.trust_remote_code
            if kind in ("vllm", "vllm-server"):
                model, tokenizer = None, load_tokenizer(self.model_name, remote)
            else:
                model, tokenizer = load_policy(
                    self.model_name, dtype=self.dtype, trust_remote_code=remote
                )
            options = self.rollout.options
            self._backend = build_backend(
                kind, model, tokenizer, self.model_name, self.dtype, **options
            )
        return self._backend


FIX = "give the teacher a reward that needs none (data.teacher.init_args.reward)"
"""What the teacher's refusal of prompt-only rows asks for (:mod:`coscale.scoring.answers`)."""


def _teacher_rollout(rollout: RolloutSettings | dict[str, Any] | None) -> RolloutSettings:
    """The teacher's checked ``rollout`` (a mapping's ``backend`` defaults to ``hf``)."""
    if isinstance(rollout, dict):
        try:
            rollout = RolloutSettings(**{"backend": "hf", **rollout})
        except TypeError as err:
            raise ValueError(f"teacher rollout: {err} (it takes backend, options)") from None
    rollout = rollout or RolloutSettings(backend="hf")
    if errors := rollout.errors():
        raise ValueError("teacher rollout." + "; rollout.".join(errors))
    return rollout
