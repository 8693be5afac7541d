"""The block size of a drafter folder, and the two checks against it, without an engine.

``launch.drafter_block_size`` is the one reader of a drafter folder's block size;
``launch.check_block_size`` (a scheduler config) and ``launch.check_sts_block_size``
(an STS file) are the one comparison each, used by the launch check, the worker
(``scheduler_bridge.load_decider``) and the SGLang demo. Each refusal names the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration import launch, scheduler_bridge


def _drafter(tmp_path: Path, block_size: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"dspark_config": {"block_size": block_size}}))
    return tmp_path


def test_the_block_size_of_a_drafter_folder(tmp_path: Path) -> None:
    assert launch.drafter_block_size(_drafter(tmp_path, 5)) == 5
    with pytest.raises(launch.LaunchError, match="integer >= 1"):
        launch.drafter_block_size(_drafter(tmp_path, 0))
    with pytest.raises(launch.LaunchError, match="--speculative-draft-model-path"):
        launch.drafter_block_size(tmp_path / "missing")


def test_a_config_for_another_block_names_the_value_to_set() -> None:
    cfg = SchedulerConfig(block_size=5, policy="mtp1")
    launch.check_block_size(cfg, "tier.yaml", 5)
    with pytest.raises(launch.LaunchError) as err:
        launch.check_block_size(cfg, "tier.yaml", 7)
    msg = str(err.value)
    assert "tier.yaml: block_size=5 but the drafter proposes 7" in msg
    assert "set block_size: 7" in msg and f"{launch.CHART_BLOCK_SIZE}: 7" in msg


def test_an_sts_file_for_another_block_names_the_refit() -> None:
    launch.check_sts_block_size(4, 4, "STS x.json")
    with pytest.raises(launch.LaunchError, match=r"x.json was fit for block size 4, the drafter "):
        launch.check_sts_block_size(4, 7, "STS x.json")


def test_the_worker_refuses_an_sts_file_for_another_block(tmp_path: Path) -> None:
    sts = tmp_path / "sts.json"
    StsCalibration(temperatures=(1.5,) * 3).save(sts)
    path = tmp_path / "s.yaml"
    SchedulerConfig(block_size=4, policy="mtp1", sts_path=str(sts)).save(path)
    env = {"DSPARK_SCHEDULER_CONFIG": str(path), "SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}
    with pytest.raises(
        ValueError, match=r"fit for block size 3, the drafter proposes 4.*calibrate"
    ):
        scheduler_bridge.load_decider(4, env=env)
