"""GPU check ``vllm-server``: `VLLMServerBackend` on a ``vllm serve`` the check starts, sample,
optimiser step, weight sync and parity after each of ``--vllm-steps`` steps, the same worker as
``vllm`` (benchmarks/gpu_check_vllm.py, which picks the transfer: vLLM's NCCL weight transfer to
a server on GPU 1 where there are 2 GPUs; through files on one GPU, where NCCL cannot link two
processes on one device).

SKIP where vllm is not installed, or where the check runs for a GPU (the default) and this
machine has no CUDA device: then no server is started. ``--cpu`` asks for the CPU build's dry
run instead (files, on this machine's cores).
"""

from __future__ import annotations

import importlib.util

import gpu_check_paths as paths
import gpu_check_vllm

NO_CUDA = ("no CUDA device: the vllm-server check needs vLLM's GPU build and a GPU (2 for its "
           "NCCL weight transfer); --cpu runs the CPU build's dry run through files")  # fmt: skip


def skip_reason(accelerator: str) -> str | None:
    """Why the check cannot run here (no vllm; a GPU run without CUDA), or None."""
    if importlib.util.find_spec("vllm") is None:
        return gpu_check_vllm.INSTALL
    if accelerator != "cpu":
        import torch

        if torch.cuda.device_count() == 0:
            return NO_CUDA
    return None


def vllm_server(
    setup: paths.Setup, model: str = "auto", dtype: str = "float32", steps: int = 3
) -> str:
    """The check's line (see the module doc); raises `paths.Skipped` before starting anything
    when it cannot run here."""
    if why := skip_reason(setup.accelerator):
        raise paths.Skipped(why)
    return gpu_check_vllm.vllm(setup, model, dtype, steps, "vllm-server")
