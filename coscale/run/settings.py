"""The run's settings of what it hands the stages: one sampling definition, the end's switches,
and which module arguments the run sets itself.

* ``pipeline.sampling`` (:class:`RunSamplingSettings`), stated once. The pools follow what a model
  samples: a problem is solvable when the policy RL trains samples a correct answer to it. So
  every sampler of a run reads the same prompt, token limit and temperature: the pool
  measurements, each SFT stage's checkpoint selection, the final judge and the RL rollouts (and
  ``coscale eval`` / the demo's report of a run's models). SFT trains on the same prompt. The one
  setting that may differ is named: ``judge_temperature``, for checkpoint selection and the
  final judge.
* ``pipeline.final`` (:class:`FinalSettings`).
* :data:`SET_BY_RUN`: the module arguments the run writes for every stage; a second copy in
  ``pipeline.sft`` / ``pipeline.grpo`` is refused with the key to set instead.
* ``pipeline.sft`` / ``pipeline.grpo`` from YAML checked against the modules' signatures
  (:func:`typed_errors`) and turned into objects (:func:`instantiate`), and the run's one
  verifier handed to every stage that judges (:func:`one_verifier`).
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any

from coscale.checks import at_least, imported, one_of
from coscale.datamodules import ProblemDataModule
from coscale.loop.curriculum import SFT_SOURCES, SFTSource
from coscale.measure.pass_rates import KEEP
from coscale.models.prompting import PromptSettings, as_prompt_format
from coscale.modules.optimizer_choice import CALLABLE_KEYS
from coscale.renamed import GOES_IN, old_names
from coscale.rollout.base import SamplingSettings
from coscale.scoring.reward_set import default_verifier


@dataclass(frozen=True)
class RunSamplingSettings(SamplingSettings):
    """How the run's policy is prompted and sampled, for every sampler of the run: the sampling
    settings (:class:`~coscale.rollout.base.SamplingSettings`, their one set of defaults) with
    the prompt and the judge's temperature.

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

    prompt: PromptSettings | str = PromptSettings()
    judge_temperature: float | None = None

    def __post_init__(self) -> None:  # checked with the rest of the run's settings (errors)
        object.__setattr__(self, "prompt", as_prompt_format(_plain(self.prompt)))

    def errors(self, unset: bool = False) -> list[str]:
        """Every out-of-range setting, named."""
        errors = super().errors(unset)
        return errors + at_least(0, float, optional=True, judge_temperature=self.judge_temperature)

    @property
    def judging_temperature(self) -> float:
        """The temperature of checkpoint selection and the final judge."""
        return self.temperature if self.judge_temperature is None else self.judge_temperature

    @property
    def rl_sampling(self) -> dict[str, Any]:
        """Token limit, temperature, top-p and top-k of the RL rollouts and pool measurements."""
        return {k: getattr(self, k) for k in ("max_new_tokens", "temperature", "top_p", "top_k")}

    def sft_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """``pipeline.sft`` with the run's prompt and judging settings written in."""
        return {**args, "prompt": self.prompt, "validation": self._validation(args)}

    def grpo_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """``pipeline.grpo`` with the run's prompt, rollout settings and judging settings."""
        sampling = {**_given(args.get("sampling")), **self.rl_sampling}
        return {**self.sft_args(args), "sampling": sampling}

    def _validation(self, args: dict[str, Any]) -> dict[str, Any]:
        judged = {"max_new_tokens": self.max_new_tokens, "temperature": self.judging_temperature}
        return {**_given(args.get("validation")), **judged}


NOT_TAKEN = "RL, the measurements and the judge must sample alike"
"""What :data:`MOVED` holds, in place of a key, for a module setting the run cannot take yet:
why."""

MOVED = {
    "prompt": "pipeline.sampling.prompt",
    "rollout": "pipeline.rollout",
    "sampling.max_new_tokens": "pipeline.sampling.max_new_tokens",
    "sampling.temperature": "pipeline.sampling.temperature",
    "sampling.top_p": "pipeline.sampling.top_p",
    "sampling.top_k": "pipeline.sampling.top_k",
    "sampling.stop": NOT_TAKEN,
    "validation.max_new_tokens": "pipeline.sampling.max_new_tokens",
    "validation.temperature": "pipeline.sampling.judge_temperature",
}
"""A module setting the pipeline writes from the run's sampling definition -> the key to set
(part of :data:`SET_BY_RUN`)."""


def moved_keys(group: str) -> dict[str, str]:
    """:data:`MOVED` as it applies to ``pipeline.<group>`` (an SFTModule has no ``rollout``
    and no ``sampling``)."""
    if group != "sft":
        return dict(MOVED)
    return {k: v for k, v in MOVED.items() if k != "rollout" and not k.startswith("sampling.")}


SET_BY_RUN = {
    ("sft", "model"): "pipeline.model",
    ("grpo", "model"): "pipeline.model",
    ("sft", "peft"): "pipeline.peft",
    ("grpo", "peft"): "pipeline.peft",
    ("sft", "distill"): "pipeline.distill_weight (the teacher is the latest RL model)",
    ("sft", "verifier"): "pipeline.grpo.verifier",
} | {(group, key): where for group in ("sft", "grpo") for key, where in moved_keys(group).items()}
"""Every module argument (``<arg>``) or group field (``<arg>.<field>``) that the run sets
itself for every stage -> the key that sets it. The one table: the parser leaves these out
(``--help`` never offers them), a refusal names the key, and :func:`set_by_run_errors` refuses
them in a ``PipelineSettings``."""


def set_by_run(group: str) -> dict[str, str]:
    """:data:`SET_BY_RUN` of ``pipeline.<group>``: key -> where it is set."""
    return {key: where for (g, key), where in SET_BY_RUN.items() if g == group}


def set_by_run_errors(group: str, args: dict[str, Any]) -> list[str]:
    """A message for each key of :func:`set_by_run` that ``pipeline.<group>`` sets (the CLI
    leaves a group field None when unset); ``args`` loses them, so that its type check sees a
    module's own settings only."""
    errors = []
    for key, where in set_by_run(group).items():
        outer, _, inner = key.partition(".")
        holder = args if not inner else _given(args.get(outer))
        name = inner or outer
        if name not in holder:
            continue
        given = holder[name] not in (None, ())  # () : stop strings unset, as a group holds them
        if given and where == NOT_TAKEN:
            errors.append(f"{group}.{key} is not taken by coscale run yet ({where})")
        elif given:
            errors.append(f"{group}.{key} is set by the run for every stage: set {where} instead")
        if inner:  # a CLI default None, or the refused value: out of the module's settings
            args[outer] = {k: v for k, v in holder.items() if k != name}
        else:
            del args[name]
    return errors


def _given(group: Any) -> dict[str, Any]:
    """A settings group as a mapping of the values it holds (a dataclass, a mapping or None)."""
    return dict(_plain(group) or {})


def _plain(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


@dataclass(frozen=True)
class FinalSettings:
    """The final stage's switches.

    Attributes:
        retrain: Retrain from the initial model at the end (stage ``final/retrain``, distilled
            from the last RL model when ``distill_weight`` > 0). Off: the run ends with the last
            iteration's model.
        epochs: Epochs of the final retrain (None: ``sft_epochs``). The retrain is the one SFT
            whose model is shipped; the iterations' SFT stages only feed their RL stages, so a
            short ``sft_epochs`` with a long retrain moves SFT budget to where it is kept.
        source: What the retrain trains on (plus the replay share): ``all`` (the bank and the
            latest correct RL rollouts: "everything collected", the paper), ``bank`` (the bank
            only: each pass is cheaper, so the same time buys more passes) or ``redistill``
            (the rollouts only).
        rl: After the retrain, measure it (``final/measure``) and run RL on its solvable problems
            (``final/rl``), as after every iteration's SFT; the final candidate is then that RL
            model. Off: the retrain itself (the paper).
        keep: ``retrained`` (the paper), ``better`` or ``best`` (:mod:`coscale.stages.final`),
            judged on the held-out problems (else the training problems).
    """

    retrain: bool = True
    epochs: int | None = None
    source: SFTSource = "all"
    rl: bool = False
    keep: str = "retrained"

    def errors(self) -> list[str]:
        """Every out-of-range setting, named."""
        errors = at_least(1, optional=True, epochs=self.epochs)
        errors += one_of(SFT_SOURCES, source=self.source)
        return errors + one_of(KEEP, keep=self.keep)


def instantiate(value: Any, where: str = "pipeline") -> Any:
    """``{"class_path": ..., "init_args": {...}}`` dicts (from YAML) become objects, recursively
    (in lists too: a list of reward functions); a module's ``custom_optimizer`` and
    ``lr_scheduler`` stay classes to call later (the module binds their arguments). A class that
    cannot be imported is refused naming its setting (``where``, then the keys to it)."""
    if isinstance(value, dict) and "class_path" in value:
        cls = imported(value["class_path"], f"{where}.class_path")
        return cls(**instantiate(value.get("init_args", {}), f"{where}.init_args"))
    if isinstance(value, dict):
        return {
            k: v if k in CALLABLE_KEYS else instantiate(v, f"{where}.{k}") for k, v in value.items()
        }
    if isinstance(value, list):
        return [instantiate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def one_verifier(sft: dict[str, Any], grpo: dict[str, Any], data: ProblemDataModule) -> None:
    """Makes ``pipeline.grpo.verifier`` (or its default, :func:`default_verifier`) the run's one
    verifier: the RL stages' and the SFT stages' (measurement, selection, the final judge), and
    the teacher's when it has none of its own (the bank)."""
    verifier = default_verifier(grpo.get("reward"), grpo.get("verifier"))
    grpo["verifier"] = sft["verifier"] = verifier
    if (teacher := data.curriculum.teacher) is not None and hasattr(teacher, "adopt_verifier"):
        teacher.adopt_verifier(verifier)


def typed_errors(name: str, cls: type, args: dict[str, Any], ranges) -> list[str]:
    """``args`` checked against ``cls``'s typed signature (keys, types, ``class_path`` parts)
    by jsonargparse, then its value ranges by ``ranges``; messages name ``pipeline.<name>``."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, skip={"model"}, instantiate=False)  # refused before
    try:
        parser.parse_object(args)
    except Exception as err:  # jsonargparse's ArgumentError: unknown key or wrong type
        detail = " ".join(line.strip() for line in str(err).splitlines())
        params = ", ".join(sorted(set(inspect.signature(cls).parameters) - {"model"}))
        return [f"{name}: {detail} ({cls.__name__} takes: {params})"]
    return [f"{name}.{e}" for e in ranges(**args)]


SET_PER_STAGE = {
    "max_epochs": "pipeline.sft_epochs, pipeline.rl_epochs or pipeline.final.epochs",
    "max_steps": "pipeline.sft_max_steps",
    "logger": "pipeline.logger",
    "default_root_dir": "pipeline.run_dir",
    "enable_checkpointing": "pipeline.checkpoint_every_n_steps",
    "callbacks": "the stages (a run's fits take no callbacks of their own)",
}
"""``lightning.Trainer`` arguments each stage's fit sets itself -> the setting that decides them."""


def trainer_errors(trainer: dict[str, Any]) -> list[str]:
    """``pipeline.trainer``'s keys checked against ``lightning.Trainer``'s own signature (the
    nearest names suggested for a typo) and against the arguments each stage sets itself."""
    import lightning as L

    known = set(inspect.signature(L.Trainer).parameters) - {"self"}
    errors = []
    for key in trainer:
        if key in SET_PER_STAGE:
            errors.append(f"trainer.{key} is set by each stage: use {SET_PER_STAGE[key]}")
        elif key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            errors.append(f"trainer.{key} is not a lightning.Trainer argument{hint}")
    return errors


RENAMED = {
    "eval_k": "measure_samples",
    "measure_k": "measure_samples",
    "eval_max_problems": "measure_max_problems",
    "rl_eval_every": "rl_measure_every",
}
"""``pipeline.*`` settings of an earlier release -> their names now (kept for one release)."""


def take_renamed(config: Any) -> None:
    """Each old name of :data:`RENAMED` that ``config`` sets: its value under the new name, with
    a ``FutureWarning`` naming it; a ``ValueError`` when the new name is set too."""
    defaults = {f.name: f.default for f in fields(config)}
    for old, new in RENAMED.items():
        if (value := getattr(config, old)) is not None:
            if getattr(config, new) != defaults[new]:
                raise ValueError(f"pipeline: {old} is the earlier name of {new}; set {new} only")
            warnings.warn(
                f"pipeline.{old} is now pipeline.{new} ({old} goes in coscale {GOES_IN})",
                FutureWarning,
                stacklevel=3,
            )
            setattr(config, new, value)
            setattr(config, old, None)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"RunSampling": RunSamplingSettings})
