#!/usr/bin/env bash
# The GPU machine's side of the GPU kit (benchmarks/gpu_kit.sh builds .whl/ and prints the call):
# installs the kit's wheels into $SITE (pip --no-index --no-deps --target: nothing is fetched),
# puts it and this checkout on PYTHONPATH, checks the wheels' requirements against the image,
# runs benchmarks/gpu_check.sh (every check, --budget 420, killed at 450 s), and leaves in $OUT:
#   summary.txt        the [gpu_check] PASS|FAIL|SKIP lines, the figures and the exit code
#   gpu_check.log      everything printed
#   versions.txt       python, the image's packages that coscale uses, the kit, nvidia-smi
#   check_logs.tar.gz  each check's own log (<work>/*.log) and the pipeline's state file
# Extra arguments and $GPU_CHECK_ARGS go to gpu_check.sh. Rehearsed on CPU, unchanged, by
# benchmarks/gpu_kit_rehearse.sh (GPU_CHECK_ARGS="--cpu --devices 1", python3 from a clean venv).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the folder for the results (the device tool sets it)}"
PY=${PYTHON:-python3}
SITE=${COSCALE_KIT_SITE:-/tmp/coscale_site}
WORK=${COSCALE_CHECK_WORK:-/tmp/coscale_gpu_check}
start=$SECONDS
mkdir -p "$OUT"
rm -rf "$SITE" "$WORK"
if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl > "$OUT/gpu_check.log" 2>&1; then
  { echo "[gpu_kit] FAIL: installing the kit (.whl/, carried?)"; tail -20 "$OUT/gpu_check.log"; } \
    | tee "$OUT/summary.txt"
  exit 2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHON="$PY" PYTHONUNBUFFERED=1 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled \
  TOKENIZERS_PARALLELISM=false
echo "[gpu_kit] kit installed in $((SECONDS - start)) s" | tee -a "$OUT/gpu_check.log"
{
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  "$PY" - <<'EOF'
from importlib import metadata
names = ("torch lightning pytorch-lightning transformers peft torchmetrics accelerate "
         "safetensors huggingface-hub tokenizers numpy pyarrow pandas fsspec sympy pyyaml "
         "matplotlib typing-extensions tqdm xxhash").split()
for name in names:
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} MISSING")
import torch
print(f"torch.version.cuda {torch.version.cuda}; cuda available {torch.cuda.is_available()}")
EOF
  "$PY" benchmarks/gpu_kit_deps.py versions .whl
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 \
    || echo "nvidia-smi: not here"
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt" >> "$OUT/gpu_check.log"
grep -E 'MISSING|PROBLEM' "$OUT/versions.txt" | tee -a "$OUT/gpu_check.log"

# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of words
GPU_CHECK_TIMEOUT=450 bash benchmarks/gpu_check.sh --budget 420 --work "$WORK" \
  ${GPU_CHECK_ARGS:-} "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
{
  grep -E '^\[gpu_check\] (PASS|FAIL|SKIP|all passed|FAILED|torch|speed|matmul|median)' \
    "$OUT/gpu_check.log"
  grep -E 'PROBLEM|MISSING' "$OUT/versions.txt"
  echo "[gpu_kit] exit code $rc after $((SECONDS - start)) s$( ((rc == 124)) && echo ': timed out')"
} > "$OUT/summary.txt"
(cd "$WORK" 2>/dev/null && tar czf "$OUT/check_logs.tar.gz" -- *.log pipeline/pipeline_state.json \
  2>/dev/null)
cat "$OUT/summary.txt"
exit "$rc"
