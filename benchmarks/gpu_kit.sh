#!/usr/bin/env bash
# Builds the GPU kit: the wheels coscale's GPU checks need that the GPU machine's image lacks
# (benchmarks/gpu_image.txt lists what it has: torch 2.11, lightning 2.6.6, transformers 5.17,
# peft, ...), for its Python 3.12, into .whl/ (ignored by git, about 2.5 MB; the limit is 30 MiB,
# the device tool carries 64 MiB a call). That machine has no network: what is missing travels.
# Left out: wandb (20 MB; the checks log to CSV), trl and gguf (tests only), vllm (its CUDA wheel
# is hundreds of MB: the vllm check SKIPs there). Then prints the one device call that installs
# the kit and runs every check (benchmarks/gpu_kit_run.sh). Rehearsed on CPU by
# benchmarks/gpu_kit_rehearse.sh.
# Usage: bash benchmarks/gpu_kit.sh        (needs pip and a package registry, no GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
KIT=.whl
LIMIT_MIB=30
# The versions coscale is developed and tested with (the dev venv, 2026-12-03); each is pure
# Python, and datasets 5.2.0 asks only for ranges the image's versions meet (gpu_kit_deps.py).
WHEELS=(
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0  # jsonargparse[signatures]
  omegaconf==2.4.0                 # 2.4: 2.3 pins antlr4 4.9, which math-verify's parser cannot use
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 any; do PLATFORMS+=(--platform "$p"); done

rm -rf "$KIT" && mkdir "$KIT"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" -d "$KIT" "${WHEELS[@]}"
"$PY" benchmarks/gpu_kit_deps.py names "$KIT"
bytes=$(du -cb "$KIT"/*.whl | tail -1 | cut -f1)
if (( bytes > LIMIT_MIB * 1024 * 1024 )); then
  echo "[gpu_kit] FAIL: the kit is $((bytes / 1024)) KiB, over ${LIMIT_MIB} MiB" >&2
  exit 1
fi
git check-ignore -q "$KIT/x.whl" || echo "[gpu_kit] WARNING: $KIT/ is not ignored by git" >&2
echo "[gpu_kit] $(ls "$KIT"/*.whl | wc -l) wheels, $((bytes / 1024)) KiB in $KIT/"
cat <<'EOF'
[gpu_kit] The device call (one; about 8 minutes of the 15; needs no other preparation). The
tool sends the checkout the session was started in, with .whl/: build the kit there.
  run(command="bash benchmarks/gpu_kit_run.sh", carry=[".whl"], timeout_s=540)
It installs the kit with pip --no-index --no-deps --target /tmp/coscale_site, puts that and the
checkout on PYTHONPATH, runs benchmarks/gpu_check.sh (every check, 420 s budget, killed at 450 s)
and leaves under $OUT: summary.txt (one line per check), gpu_check.log (all output),
versions.txt (the image's packages as seen) and check_logs.tar.gz (each check's own log).
After it: give_back, then record the figures in docs/scale.md ("What has run on a GPU").
EOF
