"""Rollout files: our .pt/.jsonl layouts and SGLang's StsDataRecorder shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_sglang.calibration.rollouts import Rollouts, load_rollouts, save_rollouts

sts_sglang = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_sts")


def test_reads_shards_written_by_sglangs_recorder(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    rec = sts_sglang.StsDataRecorder(
        path_stem=str(tmp_path / "sts" / "run"), gamma=4, flush_every=2
    )
    logits, counts = [], []
    for n in (3, 5, 2, 4, 1):  # 5 batches -> shards of 2, 2 and 1 batches
        z = torch.randn(n, 4, generator=g)
        c = torch.randint(0, 5, (n,), generator=g)
        rec.record(confidence_raw=z, num_correct_drafts=c)
        logits.append(z)
        counts.append(c)
    rec.flush()
    assert len(list((tmp_path / "sts").glob("run.*.pt"))) == 3
    data = load_rollouts([str(tmp_path / "sts" / "run.*.pt")])
    assert data.block_size == 4 and data.num_rounds == 15 and data.verified is None
    # Shards are read in sorted order: run.0, run.1, run.2 = record order.
    assert torch.equal(data.confidence_logits, torch.cat(logits))
    assert torch.equal(data.accepted, torch.cat(counts))


@pytest.mark.parametrize("suffix", [".pt", ".jsonl"])
@pytest.mark.parametrize("with_verified", [False, True])
def test_our_layouts_round_trip(tmp_path: Path, suffix: str, with_verified: bool) -> None:
    z = torch.tensor([[0.5, -1.25, 3.0], [2.0, 0.0, -0.125]])
    acc = torch.tensor([1, 3])
    ver = torch.tensor([2, 3]) if with_verified else None
    path = tmp_path / f"r{suffix}"
    save_rollouts(path, Rollouts(z, acc, ver))
    back = load_rollouts([path])
    assert torch.equal(back.confidence_logits, z) and torch.equal(back.accepted, acc)
    assert (back.verified is None) == (ver is None)
    if ver is not None:
        assert back.verified is not None and torch.equal(back.verified, ver)
    assert back.sources == (str(path),)


def test_mixing_files_with_and_without_verified(tmp_path: Path) -> None:
    save_rollouts(tmp_path / "a.pt", Rollouts(torch.zeros(2, 3), torch.tensor([0, 1])))
    save_rollouts(
        tmp_path / "b.jsonl", Rollouts(torch.ones(1, 3), torch.tensor([1]), torch.tensor([2]))
    )
    data = load_rollouts([tmp_path / "a.pt", tmp_path / "b.jsonl"])
    assert data.verified is not None and data.verified.tolist() == [3, 3, 2]


def test_rejects_malformed_files(tmp_path: Path) -> None:
    bad_mask = tmp_path / "bad.0.pt"
    torch.save(
        {"logits": torch.zeros(1, 3), "prefix_mask": torch.tensor([[1.0, 0.0, 1.0]])}, bad_mask
    )
    with pytest.raises(ValueError, match="prefix_mask rows must be prefixes"):
        load_rollouts([bad_mask])
    keys = tmp_path / "keys.pt"
    torch.save({"logits": torch.zeros(1, 3)}, keys)
    with pytest.raises(ValueError, match=r"unrecognised keys \['logits'\]"):
        load_rollouts([keys])
    lines = tmp_path / "r.jsonl"
    lines.write_text(
        '{"confidence_logits": [0.1, 0.2], "accepted": 1}\n'
        '{"confidence_logits": [0.1, 0.2], "accepted": 3}\n'
    )
    with pytest.raises(ValueError, match=r"r.jsonl:2: accepted = 3 must lie in 0..2"):
        load_rollouts([lines])
    lines.write_text(
        '{"confidence_logits": [0.1, 0.2], "accepted": 1}\n'
        '{"confidence_logits": [0.1, 0.2, 0.3], "accepted": 0}\n'
    )
    with pytest.raises(ValueError, match=r"r.jsonl: round 2 has 3 confidence_logits, the first"):
        load_rollouts([lines])
    lines.write_text("\n")
    with pytest.raises(ValueError, match=r"r.jsonl: no rounds in file"):
        load_rollouts([lines])
    lines.write_text('{"confidence_logits": [0.1], "accepted": 0, "extra": 1}\n')
    with pytest.raises(ValueError, match="unknown field `extra`"):
        load_rollouts([lines])
    save_rollouts(tmp_path / "b2.pt", Rollouts(torch.zeros(1, 2), torch.tensor([0])))
    save_rollouts(tmp_path / "b3.pt", Rollouts(torch.zeros(1, 3), torch.tensor([0])))
    with pytest.raises(ValueError, match="block size 3 differs"):
        load_rollouts([tmp_path / "b2.pt", tmp_path / "b3.pt"])
    with pytest.raises(ValueError, match="no rollout files match"):
        load_rollouts([str(tmp_path / "none*.pt")])
    with pytest.raises(ValueError, match="accepted <= verified"):
        Rollouts(torch.zeros(1, 3), torch.tensor([2]), torch.tensor([1]))
