"""SFTModule: supervised fine-tuning of a causal LM on (prompt, solution) pairs.

The loss is the token mean over the solution tokens only (the prompt is context, not target).
Used for the warm-up, for data scaling (many solutions per hard problem), re-distillation and
the final retrain; batches are lists of ``{"question", "solution"}`` dicts from
:class:`~coscale.datamodules.ProblemDataModule` or any loader that yields the same.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from coscale.modules.generation import PolicyMixin
from coscale.modules.optim import adamw_with_warmup
from coscale.prompting import PromptFormat, as_prompt_format
from coscale.rollout.base import SamplingParams
from coscale.sft_batch import token_mean_loss, tokenize_pairs


class SFTModule(PolicyMixin, L.LightningModule):
    """Causal-LM fine-tuning with the loss on solution tokens.

    Args:
        model: HF hub name or local folder of a causal LM (or a built model, in Python).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        prompt: How a question becomes the prompt.
        lr: AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warm-up steps of the learning rate.
        max_length: Longest (prompt + solution) in tokens; longer pairs are cut.
        dtype: Weights' dtype name (``float32``, ``bfloat16``, ``float16``).
        gradient_checkpointing: Recompute activations in the backward pass to save memory.
        trust_remote_code: Allow custom model code shipped with the model (off unless asked).
        reward: Verifier used by validation (``class_path`` in YAML); default MathReward.
        val_samples: Samples per held-out problem in validation (pass@k up to this k).
        val_temperature: Sampling temperature in validation.
        val_max_new_tokens: Token limit of a validation sample.
    """

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | None = None,
        prompt: PromptFormat = PromptFormat(),
        lr: float = 1e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_length: int = 1024,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        reward: Any = None,
        val_samples: int = 8,
        val_temperature: float = 1.0,
        val_max_new_tokens: int = 256,
    ) -> None:
        super().__init__()
        if lr <= 0 or max_length < 2 or val_samples < 1:
            raise ValueError(
                f"SFTModule: lr must be > 0 (got {lr}), max_length >= 2 (got {max_length}), "
                f"val_samples >= 1 (got {val_samples})"
            )
        self.save_hyperparameters(
            ignore=["model", "reward"] if not isinstance(model, (str, os.PathLike)) else ["reward"]
        )
        prompt = as_prompt_format(prompt)
        self.prompt, self.lr, self.betas = prompt, lr, betas
        self.weight_decay, self.warmup_steps, self.max_length = (
            weight_decay,
            warmup_steps,
            max_length,
        )
        self.reward = reward if reward is not None else _default_reward()
        self.val_samples = val_samples
        self.val_sampling = SamplingParams(
            max_new_tokens=val_max_new_tokens, temperature=val_temperature
        )
        self._init_policy(model, tokenizer, dtype, trust_remote_code, gradient_checkpointing)

    @override
    def forward(self, **batch: torch.Tensor) -> Any:
        return self.policy(**batch)

    @override
    def training_step(self, batch: list[dict], batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        enc = self.encode(batch)
        out = self.policy(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        loss, n_tokens = token_mean_loss(out.logits, enc["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        self.log("train/solution_tokens", float(n_tokens), batch_size=len(batch))
        self.log(
            "perf/tokens_per_s",
            enc["attention_mask"].sum().item() / (time.perf_counter() - start),
            batch_size=len(batch),
        )
        return loss

    def encode(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        """Tokenises a batch of ``{"question", "solution"}`` dicts onto the module's device."""
        prompts = self.prompts_for([row["question"] for row in batch])
        enc = tokenize_pairs(
            self.tokenizer, prompts, [row["solution"] for row in batch], self.max_length
        )
        return {k: v.to(self.device) for k, v in enc.items()}

    @override
    def configure_optimizers(self) -> Any:
        return adamw_with_warmup(
            self.policy, self.lr, self.betas, self.weight_decay, self.warmup_steps
        )


def _default_reward() -> Any:
    from coscale.rewards import MathReward

    return MathReward()
