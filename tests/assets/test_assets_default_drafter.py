"""The embedded default drafter: small enough to commit, loadable,
and calibrated for its own block size."""

from __future__ import annotations

import json

from safetensors import safe_open

from dspark_sglang.calibration.sts import GREEDY_STS_FILENAME, STS_FILENAME, load_sts
from dspark_sglang.model.checkpoint import CONFIG_FILE
from dspark_sglang.model.config import DSparkConfig
from dspark_sglang.model.vocab import (
    DRAFT_VOCAB_BUFFER,
    DRAFT_VOCAB_SIZE_KEY,
    GREEDY_DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_SIZE_KEY,
    check_greedy_draft_vocab_ids,
)
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

TOKEN_MAPS = {DRAFT_VOCAB_BUFFER, GREEDY_DRAFT_VOCAB_BUFFER}

MAX_BYTES = 30_000_000  # the 30 MB commit budget, read strictly (decimal megabytes)


def test_default_drafter_fits_the_commit_budget_in_bfloat16() -> None:
    weights = DEFAULT_DRAFTER_DIR / "model.safetensors"
    assert weights.stat().st_size <= MAX_BYTES
    with safe_open(str(weights), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert {d for k, d in dtypes.items() if k not in TOKEN_MAPS} == {"BF16"}
    assert {d for k, d in dtypes.items() if k in TOKEN_MAPS} <= {"I64"}


def test_default_drafter_ships_a_valid_greedy_map() -> None:
    """Greedy-only tiers draft over the map; sampled ones keep the whole vocabulary."""
    raw = json.loads((DEFAULT_DRAFTER_DIR / CONFIG_FILE).read_text())
    config = DSparkConfig.from_hf_dict(raw)
    assert DRAFT_VOCAB_SIZE_KEY not in raw["dspark_config"]  # a full drafter
    size = raw["dspark_config"][GREEDY_DRAFT_VOCAB_SIZE_KEY]
    with safe_open(str(DEFAULT_DRAFTER_DIR / "model.safetensors"), "pt") as f:
        ids = f.get_tensor(GREEDY_DRAFT_VOCAB_BUFFER)
    check_greedy_draft_vocab_ids(ids, config.vocab_size, size)
    assert 0 < size < config.vocab_size


def test_default_drafter_config_and_sts_agree() -> None:
    raw = json.loads((DEFAULT_DRAFTER_DIR / CONFIG_FILE).read_text())
    config = DSparkConfig.from_hf_dict(raw)
    assert raw["architectures"] == ["DSparkMoEDraftModel"]
    assert config.markov_head_type != "none" and config.enable_confidence_head
    for name in (STS_FILENAME, GREEDY_STS_FILENAME):  # sampled tiers, greedy-only tiers
        sts = load_sts(DEFAULT_DRAFTER_DIR / name)
        assert len(sts.temperatures) == config.block_size, name
        assert all(t > 0 for t in sts.temperatures), name
