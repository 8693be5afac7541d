"""The embedded default drafter: small enough to commit, loadable,
and calibrated for its own block size."""

from __future__ import annotations

import json

from safetensors import safe_open

from dspark_sglang.calibration.sts import load_sts
from dspark_sglang.model.checkpoint import CONFIG_FILE
from dspark_sglang.model.config import DSparkConfig
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

MAX_BYTES = 30_000_000  # the 30 MB commit budget, read strictly (decimal megabytes)


def test_default_drafter_fits_the_commit_budget_in_bfloat16() -> None:
    weights = DEFAULT_DRAFTER_DIR / "model.safetensors"
    assert weights.stat().st_size <= MAX_BYTES
    with safe_open(str(weights), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}


def test_default_drafter_config_and_sts_agree() -> None:
    raw = json.loads((DEFAULT_DRAFTER_DIR / CONFIG_FILE).read_text())
    config = DSparkConfig.from_hf_dict(raw)
    assert raw["architectures"] == ["DSparkMoEDraftModel"]
    assert config.markov_head_type != "none" and config.enable_confidence_head
    sts = load_sts(DEFAULT_DRAFTER_DIR / "sts.json")
    assert len(sts.temperatures) == config.block_size
    assert all(t > 0 for t in sts.temperatures)
