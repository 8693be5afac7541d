"""bfloat16 asked for on a CPU that emulates it: the data and train stages say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.training import precision
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.precision import emulated_bf16_warning

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: avx2\n"
AMX = "processor\t: 0\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"
MIXED = "processor\t: 0\nflags\t\t: avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: avx2\n"


@pytest.mark.parametrize(
    ("value", "device", "cpuinfo", "warned"),
    [
        ("bfloat16", "cpu", AVX2_ONLY, True),
        ("bfloat16", "cpu", MIXED, True),  # one core without bf16 is enough to emulate
        ("bfloat16", "cpu", AMX, False),
        ("float32", "cpu", AVX2_ONLY, False),
        ("bfloat16", "cuda", AVX2_ONLY, False),
        ("bfloat16", "cuda:1", AVX2_ONLY, False),
        ("bfloat16", "cpu", None, False),  # flags unreadable: nothing claimed
    ],
)
def test_warning_only_for_bf16_on_an_emulating_cpu(
    value: str, device: str, cpuinfo: str | None, warned: bool
) -> None:
    line = emulated_bf16_warning("data.gen_dtype", value, device, cpuinfo)
    assert (line is not None) == warned
    if line is not None:
        assert "data.gen_dtype" in line and "set data.gen_dtype: float32" in line


def _cfg(tmp_path: Path, layer_ids: list[int]) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "name": "bf16",
            "target": {"name": "tiny", "layer_ids": layer_ids},
            "data": {
                "dir": str(tmp_path / "data"),
                "num_math": 1,
                "num_code": 1,
                "num_chat": 0,
                "max_new_tokens": 4,
                "max_prompt_tokens": 4096,
                "hidden_states": "online",
                "gen_dtype": "bfloat16",
            },
            "drafter": {
                "block_size": 4,
                "model": {"num_hidden_layers": 1, "num_experts": 4, "num_experts_per_tok": 2},
            },
            "anchors": {"anchors_per_seq": 4, "max_anchors_per_batch": 16},
            "optim": {"warmup_steps": 1, "max_steps": 1},
            "run": {
                "out_dir": str(tmp_path / "run"),
                "threads": 1,
                "log_every": 1,
                "autocast": "bfloat16",
            },
        }
    )


@pytest.mark.parametrize(("cpuinfo", "warned"), [(AVX2_ONLY, True), (AMX, False)])
def test_both_stages_print_it_on_this_cpu(
    cpuinfo: str,
    warned: bool,
    tiny_chat_model: Any,
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tiny_chat_target import LAYER_IDS

    from dspark_sglang.training.pipeline import run_data_stage, run_train_stage

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    monkeypatch.setattr(precision, "read_cpuinfo", lambda: cpuinfo)
    cfg = _cfg(tmp_path, list(LAYER_IDS))
    run_data_stage(cfg, tiny_chat_model, limit=None, progress=False)
    run_train_stage(cfg, tiny_chat_model, resume=False, progress=False)
    out = capsys.readouterr().out
    assert ("[precision] data.gen_dtype: bfloat16" in out) == warned
    assert ("[precision] run.autocast: bfloat16" in out) == warned
