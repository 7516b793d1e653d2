"""Fast rollouts: a decode loop over the HF model's own forward pass and its KV cache.

`CachedDecodeBackend` returns the same `Rollouts` as `HFGenerateBackend` (same log-prob
definition, masks, stop strings and EOS handling) but does less work per completion. Each
speed path is a switch, on by default, and none changes what is computed:

- `share_prefix`: every distinct prompt runs through the model once; its KV cache is then
  copied to its N rollouts (prefill costs B prompts instead of R rows).
- `drop_finished`: rows that emitted an end token (EOS or the chat template's end of turn) leave
  the decode batch. The batch is compacted once at least 1/8 of its rows are done, so a copy of
  the cache is not paid on every step.
- `static_cache`: keys and values go into buffers allocated once per call and written in
  place (`kv_cache.PreallocatedLayer`), instead of HF `DynamicCache`'s `torch.cat`, which
  copies the whole cache on every token.
- `compile`: off by default. Decode steps run as one `torch.compile`d forward over HF's
  `StaticCache` (`coscale.rollout.cached.compiled`); rows stay in the batch until the chunk ends
  (a changing row count would recompile), so `drop_finished` is ignored. The first calls
  compile (seconds to a minute); it pays on long runs of small, overhead-bound models.

Precision is the caller's: inside a Lightning fit the rollouts run under the trainer's
``precision`` (its autocast with ``bf16-mixed``), as every other forward pass does.

Sampling is batch-invariant: at every step one uniform number is drawn for each row of the
chunk, finished or not, and the token is picked by inverse CDF. So the same seed yields the
same completions with any combination of switches (up to float rounding of the logits), and
the tests can hold every speed path to the plain one. The draws differ from `generate`'s,
so a seed gives other samples than `HFGenerateBackend` (same distribution); greedy decoding
gives the same tokens.

Shapes: n rows of one chunk, U distinct prompts in it, P prompt tokens, T new tokens, V vocab.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from coscale.models.capabilities import cache_kwargs, keep_last_logits
from coscale.rl.logprobs import position_ids_from_mask, token_logprobs
from coscale.rollout.base import SamplingParams
from coscale.rollout.cached.compiled import CompiledDecodeStep
from coscale.rollout.cached.kv_cache import new_cache
from coscale.rollout.hf import HFGenerateBackend
from coscale.rollout.lockstep import all_finished, in_lockstep

DROP_FRACTION = 8
"""Compact the decode batch once at least 1/DROP_FRACTION of its rows have finished."""


class CachedDecodeBackend(HFGenerateBackend):
    """Samples from the module being trained with a KV-cached decode loop of its own.

    Args:
        model: An HF causal LM (`*ForCausalLM`) whose forward takes a cache object.
        tokenizer: Its tokenizer; needs a pad token. Prompts are always left-padded.
        batch_size: Most rows decoded together; None decodes all R at once. Seeded results
            depend on it (same seed + same batch_size = same tokens).
        share_prefix: Prefill each distinct prompt once and copy its cache to its rows.
        drop_finished: Remove finished rows from the decode batch.
        static_cache: Write keys/values into preallocated buffers (models whose layers all
            use full attention; others fall back to `DynamicCache`).
        compile: Run decode steps as a `torch.compile`d step over a static cache (full
            attention models only; finished rows stay in the batch).
    """

    name = "cached"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int | None = None,
        share_prefix: bool = True,
        drop_finished: bool = True,
        static_cache: bool = True,
        compile: bool = False,
    ) -> None:
        super().__init__(model, tokenizer, batch_size)
        self.share_prefix, self.drop_finished = share_prefix, drop_finished
        self.static_cache, self.compile = static_cache, compile
        self._compiled = CompiledDecodeStep(model) if compile else None
        self._kwargs: dict = {}  # forward keywords (with the cache) of the chunk being decoded

    def update_weights(self, model: nn.Module) -> None:
        """Points the backend (and its compiled step) at `model`."""
        if self.compile and (self._compiled is None or model is not self.model):
            self._compiled = CompiledDecodeStep(model)
        super().update_weights(model)

    def release(self) -> None:
        """Drops the model and its compiled step (compiled again for the next model)."""
        super().release()
        self._compiled = None

    def _sample(
        self, ids: Tensor, mask: Tensor, sampling: SamplingParams, prompt_index: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Decodes one chunk -> (completion ids [n, T_c], their log-probs [n, T_c])."""
        try:
            return self._decode_chunk(ids, mask, sampling, prompt_index)
        finally:
            self._kwargs = {}  # drop the cache buffers as soon as the chunk is done

    def _decode_chunk(
        self, ids: Tensor, mask: Tensor, sampling: SamplingParams, prompt_index: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Prefill, then one token per step for the rows still decoding, until all are done."""
        (n, p), t_max = ids.shape, sampling.max_new_tokens
        # compiled: the prefill cache only holds the prompt; the static cache gets all P+T columns
        capacity = p if self._compiled is not None else p + t_max
        cache = new_cache(self.model, capacity, self.static_cache)
        self._kwargs = {**cache_kwargs(self.model, cache), **keep_last_logits(self.model, 1)}
        logits = self._prefill(ids, mask, prompt_index, cache)  # [n, V]
        if self._compiled is not None:
            cache = self._compiled.static_cache(cache, p + t_max)
            self._kwargs = {}  # the prefill cache is copied; free it now
        attn = torch.cat([mask, mask.new_ones(n, t_max)], dim=1)  # [n, P+T]
        next_pos = mask.sum(-1)  # [n] position of the first new token
        tokens = ids.new_full((n, t_max), self.tokenizer.pad_token_id)  # [n, T]
        logprobs = torch.zeros(n, t_max, device=ids.device)  # [n, T]
        eos = torch.tensor(self.eos_token_ids, device=ids.device)
        rows = torch.arange(n, device=ids.device)  # [m] rows still in the decode batch
        done = torch.zeros(n, dtype=torch.bool, device=ids.device)  # [n]
        together = in_lockstep(self.model)  # sharded on several ranks: stop when all are done
        for t in range(t_max):
            # one draw per chunk row every step, used or not: the stream never depends on
            # which rows are still decoding
            u = None if sampling.greedy else 1.0 - torch.rand(n, device=ids.device)  # (0, 1]
            picked = pick_tokens(logits, sampling, None if u is None else u[rows])  # [m]
            tokens[rows, t] = picked
            logprobs[rows, t] = token_logprobs(logits, picked, sampling.temperature)
            done[rows] |= torch.isin(picked, eos)
            if t + 1 == t_max or all_finished(bool(done.all()), together):
                break
            rows, picked = self._maybe_drop(rows, picked, done, cache)
            pos = (next_pos[rows] + t).unsqueeze(1)  # [m, 1]
            logits = self._step(picked.unsqueeze(1), attn, rows, p + t, pos, cache)
        return tokens[:, : t + 1], logprobs[:, : t + 1]

    def _prefill(self, ids: Tensor, mask: Tensor, prompt_index: Tensor, cache) -> Tensor:
        """Runs the prompts into `cache` -> last-position logits [n, V] of every row."""
        if not self.share_prefix:
            return self._forward(ids, mask, position_ids_from_mask(mask))
        _, counts = torch.unique_consecutive(prompt_index, return_counts=True)  # [U]
        first = counts.cumsum(0) - counts  # [U] first row of each prompt
        logits = self._forward(ids[first], mask[first], position_ids_from_mask(mask[first]))
        rows_of = torch.repeat_interleave(torch.arange(len(counts), device=ids.device), counts)
        cache.batch_select_indices(rows_of)  # [U, ...] -> [n, ...]: copy each prompt's cache
        return logits[rows_of]

    def _step(self, ids: Tensor, attn: Tensor, rows: Tensor, column: int, pos: Tensor, cache):
        """Feeds `ids` [m, 1] at cache column `column` -> next-token logits [m, V]."""
        if self._compiled is None:
            return self._forward(ids, attn[rows, : column + 1], pos)
        at = torch.tensor([column], device=ids.device)  # a tensor: no recompile per step
        return self._compiled(ids, attn, pos, at, cache)

    def _maybe_drop(self, rows: Tensor, picked: Tensor, done: Tensor, cache) -> tuple[Tensor, ...]:
        """Removes finished rows from the batch (and the cache) once enough of them are done."""
        if not self.drop_finished or self._compiled is not None:
            return rows, picked
        finished = done[rows]  # [m]
        count = int(finished.sum())
        # all done: keep the rows, as another rank of a sharded policy may still be decoding
        if count == 0 or count == len(rows) or count * DROP_FRACTION < len(rows):
            return rows, picked
        keep = (~finished).nonzero().squeeze(1)  # [m']
        cache.batch_select_indices(keep)
        return rows[keep], picked[keep]

    def _forward(self, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """One forward pass that appends to the chunk's cache -> logits of the last position [m, V]."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **self._kwargs)
        return out.logits[:, -1]


def pick_tokens(logits: Tensor, sampling: SamplingParams, uniform: Tensor | None) -> Tensor:
    """Next tokens: argmax when greedy, else the inverse CDF of the filtered distribution.

    Args:
        logits: [m, V] raw logits.
        sampling: Temperature, top-k and top-p (applied in that order, as `generate` does).
        uniform: [m] numbers in (0, 1], one per row; None for greedy decoding.

    Returns:
        [m] long token ids; a token removed by top-k / top-p is never picked.
    """
    if uniform is None:
        return logits.argmax(-1)
    scaled = filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p)
    cdf = torch.softmax(scaled, dim=-1).cumsum(-1)  # [m, V], non-decreasing per row
    target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)  # [m, 1] in (0, total]
    # first index whose cdf reaches the target; that token has mass > 0 since target > 0
    picked = torch.searchsorted(cdf, target).squeeze(1)  # [m]
    return picked.clamp(max=logits.shape[-1] - 1)


def filter_logits(scaled: Tensor, top_k: int, top_p: float) -> Tensor:
    """Sets the logits outside the top-k, then outside the top-p mass, to -inf.

    Top-k keeps every token tied with the k-th largest logit. Top-p keeps, in descending
    order, each token whose preceding mass is still below `top_p` (at least one token).
    """
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # [m, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)  # [m, V]
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(-1) - probs  # [m, V] mass of the better tokens
        drop = before >= top_p
        drop[:, 0] = False
        scaled = scaled.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return scaled
