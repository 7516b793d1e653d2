"""`rollout.backend: vllm-server` on a real ``vllm serve`` (vLLM's CPU build), one server for the
module: started by the backend, sampled seeded and reproducibly, synced after optimiser steps
(weight version reported back, parity with the trainer, greedy text equal to the trainer's),
attached to by URL from a second backend, asynchronous GRPO on it killed with rollouts in flight
and resumed, and the server killed: the next call names the exit code and the server's last log
lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import lightning as L
import pytest
import torch
from test_vllm_engine import _step

from coscale.rollout import HFGenerateBackend, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PROMPTS = ["1+2=", "7*6=", "x"]
SEEDED = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
GREEDY = SamplingParams(max_new_tokens=10, temperature=0)
ENGINE = {"dtype": "float32", "max_model_len": 256, "kwargs": {"enforce_eager": True}}


@pytest.fixture(scope="module")
def policy(char_tokenizer):
    from coscale.models.tiny import build_tiny_model

    return build_tiny_model(char_tokenizer, num_heads=2, seed=0)  # head size 32 for vLLM's CPU


@pytest.fixture(scope="module")
def started(model_folder, policy, char_tokenizer, tmp_path_factory):
    from coscale.rollout.vllm.server.backend import VLLMServerBackend

    model_dir = model_folder("tiny32_server", policy, char_tokenizer)
    log = tmp_path_factory.mktemp("server") / "vllm-server.log"
    backend = VLLMServerBackend(
        str(model_dir), char_tokenizer, policy, server={"log": str(log)}, engine=ENGINE
    )
    yield backend, model_dir, log
    backend.close()


def test_the_started_server_samples_seeded_and_follows_every_sync(started, policy, char_tokenizer):
    backend, _, log = started
    first = backend.generate(PROMPTS, 2, SEEDED)
    assert backend.generate(PROMPTS, 2, SEEDED).texts == first.texts  # seeded: reproducible
    assert first.logprob_source == "engine" and backend.engine.process is not None
    assert "coscale-worker-extension" not in log.read_text()  # the log is the server's own
    for sync in (1, 2):
        _step(policy)  # two Adam steps, every weight moves (the colocated engine's test)
        backend.update_weights(policy)
        engine = backend.engine
        assert engine.client.weight_version() == engine.weight_version == str(sync)
        assert backend.book.last.tensors > 0 and backend.book.last.engine_loaded[0] > 0
        result = backend.check_parity()
        assert result.mean_abs < backend.parity_atol
    hf = HFGenerateBackend(policy, char_tokenizer).generate(PROMPTS, 1, GREEDY)
    assert backend.generate(PROMPTS, 1, GREEDY).texts == hf.texts  # the trained weights serve


def test_a_second_backend_attaches_by_url_and_leaves_the_server_up(started, policy, char_tokenizer):
    from coscale.rollout.vllm.server.backend import VLLMServerBackend

    backend, model_dir, _ = started
    url = backend.engine.client.url
    attached = VLLMServerBackend(str(model_dir), char_tokenizer, None, server={"url": url})
    assert attached.engine.process is None and attached.engine.weight_version == "2"
    assert attached.generate(PROMPTS, 1, GREEDY).texts == backend.generate(PROMPTS, 1, GREEDY).texts
    attached.close()
    assert backend.engine.client.healthy()  # attaching never stops it


def test_no_server_at_the_url_is_a_clear_error(started, char_tokenizer):
    from coscale.rollout.vllm.server.backend import VLLMServerBackend
    from coscale.rollout.vllm.server.launch import ServerError, free_port

    _, model_dir, _ = started
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    nowhere = VLLMServerBackend(str(model_dir), char_tokenizer, None, server={"url": url})
    with pytest.raises(
        ServerError, match=r"no vLLM server answers at .*rollout\.options\.server\.url"
    ):
        nowhere.generate(PROMPTS, 1, GREEDY)


class _Watch(L.Callback):
    """Each step's logged staleness and how many rollouts it reported to the curriculum."""

    def __init__(self) -> None:
        self.staleness: list[float] = []
        self.recorded: list[int] = []
        self.asked: list[int] = []  # the batch's sum of N

    def on_train_start(self, trainer, module) -> None:
        record = module.record_outcomes

        def counted(batch, rollouts, correct):
            self.recorded.append(rollouts.num_rollouts)
            return record(batch, rollouts, correct)

        module.record_outcomes = counted

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.staleness.append(float(trainer.callback_metrics["train/staleness"]))
        self.asked.append(sum(p["n"] for p in batch))


def _async_fit(backend, model_dir) -> tuple[dict, _Watch]:
    from ddp_worker import loaded_data, mark_solvable
    from reward_examples import HasDigit
    from trainers import quiet_trainer

    from coscale.modules import GRPOModule

    dm = loaded_data(8)  # 4 batches of 2 problems
    mark_solvable(dm)
    module = GRPOModule(
        model=str(model_dir), reward=HasDigit(), optimizer={"lr": 0.005},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
        update={"micro_batch_size": 4, "max_staleness": 1},
    )  # fmt: skip
    backend.follow(module.policy)
    module.backend = backend  # lent: the module's fit does not stop the server
    watch = _Watch()
    quiet_trainer(4, callbacks=[watch]).fit(module, datamodule=dm)
    return {k: v.clone() for k, v in module.policy.state_dict().items()}, watch


def test_async_grpo_with_staleness_1_samples_ahead_and_reproduces(started):
    backend, model_dir, _ = started
    first, watch = _async_fit(backend, model_dir)
    # the first batch is sampled when it trains; each later one a step ahead, by weights one
    # optimiser step old; every rollout reaches the curriculum once, when its batch trains
    assert watch.staleness == [0.0, 1.0, 1.0, 1.0]
    assert watch.recorded == watch.asked and len(watch.asked) == 4
    again, _ = _async_fit(backend, model_dir)  # same seeds, and no request straddles a sync
    assert all(torch.equal(first[k], again[k]) for k in first)


def _worker(url: str, model_dir, out, mode: str) -> int:
    """tests/vllm_server_kill_worker.py in its own process; its exit status."""
    from runs import ROOT, env

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "tests" / "vllm_server_kill_worker.py"), url, str(model_dir)]
    with open(out / f"{mode}.log", "w") as log:
        return subprocess.run([*cmd, str(out), mode], env=env(), stdout=log, stderr=log).returncode


def _steps(out) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _end(out) -> tuple[dict, dict]:
    return json.loads((out / "result.json").read_text()), torch.load(out / "weights.pt")


def _rounds(result: dict) -> list[tuple[str, int, int]]:
    """Each problem's measurements and RL rounds counted by the curriculum."""
    problems = result["curriculum"]["pools"]["problems"]
    return [(p["id"], len(p["history"]), p["rl_rounds"]) for p in problems]


def test_a_fit_killed_with_rollouts_in_flight_resumes_to_the_uninterrupted_result(
    started, tmp_path
):
    """Asynchronous GRPO (max_staleness 1, a checkpoint every step) SIGKILLed after step 2's
    checkpoint while batch 3's request is out, and resumed, ends in the very state of the fit
    never killed: the checkpoint holds batch 3's rollouts, sampled by the weights one step old,
    and the resumed fit trains on them (staleness 1, not requested again by newer weights)."""
    backend, model_dir, _ = started
    url = backend.engine.client.url
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert _worker(url, model_dir, full, "full") == 0, (full / "full.log").read_text()[-3000:]
    assert _worker(url, model_dir, killed, "kill") == -signal.SIGKILL, (
        killed / "kill.log"
    ).read_text()[-3000:]
    at_kill = _steps(killed)[-1]
    assert (at_kill["step"], at_kill["batch"], at_kill["out"]) == (2, 1, 1)  # batch 3's request
    assert _worker(url, model_dir, killed, "resume") == 0, (killed / "resume.log").read_text()[
        -3000:
    ]
    want_steps = _steps(full)
    assert [s["staleness"] for s in want_steps] == [0.0, 1.0, 1.0, 1.0] * 2  # 2 epochs
    assert [s["staleness"] for s in _steps(killed)] == [s["staleness"] for s in want_steps]
    (state, weights), (want, want_weights) = _end(killed), _end(full)
    assert state == want and state["spend"]["rollouts"] > 0  # each rollout counted once
    assert _rounds(state) == _rounds(want)
    assert all(torch.equal(weights[k], want_weights[k]) for k in want_weights)


def test_a_killed_server_is_reported_with_its_exit_code_and_log(started):
    from coscale.rollout.vllm.server.launch import ServerError

    backend, _, log = started
    process = backend.engine.process
    os.killpg(process.pid, signal.SIGKILL)
    process.process.wait(30)
    with pytest.raises(ServerError, match=r"exited with code -9 while sampling") as err:
        backend.generate(PROMPTS, 1, GREEDY)
    assert str(log) in str(err.value) and "\n" in str(err.value)  # the log's last lines


def test_ddp_on_two_cpu_ranks_shares_one_server(started, tmp_path):
    from runs import worker_ranks

    _, model_dir, _ = started
    r0, r1 = worker_ranks("vllm_server_ddp_worker.py", model_dir, tmp_path, timeout=800)
    assert r0["grpo_sum"] == pytest.approx(r1["grpo_sum"], abs=1e-9)  # DDP kept them equal
    assert r0["server"]["url"] == r1["server"]["url"]  # one server
    assert (r0["server"]["started_here"], r1["server"]["started_here"]) == (True, False)
    for rank in (r0, r1):
        # a sync at the fit's start and after its first step (the second step's sync is the
        # last batch's end), each checked by this rank against its own policy
        server = rank["server"]
        assert server["reported_version"] == str(server["syncs"]) and server["syncs"] >= 2
        assert rank["parity"] and all(diff < 1e-4 for _, diff in rank["parity"]), rank["parity"]
