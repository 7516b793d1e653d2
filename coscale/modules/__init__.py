"""LightningModules of coscale: SFT and GRPO on any Hugging Face causal LM."""

from coscale.modules.grpo import GRPOModule
from coscale.modules.sft import SFTModule

__all__ = ["GRPOModule", "SFTModule"]
