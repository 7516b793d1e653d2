"""Tokenising (prompt, solution) pairs for SFT with the loss on the solution tokens only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from coscale.loop.budget import spend
from coscale.models.capabilities import keep_last_logits
from coscale.models.prompting import end_of_turn_id, generation_prompt
from coscale.sft.packing import can_pack, pack, packed_logits, packed_loss
from coscale.sft.token_loss import IGNORE, token_mean_ce


def tokenize_pairs(
    tokenizer: Any,
    prompts: list[str],
    solutions: list[str],
    max_length: int,
    add_eos: bool = True,
    chat: Sequence[bool] | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` ([B, L]).

    Prompts are encoded exactly as the rollout backends encode them (``tokenizer(prompt)``), so a
    model is trained on the token sequence it will later be sampled from. Labels are ``-100`` on
    the prompt and padding; a pair longer than ``max_length`` is cut on the right.

    With ``add_eos`` each target ends with the token that stops its generation, a label like the
    solution's: the chat template's end-of-turn token (``<|im_end|>``) after a chat prompt (one
    that ends with the template's generation prompt, as ``PromptSettings(chat=True)`` renders it),
    so the model learns to close its turn; the tokenizer's EOS after any other prompt. ``chat``
    says which prompts are chat-rendered (`PromptSettings.is_chat`) where the generation prompt
    cannot tell (template arguments such as ``enable_thinking`` change what the prompt ends with).
    """
    if len(prompts) != len(solutions) or (chat is not None and len(chat) != len(prompts)):
        raise ValueError(f"got {len(prompts)} prompts but {len(solutions)} solutions")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    spend("sft_examples", len(prompts))
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    turn_end = end_of_turn_id(tokenizer) if add_eos else None
    opening = generation_prompt(tokenizer) if turn_end is not None and chat is None else ""
    chat = chat if chat is not None else [bool(opening) and p.endswith(opening) for p in prompts]
    rows = []
    for prompt, solution, is_chat in zip(prompts, solutions, chat):
        end = [turn_end] if is_chat and turn_end is not None else eos
        p = tokenizer(prompt)["input_ids"]
        s = tokenizer(solution, add_special_tokens=False)["input_ids"] + end
        rows.append(((p + s)[:max_length], ([IGNORE] * len(p) + s)[:max_length]))
    return _pad_right(rows, tokenizer.pad_token_id)


def _pad_right(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
        mask[i, : len(row_ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def token_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cross-entropy averaged over the labelled tokens of the batch; also returns their count."""
    shift_logits = logits[:, :-1].float().flatten(0, 1)  # [B*(L-1), V]
    return token_mean_ce(shift_logits, labels[:, 1:].flatten())


def solution_loss(
    model: torch.nn.Module, enc: dict[str, torch.Tensor], padding_free: bool = True
) -> tuple[torch.Tensor, int]:
    """:func:`token_mean_loss` of ``model`` on a :func:`tokenize_pairs` batch, with the output
    head run only from the first solution token on (``logits_to_keep``) when the model takes it:
    the prompt's logits are never needed, so they are never computed. Same loss as the full pass.

    With `padding_free` and a model that :func:`~coscale.sft.packing.can_pack`, the batch runs packed
    (:mod:`coscale.sft.packing`): no FLOPs on padding, same loss up to float rounding.
    """
    if padding_free and can_pack(model, longest=enc["input_ids"].size(1)):
        return packed_loss(model, pack(enc, IGNORE))
    return token_mean_loss(*_padded_tail(model, enc))


def _padded_tail(model: torch.nn.Module, enc: dict[str, torch.Tensor]):
    """The padded forward with the output head run from the first labelled column on:
    (logits [B, keep, V], the labels under them [B, keep])."""
    labels = enc["labels"]  # [B, L]
    labelled = (labels != IGNORE).any(0).nonzero()  # [L'] columns with a label
    keep = labels.size(1) - int(labelled[0]) + 1 if len(labelled) else labels.size(1)
    kwargs = keep_last_logits(model, keep)
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **kwargs)
    return out.logits, labels[:, -out.logits.size(1) :]


def solution_logits(
    model: torch.nn.Module, enc: dict[str, torch.Tensor], padding_free: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s float logits at every position whose next token is a label, and those labels:
    ([K, V], [K]), rows in batch order, positions in order within a row. The packed and padded
    paths give the same K positions in the same order, so two models' logits on one batch line
    up whichever path each takes (what :mod:`coscale.sft.distill` needs)."""
    if padding_free and can_pack(model, longest=enc["input_ids"].size(1)):
        batch = pack(enc, IGNORE)
        return packed_logits(model, batch), batch.targets
    logits, tail = _padded_tail(model, enc)  # [B, keep, V], [B, keep]
    after = tail[:, 1:]  # [B, keep-1] the label after each position
    taken = after != IGNORE  # [B, keep-1]
    return logits[:, :-1][taken].float(), after[taken]  # [K, V], [K]
