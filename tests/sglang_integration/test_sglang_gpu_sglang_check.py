"""The SGLang GPU check's CPU-testable parts.

Driver ``benchmarks/gpu_sglang_check.py``, script ``scripts/gpu_sglang_check.sh``.

The GPU run itself needs CUDA and is not exercised here. Covered: argument
parsing and validation, drafter resolution against a real ``save_drafter``
folder, result accounting (tokens/s, speed-up, SGLang's accepted length,
first divergence), the table and the JSON, that every engine keyword is a real
SGLang 0.5.23 ``ServerArgs`` field, and the no-GPU skip of both the driver and
the shell script (exit 0 with a message).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]


gc = load_benchmark("gpu_sglang_check", "gpu_sglang_check")


def _out(ids: list[int], verify_ct: int | None = None, correct: int | None = None) -> dict:
    meta: dict[str, Any] = {"completion_tokens": len(ids)}
    if verify_ct is not None:
        meta |= {"spec_verify_ct": verify_ct, "spec_num_correct_drafts": correct}
    return {"output_ids": ids, "meta_info": meta}


# --------------------------------------------------------------------------- arguments


def test_defaults_are_the_issue_settings() -> None:
    args = gc.parse_args([])
    assert args.batch_sizes == (1, 16)
    assert args.new_tokens == 128
    assert args.dtype == "bfloat16"
    assert args.tp == 1
    assert args.model == "smollm2"
    assert args.drafter is None
    assert args.num_prompts == 16
    assert args.out is None  # a fresh run folder, chosen when the check runs


def test_options_parse(tmp_path: Path) -> None:
    args = gc.parse_args(
        [
            "--batch-sizes",
            "4,1,32",
            "--tp",
            "2",
            "--dtype",
            "float32",
            "--drafter",
            str(tmp_path),
            "--ragged-verify-mode",
            "cap-accept",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert args.batch_sizes == (4, 1, 32)
    assert args.num_prompts == 32
    assert (args.tp, args.dtype, args.ragged_verify_mode) == (2, "float32", "cap-accept")
    assert args.drafter == tmp_path


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--batch-sizes", "0,16"], "--batch-sizes"),
        (["--batch-sizes", "4,4"], "duplicates"),
        (["--batch-sizes", "a,b"], "comma-separated"),
        (["--tp", "0"], "--tp"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
        (["--dtype", "int8"], "--dtype"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        gc.parse_args(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_resolve_drafter(tmp_path: Path) -> None:
    from dspark_sglang.model import DSparkConfig, DSparkDrafter, TargetSpec, save_drafter

    spec = TargetSpec(
        name="tiny",
        vocab_size=32,
        hidden_size=16,
        num_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
    )
    config = DSparkConfig.for_target(
        spec, mask_token_id=31, num_hidden_layers=1, block_size=2, num_experts=2,
        num_experts_per_tok=1, markov_rank=4, intermediate_size=16,
    )  # fmt: skip
    drafter = DSparkDrafter(config, torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    folder = save_drafter(drafter, tmp_path / "draft")
    assert gc.resolve_drafter(folder) == folder
    # The default is used when nothing is passed.
    assert gc.resolve_drafter(None, default=folder) == folder

    with pytest.raises(FileNotFoundError, match="DRAFTER=<dir>"):
        gc.resolve_drafter(None, default=tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="--drafter"):
        gc.resolve_drafter(tmp_path / "absent")
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(folder / "config.json", partial / "config.json")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        gc.resolve_drafter(partial)


def test_engine_kwargs_are_sglang_server_args(tmp_path: Path) -> None:
    from sglang.srt.server_args import ServerArgs

    fields = set(ServerArgs.__struct_fields__)  # a msgspec Struct in 0.5.23
    args = gc.parse_args(["--tp", "4", "--batch-sizes", "1,8"])
    plain = gc.engine_kwargs(args, tmp_path, None)
    spec = gc.engine_kwargs(args, tmp_path, tmp_path / "draft")
    assert set(plain) <= fields, f"not SGLang server args: {set(plain) - fields}"
    assert set(spec) <= fields, f"not SGLang server args: {set(spec) - fields}"
    assert plain["tp_size"] == 4 and plain["disable_cuda_graph"] is False
    assert plain["cuda_graph_max_bs_decode"] == 8
    assert "speculative_algorithm" not in plain
    assert spec["speculative_algorithm"] == "DSPARK_MOE"
    assert spec["speculative_draft_model_path"] == str(tmp_path / "draft")


# --------------------------------------------------------------------------- results


def test_first_divergence() -> None:
    assert gc.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert gc.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert gc.first_divergence([1, 2], [1, 2, 3]) == 2
    assert gc.first_divergence([], []) is None


def test_compare_accounts_speed_acceptance_and_equality() -> None:
    plain = gc.BatchRun.from_outputs("plain", 2.0, [_out([1, 2, 3, 4]), _out([5, 6, 7, 8])])
    # 8 tokens in 1.0 s; 3 + 2 = 5 verify rounds, 1 + 2 = 3 drafts accepted.
    dspark = gc.BatchRun.from_outputs(
        "dspark", 1.0, [_out([1, 2, 3, 4], 3, 1), _out([5, 6, 0, 8], 2, 2)]
    )
    assert plain.tokens == 8 and plain.verify_ct == 0
    assert dspark.verify_ct == 5 and dspark.correct_drafts == 3
    row = gc.compare(plain, dspark)
    assert row.plain_tokens_per_s == pytest.approx(4.0)
    assert row.dspark_tokens_per_s == pytest.approx(8.0)
    assert row.speedup == pytest.approx(2.0)
    assert row.accept_length == pytest.approx(8 / 5)
    assert row.accepted_drafts_per_round == pytest.approx(3 / 5)
    assert row.identical == 1 and not row.all_identical
    assert row.divergence == (None, 2)

    same = gc.compare(
        plain, gc.BatchRun.from_outputs("dspark", 1.0, [_out([1, 2, 3, 4]), _out([5, 6, 7, 8])])
    )
    assert same.all_identical
    assert same.accept_length is None  # no verify round ran

    with pytest.raises(ValueError, match="modes"):
        gc.compare(dspark, plain)
    with pytest.raises(ValueError, match="outputs for batch size"):
        gc.BatchRun("plain", 3, 1.0, ((1,),))
    with pytest.raises(ValueError, match="wall_s"):
        gc.BatchRun("plain", 1, 0.0, ((1,),))


def test_table_and_json(tmp_path: Path) -> None:
    args = gc.parse_args(["--batch-sizes", "1,2", "--out", str(tmp_path / "gpu_sglang_check.json")])
    rows = [
        gc.compare(
            gc.BatchRun.from_outputs("plain", 1.0, [_out([1, 2])]),
            gc.BatchRun.from_outputs("dspark", 0.5, [_out([1, 2], 1, 1)]),
        ),
        gc.compare(
            gc.BatchRun.from_outputs("plain", 1.0, [_out([1, 2]), _out([3, 4])]),
            gc.BatchRun.from_outputs("dspark", 0.8, [_out([1, 2], 2, 0), _out([3, 9], 1, 1)]),
        ),
    ]
    table = gc.format_table(rows).splitlines()
    assert "speed-up" in table[0] and "accept len" in table[0]
    assert table[2].split() == ["1", "2.0", "4.0", "2.00x", "2.00", "1.00", "1/1"]
    assert table[3].split() == ["2", "4.0", "5.0", "1.25x", "1.33", "0.33", "1/2"]

    doc = gc.result_json(args, rows, model_path="/m", drafter="/d", env={"gpu": "test"})
    gc.write_json(args.out, doc)
    back = json.loads(args.out.read_text())
    assert back["all_identical"] is False
    assert back["settings"]["batch_sizes"] == [1, 2]
    assert back["settings"]["drafter"] == "/d"
    assert back["environment"] == {"gpu": "test"}
    assert [r["speedup"] for r in back["rows"]] == pytest.approx([2.0, 1.25])
    assert back["rows"][1]["divergence"] == [None, 1]


# --------------------------------------------------------------------------- no-GPU skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: it would run")
def test_driver_skips_without_cuda(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    assert gc.main(["--out", str(out)]) == 0
    assert "skipped" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi present")
def test_script_skips_without_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "never.json")}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_sglang_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SKIPPED" in proc.stdout
    assert not (tmp_path / "never.json").exists()
