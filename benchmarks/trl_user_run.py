"""A TRL user's GRPO set-up moved to ``coscale run`` unchanged: a conversational JSONL (system and
few-shot turns, TRL's prompt-completion column as the SFT solution), TRL's own reward functions
with weights, and a ``GRPOConfig`` translated by ``coscale.integrations``.

    python benchmarks/trl_user_run.py <folder>   # writes train/val JSONL and overlay.yaml there
    coscale run --config configs/run/smollm2-135m/smoke.yaml --config <folder>/overlay.yaml

Results: benchmarks/results/trl_user_run_2026-12-03.md.
"""

import json
import os
import random
import sys

import yaml
from trl import GRPOConfig

from coscale.integrations.trl import from_grpo_config
from coscale.integrations.trl_pipeline import pipeline_settings

OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "runs/trl_user")
os.makedirs(OUT, exist_ok=True)
SYSTEM = {"role": "system", "content": "Answer briefly. Put the final answer in \\boxed{}."}
SHOT = [
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "\\boxed{2}"},
]


def rows(n, seed):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = r.randint(1, 20), r.randint(1, 20)
        out.append(
            {
                "prompt": [SYSTEM, *SHOT, {"role": "user", "content": f"What is {a} + {b}?"}],
                "solution": str(a + b),
                "completion": [{"role": "assistant", "content": f"\\boxed{{{a + b}}}"}],
            }
        )
    return out


for name, n, seed in (("train", 16, 0), ("val", 8, 1)):
    with open(os.path.join(OUT, f"{name}.jsonl"), "w") as f:
        for row in rows(n, seed):
            f.write(json.dumps(row) + "\n")
args = GRPOConfig(
    output_dir="runs/trl",
    learning_rate=1e-6,
    num_generations=4,
    max_completion_length=32,
    temperature=1.0,
    per_device_train_batch_size=16,
    gradient_checkpointing=False,
    reward_weights=[1.0, 0.2],
    use_cpu=True,
    bf16=False,
    report_to="none",
)
pipe = pipeline_settings(from_grpo_config(args))
pipe["grpo"]["reward"] = ["trl.rewards.accuracy_reward", "trl.rewards.think_format_reward"]
pipe["grpo"]["verifier"] = "trl.rewards.accuracy_reward"
pipe["sampling"]["prompt"] = {**pipe["sampling"].get("prompt", {}), "chat": True}
pipe["sampling"]["prompt"].update({"template": "{question}", "system": None})
pipe.update({"iterations": 1, "run_dir": os.path.join(OUT, "run")})
data = {
    "train": os.path.join(OUT, "train.jsonl"),
    "val": os.path.join(OUT, "val.jsonl"),
    "fields": {"question": "prompt", "answer": "solution", "solutions": "completion"},
}
with open(os.path.join(OUT, "overlay.yaml"), "w") as f:
    yaml.safe_dump({"pipeline": pipe, "data": data}, f, sort_keys=False)
print(f"wrote {OUT}/train.jsonl, val.jsonl, overlay.yaml")
