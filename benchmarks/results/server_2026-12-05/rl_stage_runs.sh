#!/bin/bash
# SmolLM2 smoke (1 iteration) per backend, alone, one after another
cd /work/main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
base=(.venv/bin/coscale run --config configs/smollm2-135m/smoke.yaml --pipeline.iterations 1)
for name in vllm vllm-server vllm-server-async; do
  dir=/work/runs/rlstage/$name; rm -rf $dir
  case $name in
    vllm) pre=(); rollout='{"backend": "vllm", "options": {"engine": {"kwargs": {"enforce_eager": true}}}}'; extra=();;
    vllm-server) pre=(taskset -c 0); rollout='{"backend": "vllm-server", "options": {"engine": {"kwargs": {"enforce_eager": true}}, "server": {"cores": [1], "log": "'$dir'-server.log"}}}'; extra=();;
    vllm-server-async) pre=(taskset -c 0); rollout='{"backend": "vllm-server", "options": {"engine": {"kwargs": {"enforce_eager": true}}, "server": {"cores": [1], "log": "'$dir'-server.log"}}}'; extra=(--pipeline.grpo.update.max_staleness 1);;
  esac
  echo "== $name $(date -u +%H:%M:%S)"
  /usr/bin/time -f "$name wall %e s" "${pre[@]}" "${base[@]}" --pipeline.rollout "$rollout" "${extra[@]}" --pipeline.run_dir $dir > $dir.log 2>&1
  tail -1 $dir.log
done
echo "== done $(date -u +%H:%M:%S)"
