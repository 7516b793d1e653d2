"""GPU check of the multi-process paths that CI runs only on 2 CPU processes over gloo
(tests/test_multiprocess.py), here on every visible GPU over nccl:

* ``pipeline``: the whole pipeline of tests/configs/two_ranks.yaml under FSDP2
  (``ModelParallelStrategy``) on N GPUs; every stage must run, the exports must load in plain
  transformers (no DTensor, finite weights). Prints the wall time and each stage's seconds.
* ``lockstep``: the cached-decode backend on a ``fully_shard``ed policy where every row of
  rank 0 ends at its first token (and rank 0 has fewer prompts, so fewer chunks); the other
  ranks decode to the token limit and must get the unsharded model's completions. Needs 2+
  devices. Without lockstep a rank waits in an all-gather until the 60 s timeout.
* ``fits``: tests/fsdp_worker.py's ``fits`` (an SFT fit, a GRPO fit with re-distillation, each
  exported) with a GPU trainer; the exports must equal the gathered weights.

Each check runs its ranks as one worker subprocess in a session of its own (a hang is killed
whole, ranks included), its output in ``<work>/<check>.log``; then it reads what the ranks
wrote and returns a line of numbers, or raises `CheckFailed`. ``--cpu`` (gpu_check.py) runs the
same logic on 2 CPU processes over gloo. Single node only.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CONFIG = TESTS / "configs" / "two_ranks.yaml"
STAGES = ["warmup", "it1/scale", "it1/sft", "it1/measure", "it1/rl", "it1/redistill",
          "it2/scale", "it2/sft", "it2/measure", "it2/rl",
          "final/retrain", "final/measure", "final/rl", "final"]  # fmt: skip
"""What two_ranks.yaml runs (the same list as tests/test_multiprocess.py)."""
LIMITS = {"speed": 180, "lockstep": 90, "fits": 150, "pipeline": 240, "vllm": 300, "matmul": 90,
          "vllm-server": 360}  # fmt: skip
"""Seconds each check's worker may run (less when the overall budget has less left)."""


class CheckFailed(Exception):
    """A check's expectation did not hold; the message says what was seen."""


class Skipped(Exception):
    """A check that cannot run on this machine; the message says why."""


@dataclass
class Setup:
    """Where and how the checks run; ``deadline`` (time.monotonic) ends the overall budget."""

    accelerator: str  # "gpu" or "cpu"
    devices: int
    precision: str
    work: Path
    deadline: float

    @property
    def backend(self) -> str:
        return "gloo" if self.accelerator == "cpu" else "nccl"

    @property
    def where(self) -> str:
        return f"{self.devices} x {self.accelerator} ({self.backend}, {self.precision})"


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# ------------------------------------------------------------------------------ workers
def run_worker(name: str, cmd: list[str], setup: Setup) -> float:
    """Runs ``cmd`` (from the repository root) with its output in ``<work>/<name>.log``, in a
    process group of its own that is killed whole afterwards (ranks left waiting included).
    Returns its wall seconds; raises `CheckFailed` on a nonzero exit or past its time limit."""
    limit = min(LIMITS[name], setup.deadline - time.monotonic())
    if limit < 15:
        raise CheckFailed(f"not started: the overall budget is spent ({limit:.0f} s left)")
    log = setup.work / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}  # fmt: skip
    threads = max(1, (os.cpu_count() or 1) // setup.devices)
    env.setdefault("OMP_NUM_THREADS", "1" if setup.accelerator == "cpu" else str(threads))
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(proc, grace=30.0 if proc.returncode == 0 else 0.0)
    seconds = time.perf_counter() - start
    if rc != 0:
        why = f"timed out after {limit:.0f} s" if rc is None else f"exit code {rc}"
        raise CheckFailed(f"worker {why} ({seconds:.1f} s); last lines of {log}:\n{_tail(log)}")
    return seconds


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    """Gives the worker's process group (its own session) ``grace`` seconds to end by itself
    (ranks may still be closing when rank 0 has exited), then SIGTERM, then SIGKILL."""
    for sig, wait in ((0, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        while _signal_group(proc, sig):
            sig = 0  # sent once; then only look whether any of the group is left
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        else:
            return
    proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Sends ``sig`` (0: none) to the worker's group; False when none of it is left."""
    proc.poll()  # reaps the leader once it has exited (a zombie still counts as the group)
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _fresh(folder: Path) -> Path:
    """``folder``, empty (files of an earlier run in the same ``--work`` removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _tiny_model(work: Path, folder: str = "tiny_model", **sizes: int) -> Path:
    """A random Llama and character tokenizer saved once in ``work / folder``: by default the
    2-layer, 64-wide one of tests/conftest.py; ``sizes``: other `build_tiny_model` sizes."""
    from coscale.models.tiny import build_char_tokenizer, build_tiny_model

    path = work / folder
    if not (path / "config.json").exists():
        tok = build_char_tokenizer()
        build_tiny_model(tok, seed=0, **sizes).save_pretrained(path)
        tok.save_pretrained(path)
    return path


def _fsdp2(n: int) -> str:
    return ("{class_path: lightning.pytorch.strategies.ModelParallelStrategy, "
            f"init_args: {{data_parallel_size: {n}, tensor_parallel_size: 1}}}}")  # fmt: skip


# ----------------------------------------------------------------------------- (a) pipeline
def pipeline(setup: Setup) -> str:
    """``coscale run`` on two_ranks.yaml under FSDP2 on every device; see the module doc."""
    from safetensors.torch import load_file

    run_dir = _fresh(setup.work / "pipeline")  # a state file left there would resume
    trainer = (f"{{accelerator: {setup.accelerator}, devices: {setup.devices}, "
               f"precision: {setup.precision}, strategy: {_fsdp2(setup.devices)}}}")  # fmt: skip
    cmd = [sys.executable, "-m", "coscale", "run", "--config", str(CONFIG),
           "--pipeline.run_dir", str(run_dir), "--pipeline.trainer", trainer]  # fmt: skip
    wall = run_worker("pipeline", cmd, setup)
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    expect(state["done"] == STAGES, f"stages run: {state['done']}")
    missing = {"it1/rl", "it1/redistill"} - set(state["models"])
    expect(not missing, f"no model exported for {sorted(missing)}")
    rollouts = state["results"]["spend"]["it1/rl"]["rollouts"]
    expect(rollouts > 0, "it1/rl sampled no rollouts")
    for stage in ("it1/rl", "it1/redistill", "final"):
        folder = run_dir / stage / "model"
        _loads_in_transformers(folder)
        bad = [k for k, t in load_file(folder / "model.safetensors").items()
               if not torch.isfinite(t).all()]  # fmt: skip
        expect(not bad, f"{stage}: non-finite weights in {bad[:5]}")
    stages = " ".join(f"{k}={v:.1f}" for k, v in state.get("seconds", {}).items())
    return (f"{setup.where}: {len(STAGES)} stages in {wall:.1f} s wall, it1/rl {rollouts} "
            f"rollouts, exports load in transformers; stage seconds: {stages}")  # fmt: skip


def _loads_in_transformers(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    expect(not any(hasattr(p, "full_tensor") for p in model.parameters()),
           f"{folder}: DTensor parameters after loading")  # fmt: skip


# ----------------------------------------------------------------------------- (b) lockstep
LOCKSTEP_PROMPTS = ["12+7=", "3+4=", "40-2="]
LOCKSTEP_BATCH = 2  # rows per chunk: rank 0 (1 prompt x 2) has 1 chunk, the others (3 x 2) 3


def lockstep(setup: Setup) -> str:
    """Cached decode on a sharded policy, rank 0 done at once; see the module doc."""
    if setup.devices < 2:
        lent = "one GPU was lent" if setup.accelerator != "cpu" else "1 CPU process"
        raise Skipped(f"a multi-GPU check: needs 2 or more devices, {lent}")
    model_dir, out = _tiny_model(setup.work), _fresh(setup.work / "lockstep")
    cmd = [sys.executable, __file__, "lockstep-worker", str(model_dir), str(out),
           setup.backend, str(setup.devices)]  # fmt: skip
    wall = run_worker("lockstep", cmd, setup)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(setup.devices)]
    first = ranks[0]["sharded"]
    expect(first == [""] * 2, f"rank 0 should end both rows at once, got {first}")
    others = ranks[1:]
    for r, row in enumerate(others, start=1):
        expect(all(row["plain"]), f"rank {r}: an empty unsharded completion {row['plain']}")
    equal = sum(a == b for row in others for a, b in zip(row["sharded"], row["plain"]))
    total = sum(len(row["plain"]) for row in others)
    differ = [(r, row["sharded"], row["plain"]) for r, row in enumerate(others, start=1)
              if row["sharded"] != row["plain"]]  # fmt: skip
    expect(not differ, f"{equal}/{total} completions equal the unsharded model's; first "
           f"differing (rank, sharded, unsharded): {differ[0] if differ else None}")  # fmt: skip
    decode = max(row["seconds"] for row in ranks)
    return (f"{setup.where}: rank 0 ended its 2 rows (1 chunk) at the first token; ranks "
            f"1..{setup.devices - 1} decoded 3 chunks each, {equal}/{total} completions equal "
            f"the unsharded model's; sharded decode {decode:.2f} s, worker {wall:.1f} s")  # fmt: skip


def _lockstep_worker(model_dir: str, out: str, backend: str, world: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_lockstep_rank, args=(int(world), backend, model_dir, out, port), nprocs=int(world))


def _lockstep_rank(rank: int, world: int, pg_backend: str, model_dir: str, out: str, port: int):
    """tests/fsdp_worker.py's ``_lockstep_rank`` for N ranks, any backend and device, with
    rank 0 given fewer prompts (duplicated there: that one is gloo, CPU and 2 ranks only)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from coscale.models.policy import load_policy
    from coscale.rollout.base import SamplingParams
    from coscale.rollout.cached.backend import CachedDecodeBackend

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if pg_backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group(pg_backend, rank=rank, world_size=world, timeout=timeout)
    torch.set_num_threads(1)
    model, tok = load_policy(model_dir)
    model.to(device)
    prompts = LOCKSTEP_PROMPTS[:1] if rank == 0 else LOCKSTEP_PROMPTS
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    plain = CachedDecodeBackend(model, tok, LOCKSTEP_BATCH).generate(prompts, 2, sampling).texts
    mesh = init_device_mesh(device.type, (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    backend = CachedDecodeBackend(model, tok, LOCKSTEP_BATCH)
    if rank == 0:  # every token ends a row: rank 0 is done after one step
        backend.eos_token_ids = tuple(range(len(tok)))
    start = time.perf_counter()
    texts = backend.generate(prompts, 2, sampling).texts
    seconds = time.perf_counter() - start
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"plain": plain, "sharded": texts, "seconds": seconds}, f)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------------- (c) fits
def fits(setup: Setup) -> str:
    """SFT and GRPO+ReDistillation fits under FSDP2, then export; see the module doc."""
    from safetensors.torch import load_file

    model_dir, out = _tiny_model(setup.work), _fresh(setup.work / "fits")
    cmd = [sys.executable, __file__, "fits-worker", str(model_dir), str(out),
           setup.accelerator, str(setup.devices), setup.precision]  # fmt: skip
    wall = run_worker("fits", cmd, setup)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(setup.devices)]
    expect(all(r["sharded"] == "DTensor" for r in ranks), f"not sharded: {ranks}")
    expect(all(r["redistill_runs"] == 1 for r in ranks), f"re-distillation runs: {ranks}")
    expect(ranks[0]["sft_tensors"] > 0 and all(r["sft_tensors"] == 0 for r in ranks[1:]),
           f"the full state dict should reach rank 0 only: {ranks}")  # fmt: skip
    counts = []
    for folder, gathered in (("sft", "sft_gathered.pt"), ("redistilled", "grpo_gathered.pt")):
        exported = load_file(out / folder / "model.safetensors")
        full = torch.load(out / gathered)
        expect(bool(exported) and set(exported) <= set(full),
               f"{folder}: exported names {sorted(exported)[:5]}... not all gathered")  # fmt: skip
        differ = [k for k, t in exported.items() if not torch.equal(t, full[k])]
        expect(not differ, f"{folder}: export differs from the gathered weights in {differ[:5]}")
        counts.append(len(exported))
    initial = load_file(model_dir / "model.safetensors")
    trained = load_file(out / "sft" / "model.safetensors")
    expect(
        any(not torch.equal(trained[k], initial[k]) for k in initial), "the SFT fit trained nothing"
    )
    _loads_in_transformers(out / "redistilled")
    return (f"{setup.where}: SFT and GRPO+ReDistillation exports equal the gathered weights "
            f"({counts[0]} and {counts[1]} tensors, bitwise), gathered on rank 0 only; "
            f"worker {wall:.1f} s")  # fmt: skip


def _fits_worker(model_dir: str, out: str, accelerator: str, devices: str, precision: str):
    """tests/fsdp_worker.py's ``fits``, its trainer swapped for one on ``accelerator``. Lightning
    starts ranks 1.. by running this script again with the same arguments."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    sys.path.insert(0, str(TESTS))
    import fsdp_worker

    n = int(devices)

    def trainer(**kw) -> L.Trainer:
        return L.Trainer(accelerator=accelerator, devices=n, precision=precision,
                         strategy=ModelParallelStrategy(data_parallel_size=n, tensor_parallel_size=1),
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, **kw)  # fmt: skip

    if not callable(getattr(fsdp_worker, "_trainer", None)):
        raise RuntimeError("tests/fsdp_worker.py has no _trainer() to replace: update this check")
    fsdp_worker._trainer = trainer  # fits() looks it up at call time
    fsdp_worker.fits(model_dir, out)


CHECKS = {"lockstep": lockstep, "fits": fits, "pipeline": pipeline}

if __name__ == "__main__":  # the workers; the checks run from gpu_check.py
    workers = {"lockstep-worker": _lockstep_worker, "fits-worker": _fits_worker}
    workers[sys.argv[1]](*sys.argv[2:])
