"""Cost tables: byte-compatible with SGLang 0.5.23, same lookups, stricter validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dspark_sglang.scheduling.cost_table import (
    CostModel,
    CostTableError,
    SpsAdditiveCostTable,
    SpsCostTable,
    from_probes,
    load_cost_table,
    parse_cost_table,
)

sps = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_sps")

# Extremes sit on the bounds (MAX_BATCH_TOKENS = 2**20, MAX_STEPS_PER_SEC = 1e6).
STAIRCASES = [
    ([1], [1.0], 1),
    ([1, 2, 4, 8], [0.1, 1e-05, 123.456, 7.0], 8),
    ([1, 16, 64, 4096], [2.5e-300, 1e6, 0.3, 1 / 3], 2**20),
    ([3, 5, 1_000_003], [100.0, 99.99999999999999, 1e-05], 1_048_573),
]

ADDITIVES = [
    (0.1, [1], [0.0], [1], [1e-05]),
    (1e-05, [1, 4, 16], [0.0, 0.002, 0.1], [1, 64, 4096], [0.001, 0.003, 1 / 7]),
    (0.0125, [2, 2**20], [1e-05, 0.5], [5, 6, 2**20], [0.1, 0.2, 0.30000000000000004]),
]


@pytest.mark.parametrize(("probes", "rates", "max_bt"), STAIRCASES)
def test_staircase_json_is_byte_identical_to_sglang(
    probes: list[int], rates: list[float], max_bt: int
) -> None:
    ours = SpsCostTable(
        sample_batch_tokens=probes, sample_steps_per_sec=rates, max_batch_tokens=max_bt
    )
    theirs = sps.SpsCostTable(
        sample_batch_tokens=probes, sample_steps_per_sec=rates, max_batch_tokens=max_bt
    )
    assert ours.to_json() == theirs.to_json()
    # Each side reads the other's bytes back to an identical table.
    assert sps.SpsCostTable.from_json(ours.to_json()) == theirs
    assert SpsCostTable.from_json(theirs.to_json()) == ours
    # The assembler agrees too (probes given unsorted on purpose).
    pairs = list(zip(probes, rates, strict=True))[::-1]
    assert (
        from_probes(pairs, max_batch_tokens=max_bt).to_json()
        == sps.profile_sps_table(probes=pairs, max_batch_tokens=max_bt).to_json()
    )
    assert from_probes(pairs).max_batch_tokens == probes[-1]


@pytest.mark.parametrize(("bias", "bs", "alpha", "m", "theta"), ADDITIVES)
def test_additive_json_is_byte_identical_to_sglang(
    bias: float, bs: list[int], alpha: list[float], m: list[int], theta: list[float]
) -> None:
    kw = {
        "bias_seconds": bias,
        "bs_probes": bs,
        "alpha_seconds": alpha,
        "m_probes": m,
        "theta_seconds": theta,
    }
    ours, theirs = SpsAdditiveCostTable(**kw), sps.SpsAdditiveCostTable(**kw)
    assert ours.to_json() == theirs.to_json()
    assert sps.SpsAdditiveCostTable.from_json(ours.to_json()) == theirs
    assert SpsAdditiveCostTable.from_json(theirs.to_json()) == ours


def test_integer_rates_are_written_as_floats_like_sglang_reads_them() -> None:
    """SGLang decodes ``[1, 2]`` as floats, so a table given ints must write ``1.0``."""
    ours = SpsCostTable(sample_batch_tokens=[1, 2], sample_steps_per_sec=[3, 2], max_batch_tokens=2)
    text = '{"sample_batch_tokens":[1,2],"sample_steps_per_sec":[3,2],"max_batch_tokens":2}'
    assert ours.to_json() == sps.SpsCostTable.from_json(text).to_json()
    assert ours.to_json() == parse_cost_table(text).to_json()


def test_floor_lookup_matches_sglang_on_random_queries() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 12, (1,), generator=g))
        probes = sorted(set(torch.randint(1, 300, (n,), generator=g).tolist()))
        rates = (torch.rand(len(probes), generator=g, dtype=torch.float64) * 100 + 0.01).tolist()
        kw = {
            "sample_batch_tokens": probes,
            "sample_steps_per_sec": rates,
            "max_batch_tokens": probes[-1] + 5,
        }
        ours, theirs = SpsCostTable(**kw), sps.SpsCostTable(**kw)
        queries = torch.randint(-3, 400, (200,), generator=g)
        got = ours.steps_per_sec(7, queries)
        want = torch.tensor([theirs.lookup(int(q)) for q in queries], dtype=torch.float64)
        assert torch.equal(got, want)
        assert [ours.lookup(int(q)) for q in queries] == want.tolist()


def test_floor_lookup_hand_values() -> None:
    t = from_probes([(1, 100.0), (4, 90.0), (8, 50.0)], max_batch_tokens=16)
    q = torch.tensor([[0, 1, 3], [4, 7, 8]])
    out = t.steps_per_sec(1, q)
    assert out.shape == (2, 3) and out.dtype == torch.float64
    # Below the first probe clamps to it; beyond max_batch_tokens keeps the last rate.
    assert out.tolist() == [[100.0, 100.0, 100.0], [90.0, 90.0, 50.0]]
    assert t.lookup(10_000) == 50.0


def test_additive_hand_values_and_matches_sglang_step_time() -> None:
    t = SpsAdditiveCostTable(
        bias_seconds=0.01,
        bs_probes=[1, 3],
        alpha_seconds=[0.0, 0.002],
        m_probes=[2, 10],
        theta_seconds=[0.001, 0.009],
    )
    # alpha(2) = 0.001, theta(6) = 0.005 -> 0.016 s per step.
    assert t.steps_per_sec(2, torch.tensor([6])).item() == pytest.approx(1 / 0.016, rel=1e-12)
    # Clamped beyond both ends: alpha(9) = 0.002, theta(1) = 0.001, theta(50) = 0.009.
    assert t.step_time(num_reqs=9, budget=-8) == pytest.approx(0.013, rel=1e-12)
    assert t.step_time(num_reqs=9, budget=41) == pytest.approx(0.021, rel=1e-12)

    g = torch.Generator().manual_seed(1)
    for bias, bs, alpha, m, theta in ADDITIVES:
        kw = {
            "bias_seconds": bias,
            "bs_probes": bs,
            "alpha_seconds": alpha,
            "m_probes": m,
            "theta_seconds": theta,
        }
        ours, theirs = SpsAdditiveCostTable(**kw), sps.SpsAdditiveCostTable(**kw)
        for num_reqs in [1, 2, 3, 17, 5000]:
            bt = num_reqs + torch.randint(0, 5000, (50,), generator=g)
            got = ours.steps_per_sec(num_reqs, bt)
            want = torch.tensor(
                [1.0 / theirs.step_time(num_reqs=num_reqs, budget=int(b) - num_reqs) for b in bt],
                dtype=torch.float64,
            )
            torch.testing.assert_close(got, want, rtol=1e-12, atol=0.0)
            scalar = [ours.step_time(num_reqs=num_reqs, budget=int(b) - num_reqs) for b in bt]
            torch.testing.assert_close(1.0 / torch.tensor(scalar, dtype=torch.float64), got)


def test_both_tables_satisfy_the_cost_model_protocol() -> None:
    stair = from_probes([(1, 10.0)])
    add = SpsAdditiveCostTable(
        bias_seconds=0.1, bs_probes=[1], alpha_seconds=[0.0], m_probes=[1], theta_seconds=[0.0]
    )
    for t in (stair, add):
        assert isinstance(t, CostModel)
        assert t.steps_per_sec(1, torch.tensor([1, 2])).tolist() == [10.0, 10.0]
    with pytest.raises(TypeError, match="integer tensor"):
        stair.steps_per_sec(1, torch.tensor([1.5]))
    with pytest.raises(ValueError, match="num_reqs"):
        add.steps_per_sec(-1, torch.tensor([1]))


def test_load_cost_table_detects_the_format(tmp_path: Path) -> None:
    stair = from_probes([(1, 10.0), (8, 5.0)], max_batch_tokens=64)
    add = SpsAdditiveCostTable(
        bias_seconds=0.1, bs_probes=[1], alpha_seconds=[0.0], m_probes=[1], theta_seconds=[0.0]
    )
    stair.save(tmp_path / "s.json")
    add.save(tmp_path / "a.json")
    assert load_cost_table(tmp_path / "s.json") == stair
    assert load_cost_table(tmp_path / "a.json") == add
    # SGLang's own loader reads what we wrote.
    assert sps.load_sps_table_from_path(str(tmp_path / "s.json")).to_json() == stair.to_json()
    assert sps.load_sps_table_from_path(str(tmp_path / "a.json")).to_json() == add.to_json()
    with pytest.raises(CostTableError, match="cannot read"):
        load_cost_table(tmp_path / "missing.json")
    with pytest.raises(CostTableError, match="expected an SpsCostTable"):
        SpsCostTable.from_json(add.to_json())


def _stair(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "sample_batch_tokens": [1, 4, 8],
        "sample_steps_per_sec": [100.0, 90.0, 50.0],
        "max_batch_tokens": 8,
    }
    base.update(over)
    return base


def _add(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "bias_seconds": 0.01,
        "bs_probes": [1, 4],
        "alpha_seconds": [0.0, 0.001],
        "m_probes": [1, 64],
        "theta_seconds": [0.001, 0.01],
    }
    base.update(over)
    return base


BAD_STAIRCASES = [
    (_stair(sample_batch_tokens=[], sample_steps_per_sec=[]), "sample_batch_tokens is empty"),
    (_stair(sample_batch_tokens=[1, 8, 4]), "sample_batch_tokens is not sorted"),
    (_stair(sample_batch_tokens=[1, 4, 4]), "sample_batch_tokens has duplicate probe 4"),
    (_stair(sample_batch_tokens=[0, 4, 8]), "sample_batch_tokens[0] = 0"),
    (_stair(sample_batch_tokens=[-2, 4, 8]), "sample_batch_tokens[0] = -2"),
    (_stair(sample_steps_per_sec=[1.0, 2.0]), "sample_steps_per_sec has 2 values"),
    (_stair(sample_steps_per_sec=[1.0, 0.0, 2.0]), "sample_steps_per_sec[1] = 0.0"),
    (_stair(sample_steps_per_sec=[1.0, -3.0, 2.0]), "sample_steps_per_sec[1] = -3.0"),
    (_stair(sample_steps_per_sec=[1.0, 2.0, math.nan]), "sample_steps_per_sec[2] = nan"),
    (_stair(sample_steps_per_sec=[math.inf, 2.0, 1.0]), "sample_steps_per_sec[0] = inf"),
    (_stair(max_batch_tokens=7), "max_batch_tokens = 7 is below the last probe 8"),
    (_stair(sample_batch_tokens=[1, 4.5, 8]), "sample_batch_tokens[1] must be an integer"),
    (_stair(sample_batch_tokens=[True, 4, 8]), "sample_batch_tokens[0] must be an integer"),
    (_stair(sample_steps_per_sec=[1.0, "2", 3.0]), "sample_steps_per_sec[1] must be a number"),
    (_stair(sample_batch_tokens="1,4,8"), "sample_batch_tokens must be a list"),
    (_stair(max_batch_tokens=8.0), "max_batch_tokens must be an integer"),
]

BAD_ADDITIVES = [
    (_add(bias_seconds=0.0), "bias_seconds = 0.0"),
    (_add(bias_seconds=math.nan), "bias_seconds = nan"),
    (_add(bias_seconds="0.1"), "bias_seconds must be a number"),
    (_add(bs_probes=[], alpha_seconds=[]), "bs_probes is empty"),
    (_add(m_probes=[64, 1]), "m_probes is not sorted"),
    (_add(bs_probes=[0, 4]), "bs_probes[0] = 0"),
    (_add(alpha_seconds=[0.0]), "alpha_seconds has 1 values but bs_probes has 2"),
    (_add(alpha_seconds=[0.0, -1e-05]), "alpha_seconds[1] = -1e-05"),
    (_add(theta_seconds=[0.001, math.inf]), "theta_seconds[1] = inf"),
]


@pytest.mark.parametrize(("kw", "msg"), BAD_STAIRCASES)
def test_malformed_staircase_is_rejected_naming_the_field(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(CostTableError) as info:
        SpsCostTable(**kw)  # type: ignore[arg-type]
    assert msg in str(info.value)


@pytest.mark.parametrize(("kw", "msg"), BAD_ADDITIVES)
def test_malformed_additive_is_rejected_naming_the_field(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(CostTableError) as info:
        SpsAdditiveCostTable(**kw)  # type: ignore[arg-type]
    assert msg in str(info.value)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ('{"sample_batch_tokens":[1,8,4],"sample_steps_per_sec":[1.0,2.0,3.0],'
         '"max_batch_tokens":8}', "sample_batch_tokens is not sorted"),
        ('{"sample_batch_tokens":[1],"sample_steps_per_sec":[0],"max_batch_tokens":1}',
         "sample_steps_per_sec[0] = 0.0"),
        ('{"sample_batch_tokens":[1],"sample_steps_per_sec":["1"],"max_batch_tokens":1}',
         "$.sample_steps_per_sec[0]"),
        ('{"sample_batch_tokens":[1.0],"sample_steps_per_sec":[1],"max_batch_tokens":1}',
         "$.sample_batch_tokens[0]"),
        ('{"sample_batch_tokens":[true],"sample_steps_per_sec":[1],"max_batch_tokens":1}',
         "$.sample_batch_tokens[0]"),
        ('{"sample_batch_tokens":[1],"sample_steps_per_sec":[1],"max_batch_tokens":"1"}',
         "$.max_batch_tokens"),
        ('{"sample_batch_tokens":[1],"sample_steps_per_sec":[1],"max_batch_tokens":1,"gpu":"h200"}',
         "unknown key(s) ['gpu'] for SpsCostTable; allowed keys: "
         "['sample_batch_tokens', 'sample_steps_per_sec', 'max_batch_tokens']"),
        ('{"sample_batch_tokens":[1],"sample_steps_per_sec":[1]}',
         "missing required key(s) ['max_batch_tokens']"),
        ('{"bias_seconds":0.1,"bs_probes":[1],"alpha_seconds":[0],"m_probes":[1],'
         '"theta_seconds":[0],"max_batch_tokens":4}', "unknown key(s) ['max_batch_tokens']"),
        ('{"bias_seconds":-1,"bs_probes":[1],"alpha_seconds":[0],"m_probes":[1],'
         '"theta_seconds":[0]}', "bias_seconds = -1.0"),
        ("[1, 2]", "top level must be a JSON object"),
        ('{"sample_batch_tokens":[1],', "not valid JSON"),
    ],
)  # fmt: skip
def test_malformed_json_is_rejected_naming_the_field(text: str, msg: str) -> None:
    with pytest.raises(CostTableError) as info:
        parse_cost_table(text)
    assert msg in str(info.value)


def test_from_probes_rejects_bad_measurements() -> None:
    with pytest.raises(CostTableError, match="duplicate probe 4"):
        from_probes([(4, 1.0), (1, 2.0), (4, 1.5)])
    with pytest.raises(CostTableError, match="no probes"):
        from_probes([])
    with pytest.raises(CostTableError, match=r"sample_batch_tokens\[0\] = 0"):
        from_probes([(0, 1.0), (2, 1.0)])
    with pytest.raises(CostTableError, match="pair"):
        from_probes([(1, 2.0, 3.0)])  # type: ignore[list-item]
    with pytest.raises(CostTableError, match="max_batch_tokens = 2"):
        from_probes([(1, 2.0), (4, 1.0)], max_batch_tokens=2)
