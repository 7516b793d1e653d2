"""Rollouts with HF `model.generate` (``rollout.backend: hf``), on CPU or GPU, no extra package.

The backend shares the policy module with the trainer, so there are no weights to sync.
Per-prompt N is done by repeating each prompt N_i times in one batch (chunked by
`batch_size`); prompts are left-padded with the pad token. A completion ends at an end
token: EOS or the chat template's end-of-turn token (`<|im_end|>`), which a chat model emits
to close its answer. Old log-probs come from the raw logits `generate` returns
(`output_logits=True`), divided by the temperature, over the full vocabulary. Stop strings
are applied afterwards: generation runs on to an end token or `max_new_tokens`, then each
completion is cut after the token that completes its first stop string.

The checkpoint's own `generation_config` (e.g. `repetition_penalty`, `top_k` of an Instruct
model) is ignored while sampling: only `SamplingParams` shapes the distribution, so the
log-probs match it.

Shapes: B prompts, R rollouts, P prompt tokens, T completion tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from coscale.distributed import max_over_ranks
from coscale.models.adapters import eval_mode
from coscale.rl.logprobs import token_logprobs
from coscale.rollout.base import RolloutBackend, Rollouts, SamplingParams, normalize_n_per_prompt
from coscale.rollout.lockstep import in_lockstep
from coscale.rollout.text import eos_token_ids, stop_cut
from coscale.seeds import seeded


class HFGenerateBackend(RolloutBackend):
    """Samples with `model.generate` from the very module being trained.

    Args:
        model: An HF causal LM (`*ForCausalLM`).
        tokenizer: Its tokenizer; needs a pad token. Prompts are always left-padded.
        batch_size: Most sequences per `generate` call; None puts all R in one call.
            Seeded results depend on it (same seed + same batch_size = same tokens).
    """

    name = "hf"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "tokenizer has no pad token: set tokenizer.pad_token (e.g. to its eos_token)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_token_ids = eos_token_ids(model, tokenizer)

    def update_weights(self, model: nn.Module) -> None:
        """Points the backend at `model` (a no-op when it is already the same module)."""
        self.model = model

    def generate(
        self,
        prompts: list[str],
        n_per_prompt: list[int] | int,
        sampling: SamplingParams,
    ) -> Rollouts:
        """Samples N_i completions for prompt i; see `RolloutBackend.generate`."""
        if not prompts:
            raise ValueError("prompts must hold at least one prompt, got []")
        counts = normalize_n_per_prompt(n_per_prompt, len(prompts))
        device = next(self.model.parameters()).device
        enc = self.tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
        prompt_index = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(counts))
        prompt_index = prompt_index.to(device)  # [R]
        prompt_ids = enc["input_ids"].to(device)[prompt_index]  # [R, P]
        prompt_mask = enc["attention_mask"].to(device)[prompt_index]  # [R, P]
        step = self.batch_size or len(prompt_index)
        starts = list(range(0, len(prompt_index), step))
        # a sharded policy: as many chunks on every rank (the extra ones are thrown away)
        extra = max_over_ranks(len(starts)) - len(starts) if in_lockstep(self.model) else 0
        chunks = [slice(i, i + step) for i in starts + [0] * extra]
        with _seeded(sampling.seed, device), _sampling_mode(self.model):
            pieces = [
                self._sample(prompt_ids[c], prompt_mask[c], sampling, prompt_index[c])
                for c in chunks
            ][: len(starts)]
        tokens = _pad_cat([p[0] for p in pieces], self.tokenizer.pad_token_id)  # [R, T]
        logprobs = _pad_cat([p[1] for p in pieces], 0.0)  # [R, T]
        return self._assemble(prompt_index, prompt_ids, prompt_mask, tokens, logprobs, sampling)

    def _sample(
        self, ids: Tensor, mask: Tensor, sampling: SamplingParams, prompt_index: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One `generate` call -> (completion ids [n, T_c], their log-probs [n, T_c]).

        `prompt_index` ([n], which prompt each row repeats) is unused here; backends that
        share work between the rows of one prompt override this method.
        """
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if not sampling.greedy:
            config.update(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
            )
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        tokens = out.sequences[:, ids.shape[1] :]  # [n, T_c]
        steps = [
            token_logprobs(logits, tokens[:, t], sampling.temperature)  # [n]
            for t, logits in enumerate(out.logits)
        ]
        return tokens, torch.stack(steps, dim=1)

    def _assemble(
        self,
        prompt_index: Tensor,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        tokens: Tensor,
        logprobs: Tensor,
        sampling: SamplingParams,
    ) -> Rollouts:
        """Finds where each completion ends, masks and pads after it, decodes the texts."""
        is_eos = torch.isin(tokens, torch.tensor(self.eos_token_ids, device=tokens.device))
        has_eos = is_eos.any(-1)  # [R]
        eos_end = torch.where(has_eos, is_eos.int().argmax(-1) + 1, tokens.shape[1])  # [R]
        ends, texts, reasons = [], [], []
        for row, end, eos in zip(tokens.tolist(), eos_end.tolist(), has_eos.tolist()):
            cut = stop_cut(row[:end], sampling.stop, self._decode)
            ends.append(end if cut is None else cut)
            # the end token stays in the ids (it was sampled: it has a log-prob), not in the text
            texts.append(self._decode(row[: end - 1] if eos and cut is None else row[: ends[-1]]))
            reasons.append("stop" if eos or cut is not None else "length")
        ends_t = torch.tensor(ends, device=tokens.device)  # [R]
        width = int(ends_t.max())  # drop columns no completion uses
        keep = torch.arange(width, device=tokens.device) < ends_t[:, None]  # [R, T]
        tokens = torch.where(keep, tokens[:, :width], self.tokenizer.pad_token_id)
        return Rollouts(
            prompt_index=prompt_index,
            input_ids=torch.cat([prompt_ids, tokens], dim=1),
            attention_mask=torch.cat([prompt_mask, keep.long()], dim=1),
            completion_mask=keep.float(),
            logprobs=torch.where(keep, logprobs[:, :width], 0.0),
            texts=texts,
            finish_reasons=reasons,
            prompt_length=prompt_ids.shape[1],
            logprob_source="trainer",  # the policy itself sampled (also for CachedDecodeBackend)
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _pad_cat(pieces: list[Tensor], value: float) -> Tensor:
    """Right-pads [n_i, T_i] pieces to the longest T and stacks them into [sum n_i, T]."""
    width = max(p.shape[1] for p in pieces)
    return torch.cat([F.pad(p, (0, width - p.shape[1]), value=value) for p in pieces])


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """:func:`coscale.seeds.seeded` on the model's device; unseeded, the global stream."""
    if seed is None:
        yield
        return
    with seeded(seed, device):
        yield


@contextmanager
def _sampling_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode, no grad and a blank generation config for the block, then restores both.

    The blank config keeps the checkpoint's sampling defaults (repetition penalty, top-k, ...)
    out of `generate`, which fills every unset field from `model.generation_config`.
    """
    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        with torch.no_grad(), eval_mode(model):
            yield
    finally:
        model.generation_config = saved
