"""Request length distributions: GSM8K default and the embedded fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_sglang.planning import workload
from dspark_sglang.planning.workload import LengthDistribution, gsm8k_lengths, load_lengths


def test_default_lengths_are_the_shipped_gsm8k_train_split() -> None:
    import gzip
    import json
    import math

    d = workload.default_lengths()
    assert len(d) == 7473
    with gzip.open(workload.gsm8k_path(), "rt") as f:
        first = json.loads(f.readline())
    answer = workload._CALC_ANNOTATION.sub("", first["answer"])
    assert d.prompt_tokens[0] == math.ceil(len(first["question"]) / 4)
    assert d.output_tokens[0] == math.ceil(len(answer) / 4)
    assert "<<" in first["answer"]  # the annotation really is stripped in this row
    assert gsm8k_lengths(workload.gsm8k_path()) == d


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
