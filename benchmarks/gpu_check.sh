#!/usr/bin/env bash
# GPU check (benchmarks/gpu_check.py all), on every visible GPU, within --budget seconds (300;
# the process is killed at $GPU_CHECK_TIMEOUT, 360), in this order:
#   matmul    the GRPO update's matrix products (bf16) against the chip's ceiling
#   speed     GRPO steps of a random ~25M-parameter Llama, cached decode then HF generate;
#             step time, tokens/s (FSDP2 on 2+ GPUs)
#   fits      SFT and GRPO+ReDistillation fits under FSDP2; exports equal the gathered weights
#   pipeline  the whole pipeline (tests/configs/two_ranks.yaml) under FSDP2; wall and stage times
#   lockstep  cached decode on a fully_shard'ed policy, rank 0 done at its first token (2+ GPUs;
#             SKIP on one)
#   vllm      the vLLM backend on the real engine (SKIP where vllm is not installed)
# One "[gpu_check] PASS|FAIL|SKIP <check> ..." line each; exits 1 when any failed. Each check's
# output is in <files>/<check>.log (the folder is printed first). Built offline; needs coscale
# importable (pip install -e ., or this checkout on PYTHONPATH) and at least one CUDA GPU. On the
# lent GPU machine, whose image lacks some of coscale's dependencies, run it through
# benchmarks/gpu_kit.sh's device call (benchmarks/gpu_kit_run.sh).
# Usage: bash benchmarks/gpu_check.sh [--devices 2] [--precision 32-true] [--steps 6] ...
#        bash benchmarks/gpu_check.sh --cpu    # dry run: 2 CPU processes over gloo, 32-true
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout "${GPU_CHECK_TIMEOUT:-360}" "$PYTHON" benchmarks/gpu_check.py all "$@"
