"""``coscale eval``: pass@k per benchmark by hand, the command end to end, W&B offline, and the
shipped Qwen2.5 configs parsed and run with model and data loading mocked."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from coscale.app import evaluate as ev
from coscale.app.benchmark_eval import evaluate, format_table, result_rows
from coscale.app.cli import main, pipeline_parser
from coscale.callbacks import RolloutNSchedule
from coscale.loop.problem import Problem
from coscale.modules import GRPOModule, SFTModule
from coscale.rollout import RolloutBackend, Rollouts, SamplingParams
from coscale.tasks.benchmarks import parse_source

ROOT = Path(__file__).resolve().parents[1]
TINY = "builtin:tiny?hidden_size=32&num_layers=1&seed=0"


class ScriptedBackend(RolloutBackend):
    """Answers each question right `right[question]` times out of N (then wrong, cut by length)."""

    def __init__(self, right: dict[str, int]) -> None:
        self.right, self.seeds = right, []

    def generate(self, prompts, n_per_prompt, sampling) -> Rollouts:
        self.seeds.append(sampling.seed)
        texts, reasons = [], []
        for prompt in prompts:
            question = prompt.removeprefix("Q:")
            good = self.right[question]
            texts += [f"\\boxed{{{question}}}"] * good + ["\\boxed{no}"] * (n_per_prompt - good)
            reasons += ["stop"] * good + ["length"] * (n_per_prompt - good)
        r = len(texts)
        lengths = torch.tensor([len(t) for t in texts])
        mask = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).float()  # [R, T]
        return Rollouts(
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n_per_prompt),
            input_ids=torch.ones(r, 1 + mask.shape[1], dtype=torch.long),
            attention_mask=torch.cat([torch.ones(r, 1), mask], 1).long(),
            completion_mask=mask,
            logprobs=-mask,
            texts=texts,
            finish_reasons=reasons,
            prompt_length=1,
        )

    def update_weights(self, model) -> None:
        pass


def exact_reward(completions, answers):
    return [float(c == f"\\boxed{{{a}}}") for c, a in zip(completions, answers)]


def test_pass_at_k_per_benchmark_matches_hand_computation():
    benchmarks = {
        "b1": [Problem("p1", "3", "3"), Problem("p2", "5", "5")],
        "b2": [Problem("p3", "7", "7")],
    }
    backend = ScriptedBackend({"3": 2, "5": 0, "7": 4})
    sampling = SamplingParams(max_new_tokens=8, seed=10)
    results = evaluate(
        backend, lambda qs: [f"Q:{q}" for q in qs], benchmarks, exact_reward, 4, (1, 2), sampling, 1
    )
    b1, b2 = results
    assert b1.correct == [2, 0] and b2.correct == [4]
    # p1: pass@1 = 2/4, pass@2 = 1 - C(2,2)/C(4,2) = 5/6; p2: 0 and 0; p3: 1 and 1
    assert b1.pass_at == {1: pytest.approx(0.25), 2: pytest.approx(5 / 12)}
    assert b2.pass_at == {1: 1.0, 2: 1.0}
    assert b1.truncated == pytest.approx(6 / 8) and b2.truncated == 0.0
    # texts: "\boxed{3}" is 9 characters, "\boxed{no}" 10: b1 has 2 x 9 + 6 x 10 over 8 samples
    assert b1.mean_tokens == pytest.approx((2 * 9 + 6 * 10) / 8)
    assert backend.seeds == [10, 11, 10]  # one call per problem (batch_size 1), seeded per call
    rows = result_rows(results)
    assert [r["benchmark"] for r in rows] == ["b1", "b2", "average"]
    assert rows[2]["problems"] == 3 and rows[2]["pass@1"] == pytest.approx(0.625)
    table = format_table(rows).splitlines()
    assert table[0].split() == [
        "benchmark", "problems", "samples", "pass@1", "pass@2", "mean_tokens", "truncated"
    ]  # fmt: skip
    assert table[2].split()[:5] == ["b1", "2", "4", "0.2500", "0.4167"]


def test_eval_config_collects_every_bad_setting():
    with pytest.raises(ValueError) as err:
        ev.EvalSettings(model="m", samples=0, k=[1, 4], benchmarks=[], device="tpu", batch_size=0)
    for part in ("samples must be an int >= 1", "batch_size must be an int >= 1", "k must be", "benchmarks must",
                 "device must be one of"):  # fmt: skip
        assert part in str(err.value)


def _write_benchmarks(tmp_path: Path) -> list[str]:
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(json.dumps({"problem": f"{i}+1", "answer": i + 1}) for i in range(3)))
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"question": "2+2", "answer": "4", "id": "x"}))
    return [f"arith?path={a}", f"other?path={b}&question=question&id=id"]


def test_eval_command_end_to_end_with_the_hf_backend(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = {
        "eval": {
            "model": TINY, "benchmarks": _write_benchmarks(tmp_path),
            "prompt": {"template": "Q:{question}\nA:"}, "samples": 2, "k": [1, 2],
            "max_new_tokens": 6, "temperature": 1.0, "batch_size": 2, "backend": "hf",
            "reward": {"num_workers": 0}, "dtype": "float32", "device": "cpu",
            "logger": "none", "output": str(tmp_path / "out" / "results.json"),
        }
    }  # fmt: skip
    path = tmp_path / "eval.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    assert main(["eval", "--config", str(path), "--eval.seed", "3"]) == 0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = saved["results"]
    assert [(r["benchmark"], r["problems"], r["samples"]) for r in rows] == [
        ("arith", 3, 2), ("other", 1, 2), ("average", 4, 2)
    ]  # fmt: skip
    assert all(0.0 <= r["pass@1"] <= r["pass@2"] <= 1.0 for r in rows)
    assert saved["config"]["seed"] == 3 and "arith" in capsys.readouterr().out


def test_wandb_offline_gets_metrics_and_the_table(tmp_path, monkeypatch, wandb_log):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    rows = [{"benchmark": "b1", "problems": 2, "samples": 4, "pass@1": 0.25, "truncated": 0.5}]
    ev.log_to_wandb(rows, ev.EvalSettings(model="m", k=[1], run_name="t"))
    runs = list(tmp_path.glob("wandb/offline-run-*"))
    assert len(runs) == 1
    records = wandb_log(tmp_path / "wandb", [b"eval/b1/pass@1", b"eval/b1/truncated"])
    assert b"eval/b1/pass@1" in records and b"eval/b1/truncated" in records
    table = json.loads(
        next(runs[0].glob("files/media/table/eval/results_*.table.json")).read_text()
    )
    assert table["columns"] == list(rows[0]) and table["data"] == [list(rows[0].values())]


# --- the shipped Qwen2.5-0.5B configs ------------------------------------------------------


def test_eval_config_runs_with_model_and_data_mocked(tmp_path, monkeypatch):
    parser = ev.eval_parser()
    config = parser.instantiate(
        parser.parse_args(["--config", str(ROOT / "configs/eval/qwen2.5-0.5b.yaml")])
    ).eval
    assert config.backend == "vllm" and config.k == [1, 4, 16]
    names = [parse_source(s).name for s in config.benchmarks]
    assert names == ["math500", "amc", "olymmath-en-easy", "olymmath-en-hard"]
    built = {}

    def fake_backend(cfg):
        built["options"] = cfg.backend_options
        return ScriptedBackend({"1": 16, "2": 3}), None

    monkeypatch.setattr(ev, "build_eval_backend", fake_backend)
    monkeypatch.setattr(
        "coscale.tasks.benchmarks.load_benchmark",
        lambda spec: [Problem("a", "1", "1"), Problem("b", "2", "2")],
    )
    monkeypatch.setattr(ev.PromptSettings, "__call__", lambda self, q, tok=None: f"Q:{q}")
    quick = replace(
        config, logger="none", output=str(tmp_path / "r.json"), reward={"num_workers": 0}
    )
    rows = ev.run_eval(quick)
    assert built["options"]["engine"]["gpu_memory_utilization"] == 0.85
    # per benchmark: problem a 16/16, problem b 3/16 -> pass@1 = (1 + 3/16) / 2
    assert (
        rows[0]["pass@1"] == pytest.approx((1 + 3 / 16) / 2) and rows[-1]["benchmark"] == "average"
    )


class ClosingBackend(ScriptedBackend):
    """A `ScriptedBackend` that counts `close` calls (a vLLM engine frees its GPU memory there);
    ``fail`` makes sampling raise, as a crashed engine would."""

    def __init__(self, right: dict[str, int], fail: bool) -> None:
        super().__init__(right)
        self.fail, self.closed = fail, 0

    def generate(self, prompts, n_per_prompt, sampling) -> Rollouts:
        if self.fail:
            raise RuntimeError("engine died")
        return super().generate(prompts, n_per_prompt, sampling)

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("fail", [False, True], ids=["finished", "failed"])
def test_eval_closes_the_backend_it_built(monkeypatch, fail):
    built = []

    def fake_build_backend(kind, policy, tokenizer, model_path=None, **options):
        built.append(ClosingBackend({"1": 2, "2": 1}, fail))
        assert (kind, policy, model_path, options) == ("vllm", None, "some/model", {"seed": 1})
        return built[-1]

    monkeypatch.setattr("coscale.rollout.factory.build_backend", fake_build_backend)
    monkeypatch.setattr("coscale.models.policy.load_tokenizer", lambda name: None)
    monkeypatch.setattr(
        "coscale.tasks.benchmarks.load_benchmark",
        lambda spec: [Problem("a", "1", "1"), Problem("b", "2", "2")],
    )
    monkeypatch.setattr(ev.PromptSettings, "__call__", lambda self, q, tok=None: f"Q:{q}")
    config = ev.EvalSettings(model="some/model", benchmarks=["math500"], samples=2, k=[1, 2],
                           backend="vllm", backend_options={"seed": 1}, logger="none",
                           output=None, reward={"num_workers": 0})  # fmt: skip
    if fail:
        with pytest.raises(RuntimeError, match="engine died"):
            ev.run_eval(config)
    else:
        assert ev.run_eval(config)[0]["pass@1"] == pytest.approx((1 + 1 / 2) / 2)
    assert [backend.closed for backend in built] == [1]  # closed once, whatever happened


def test_8gpu_fsdp_pipeline_config_instantiates_with_a_tiny_model():
    base = ROOT / "configs/run/qwen2.5-0.5b/pipeline_1gpu.yaml"
    overlay = ROOT / "configs/overlays/8gpu_fsdp.yaml"
    parser = pipeline_parser()
    init = parser.instantiate(parser.parse_args(["--config", str(base), "--config", str(overlay)]))
    pipe, data = init.pipeline, init.data
    strategy = pipe.trainer["strategy"]  # class_path: built by the parser, as Trainer wants it
    assert isinstance(strategy, ModelParallelStrategy) and pipe.trainer["devices"] == 8
    assert strategy._data_parallel_size == 8 * pipe.trainer["num_nodes"]
    accepted = set(inspect.signature(L.Trainer.__init__).parameters)
    assert set(pipe.trainer) <= accepted
    for spec in (data.train_source, data.val_source):
        assert parse_source(spec).name in ("openmathreasoning", "math500")
    # the module settings are accepted as they are (a tiny model stands in for Qwen)
    grpo, sft = pipe.sampling.grpo_args(pipe.grpo), pipe.sampling.sft_args(pipe.sft)
    assert GRPOModule(model=TINY, **grpo).sampling.max_new_tokens == 4096
    assert (
        SFTModule(model=TINY, **sft).val_sampling.max_new_tokens == 4096
    )  # measured as RL samples
    assert SFTModule(model=TINY, **sft).max_length == 4096


# --- GRPO with a vLLM-style backend: GRPOModule keeps the engine in sync ---------------


def test_grpo_steps_keep_a_colocated_engine_in_sync(tiny_model_dir):
    from reward_examples import HasDigit
    from test_vllm_logic import _backend, _same_weights

    from coscale.datamodules import ProblemDataModule

    module = GRPOModule(model=str(tiny_model_dir), reward=HasDigit(), optimizer={'lr': 0.01}, sampling={'max_new_tokens': 4, 'temperature': 1.0}, update={'micro_batch_size': 64})  # fmt: skip
    initial = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    module.backend = _backend(module.policy, module.tokenizer, parity={"tokens": 4})
    rows = [{"id": f"p{i}", "question": f"{i}+{i}", "answer": str(2 * i)} for i in range(8)]
    data = ProblemDataModule(train=rows, batch_size=4, curriculum={"rl_unmeasured": True})
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        callbacks=[RolloutNSchedule(n_init=2, factor=1.0)],
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(module, datamodule=data)
    backend = module.backend
    # one sync at train start, one after each of the 2 optimiser steps
    assert backend.book.version == 3 and backend.last_parity.ok
    assert _same_weights(backend.fake().model, module.policy)  # the engine follows the policy
    assert any(not torch.equal(p, initial[n]) for n, p in module.policy.named_parameters())


def test_a_runs_models_are_evaluated_with_the_runs_sampling_definition(tmp_path):
    from coscale.app.evaluate import EvalSettings

    sampling = {"prompt": {"template": "Q:{question}\nA:", "chat": False, "system": None},
                "max_new_tokens": 40, "temperature": 1.0, "top_p": 0.9, "judge_temperature": 0.5}  # fmt: skip
    state = {"config": {"sampling": sampling, "rollout": {"backend": "cached", "options": {}}}}
    (tmp_path / "pipeline_state.json").write_text(json.dumps(state))
    cfg = EvalSettings(model="m", run=str(tmp_path), logger="none")
    assert cfg.prompt.template == "Q:{question}\nA:" and cfg.max_new_tokens == 40
    assert (cfg.temperature, cfg.top_p, cfg.backend) == (0.5, 0.9, "cached")  # the judge's
    mine = EvalSettings(model="m", run=str(tmp_path), max_new_tokens=8, backend="hf", logger="none")
    assert (mine.max_new_tokens, mine.backend, mine.temperature) == (8, "hf", 0.5)
    plain = EvalSettings(model="m", logger="none")  # no run: the defaults
    assert (plain.max_new_tokens, plain.temperature, plain.backend) == (4096, 0.6, "auto")
    with pytest.raises(ValueError, match=r"eval\.run=.* holds no pipeline_state\.json"):
        EvalSettings(model="m", run=str(tmp_path / "nothing"))
