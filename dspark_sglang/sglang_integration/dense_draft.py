"""A small dense draft in SGLang's own ``DSparkDraftModel`` format.

Why: SGLang's built-in DSPARK worker is the baseline our plugin builds on, and
exercising it on CPU needs a draft checkpoint SGLang's own loader accepts.
Weights are not needed for correctness tests: SGLang's ``dummy`` load format
random-initialises them (a random draft is always rejected, so greedy output
must equal plain decoding). This module writes only the ``config.json`` (and
copies the target's tokenizer files so the folder is self-describing).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class DenseDSparkDraftSpec:
    """Shape of the draft; validated against the target when written."""

    num_layers: int = 1
    block_size: int = 4
    target_layer_ids: tuple[int, ...] = (1, 14, 27)
    markov_rank: int = 16
    markov_head_type: str = "vanilla"
    mask_token_id: int = 0

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + drafts), got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if self.markov_rank < 1:
            raise ValueError(
                f"markov_rank must be >= 1 (SGLang's DSpark requires it), got {self.markov_rank}"
            )

    def hf_config(self, target: dict[str, Any]) -> dict[str, Any]:
        """``config.json`` for ``DSparkDraftModel`` next to the given target config."""
        n_target = int(target["num_hidden_layers"])
        bad = [i for i in self.target_layer_ids if not 0 <= i < n_target - 1]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} out of range: use 0..{n_target - 2} "
                "(the target's last layer is never captured as a hidden state)"
            )
        copied = (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "vocab_size",
            "hidden_act",
            "rope_theta",
            "rope_parameters",
            "rope_scaling",
            "bos_token_id",
            "eos_token_id",
        )
        cfg = {k: target[k] for k in copied if k in target}
        cfg.update(
            architectures=["DSparkDraftModel"],
            model_type=target.get("model_type", "llama"),
            num_hidden_layers=self.num_layers,
            tie_word_embeddings=False,
            torch_dtype="float32",
            block_size=self.block_size,
            # SGLang's head builders read these from the top level, the config
            # parser from dspark_config: write both, equal.
            markov_rank=self.markov_rank,
            markov_head_type=self.markov_head_type,
            dflash_config={
                "block_size": self.block_size,
                "target_layer_ids": list(self.target_layer_ids),
                "num_target_layers": n_target,
                "mask_token_id": self.mask_token_id,
            },
            dspark_config={
                "markov_rank": self.markov_rank,
                "markov_head_type": self.markov_head_type,
                "mask_token_id": self.mask_token_id,
            },
        )
        return cfg


def write_dense_dspark_draft(
    target_path: Path | str, dst: Path | str, spec: DenseDSparkDraftSpec | None = None
) -> Path:
    """Write a draft folder for ``target_path`` into ``dst``; returns ``dst``."""
    spec = spec or DenseDSparkDraftSpec()
    src, out = Path(target_path), Path(dst)
    target = json.loads((src / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(spec.hf_config(target), indent=2))
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    return out
