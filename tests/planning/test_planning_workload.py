"""Request length distributions: GSM8K default and the embedded fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_sglang.planning import workload
from dspark_sglang.planning.workload import LengthDistribution, gsm8k_lengths, load_lengths


def test_embedded_sample_is_the_files_subsample(monkeypatch: pytest.MonkeyPatch) -> None:
    path = workload.gsm8k_path()
    if not path.is_file():
        pytest.skip(f"{path} not present; the embedded sample cannot be re-derived here")
    full = gsm8k_lengths(path)
    assert len(full) == 7473
    monkeypatch.setenv("DSPARK_SHARED_DIR", "/nonexistent")
    fallback = workload.default_lengths()
    sub = workload.embedded_subsample(full)
    assert fallback.prompt_tokens == sub.prompt_tokens
    assert fallback.output_tokens == sub.output_tokens


def test_sampling_keeps_pairs() -> None:
    d = LengthDistribution((1, 2, 3), (10, 20, 30))
    p, o = d.sample(500, torch.Generator().manual_seed(0))
    assert torch.equal(o, p * 10)
    assert set(p.tolist()) == {1, 2, 3}


def test_load_lengths_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "l.jsonl"
    f.write_text(
        '{"prompt_tokens": 5, "output_tokens": 7}\n{"prompt_tokens": 9, "output_tokens": 1}\n'
    )
    d = load_lengths(f)
    assert d.prompt_tokens == (5, 9) and d.output_tokens == (7, 1)
    f.write_text('{"prompt_tokens": 5, "output_tokens": 0}\n')
    with pytest.raises(ValueError, match="output_tokens must be integers >= 1"):
        load_lengths(f)
