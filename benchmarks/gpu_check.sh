#!/usr/bin/env bash
# GPU check: a few GRPO steps of a small HF model (random ~25M-parameter Llama, built offline)
# with the HF rollout backend under FSDP on all visible GPUs; prints step time and tokens/s.
# Needs coscale installed (pip install -e .) and at least one CUDA GPU; ends within 5 minutes.
# Usage: bash benchmarks/gpu_check.sh [--devices 2] [--steps 6] [--strategy ddp] ...
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 300 "$PYTHON" benchmarks/gpu_check.py "$@"
