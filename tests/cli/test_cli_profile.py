"""``dspark-sglang profile`` locally: real SmolLM2 end to end, and clear input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable

from dspark_sglang.cli import main


@pytest.mark.slow
def test_local_profile_of_smollm2_writes_loadable_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", "--points", "1,3,6", "--no-refine", "--warmup", "0", "--repeats", "2"]
    argv += ["--rounds", "1", "--threads", "1", "--context-len", "16", "--out", str(tmp_path)]
    assert main([*argv, "--node-name", "cli-test"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    table = Path(out["table"])
    assert table.parent.parent == tmp_path and table.parent.name.startswith("cpu-")
    assert table.name == "smollm2-135m-instruct-tp1.json"
    sg = SGLangSpsCostTable.from_json(table.read_text())
    meta = json.loads(Path(out["meta"]).read_text())
    assert [p["batch_tokens"] for p in meta["probes"]] == [1, 3, 6] and sg.max_batch_tokens == 256
    # Sizes between the probes are interpolated entries (floor_table.py), listed in the meta.
    interpolated = meta["table"]["interpolated_batch_tokens"]
    assert sorted([1, 3, 6, *interpolated]) == sg.sample_batch_tokens
    assert set(interpolated) <= {2, 4, 5}
    assert meta["nodes"] == ["cli-test"]
    assert meta["backend"]["settings"]["torch_threads"] == 1
    assert [p["samples"] for p in meta["probes"]] == [2, 2, 2]
    assert Path(out["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert table.with_name("smollm2-135m-instruct-tp1.configmap.yaml").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--points", ","], "points is empty"),
        (["--points", "4,2,8"], "strictly increasing"),
        (["--max-batch-tokens", "4", "--points", "1,8"], "exceeds max_tokens"),
        (["--repeats", "0"], "repeats"),
        (["--backend", "sglang"], "profiles GPUs"),
        (["--clock", "thread_cpu", "--threads", "2"], "needs --threads 1"),
    ],
)
def test_malformed_cli_input_fails_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["profile", "--out", str(tmp_path), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
