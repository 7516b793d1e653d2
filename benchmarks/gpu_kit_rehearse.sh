#!/usr/bin/env bash
# CPU rehearsal of the GPU kit's device call (benchmarks/gpu_kit.sh prints it). Builds a clean
# venv that holds only packages of the GPU image (benchmarks/gpu_image.txt), at its versions where
# known (torch 2.11.0, lightning 2.6.6, transformers 5.17.0, ...; peft and the rest: what pip
# resolves with them), so that whatever coscale needs beyond the image must come from the kit;
# then runs the device call's command unchanged, `bash benchmarks/gpu_kit_run.sh`, with python3
# that venv's, OUT a local folder and GPU_CHECK_ARGS="--cpu --devices 1": every check on one CPU
# process, the paths one GPU takes (lockstep SKIPs). REHEARSAL_ARGS="--cpu" runs 2 processes.
# The venv takes ~5 GB (torch 2.11 from PyPI is a CUDA build, with its CUDA libraries) and
# ~3 minutes the first time; it is kept (VENV/.image-installed) and reused.
# Usage: bash benchmarks/gpu_kit_rehearse.sh [VENV] [OUT]
#        (defaults ../gpu_kit_rehearsal_venv, /tmp/gpu_kit_rehearsal_out; REHEARSAL_PYTHON=...)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-../gpu_kit_rehearsal_venv}
OUT_DIR=${2:-/tmp/gpu_kit_rehearsal_out}
# the image's pins (gpu_image.txt) and the unpinned packages of it that coscale's imports need
PINNED=$(grep -E '^[a-z0-9-]+==' benchmarks/gpu_image.txt)
UNPINNED="peft pyarrow pandas sympy pyyaml matplotlib pytest pytest-timeout xxhash fsspec requests
  tqdm psutil"

python312() {  # the image's Python is 3.12: PATH, then pyenv's versions, then $REHEARSAL_PYTHON
  if [[ -n ${REHEARSAL_PYTHON:-} ]]; then echo "$REHEARSAL_PYTHON"; return; fi
  local p
  p=$(command -v python3.12 || true)  # a pyenv shim is there but fails unless 3.12 is selected
  [[ -n $p ]] && "$p" -V >/dev/null 2>&1 && { echo "$p"; return; }
  for p in "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.12*/bin/python3.12; do
    [[ -x $p ]] && { echo "$p"; return; }
  done
  echo "[rehearsal] WARNING: no Python 3.12 found; using python3 ($(python3 -V))" >&2
  echo python3
}

if [[ ! -f $VENV/.image-installed ]]; then
  base=$(python312)
  echo "[rehearsal] building $VENV with $base ($("$base" -V))"
  rm -rf "$VENV"
  "$base" -m venv "$VENV"
  # shellcheck disable=SC2086  # word lists
  "$VENV/bin/python" -m pip install -q --no-cache-dir $PINNED $UNPINNED
  # what pip pulled in beyond the image's list goes (typer's pydantic, dateutil's tzdata, ...)
  extra=$("$VENV/bin/python" - <<'EOF'
import re
from importlib import metadata
image = {re.sub(r"[-_.]+", "-", ln.split("#")[0].split("==")[0].strip()).lower()
         for ln in open("benchmarks/gpu_image.txt")} - {""}
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions()}
print(" ".join(sorted(have - image)))
EOF
)
  if [[ -n $extra ]]; then
    echo "[rehearsal] not in the image, removed: $extra"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip uninstall -q -y $extra
  fi
  touch "$VENV/.image-installed"
fi
echo "[rehearsal] $("$VENV/bin/python" -V) in $VENV; $("$VENV/bin/python" -m pip list 2>/dev/null \
  | grep -i -E '^(torch|lightning|pytorch-lightning|transformers|peft|numpy|jsonargparse) ' \
  | tr -s ' ' | paste -sd, -)"
rm -rf "$OUT_DIR"
start=$SECONDS
set +e
env -u PYTHON -u PYTHONPATH -u VIRTUAL_ENV PATH="$VENV/bin:$PATH" OUT="$OUT_DIR" \
  GPU_CHECK_ARGS="${REHEARSAL_ARGS:---cpu --devices 1}" bash benchmarks/gpu_kit_run.sh
rc=$?
set -e
echo "[rehearsal] the device command exited $rc after $((SECONDS - start)) s; files in $OUT_DIR:"
ls -la "$OUT_DIR"
exit $rc
