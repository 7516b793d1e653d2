"""``coscale eval --config eval.yaml``: pass@1 / pass@k of a model on named benchmarks.

Every problem gets ``samples`` completions from the chosen rollout backend (the cached decode,
HF ``generate``, vLLM or a vLLM server), scored by a `MathReward` (``reward``: its arguments; not
a run's own verifier); pass@k is the unbiased estimator of
`coscale.scoring.metrics.pass_at_k`, averaged over a benchmark's problems. The result is a table on
stdout, a JSON file, and (``logger: wandb``) ``eval/<benchmark>/pass@<k>`` metrics plus a
results table in W&B (offline without an API key). Lightning-free: plain PyTorch.

The YAML has one ``eval`` section, the fields of `EvalSettings`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from coscale.app.benchmark_eval import evaluate, format_table, result_rows
from coscale.checks import at_least, one_of
from coscale.models.prompting import PromptSettings
from coscale.renamed import old_names
from coscale.rollout.base import RolloutBackend, SamplingParams


@dataclass
class EvalSettings:
    """Settings of ``coscale eval``.

    Attributes:
        model: Hub name or folder of the model to evaluate (``builtin:`` specs too), or a
            PEFT adapter folder such as a stage's ``model/adapter`` (merged into its base; hf).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        benchmarks: Problem source specs (`coscale.tasks.benchmarks`), e.g. ``math500``,
            ``amc``, ``olymmath-en-easy``, ``mine?path=data/test.jsonl``.
        run: A ``coscale run`` folder whose models are evaluated: its one sampling definition
            (``pipeline.sampling``: the prompt, the token limit, the judge's temperature, top-p)
            and its engine (``pipeline.rollout``) fill whatever of ``prompt``,
            ``max_new_tokens``, ``temperature``, ``top_p``, ``backend`` is not set here.
        prompt: How a question becomes the prompt (as in training; unset: the run's, else the
            question alone).
        samples: Completions per problem (n of pass@k).
        k: The pass@k budgets reported, each <= samples.
        max_new_tokens: Token limit of a completion (unset: the run's, else 4096).
        temperature: Sampling temperature, 0 greedy (unset: the run's judge temperature, else
            0.6).
        top_p: Nucleus sampling (unset: the run's, else 1.0).
        batch_size: Problems per backend call.
        backend: ``auto`` (vLLM where it is installed and the model is on CUDA, else the cached
            decode), ``cached``, ``hf``, ``vllm`` or ``vllm-server`` (unset: the run's, else
            ``auto``).
        backend_options: Arguments of the backend class (vLLM: ``engine: {gpu_memory_utilization:
            0.85}``, ...; see `coscale.rollout.vllm.settings`).
        reward: `MathReward` arguments (``extract``, ``timeout``, ``num_workers``).
        dtype: Weights' dtype of the HF model.
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        logger: ``wandb`` (offline without an API key) or ``none``.
        project: W&B project.
        run_name: W&B run name.
        output: JSON file for the results (None: not written).
        seed: Base seed of the samples.
    """

    model: str
    tokenizer: str | None = None
    benchmarks: list[str] = field(default_factory=lambda: ["math500"])
    run: str | None = None
    prompt: PromptSettings | None = None
    samples: int = 16
    k: list[int] = field(default_factory=lambda: [1, 8, 16])
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    batch_size: int = 64
    backend: Literal["auto", "cached", "hf", "vllm", "vllm-server"] | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    reward: dict[str, Any] = field(default_factory=dict)
    dtype: str = "bfloat16"
    device: str = "auto"
    logger: Literal["wandb", "none"] = "wandb"
    project: str = "coscale-eval"
    run_name: str | None = None
    output: str | None = "runs/eval/results.json"
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in {**UNSET_DEFAULTS, **_run_sampling(self.run)}.items():
            if getattr(self, name) is None:  # the run's first, then the defaults
                setattr(self, name, value)
        if isinstance(self.prompt, dict):
            self.prompt = PromptSettings(**self.prompt)
        errors = at_least(1, samples=self.samples, max_new_tokens=self.max_new_tokens)
        errors += at_least(1, batch_size=self.batch_size)
        if not self.k or any(not 1 <= k <= self.samples for k in self.k):
            errors.append(f"k must be a non-empty list of ints in [1, samples={self.samples}]")
        if not self.benchmarks:
            errors.append("benchmarks must name at least one problem source")
        errors += one_of(("auto", "cpu", "cuda"), device=self.device)
        if errors:
            raise ValueError("eval: " + "; ".join(errors))


UNSET_DEFAULTS = {
    "prompt": PromptSettings(),
    "max_new_tokens": 4096,
    "temperature": 0.6,
    "top_p": 1.0,
    "backend": "auto",
}
"""What ``eval`` samples with where neither its own settings nor ``eval.run`` say."""


def _run_sampling(run: str | None) -> dict[str, Any]:
    """The sampling settings of the ``coscale run`` folder ``run`` (its state file's config)."""
    if run is None:
        return {}
    path = os.path.join(run, "pipeline_state.json")
    if not os.path.exists(path):
        raise ValueError(f"eval.run={run!r} holds no pipeline_state.json: not a coscale run folder")
    with open(path) as f:
        config = json.load(f)["config"]
    sampling, rollout = config.get("sampling") or {}, config.get("rollout") or {}
    if not sampling:
        raise ValueError(f"eval.run={run!r} was run before pipeline.sampling existed: set "
                         "eval.prompt, eval.max_new_tokens and eval.temperature")  # fmt: skip
    judge = sampling.get("judge_temperature")
    found = {
        "prompt": PromptSettings(**sampling["prompt"]),
        "max_new_tokens": sampling["max_new_tokens"],
        "temperature": sampling["temperature"] if judge is None else judge,
        "top_p": sampling["top_p"],
    }
    return found | ({"backend": rollout["backend"]} if rollout.get("backend") else {})


def log_to_wandb(rows: Sequence[dict[str, Any]], config: EvalSettings) -> None:
    """``eval/<benchmark>/<metric>`` values and an ``eval/results`` table in one W&B run."""
    import wandb

    from coscale.modules.loggers import wandb_mode

    run = wandb.init(
        project=config.project,
        name=config.run_name,
        config=asdict(config),
        mode=wandb_mode(),
        dir=os.getcwd(),  # explicit: an earlier run in this process must not pick the folder
    )
    metrics = {
        f"eval/{row['benchmark']}/{key}": value
        for row in rows
        for key, value in row.items()
        if isinstance(value, float)
    }
    table = wandb.Table(columns=list(rows[0]), data=[list(row.values()) for row in rows])
    run.log({**metrics, "eval/results": table})
    run.summary.update(metrics)
    run.finish()


def run_eval(config: EvalSettings) -> list[dict[str, Any]]:
    """Loads the model and benchmarks, evaluates, prints, writes and logs; returns the rows.

    The backend is closed (`RolloutBackend.close`) as soon as the samples are scored, and when
    evaluation fails.
    """
    from coscale.scoring.rewards import MathReward
    from coscale.tasks.benchmarks import load_benchmark, parse_source

    benchmarks = {parse_source(s).name: load_benchmark(s) for s in config.benchmarks}
    backend, tokenizer = build_eval_backend(config)
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
    )
    try:
        with MathReward(**config.reward) as reward:
            results = evaluate(
                backend,
                lambda qs: [config.prompt(q, tokenizer) for q in qs],
                benchmarks,
                reward,
                config.samples,
                config.k,
                sampling,
                config.batch_size,
            )
    finally:
        backend.close()  # a vLLM engine's GPU memory, even when evaluation failed
    rows = result_rows(results)
    print(format_table(rows), flush=True)
    if config.output:
        os.makedirs(os.path.dirname(os.path.abspath(config.output)), exist_ok=True)
        with open(config.output, "w") as f:
            json.dump({"config": asdict(config), "results": rows}, f, indent=1, default=str)
    if config.logger == "wandb":
        log_to_wandb(rows, config)
    return rows


def build_eval_backend(config: EvalSettings) -> tuple[RolloutBackend, Any]:
    """The backend and tokenizer of `config` (vLLM loads the weights itself, no HF copy).

    The caller closes the backend when done with it (`RolloutBackend.close`).
    """
    from coscale.models.adapters import is_adapter_folder
    from coscale.models.policy import load_policy, load_tokenizer, resolve_model_path
    from coscale.rollout.factory import build_backend, resolve_backend
    from coscale.run.precision import training_device

    path = resolve_model_path(config.model)
    device = training_device(config.device)  # auto: CUDA when available
    kind, why = resolve_backend(config.backend, device == "cuda")
    print(f"[coscale] {why}", flush=True)
    if kind in ("vllm", "vllm-server"):
        if is_adapter_folder(path):  # vLLM loads a whole model folder
            raise ValueError(
                f"eval.model={config.model!r} is an adapter folder: with eval.backend={kind} give "
                "the merged export that holds it (its parent folder), or use eval.backend=hf"
            )
        tokenizer = load_tokenizer(config.tokenizer or path)
        return build_backend(kind, None, tokenizer, path, **config.backend_options), tokenizer
    policy, tokenizer = load_policy(path, config.tokenizer, config.dtype)
    policy = policy.to(device).eval()
    return build_backend(kind, policy, tokenizer, **config.backend_options), tokenizer


def eval_parser():
    """The parser of ``coscale eval``: ``--config`` YAML with an ``eval`` section."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="coscale eval",
        parser_mode="omegaconf",
        description=(
            "pass@1 / pass@k of a model on named benchmarks: a table on stdout, a JSON file and"
            " (logger: wandb) W&B metrics. Settings: a YAML with an eval section (--config);"
            " every flag below overrides one."
        ),
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML with an eval section")
    parser.add_class_arguments(EvalSettings, "eval")
    return parser


def eval_command(argv: list[str]) -> list[dict[str, Any]]:
    """``coscale eval --config eval.yaml [--eval.samples 4 ...]``."""
    parser = eval_parser()
    init = parser.instantiate(parser.parse_args(argv))
    return run_eval(init.eval)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"EvalConfig": EvalSettings})
