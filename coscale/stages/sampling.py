"""One sampling definition for a run's policy (``pipeline.sampling``), stated once.

The pools follow what a model samples: a problem is solvable when the policy RL trains samples a
correct answer to it. So every sampler of a run reads the same prompt, token limit and
temperature: the pool measurements, each SFT stage's checkpoint selection, the final judge and
the RL rollouts (and ``coscale eval`` / the demo's report of a run's models). SFT trains on the
same prompt. The one setting that may differ is named: ``judge_temperature``, for checkpoint
selection and the final judge.

The pipeline writes these values into the modules' own settings (``prompt``, GRPO's
``sampling``, both modules' ``validation``), so a second copy there is refused with the key to
set instead (:func:`moved_errors`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from coscale.checks import at_least
from coscale.models.prompting import PromptFormat, as_prompt_format
from coscale.rollout.base import sampling_errors


@dataclass(frozen=True)
class RunSampling:
    """How the run's policy is prompted and sampled, for every sampler of the run.

    Attributes:
        prompt: How a question becomes the prompt (template, chat template, system message;
            a bare string is the template): SFT trains on it, and every sample of the run is
            taken on it.
        max_new_tokens: Token limit of every sample: RL rollouts, pool measurements, checkpoint
            selection and the final judge (a problem whose answers need more is never
            measured solvable, so RL would never see it).
        temperature: Temperature of the RL rollouts and of the pool measurements.
        top_p: Nucleus sampling of the RL rollouts and the pool measurements (1: off).
        top_k: Keep the k most likely tokens in the RL rollouts and the pool measurements
            (0: off).
        judge_temperature: Temperature of checkpoint selection and the final judge (None: as
            ``temperature``).
    """

    prompt: PromptFormat | str = PromptFormat()
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    judge_temperature: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", as_prompt_format(_plain(self.prompt)))

    def errors(self) -> list[str]:
        """Every out-of-range setting, named."""
        errors = sampling_errors(self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        return errors + at_least(0, float, optional=True, judge_temperature=self.judge_temperature)

    @property
    def judging_temperature(self) -> float:
        """The temperature of checkpoint selection and the final judge."""
        return self.temperature if self.judge_temperature is None else self.judge_temperature

    def sft_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """``pipeline.sft`` with the run's prompt and judging settings written in."""
        return {**args, "prompt": self.prompt, "validation": self._validation(args)}

    def grpo_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """``pipeline.grpo`` with the run's prompt, rollout settings and judging settings."""
        rollouts = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }
        sampling = {**_given(args.get("sampling")), **rollouts}
        return {
            **args,
            "prompt": self.prompt,
            "sampling": sampling,
            "validation": self._validation(args),
        }

    def _validation(self, args: dict[str, Any]) -> dict[str, Any]:
        judged = {"max_new_tokens": self.max_new_tokens, "temperature": self.judging_temperature}
        return {**_given(args.get("validation")), **judged}


MOVED = {
    "prompt": "pipeline.sampling.prompt",
    "rollout": "pipeline.rollout",
    "sampling.max_new_tokens": "pipeline.sampling.max_new_tokens",
    "sampling.temperature": "pipeline.sampling.temperature",
    "sampling.top_p": "pipeline.sampling.top_p",
    "sampling.top_k": "pipeline.sampling.top_k",
    "validation.max_new_tokens": "pipeline.sampling.max_new_tokens",
    "validation.temperature": "pipeline.sampling.judge_temperature",
}
"""A module setting the pipeline writes from the run's sampling definition -> the key to set."""


def moved_keys(group: str) -> dict[str, str]:
    """:data:`MOVED` as it applies to ``pipeline.<group>`` (an SFTModule has no ``rollout``
    and no ``sampling``)."""
    if group != "sft":
        return dict(MOVED)
    return {k: v for k, v in MOVED.items() if k != "rollout" and not k.startswith("sampling.")}


def moved_errors(group: str, args: dict[str, Any]) -> list[str]:
    """A message for each of :data:`MOVED` that ``pipeline.<group>`` sets (the CLI leaves them
    None when unset); ``args`` loses the unset ones, so that its type check sees a module's
    own settings only."""
    errors = []
    for key, where in moved_keys(group).items():
        outer, _, inner = key.partition(".")
        holder = args if not inner else _given(args.get(outer))
        name = inner or outer
        if name not in holder:
            continue
        if holder[name] is not None:
            errors.append(
                f"{group}.{key} is the run's one sampling setting: set {where} instead (every "
                "sampler of the run, measurements, selection, judge and RL, reads it there)"
            )
        if inner:  # a CLI default None, or the refused value: out of the module's settings
            args[outer] = {k: v for k, v in holder.items() if k != name}
        else:
            del args[name]
    return errors


def _given(group: Any) -> dict[str, Any]:
    """A settings group as a mapping of the values it holds (a dataclass, a mapping or None)."""
    if group is None:
        return {}
    return dict(_plain(group))


def _plain(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
