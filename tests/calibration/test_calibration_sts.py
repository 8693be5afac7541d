"""STS: metrics against hand values and SGLang, recovery of known temperatures, JSON compat."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dspark_sglang.calibration.sts import (
    StsCalibration,
    apply_sts,
    default_grid,
    ece,
    evaluate_sts,
    fit_sts,
    load_sts,
    observed_mask,
    reliability_bins,
    roc_auc,
    survival_labels,
    survival_probs,
)

sts_sglang = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_sts")
fit_sglang = pytest.importorskip("sglang.benchmark.dspark_sts_fit")

T_STAR = [0.5, 1.0, 2.0, 3.0, 1.5]


# --------------------------------------------------------------------------- #
# Metrics.
# --------------------------------------------------------------------------- #


def test_ece_hand_computed() -> None:
    # 10 bins: 0.1 -> bin 1, 0.2 -> bin 2, 0.9 and 0.95 -> bin 9.
    # ECE = 1/4*|0.1-0| + 1/4*|0.2-1| + 2/4*|0.925-1| = 0.025 + 0.2 + 0.0375.
    p = torch.tensor([0.1, 0.2, 0.9, 0.95], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 1])
    assert ece(p, y, n_bins=10) == pytest.approx(0.2625, abs=1e-12)
    # A perfectly calibrated bin has zero error; p = 1 falls in the last bin.
    assert ece(torch.tensor([0.5, 0.5, 1.0]), torch.tensor([1, 0, 1]), n_bins=2) == 0.0
    count, mp, my = reliability_bins(torch.tensor([0.0, 1.0, 0.74]), torch.tensor([0, 1, 0]), 4)
    assert count.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert mp.tolist() == pytest.approx([0.0, 0.0, 0.74, 1.0])
    assert my.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_ece_matches_sglang_fitter_definition() -> None:
    g = torch.Generator().manual_seed(3)
    for n_bins in (5, 15, 40):
        p = torch.rand(5000, generator=g, dtype=torch.float64)
        y = (torch.rand(5000, generator=g, dtype=torch.float64) < p**1.3).double()
        want = fit_sglang.expected_calibration_error(probs=p, targets=y, num_bins=n_bins)
        assert ece(p, y, n_bins) == pytest.approx(want, abs=1e-12)


def test_ece_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        ece(torch.tensor([]), torch.tensor([]))
    with pytest.raises(ValueError, match=r"prob must lie in \[0, 1\]"):
        ece(torch.tensor([1.2]), torch.tensor([1]))
    with pytest.raises(ValueError, match="sizes differ"):
        ece(torch.tensor([0.2, 0.3]), torch.tensor([1]))


def test_roc_auc_hand_computed_and_ties() -> None:
    assert roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert roc_auc(torch.tensor([0.5, 0.5]), torch.tensor([0, 1])) == 0.5
    # Positives {2, 2}, negatives {1, 2}: pairs (2>1) twice = 2, ties (2=2) twice = 1 -> 3/4.
    assert roc_auc(torch.tensor([1.0, 2.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert roc_auc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 1])) == 1.0
    assert roc_auc(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([0, 1, 1])) == 0.0
    assert math.isnan(roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([1, 1])))


def test_roc_auc_equals_pairwise_count_with_many_ties() -> None:
    g = torch.Generator().manual_seed(5)
    s = torch.randint(0, 6, (300,), generator=g).double()
    y = torch.rand(300, generator=g) < 0.3 + 0.1 * s
    pos, neg = s[y], s[~y]
    diff = pos.unsqueeze(1) - neg.unsqueeze(0)
    want = float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
    assert roc_auc(s, y) == pytest.approx(want, abs=1e-12)


def test_labels_and_censoring_mask() -> None:
    acc = torch.tensor([0, 2, 3, 1])
    assert survival_labels(acc, 3).tolist() == [
        [False, False, False],
        [True, True, False],
        [True, True, True],
        [True, False, False],
    ]
    # Verified 1, 2, 3, 3: a position enters the fit only if its draft was verified,
    # whatever the outcome (row 0 rejected early, yet positions 2-3 stay out).
    ver = torch.tensor([1, 2, 3, 3])
    assert observed_mask(acc, ver, 3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
        [True, True, True],
    ]
    assert bool(observed_mask(acc, None, 3).all())


# --------------------------------------------------------------------------- #
# Fitting.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_temperatures(synthetic, seed: int) -> None:
    """20k rounds, B = 5, T* = (0.5, 1, 2, 3, 1.5).

    Tolerances: each fitted T_k within 25 % of T*_k (observed spread over seeds
    is ~±10 %, largest at the last position where few prefixes survive); every
    per-position survival ECE after STS < 0.02 (ECE noise floor at this size is
    ~0.005-0.01) and below the raw ECE; mean ECE at least 3x smaller.
    """
    torch.set_num_threads(1)
    z, acc, _ = synthetic(20_000, T_STAR, seed)
    fit = fit_sts(z, acc)
    for t, ts in zip(fit.temperatures, T_STAR, strict=True):
        assert abs(t / ts - 1.0) < 0.25, (fit.temperatures, T_STAR)
    for before, after in zip(fit.ece_before, fit.ece_after, strict=True):
        assert after < 0.02
        assert after < before
    assert sum(fit.ece_after) * 3 < sum(fit.ece_before)
    # ece_after is the ECE of the product at the fitted temperatures.
    surv = survival_probs(apply_sts(z, fit.temperatures))
    labels = survival_labels(acc, 5)
    for k in range(5):
        assert ece(surv[:, k], labels[:, k]) == pytest.approx(fit.ece_after[k], abs=1e-12)
    assert fit.num_samples == 20_000 and fit.num_tested[0] == 20_000


def test_fit_matches_sglang_fitter_on_its_grid(synthetic) -> None:
    z, acc, _ = synthetic(8_000, T_STAR, 11)
    grid = fit_sglang.default_temperature_grid()
    ours = fit_sts(z, acc, grid)
    theirs = fit_sglang.fit_sts_temperatures(
        logits=z, prefix_mask=survival_labels(acc, 5).double(), grid=grid
    )
    assert list(ours.temperatures) == theirs["temperatures"]
    assert list(ours.ece_before) == pytest.approx(theirs["ece_before"], abs=1e-12)
    assert list(ours.ece_after) == pytest.approx(theirs["ece_after"], abs=1e-12)


def test_scaling_preserves_order_and_auc(synthetic) -> None:
    z, acc, _ = synthetic(5_000, T_STAR, 4)
    fit = fit_sts(z, acc)
    conf = apply_sts(z, fit.temperatures)
    assert conf.dtype == torch.float64
    for k in range(5):
        order = torch.argsort(z[:, k])
        assert bool((conf[order, k].diff() >= 0).all())
        tested = acc >= k
        y = acc[tested] >= k + 1
        assert roc_auc(conf[tested, k], y) == roc_auc(z[tested, k], y) == fit.auc[k]
    # The head is informative (true logits spread with sigma 1.5): AUC well above chance.
    assert min(fit.auc) > 0.75


def test_censored_rounds_are_left_out_not_counted_as_rejections(synthetic) -> None:
    """40k rounds, verify lengths drawn uniformly in 1..B, independent of the logits.

    At the true temperatures the survival product is calibrated on the cells
    whose draft was verified (ECE < 0.02), while treating unverified cells as
    rejections is miscalibrated (ECE > 0.05 at the last position), and so is
    keeping unverified cells only when an earlier draft failed (selection on
    the outcome). The fit recovers T* within 25 % at every position.
    """
    g = torch.Generator().manual_seed(7)
    t_star = [0.5, 2.0, 1.0]
    ver = torch.randint(1, 4, (40_000,), generator=g)
    z, acc, _ = synthetic(40_000, t_star, 8, verified=ver)
    surv = survival_probs(apply_sts(z, t_star))
    labels = survival_labels(acc, 3).double()
    obs = observed_mask(acc, ver, 3)
    assert ece(surv[obs[:, 2], 2], labels[obs[:, 2], 2]) < 0.02
    assert ece(surv[:, 2], labels[:, 2]) > 0.05
    outcome_selected = (ver >= 3) | (acc < ver)
    assert ece(surv[outcome_selected, 2], labels[outcome_selected, 2]) > 0.05
    fit = fit_sts(z, acc, verified=ver)
    for t, ts in zip(fit.temperatures, t_star, strict=True):
        assert abs(t / ts - 1.0) < 0.25
    assert max(fit.ece_after) < 0.02


def test_fit_rejects_bad_input() -> None:
    z = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"accepted counts must lie in 0..3"):
        fit_sts(z, torch.tensor([0, 1, 4, 2]))
    with pytest.raises(ValueError, match="accepted has 2 entries"):
        fit_sts(z, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="NaN or inf"):
        fit_sts(torch.full((2, 2), math.nan), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="accepted <= verified"):
        fit_sts(z, torch.tensor([0, 1, 2, 2]), verified=torch.tensor([0, 0, 3, 3]))
    with pytest.raises(ValueError, match="position 3: no round verified"):
        fit_sts(z, torch.tensor([2, 2, 2, 2]), verified=torch.tensor([2, 2, 2, 2]))
    with pytest.raises(ValueError, match="grid"):
        fit_sts(z, torch.tensor([0, 1, 2, 3]), grid=[1.0, -2.0])
    with pytest.raises(ValueError, match="one temperature per block position"):
        apply_sts(z, [1.0, 1.0])
    with pytest.raises(ValueError, match="grid needs"):
        default_grid(2.0, 1.0)


# --------------------------------------------------------------------------- #
# SGLang STS JSON.
# --------------------------------------------------------------------------- #

CALIBRATIONS = [
    {"temperatures": [1.0]},
    {"temperatures": [0.1, 1e-05, 20.0, 3.1622776985168457], "dataset": "gsm8k"},
    {
        "temperatures": [0.5, 2],
        "dataset": 'held-out "gsm8k/test" ü,/data/*.pt',
        "num_samples": 2**53 + 1,
        "ece_before": [0.1, 1e-05],
        "ece_after": [0.0, 1.0],
    },
    {"temperatures": [0.7, 0.9, 1.1], "num_samples": 123456789, "ece_before": [0.05, 0.04, 0.03]},
]


@pytest.mark.parametrize("kw", CALIBRATIONS)
def test_sts_json_is_byte_identical_to_sglang(kw: dict[str, object], tmp_path: Path) -> None:
    ours = StsCalibration(**kw)  # type: ignore[arg-type]
    theirs = sts_sglang.DSparkStsCalibration(**kw)
    their_text = msgspec_reencode(theirs)
    assert ours.to_json() == their_text
    assert sts_sglang.DSparkStsCalibration.from_json(ours.to_json()) == (
        sts_sglang.DSparkStsCalibration.from_json(their_text)
    )
    assert StsCalibration.from_json(their_text) == ours
    ours.save(tmp_path / "sts.json")
    assert load_sts(tmp_path / "sts.json") == ours
    assert sts_sglang.load_sts_calibration_from_path(str(tmp_path / "sts.json")).to_json() == (
        their_text
    )


def msgspec_reencode(cal: object) -> str:
    """SGLang's text after its own decode: ints given for floats come back as floats."""
    cls = type(cal)
    return cls.from_json(cal.to_json()).to_json()  # type: ignore[attr-defined]


def test_defaults_are_omitted_like_sglang() -> None:
    assert StsCalibration(temperatures=[1.5]).to_json() == '{"temperatures":[1.5]}'
    assert sts_sglang.DSparkStsCalibration(temperatures=[1.5]).to_json() == (
        '{"temperatures":[1.5]}'
    )


def test_fit_output_loads_in_sglang(synthetic, tmp_path: Path) -> None:
    z, acc, _ = synthetic(3_000, [1.0, 2.0], 9)
    fit = fit_sts(z, acc)
    fit.to_calibration("synthetic").save(tmp_path / "sts.json")
    theirs = sts_sglang.load_sts_calibration_from_path(str(tmp_path / "sts.json"))
    assert theirs.temperatures == list(fit.temperatures)
    assert theirs.ece_after == list(fit.ece_after)
    assert (theirs.dataset, theirs.num_samples) == ("synthetic", 3_000)
    torch.testing.assert_close(
        load_sts(tmp_path / "sts.json").apply(z),
        torch.sigmoid(z / torch.tensor(theirs.temperatures)),
    )
    assert "ECE before" in fit.table() and len(fit.table().splitlines()) == 4


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"temperatures": []}, "temperatures is empty"),
        ({"temperatures": [1.0, 0.0]}, "temperatures[1] = 0.0: must be finite and > 0"),
        ({"temperatures": [-1.0]}, "temperatures[0] = -1.0"),
        ({"temperatures": [math.nan]}, "temperatures[0] = nan"),
        ({"temperatures": [math.inf]}, "temperatures[0] = inf"),
        ({"temperatures": [1.0], "num_samples": -1}, "num_samples must be an integer >= 0"),
        ({"temperatures": [1.0], "num_samples": True}, "num_samples must be an integer >= 0"),
        ({"temperatures": [1.0, 2.0], "ece_after": [0.1]}, "ece_after has 1 entries for 2"),
        ({"temperatures": [1.0], "ece_before": [1.5]}, "ece_before[0] = 1.5"),
        ({"temperatures": [1.0], "ece_before": [math.nan]}, "ece_before[0] = nan"),
        ({"temperatures": [1.0], "dataset": 3}, "dataset must be a string"),
    ],
)
def test_malformed_calibration_is_rejected(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ValueError) as info:
        StsCalibration(**kw)  # type: ignore[arg-type]
    assert msg in str(info.value)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ('{"temperatures":[1.0],"gamma":5}', "unknown key(s) ['gamma']; allowed keys"),
        ('{"dataset":"x"}', "missing required field `temperatures`"),
        ('{"temperatures":["1"]}', "$.temperatures[0]"),
        ('{"temperatures":[1.0],"num_samples":1.5}', "$.num_samples"),
        ('{"temperatures":[0]}', "temperatures[0] = 0.0"),
        ("[]", "top level must be a JSON object"),
    ],
)
def test_malformed_calibration_json_is_rejected(text: str, msg: str) -> None:
    with pytest.raises(ValueError) as info:
        StsCalibration.from_json(text)
    assert msg in str(info.value)


def test_evaluate_on_fit_data_reproduces_the_fit_figures(synthetic) -> None:
    # Scoring the fitted temperatures on the fit rounds must give back the fit's own
    # before/after ECE and AUC: one definition of each figure, two entry points.
    z, acc, _ = synthetic(4_000, [0.6, 1.8, 1.0], 41)
    fit = fit_sts(z, acc)
    ev = evaluate_sts(z, acc, fit.temperatures)
    assert ev.ece_before == pytest.approx(fit.ece_before, abs=1e-12)
    assert ev.ece_after == pytest.approx(fit.ece_after, abs=1e-9)
    assert ev.auc == pytest.approx(fit.auc, abs=1e-12, nan_ok=True)
    assert ev.num_tested == fit.num_tested
    assert ev.mean_ece_after < ev.mean_ece_before


def test_evaluate_rejects_wrong_temperature_count(synthetic) -> None:
    z, acc, _ = synthetic(100, [1.0, 1.0, 1.0], 3)
    with pytest.raises(ValueError, match="one temperature per block position"):
        evaluate_sts(z, acc, [1.0, 1.0])
