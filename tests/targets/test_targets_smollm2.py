"""SmolLM2 GGUF -> HF conversion: same model, cached, complete-or-absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cpu_threads import torch_threads

from dspark_sglang.targets import smollm2 as s

torch.set_num_threads(torch_threads())


def test_missing_gguf_names_the_fetch_script(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"scripts/fetch_assets\.sh"):
        s.ensure_smollm2(tmp_path)
    assert not s.converted_dir(tmp_path).exists()


def test_unrecorded_folder_is_not_taken_as_converted(tmp_path: Path) -> None:
    """A folder without the record file (e.g. from a crash) is never used."""
    folder = s.converted_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert not s.is_converted(folder)
    (folder / s.RECORD_FILENAME).write_text("{}")
    assert s.is_converted(folder)


def test_cache_root_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "c"))
    assert s.cache_root() == tmp_path / "c"
    assert s.converted_dir().parent == tmp_path / "c" / "models"
    monkeypatch.delenv("DSPARK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert s.cache_root() == tmp_path / "x" / "dspark-sglang"


@pytest.mark.slow
def test_converted_model_equals_gguf_model() -> None:
    """Load the GGUF with transformers (slow, ~30 s) and compare with the cached copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark_sglang.targets.hf_target import HFTarget

    path = s.ensure_smollm2()
    assert s.is_converted(path)
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "float32"
    record = json.loads((path / s.RECORD_FILENAME).read_text())
    gguf = s.gguf_path()
    assert record["source_sha256"] == s.sha256_file(gguf)

    target = HFTarget(path)
    ref_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    assert target.tokenizer is not None
    ids = target.encode_chat(messages)
    assert ids == [
        int(t)
        for t in ref_tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    ]
    with torch.inference_mode():
        ref_logits = ref(input_ids=torch.tensor([ids])).logits.float()
    logits, _, _ = target.forward(torch.tensor([ids]), None, 0, ())
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    greedy = s._greedy_tokens(target.model, ids, 12)
    assert greedy == s._greedy_tokens(ref, ids, 12)
    assert record["gguf_greedy_tokens"] == s._greedy_tokens(
        target.model, record["check_prompt_ids"], s.CHECK_NEW_TOKENS
    )
