"""Response generation (resumable shards) and the bfloat16 hidden-state cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_training_target import EOS, PAD, TINY_LAYER_IDS, tiny_llama, tiny_prompts

from dspark_sglang.training.datagen import (
    HIDDEN_DIR,
    INDEX_FILE,
    RESPONSES_DIR,
    GenerationSettings,
    cache_hidden_states,
    generate_responses,
    left_pad,
    load_responses,
    read_index,
    throughput,
)
from dspark_sglang.training.dataset import HiddenCache

SETTINGS = GenerationSettings(max_new_tokens=24, batch_size=3, seed=7)


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("shard-*.jsonl"))}


def test_killed_and_resumed_generation_gives_identical_shards(tmp_path: Path) -> None:
    model, prompts = tiny_llama(), tiny_prompts(10)
    kw = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}
    full = generate_responses(model, prompts, tmp_path / "a", SETTINGS, **kw)

    part = tmp_path / "b"
    generate_responses(model, prompts, part, SETTINGS, max_batches=2, **kw)
    root = part / RESPONSES_DIR
    assert sorted(read_index(root)) == [0, 1]
    # Simulate a crash in the middle of batch 2: a torn shard and a torn index line.
    (root / "shard-00002.jsonl").write_bytes(b'{"id": "p006", "dom')
    with open(root / INDEX_FILE, "ab") as fh:
        fh.write(b'{"shard": "shard-00002.jsonl", "bat')
    torch.manual_seed(12345)  # the global RNG state must not matter on resume
    resumed = generate_responses(model, prompts, part, SETTINGS, **kw)

    assert _shard_bytes(tmp_path / "a" / RESPONSES_DIR) == _shard_bytes(root)
    assert [r.id for r in resumed] == [p.id for p in prompts]
    assert resumed == full
    for rec, p in zip(full, prompts, strict=True):
        assert rec.prompt_ids == p.prompt_ids
        assert 1 <= len(rec.response_ids) <= SETTINGS.max_new_tokens
        assert rec.finished == (rec.response_ids[-1] == EOS)
        assert EOS not in rec.response_ids[:-1]
    assert throughput(tmp_path / "a" / RESPONSES_DIR)["tokens"] == sum(
        len(r.response_ids) for r in full
    )


def test_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    model, prompts = tiny_llama(), tiny_prompts(3)
    kw = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}
    generate_responses(model, prompts, tmp_path, SETTINGS, max_batches=1, **kw)
    other = GenerationSettings(max_new_tokens=25, batch_size=3, seed=7)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_responses(model, prompts, tmp_path, other, **kw)


def test_generation_samples_from_the_full_distribution(tmp_path: Path) -> None:
    # Temperature 1, no top-k: the first generated token of a fixed prompt must follow
    # softmax(logits). 240 draws of a 96-way categorical; chi-square over the tokens with
    # expected count >= 5 (others pooled), df <= 95, threshold at p = 0.001.
    model = tiny_llama()
    prompt = tiny_prompts(1)[0]
    prompts = [
        type(prompt)(id=f"r{i}", domain="chat", prompt_ids=prompt.prompt_ids) for i in range(240)
    ]
    recs = generate_responses(
        model,
        prompts,
        tmp_path,
        GenerationSettings(max_new_tokens=1, batch_size=48, seed=1),
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        progress=False,
    )
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt.prompt_ids])).logits[0, -1], -1)
    counts = torch.bincount(torch.tensor([r.response_ids[0] for r in recs]), minlength=96)
    expected = p * len(recs)
    big = expected >= 5
    obs = torch.cat([counts[big].float(), counts[~big].sum().float().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp.clamp_min(1e-9)).sum())
    df = int(big.sum())
    from scipy.stats import chi2 as chi2_dist

    assert chi2 < chi2_dist.ppf(0.999, df), (chi2, df)


def test_temperature_zero_regenerates_the_targets_greedy_continuation(tmp_path: Path) -> None:
    # data.temperature 0: every response is the target's argmax continuation, token by
    # token (checked against a plain argmax loop over the model's own logits), and the
    # manifest pins the temperature so a resume at temperature 1 is refused.
    model, prompts = tiny_llama(), tiny_prompts(6)
    greedy = GenerationSettings(max_new_tokens=12, batch_size=3, seed=7, temperature=0)
    kw = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}
    recs = generate_responses(model, prompts, tmp_path, greedy, **kw)
    for rec, prompt in zip(recs, prompts, strict=True):
        ids = list(prompt.prompt_ids)
        expect: list[int] = []
        with torch.no_grad():
            while len(expect) < greedy.max_new_tokens:
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                expect.append(nxt)
                ids.append(nxt)
                if nxt == EOS:
                    break
        assert rec.response_ids == expect, rec.id
    sampled = GenerationSettings(max_new_tokens=12, batch_size=3, seed=7)
    with pytest.raises(ValueError, match="temperature"):
        generate_responses(model, prompts + tiny_prompts(9)[6:], tmp_path, sampled, **kw)
    with pytest.raises(ValueError, match=r"data.temperature must be >= 0"):
        GenerationSettings(temperature=-1.0)


def test_hidden_cache_matches_the_target_forward(tiny_data_dir: Path) -> None:
    model = tiny_llama()
    cache = HiddenCache(tiny_data_dir)
    records = load_responses(tiny_data_dir)
    assert cache.ids == [r.id for r in records]
    for i in (0, 5, 15):
        seq = cache[i]
        rec = records[i]
        assert seq.tokens.tolist() == rec.prompt_ids + rec.response_ids
        assert seq.response_start == len(rec.prompt_ids)
        with torch.no_grad():
            out = model(seq.tokens.unsqueeze(0), output_hidden_states=True)
        expect_aux = torch.cat([out.hidden_states[l + 1][0] for l in TINY_LAYER_IDS], -1)
        assert seq.aux.dtype == seq.last.dtype == torch.bfloat16
        # bfloat16 keeps 8 significant bits: one rounding is within 2^-9 relative (the
        # cache pass batches sequences, so float32 rounding may differ in the last ulp).
        torch.testing.assert_close(seq.aux.float(), expect_aux, atol=1e-6, rtol=2**-8)
        # LM head on the cached last state reproduces the target logits (bfloat16 cache).
        with torch.no_grad():
            logits = model.lm_head(seq.last.float())
        torch.testing.assert_close(logits, out.logits[0], atol=6e-2, rtol=2e-2)


def test_hidden_pass_is_resumable(tmp_path: Path, tiny_data_dir: Path) -> None:
    import shutil

    work = tmp_path / "d"
    shutil.copytree(tiny_data_dir / RESPONSES_DIR, work / RESPONSES_DIR)
    model = tiny_llama()
    cache_hidden_states(model, work, TINY_LAYER_IDS, batch_size=4, pad_token_id=PAD, progress=False)
    root = work / HIDDEN_DIR
    first = {e.shard: e.sha256 for e in read_index(root).values()}
    # Drop the last shard's index line: the next run must redo exactly that shard.
    lines = (root / INDEX_FILE).read_text().splitlines()
    (root / INDEX_FILE).write_text("\n".join(lines[:-1]) + "\n")
    cache_hidden_states(model, work, TINY_LAYER_IDS, batch_size=2, pad_token_id=PAD, progress=False)
    second = {e.shard: e.sha256 for e in read_index(root).values()}
    assert second == first
    assert json.loads((root / "manifest.json").read_text())["layer_ids"] == list(TINY_LAYER_IDS)
    with pytest.raises(ValueError, match="layer_ids"):
        cache_hidden_states(model, work, (0, 1), progress=False)


def test_time_boxed_data_stage_trains_on_what_exists_and_completes_later(
    tmp_path: Path,
) -> None:
    # `train --stage data --gen-batches N`: generate N batches, cache them, train on them;
    # a later run without the cap generates and caches only the rest, and leaves the
    # first batches' shards byte-identical.
    model, prompts = tiny_llama(), tiny_prompts(9)
    kw = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}
    generate_responses(model, prompts, tmp_path, SETTINGS, max_batches=2, **kw)
    cache_hidden_states(model, tmp_path, TINY_LAYER_IDS, pad_token_id=PAD, progress=False)
    partial = HiddenCache(tmp_path)
    assert len(partial) == 6
    first = {e.shard: e.sha256 for e in read_index(tmp_path / HIDDEN_DIR).values()}
    generate_responses(model, prompts, tmp_path, SETTINGS, **kw)
    cache_hidden_states(model, tmp_path, TINY_LAYER_IDS, pad_token_id=PAD, progress=False)
    full = {e.shard: e.sha256 for e in read_index(tmp_path / HIDDEN_DIR).values()}
    assert len(HiddenCache(tmp_path)) == 9
    assert {k: full[k] for k in first} == first
    assert len(full) == 3


def test_bfloat16_sampling_leaves_the_float32_target_untouched(tmp_path: Path) -> None:
    """``data.gen_dtype: bfloat16`` samples from a copy: the hidden-state pass that follows
    must still see the exact float32 weights, and the manifest must pin the precision."""
    model, prompts = tiny_llama(), tiny_prompts(4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bf16 = GenerationSettings(max_new_tokens=8, batch_size=2, seed=7, dtype="bfloat16")
    kw = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}
    recs = generate_responses(model, prompts, tmp_path, bf16, **kw)
    assert [r.id for r in recs] == [p.id for p in prompts]
    assert all(1 <= len(r.response_ids) <= 8 for r in recs)
    after = model.state_dict()
    assert all(
        after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items()
    )
    manifest = json.loads((tmp_path / RESPONSES_DIR / "manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16"
    # Resuming the directory at another precision would mix two samplers: refused, named.
    fp32 = GenerationSettings(max_new_tokens=8, batch_size=2, seed=7)
    assert "dtype" not in fp32.manifest()  # float32 dirs made before the field still resume
    with pytest.raises(ValueError, match="dtype"):
        generate_responses(model, prompts, tmp_path, fp32, **kw)
    with pytest.raises(ValueError, match=r"data\.gen_dtype"):
        GenerationSettings(dtype="float16")


def test_left_padded_rows_score_like_each_prompt_alone() -> None:
    # Prompts of different lengths share one batch only if padding goes on the left and is
    # masked: each row's last-position logits must then equal that prompt run on its own.
    model = tiny_llama()
    prompts = [p.prompt_ids for p in tiny_prompts(4)]
    assert len({len(p) for p in prompts}) > 1
    ids, attn = left_pad(prompts, PAD)
    assert ids.shape == (4, max(len(p) for p in prompts))
    for j, p in enumerate(prompts):
        assert ids[j, ids.shape[1] - len(p) :].tolist() == list(p)
        assert attn[j].sum() == len(p) and attn[j, -1] == 1
    with torch.no_grad():
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        batched = model(ids, attention_mask=attn, position_ids=pos).logits[:, -1]
        for j, p in enumerate(prompts):
            alone = model(torch.tensor([p])).logits[0, -1]
            torch.testing.assert_close(batched[j], alone, atol=1e-4, rtol=1e-4)
