"""``data.hidden_states: sglang``: SGLang's real CPU engine captures the target's hidden
states in the regeneration pass, and the cache equals the Hugging Face forward's.

Tolerance (float32 engine and HF forward, both stored in bfloat16): every value within one
bfloat16 step of the HF value (``rtol = 2**-7``) plus ``1e-3`` of the layer's RMS (the two
float32 computations differ by kernel rounding, which can put a value on either side of a
bfloat16 rounding boundary; values near zero need the absolute term). A layer one off
(``l - 1`` or ``l + 1``) breaks this tolerance at most of its values: checked too, so an
off-by-one in the capture convention cannot pass.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_chat_target import encoded_chats
from tiny_hf_targets import save_tiny_target

from dspark_sglang.sglang_integration.hidden_capture import (
    capture_env,
    capture_server_args,
    with_final_state,
)
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.capture_sglang import (
    CaptureWriter,
    capture_sampler,
    fill_missing,
    rows_to_states,
)
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.datagen import (
    HIDDEN_DIR,
    RESPONSES_DIR,
    GenerationSettings,
    cache_hidden_states,
    regenerate_responses,
    target_hidden_states,
)
from dspark_sglang.training.datagen_store import INDEX_FILE
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.regen_sglang import EngineSettings, open_engine

NEW = 12
LAYERS = {"smollm2": [1, 8, 14, 20, 27], "qwen3": [0, 2, 4], "llama3": [0, 2, 4]}


# --------------------------------------------------------------------------- pure parts


class _Mode:
    def __init__(self, full: bool) -> None:
        self.full = full

    def is_full(self) -> bool:
        return self.full


class _Meta:
    def __init__(self, full: bool) -> None:
        self.capture_hidden_mode = _Mode(full)


def test_the_hook_appends_the_normed_state_to_a_full_aux_capture_only() -> None:
    aux = [torch.ones(3, 2), 2 * torch.ones(3, 2)]
    normed = 5 * torch.ones(3, 2)

    def original(_proc: Any, hidden: Any, before: Any, aux_hs: Any, *rest: Any) -> Any:
        return torch.cat(aux_hs, -1) if aux_hs is not None else hidden

    out = with_final_state(original, None, normed, None, aux, None, None, None, _Meta(True))
    assert out.tolist() == [[1, 1, 2, 2, 5, 5]] * 3
    # A "last" capture, no aux capture, or a model that returns its pre-norm state: as is.
    assert with_final_state(original, None, normed, None, aux, None, _Meta(False)).shape[1] == 4
    assert with_final_state(original, None, normed, None, None, _Meta(True)) is normed
    assert with_final_state(original, None, normed, normed, aux, _Meta(True)).shape[1] == 4


def test_rows_become_states_with_the_last_tokens_row_zero() -> None:
    n, h = 2, 3
    prefill = torch.arange(4 * 9, dtype=torch.float32).view(4, 9).tolist()
    decode = [[100.0] * 9, [200.0] * 9]
    aux, last = rows_to_states([prefill, *decode], n, h, num_tokens=7)
    assert aux.shape == (7, 6) and last.shape == (7, 3)
    assert aux[:4].tolist() == torch.tensor(prefill)[:, :6].tolist()
    assert last[5].tolist() == [200.0] * 3 and last[6].tolist() == [0.0] * 3
    assert aux[6].abs().sum() == 0
    # An output cut at EOS: the rows past it are dropped.
    aux, _ = rows_to_states([prefill, *decode], n, h, num_tokens=5)
    assert aux.shape == (5, 6) and aux[3].tolist() == prefill[3][:6]


@pytest.mark.parametrize(
    ("width", "rows", "match"),
    [
        (6, 6, "DSPARK_CAPTURE_FINAL_STATE=1"),
        (12, 6, r"width 12, expected 9 = \(2 layers"),
        (9, 3, "--disable-radix-cache"),
    ],
)
def test_rows_a_capture_server_would_not_send_are_refused_naming_the_setting(
    width: int, rows: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        rows_to_states([[[0.0] * width] * rows], 2, 3, num_tokens=6)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"hidden_states": "sglang"}, r"data\.generator is 'hf': set data\.generator: sglang"),
        (
            {
                "hidden_states": "sglang",
                "generator": "sglang",
                "sglang_args": {"disable_radix_cache": False},
            },
            r"data\.sglang_args sets \['disable_radix_cache'\]",
        ),
        ({"hidden_states": "sglang_capture"}, r"data\.hidden_states must be 'cache'.*'sglang'"),
    ],
)
def test_capture_settings_are_checked_by_name(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict({"name": "x", "data": data})


def test_a_layer_id_the_target_cannot_capture_is_refused_naming_the_field() -> None:
    from dspark_sglang.training.drafters import resolve_layer_ids

    cfg = TrainConfig.from_dict({"name": "x", "target": {"layer_ids": [0, 2, 5]}})
    assert resolve_layer_ids(cfg, 7) == (0, 2, 5)
    with pytest.raises(
        ValueError, match=r"target\.layer_ids \[0, 2, 5\] has \[5\] outside \[0, 4\]"
    ):
        resolve_layer_ids(cfg, 6)


# --------------------------------------------------------------------------- engines


@pytest.fixture(scope="module")
def targets(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("capture_targets")
    out = {"smollm2": smollm2_path}
    for kind in ("qwen3", "llama3"):
        out[kind] = save_tiny_target(kind, root / kind, smollm2_path)
    return out


@pytest.fixture(scope="module")
def hf(targets: dict[str, Path]) -> dict[str, HFTarget]:
    return {k: HFTarget(p) for k, p in targets.items()}


def _engine(path: Path, layer_ids: list[int]) -> Any:
    return open_engine(
        EngineSettings(
            model_path=str(path), extra=capture_server_args(layer_ids), env=capture_env()
        )
    )


def _capture(
    engine: Any, target: HFTarget, out: Path, layer_ids: list[int], n: int = 4, **kw: Any
) -> None:
    settings = GenerationSettings(
        max_new_tokens=NEW, batch_size=2, temperature=0.0, generator="sglang"
    )
    writer = CaptureWriter(out, layer_ids, target.spec)
    regenerate_responses(
        capture_sampler(engine, settings, target.eos_token_ids, kw.pop("in_flight", 8), writer),
        encoded_chats(target, n, prefix="p"),
        out,
        settings,
        pad_token_id=0,
        eos_token_ids=target.eos_token_ids,
        progress=False,
        after_shard=writer.after_shard,
        **kw,
    )
    fill_missing(engine, writer, 8)


def _hf_cache(target: HFTarget, captured: Path, out: Path, layer_ids: list[int]) -> HiddenCache:
    """The HF forward's cache of the same response shards."""
    shutil.copytree(captured / RESPONSES_DIR, out / RESPONSES_DIR)
    cache_hidden_states(target.model, out, layer_ids, progress=False)
    return HiddenCache(out)


def _close(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Elementwise: within the module's tolerance of ``ref``."""
    got, ref = got.float(), ref.float()
    rms = ref.pow(2).mean().sqrt()
    return (got - ref).abs() <= 2**-7 * ref.abs() + 1e-3 * rms


def _assert_same_states(a: HiddenCache, b: HiddenCache, n_layers: int, hidden: int) -> None:
    assert a.ids == b.ids and len(a) >= 2
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x.tokens, y.tokens) and x.response_start == y.response_start
        for j in range(n_layers):
            cols = slice(j * hidden, (j + 1) * hidden)
            assert _close(x.aux[:-1, cols], y.aux[:-1, cols]).all(), (i, j)
        assert _close(x.last[:-1], y.last[:-1]).all(), i


@pytest.mark.sglang
@pytest.mark.parametrize("kind", ["smollm2", "qwen3", "llama3"])
def test_captured_states_equal_the_hf_forward_layer_by_layer(
    kind: str, targets: dict[str, Path], hf: dict[str, HFTarget], tmp_path: Path
) -> None:
    target, layer_ids = hf[kind], LAYERS[kind]
    with _engine(targets[kind], layer_ids) as engine:
        _capture(engine, target, tmp_path / "cap", layer_ids)
    cap = HiddenCache(tmp_path / "cap")
    assert cap.manifest["captured_by"] == "sglang"
    ref = _hf_cache(target, tmp_path / "cap", tmp_path / "hf", layer_ids)
    hidden = target.spec.hidden_size
    _assert_same_states(cap, ref, len(layer_ids), hidden)
    # Prompts share the chat template's prefix: every row came back (no radix reuse).
    first = [cap[i].tokens[: cap[i].response_start].tolist() for i in range(2)]
    assert first[0][:4] == first[1][:4]
    for i in range(len(cap)):
        assert cap[i].aux[-1].abs().sum() == 0 and cap[i].last[-1].abs().sum() == 0
    # The tolerance tells layers apart: captured layer l against the HF output of l +/- 1.
    seq = cap[0]
    x = torch.tensor([seq.tokens.tolist()])
    for j, lid in enumerate(layer_ids):
        got = seq.aux[:-1, j * hidden : (j + 1) * hidden]
        for other in (lid - 1, lid + 1):
            if not 0 <= other < target.spec.num_layers - 1:
                continue
            aux, _ = target_hidden_states(target.model, x, torch.ones_like(x), [other])
            assert _close(got, aux[0, :-1]).float().mean() < 0.5, (lid, other)


@pytest.mark.sglang
def test_capture_under_tensor_parallelism_gives_the_same_cache(
    targets: dict[str, Path], hf: dict[str, HFTarget], tmp_path: Path
) -> None:
    target, layer_ids = hf["qwen3"], LAYERS["qwen3"]
    with _engine(targets["qwen3"], layer_ids) as engine:
        _capture(engine, target, tmp_path / "tp1", layer_ids)
    tp2 = open_engine(
        EngineSettings(
            model_path=str(targets["qwen3"]),
            extra={**capture_server_args(layer_ids), "tp_size": 2},
            env={**capture_env(), "SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
        )
    )
    with tp2 as engine:
        _capture(engine, target, tmp_path / "tp2", layer_ids)
    a, b = HiddenCache(tmp_path / "tp1"), HiddenCache(tmp_path / "tp2")
    hidden = target.spec.hidden_size
    _assert_same_states(b, a, len(layer_ids), hidden)
    ref = _hf_cache(target, tmp_path / "tp2", tmp_path / "hf", layer_ids)
    _assert_same_states(b, ref, len(layer_ids), hidden)


@pytest.fixture
def qwen3_engine(targets: dict[str, Path]) -> Iterator[Any]:
    with _engine(targets["qwen3"], LAYERS["qwen3"]) as engine:
        yield engine


@pytest.mark.sglang
def test_an_interrupted_capture_resumes_to_the_same_cache(
    qwen3_engine: Any, hf: dict[str, HFTarget], tmp_path: Path
) -> None:
    target, layer_ids = hf["qwen3"], LAYERS["qwen3"]
    hidden = target.spec.hidden_size
    _capture(qwen3_engine, target, tmp_path / "whole", layer_ids, n=6)
    part = tmp_path / "part"
    _capture(qwen3_engine, target, part, layer_ids, n=6, max_batches=1, in_flight=2)
    assert len(HiddenCache(part)) == 2
    # A kill between a response shard and its hidden shard: batch 1's states never written.
    _capture(qwen3_engine, target, part, layer_ids, n=6, max_batches=1, in_flight=2)
    index = part / HIDDEN_DIR / INDEX_FILE
    lines = index.read_text().splitlines()
    index.write_text("\n".join(lines[:1]) + "\n")
    shutil.rmtree(part / HIDDEN_DIR / "shard-00001")
    _capture(qwen3_engine, target, part, layer_ids, n=6, in_flight=3)
    _assert_same_states(HiddenCache(part), HiddenCache(tmp_path / "whole"), len(layer_ids), hidden)
    # The same directory with other layer ids is refused, naming them.
    with pytest.raises(ValueError, match=r"different settings \(\['layer_ids'\]\)"):
        CaptureWriter(part, [0, 1, 4], target.spec)
    # ... and so is another target, naming it.
    other = dataclasses.replace(target.spec, name="another-target")
    with pytest.raises(ValueError, match=r"different settings \(\['target'\]\)"):
        CaptureWriter(part, layer_ids, other)


@pytest.mark.sglang
def test_the_data_stage_writes_the_cache_from_the_regeneration_pass(
    tiny_chat_model: HFTarget,
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dspark_sglang.training.pipeline import run_data_stage

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    messages = Path(__file__).parents[1] / "data" / "fixtures" / "chats_messages.jsonl"
    cfg = TrainConfig.from_dict(
        {
            "name": "capture",
            "target": {"name": str(tiny_chat_model.path), "layer_ids": [0, 1, 2]},
            "data": {
                "dir": str(tmp_path / "data"),
                "sources": [{"kind": "jsonl", "path": str(messages)}],
                "max_prompt_tokens": 200,
                "max_new_tokens": NEW,
                "gen_batch_size": 2,
                "generator": "sglang",
                "hidden_states": "sglang",
                "temperature": 0,
            },
            "drafter": {"block_size": 4},
            "run": {"out_dir": str(tmp_path / "run"), "threads": 1},
        }
    )
    figures = run_data_stage(cfg, tiny_chat_model, limit=4, progress=False)
    cap = HiddenCache(tmp_path / "data")
    assert cap.manifest["captured_by"] == "sglang" and len(cap) == 4
    assert figures["hidden_tokens"] == sum(cap.seq_lens)
    ref = _hf_cache(tiny_chat_model, tmp_path / "data", tmp_path / "hf", [0, 1, 2])
    _assert_same_states(cap, ref, 3, tiny_chat_model.spec.hidden_size)
    # The train stage reads the captured cache with only the target's two heads in memory,
    # and trains exactly as with the whole target.
    from dspark_sglang.training.pipeline import load_target, run_train_stage

    heads = load_target(cfg, ("data", "train"))
    assert heads.model.get_decoder().layers[0].mlp.down_proj.weight.is_meta
    runs = []
    for i, target in enumerate((heads, tiny_chat_model)):
        over = cfg.with_overrides(
            optim={"warmup_steps": 1, "max_steps": 2},
            run={"out_dir": str(tmp_path / f"run{i}")},
        )
        runs.append(run_train_stage(over, target, resume=False, progress=False))
    assert [(r.first_loss, r.last_loss) for r in runs[:1]] == [
        (r.first_loss, r.last_loss) for r in runs[1:]
    ]
    # A train stage on another target is refused, naming both.
    from dspark_sglang.training.batch_plan import check_sequences

    name = tiny_chat_model.spec.name
    check_sequences(cfg, cap, None, torch.device("cpu"), (0, 1, 2), name)
    with pytest.raises(ValueError, match=rf"target {name!r} but target\.name is 'other'"):
        check_sequences(cfg, cap, None, torch.device("cpu"), (0, 1, 2), "other")
