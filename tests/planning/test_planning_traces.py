"""Acceptance traces: on-disk round trips, validation, chain rule, synthetic statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_sglang.calibration.sts import roc_auc
from dspark_sglang.planning.traces import (
    AcceptanceTraces,
    accepted_under,
    concat_traces,
    decaying_acceptance,
    load_traces,
    load_traces_many,
    save_traces,
    synthetic_traces,
)


def _small() -> AcceptanceTraces:
    return concat_traces(
        [
            synthetic_traces(5, 3, [0.8, 0.7, 0.6], domain="gsm8k", seed=0),
            synthetic_traces(4, 2, [0.5, 0.5, 0.5], domain="mt-bench", seed=1),
        ]
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".pt"])
def test_round_trip_is_exact(tmp_path: Path, suffix: str) -> None:
    t = _small()
    p = tmp_path / f"t{suffix}"
    save_traces(t, p)
    back = load_traces(p)
    assert back.domains == ("gsm8k", "mt-bench")
    assert torch.equal(back.request_id, t.request_id)
    assert torch.equal(back.domain_index, t.domain_index)
    assert torch.equal(back.accepted, t.accepted)
    assert torch.equal(back.confidence_logits, t.confidence_logits)


def test_per_domain_files_load_as_one_set(tmp_path: Path) -> None:
    # As `bench acceptance --traces-dir` writes them: one file per domain, ids from 0 each.
    a = synthetic_traces(3, 2, [0.8, 0.7], domain="gsm8k", seed=0)
    b = synthetic_traces(2, 4, [0.5, 0.5], domain="humaneval", seed=1)
    save_traces(a, tmp_path / "gsm8k.jsonl")
    save_traces(b, tmp_path / "humaneval.pt")
    both = load_traces_many([tmp_path / "gsm8k.jsonl", tmp_path / "humaneval.pt"])
    assert both.domains == ("gsm8k", "humaneval")
    assert both.num_rounds == a.num_rounds + b.num_rounds
    assert len(both.request_spans()[0]) == 5  # 3 + 2 requests, none merged across files
    assert torch.equal(both.accepted, torch.cat([a.accepted, b.accepted]))
    with pytest.raises(ValueError, match="no trace files"):
        load_traces_many([])


def test_concat_renumbers_requests_and_spans() -> None:
    t = _small()
    starts, lens, dom = t.request_spans()
    assert starts.tolist() == [0, 3, 6, 9, 12, 15, 17, 19, 21]
    assert lens.tolist() == [3] * 5 + [2] * 4
    assert dom.tolist() == [0] * 5 + [1] * 4
    assert t.select_domains(["mt-bench"]).num_rounds == 8


def test_chain_rule_accepts_min_of_full_and_verified() -> None:
    full = torch.tensor([0, 3, 7, 2])
    l = torch.tensor([2, 1, 7, 5])
    assert accepted_under(full, l).tolist() == [0, 1, 7, 2]


def test_validation_names_field(tmp_path: Path) -> None:
    t = _small()
    with pytest.raises(ValueError, match=r"accepted must lie in 0\.\.3"):
        AcceptanceTraces(
            t.request_id, t.domain_index, t.domains, t.confidence_logits, t.accepted + 4
        )
    rid = t.request_id.clone()
    rid[1] = 99  # request 0's rounds are no longer contiguous
    with pytest.raises(ValueError, match="contiguous"):
        AcceptanceTraces(rid, t.domain_index, t.domains, t.confidence_logits, t.accepted)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": 0, "domain": "x", "confidence_logits": [0.1], "accepted": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*accepted = 2 must lie in 0..1"):
        load_traces(bad)
    bad.write_text(
        '{"request_id": 0, "domain": "x", "confidence_logits": [0.1, 0.2], "accepted": 0}\n'
        '{"request_id": 0, "domain": "x", "confidence_logits": [0.1], "accepted": 0}\n'
    )
    with pytest.raises(ValueError, match=r"bad.jsonl: round 2 has 1 confidence_logits"):
        load_traces(bad)


def test_synthetic_has_requested_acceptance_and_auc() -> None:
    """Conditional acceptance within 0.02 and AUC within 0.02 of the targets (n ~ 20k/pos)."""
    acc = decaying_acceptance(0.85, 0.95, 4)
    t = synthetic_traces(1000, 20, acc, auc=0.8, seed=3)
    emp = t.conditional_acceptance()
    assert torch.allclose(emp, torch.tensor(acc, dtype=torch.float64), atol=0.02)
    # Position 1 is always reached: its outcome is observed in every round.
    label = (t.accepted >= 1).double()
    assert abs(roc_auc(t.confidence_logits[:, 0].double(), label) - 0.8) < 0.02
    # Calibrated by construction: mean sigmoid(z) matches the pass rate at position 1.
    assert abs(float(torch.sigmoid(t.confidence_logits[:, 0]).mean()) - float(label.mean())) < 0.02
