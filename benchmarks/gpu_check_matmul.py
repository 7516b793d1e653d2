"""GPU check ``matmul``: the matrix products of a GRPO update, timed one by one, against the
chip's own ceiling (one square product, measured in the same worker).

For each model below, every product of one micro-batch's update (forward, input gradient and
weight gradient of q/k/v/o, gate/up/down per layer, and the LM head) is timed on random data in
the compute dtype (bf16 on a GPU), counted by how often the update runs it, and summed: the
update's matmuls would run at ``total FLOP / total time``, a fraction of the ceiling. What this
leaves out (attention's own products, norms, the optimiser, launch gaps) only lowers the real
figure. Models: ``speed``, the speed check's ~25M random Llama (hidden 512, 8 layers, vocab
101) on one micro-batch of 16 problems x 8 rollouts x ~80 tokens; ``qwen2.5-0.5b``, the shapes of
configs/run/qwen2.5-0.5b/ (hidden 896, 24 layers, 2 key/value heads of 64, MLP 4864, vocab 151,936)
on 8 rows x 1,024 tokens. ``--cpu``: every size divided by 8, float32, a dry run of the code.

The worker prints a table (``<work>/matmul.log``) and writes ``matmul.json``; the check returns
the ceiling and each model's fraction of it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import gpu_check_paths as paths

MODELS = {  # hidden, MLP, vocab, key/value width, layers, tokens in one micro-batch
    "speed": (512, 1536, 101, 512, 8, 16 * 8 * 80),
    "qwen2.5-0.5b": (896, 4864, 151936, 128, 24, 8 * 1024),
}
CEILING = 8192
"""Side of the square product that gives the ceiling (about 790 TFLOP/s bf16 on an H200 here)."""


def shapes(hidden: int, mlp: int, vocab: int, kv: int, layers: int, tokens: int):
    """(name, M, K, N, count): each product ``[M, K] @ [K, N]`` of one update, ``count`` times."""
    linear = {"q,o": (hidden, hidden, 2), "k,v": (hidden, kv, 2), "gate,up": (hidden, mlp, 2),
              "down": (mlp, hidden, 1)}  # fmt: skip
    rows = []
    for name, (k, n, per_layer) in {**linear, "lm_head": (hidden, vocab, 0)}.items():
        count = per_layer * layers or 1
        rows += [(f"{name} fwd", tokens, k, n, count),  # y = x W
                 (f"{name} dgrad", tokens, n, k, count),  # dx = dy W^T
                 (f"{name} wgrad", k, tokens, n, count)]  # dW = x^T dy  # fmt: skip
    return rows


def _time(m: int, k: int, n: int, dtype, device) -> float:
    """Seconds of one ``[m, k] @ [k, n]``: the mean of enough repeats to fill ~50 ms."""
    import torch

    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    repeats, seconds = 1, 0.0
    while seconds < 0.05 and repeats <= 4096:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        repeats *= 4
    return seconds / (repeats // 4)


def _worker(out: str, accelerator: str) -> None:
    import torch

    cpu = accelerator == "cpu"
    device = torch.device("cpu" if cpu else "cuda", 0)
    dtype = torch.float32 if cpu else torch.bfloat16
    div = 8 if cpu else 1
    side = CEILING // div
    # the better of two (the first runs while a GPU's clocks rise); measured again at the end
    ceiling = 2 * side**3 / min(_time(side, side, side, dtype, device) for _ in range(2)) / 1e12
    name = "cpu" if cpu else torch.cuda.get_device_name(device)
    print(
        f"[gpu_check] matmul: {name}, {dtype}, ceiling {side}^3 {ceiling:.1f} TFLOP/s", flush=True
    )
    result = {"device": name, "dtype": str(dtype), "ceiling_tflops": ceiling, "models": {}}
    for model, sizes in MODELS.items():
        sizes = (*[max(1, s // div) for s in sizes[:4]], sizes[4], sizes[5] // div)
        flop = seconds = 0.0
        print(f"{model}: hidden {sizes[0]}, MLP {sizes[1]}, vocab {sizes[2]}, kv {sizes[3]}, "
              f"{sizes[4]} layers, {sizes[5]} tokens", flush=True)  # fmt: skip
        for label, m, k, n, count in shapes(*sizes):
            t = _time(m, k, n, dtype, device)
            tflops = 2 * m * k * n / t / 1e12
            flop, seconds = flop + 2 * m * k * n * count, seconds + t * count
            print(f"  {label:<14} [{m:>6} x {k:>6}] @ [{k:>6} x {n:>6}] x{count:<3} "
                  f"{t * 1e6:9.1f} us {tflops:8.2f} TFLOP/s {tflops / ceiling:6.1%}", flush=True)  # fmt: skip
        rate = flop / seconds / 1e12
        result["models"][model] = {"tflops": rate, "of_ceiling": rate / ceiling,
                                   "ms_per_update": seconds * 1e3}  # fmt: skip
        print(f"[gpu_check] matmul {model}: {rate:.1f} TFLOP/s = {rate / ceiling:.1%} of the "
              f"ceiling, {seconds * 1e3:.2f} ms of products per micro-batch", flush=True)  # fmt: skip
    again = 2 * side**3 / _time(side, side, side, dtype, device) / 1e12
    print(f"[gpu_check] matmul: ceiling measured again at the end: {again:.1f} TFLOP/s", flush=True)
    result["ceiling_again_tflops"] = again
    Path(out, "matmul.json").write_text(json.dumps(result, indent=1))


def matmul(setup: paths.Setup) -> str:
    """Runs the worker on the first device; see the module doc."""
    out = paths._fresh(setup.work / "matmul")
    cmd = [sys.executable, __file__, "matmul-worker", str(out), setup.accelerator]
    wall = paths.run_worker("matmul", cmd, setup)
    r = json.loads((out / "matmul.json").read_text())
    models = "; ".join(f"{m} update {v['tflops']:.1f} TFLOP/s ({v['of_ceiling']:.0%})"
                       for m, v in r["models"].items())  # fmt: skip
    dry = " (--cpu: a dry run of the code, not a measurement)" if setup.accelerator == "cpu" else ""
    return (f"{r['device']} {r['dtype']}: ceiling {r['ceiling_tflops']:.1f} TFLOP/s (at the end "
            f"{r['ceiling_again_tflops']:.1f}); {models}; worker {wall:.1f} s (table in "
            f"{setup.work / 'matmul.log'}){dry}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "matmul-worker":
        _worker(*sys.argv[2:])
