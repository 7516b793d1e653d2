#!/usr/bin/env bash
# GPU check (benchmarks/gpu_check.py all), on every visible GPU, within 5 minutes (--budget 300):
#   lockstep  cached decode on a fully_shard'ed policy, rank 0 done at its first token (2+ GPUs)
#   fits      SFT and GRPO+ReDistillation fits under FSDP2; exports equal the gathered weights
#   pipeline  the whole pipeline (tests/configs/two_ranks.yaml) under FSDP2; wall and stage times
#   speed     a few GRPO steps of a random ~25M-parameter Llama under FSDP2; step time, tokens/s
# One "[gpu_check] PASS|FAIL|SKIP <check> ..." line each; exits 1 when any failed. Each check's
# output is in <files>/<check>.log (the folder is printed first). Built offline; needs coscale
# installed (pip install -e .) or run from this checkout, and at least one CUDA GPU.
# Usage: bash benchmarks/gpu_check.sh [--devices 2] [--precision 32-true] [--steps 6] ...
#        bash benchmarks/gpu_check.sh --cpu    # dry run: 2 CPU processes over gloo, 32-true
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 360 "$PYTHON" benchmarks/gpu_check.py all "$@"
