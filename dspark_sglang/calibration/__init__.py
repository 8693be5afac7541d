"""Calibration of the drafter's confidence head: Sequential Temperature Scaling.

``sts`` fits/applies temperatures and writes SGLang's STS JSON, ``rollouts``
reads calibration data (ours and SGLang recorder shards), ``plots`` draws
reliability diagrams (imports matplotlib, so it is not re-exported here); the
``calibrate`` command is ``cli/calibrate.py``.
"""

from dspark_sglang.calibration.rollouts import Rollouts, load_rollouts, save_rollouts
from dspark_sglang.calibration.sts import (
    StsCalibration,
    StsFit,
    apply_sts,
    default_grid,
    ece,
    fit_sts,
    load_sts,
    roc_auc,
    survival_probs,
)

__all__ = [
    "Rollouts",
    "StsCalibration",
    "StsFit",
    "apply_sts",
    "default_grid",
    "ece",
    "fit_sts",
    "load_rollouts",
    "load_sts",
    "roc_auc",
    "save_rollouts",
    "survival_probs",
]
