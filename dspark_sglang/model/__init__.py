"""The DSpark drafter: config, context-injected backbone, heads, sampler, checkpoints."""

from dspark_sglang.model.block_sampler import (
    DraftProposal,
    MarkovLogits,
    markov_logits,
    sample_block,
)
from dspark_sglang.model.checkpoint import CheckpointError, load_drafter, save_drafter
from dspark_sglang.model.config import DSparkConfig, TargetSpec, default_target_layer_ids
from dspark_sglang.model.drafter import AnchorHidden, DraftBlock, DSparkDrafter

__all__ = [
    "AnchorHidden",
    "CheckpointError",
    "DSparkConfig",
    "DSparkDrafter",
    "DraftBlock",
    "DraftProposal",
    "MarkovLogits",
    "TargetSpec",
    "default_target_layer_ids",
    "load_drafter",
    "markov_logits",
    "sample_block",
    "save_drafter",
]
