"""``SchedulerConfig.load`` refuses a YAML key given twice instead of keeping the last."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.scheduling.config import ConfigError, SchedulerConfig


def test_duplicate_yaml_key_is_refused_naming_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("block_size: 4\npolicy: none\nblock_size: 8\n")  # PyYAML alone: 8
    with pytest.raises(ConfigError) as info:
        SchedulerConfig.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "duplicate key 'block_size' on line 3 (first on line 1)" in message
    path.write_text("block_size: 4\npolicy: static\nstatic_k: 2\n")  # once each: fine
    assert SchedulerConfig.load(path).static_k == 2
