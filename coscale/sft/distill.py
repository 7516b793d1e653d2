"""Distillation into the student: match a teacher's next-token distributions, not only its tokens.

Re-distillation and the final retrain fine-tune the initial model so that it keeps what an RL
model learned. With solution tokens alone (cross-entropy on one sampled or bank solution per
row) a retrain from the initial model ended well below the RL model it replaced
(``benchmarks/results/retrain_study.md``). With a teacher, every solution token also carries the
teacher's whole distribution over the vocabulary there:

    loss = (1 - w) * CE(student, solution tokens) + w * T^2 * KL(teacher_T || student_T)

token means over the solution tokens of the batch (``T`` the temperature both distributions are
softened with, ``w`` the weight). The teacher runs forward only, in no-grad mode, on the same
batch: it is not a submodule of the LightningModule (no optimiser state, not in checkpoints,
not wrapped by DDP, not sharded by FSDP2: every rank holds a whole copy).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from coscale.loop.budget import spend
from coscale.renamed import old_names
from coscale.sft.batch import solution_logits
from coscale.sft.token_loss import token_mean_ce


@dataclass(frozen=True)
class DistillationSettings:
    """Distil from a teacher as well as learning the solution tokens.

    Attributes:
        teacher: A model (folder or hub name, same tokenizer as the student) to distil from.
        weight: Weight of the KL term (the cross-entropy gets 1 - it).
        temperature: Temperature both distributions are softened with in the KL term.
    """

    teacher: str
    weight: float = 0.5
    temperature: float = 1.0

    def errors(self) -> list[str]:
        """Messages for bad settings (empty when they are fine)."""
        errors = []
        if not isinstance(self.weight, (int, float)) or not 0.0 <= self.weight <= 1.0:
            errors.append(f"weight must be in [0, 1], got {self.weight!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature <= 0:
            errors.append(f"temperature must be > 0, got {self.temperature!r}")
        return errors


class Teacher:
    """A frozen causal LM whose logits a student is distilled towards.

    Args:
        model: Folder or hub name of the teacher (same tokenizer as the student), or a built model.
        load: The student's :class:`~coscale.modules.settings.PolicyLoadSettings` (dtype, remote
            code); None: float32, no remote code.
    """

    def __init__(self, model: str | os.PathLike | Any, load: Any = None) -> None:
        if isinstance(model, (str, os.PathLike)):
            from coscale.models.policy import load_policy

            dtype = getattr(load, "dtype", "float32")
            remote = getattr(load, "trust_remote_code", False)
            model, _ = load_policy(model, dtype=dtype, trust_remote_code=remote)
        self.model = model.eval().requires_grad_(False)

    @torch.no_grad()
    def logits(self, enc: dict[str, torch.Tensor], padding_free: bool = True) -> torch.Tensor:
        """[K, V] the teacher's logits at the batch's labelled positions (see ``solution_logits``)."""
        device = enc["input_ids"].device
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        spend("teacher_tokens", int(enc["attention_mask"].sum()))
        return solution_logits(self.model, enc, padding_free)[0]


def kl_to_teacher(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Token mean of KL(teacher || student) over K positions, both softened by ``temperature``
    and scaled by its square (so the gradient's size does not depend on it). [K, V] x2 -> []."""
    if student.shape != teacher.shape:
        raise ValueError(
            f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} "
            "differ: the teacher must share the student's tokenizer and vocabulary"
        )
    log_s = F.log_softmax(student / temperature, dim=-1)  # [K, V]
    log_t = F.log_softmax(teacher / temperature, dim=-1)  # [K, V]
    kl = F.kl_div(log_s, log_t, log_target=True, reduction="sum")
    return kl * temperature**2 / max(student.size(0), 1)


def distill_loss(
    model: torch.nn.Module,
    teacher: Teacher,
    enc: dict[str, torch.Tensor],
    weight: float,
    temperature: float = 1.0,
    padding_free: bool = True,
) -> tuple[torch.Tensor, int, dict[str, float]]:
    """The mixed loss above on one :func:`~coscale.sft.batch.tokenize_pairs` batch.

    Returns:
        (loss, number of solution tokens, {"ce": ..., "kl": ...}: detached 0-d tensors to log).
    """
    logits, targets = solution_logits(model, enc, padding_free)  # [K, V], [K]
    ce, n = token_mean_ce(logits, targets, len(targets))
    kl = kl_to_teacher(logits, teacher.logits(enc, padding_free), temperature)
    loss = (1.0 - weight) * ce + weight * kl
    return loss, n, {"ce": ce.detach(), "kl": kl.detach()}  # tensors: no host sync per step


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Distillation": DistillationSettings})
