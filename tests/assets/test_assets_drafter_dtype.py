"""The embedded drafter's config.json names the dtype its weights are stored in."""

from __future__ import annotations

import json

from safetensors import safe_open

from dspark_sglang.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from dspark_sglang.model.config import DSparkConfig, hf_torch_dtype
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER, GREEDY_DRAFT_VOCAB_BUFFER
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

_CODES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def test_default_drafter_torch_dtype_matches_its_weights() -> None:
    raw = json.loads((DEFAULT_DRAFTER_DIR / CONFIG_FILE).read_text())
    DSparkConfig.from_hf_dict(raw)
    with safe_open(str(DEFAULT_DRAFTER_DIR / WEIGHTS_FILE), "pt") as f:
        stored = {
            _CODES[f.get_slice(k).get_dtype()]
            for k in f.keys()  # noqa: SIM118
            if k not in {DRAFT_VOCAB_BUFFER, GREEDY_DRAFT_VOCAB_BUFFER}  # integer token maps
        }
    assert hf_torch_dtype(raw) is not None and stored == {hf_torch_dtype(raw)}
