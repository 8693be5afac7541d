"""From a chat JSONL and an HF target folder to a drafter SGLang serves, by the commands users run.

For two tiny random targets with their real config classes (``tests/tiny_hf_targets.py``:
a Qwen3 with tied embeddings, a Llama-3 with an untied head and its chat template), the
test runs, as subprocesses:

1. ``dspark-sglang train --stage data`` on a messages/ShareGPT JSONL with
   ``data.generator: sglang``: SGLang's CPU ``Engine`` regenerates every assistant turn;
2. ``torchrun --nproc-per-node 2 -m dspark_sglang.cli train --stage train --device cpu``:
   two gloo processes train a reduced-vocabulary DSpark drafter for a few steps
   (inside ``unshare --net`` with only loopback up, so the rendezvous store and gloo
   reach nothing but 127.0.0.1);
3. ``dspark-sglang export-drafter --target <folder>``;

then loads the exported drafter under ``--speculative-algorithm DSPARK_MOE`` in SGLang's
real engine and checks its greedy output on held-out chat prompts equals the target's
own (HF transformers greedy), with every request going through verify rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hf_greedy import hf_greedy
from tiny_hf_targets import save_tiny_target

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 16
DRAFT_VOCAB = 1024
#: Five OpenAI-style and two ShareGPT conversations: 7 assistant turns, and one
#: conversation that ends with a user turn.
CHATS = Path(__file__).parent / "data" / "own_target_chats.jsonl"
HELD_OUT = ["Give me a synonym for fast.", "How many legs does a spider have?"]


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = ["unshare", "--net", "ip", "link", "set", "lo", "up"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def _run(cmd: list[str], cwd: Path, *, netns: bool = False, timeout: int = 600) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    if netns:
        shell = "ip link set lo up && exec " + " ".join(cmd)
        cmd = ["unshare", "--net", "bash", "-c", shell]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def _config(kind: str, target: Path, work: Path, chats: Path) -> dict[str, Any]:
    data: dict[str, Any] = {
        "dir": str(work / "data"),
        "sources": [{"kind": "jsonl", "path": str(chats)}],
        "generator": "sglang",
        "max_prompt_tokens": 256,
        "max_new_tokens": 32,
        "gen_batch_size": 4,
    }
    if kind == "llama3":
        # A Llama-3 tokenizer has no mask token to detect: name one, as users must.
        data["mask_token_id"] = 4
    return {
        "name": f"own_{kind}",
        "target": {"name": str(target), "layer_ids": None},
        "data": data,
        "drafter": {
            "kind": "dspark",
            "block_size": 4,
            "model": {
                "num_hidden_layers": 1,
                "num_experts": 2,
                "num_experts_per_tok": 1,
                "moe_intermediate_size": 64,
                "shared_expert_intermediate_size": 64,
                "sliding_window": 16,
                "markov_rank": 16,
                "draft_vocab_size": DRAFT_VOCAB,
            },
        },
        "anchors": {"anchors_per_seq": 8, "max_anchors_per_batch": 16, "max_tokens_per_batch": 512},
        "optim": {"lr": 1e-3, "warmup_steps": 1, "max_steps": 4},
        "run": {
            "out_dir": str(work / "train"),
            "checkpoint_every": 4,
            "log_every": 1,
            "threads": 1,
        },
    }


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def own_target(
    request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    if not _netns_available():
        pytest.skip("needs `unshare --net` for a loopback-only torchrun")
    kind = request.param
    work = tmp_path_factory.mktemp(f"own_{kind}")
    target = save_tiny_target(kind, work / "target", smollm2_path)
    chats = work / "chats.jsonl"
    shutil.copy(CHATS, chats)
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump(_config(kind, target, work, chats)))
    cli = [sys.executable, "-m", "dspark_sglang.cli"]
    logs = {"data": _run([*cli, "train", "--config", str(cfg), "--stage", "data"], work)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", "29531"]
    train = [*cli[1:], "train", "--config", str(cfg), "--stage", "train", "--device", "cpu"]
    logs["train"] = _run([*torchrun, *train, "--threads", "1"], work, netns=True)
    exported = work / "drafter"
    export = ["export-drafter", "--from", str(work / "train"), "--to", str(exported)]
    logs["export"] = _run([*cli, *export, "--target", str(target)], work)
    return {"kind": kind, "work": work, "target": target, "drafter": exported, "logs": logs}


def test_sglang_regenerated_every_assistant_turn(own_target: dict[str, Any]) -> None:
    from dspark_sglang.training.datagen import load_responses

    records = load_responses(own_target["work"] / "data")
    # 7 assistant turns + 1 conversation ending with a user turn = 8 prompts.
    assert len(records) == 8
    assert all(0 < len(r.response_ids) <= 32 for r in records)
    manifest = json.loads((own_target["work"] / "data/responses/manifest.json").read_text())
    assert manifest["generator"] == "sglang"


def test_two_gloo_processes_trained_a_reduced_vocabulary_drafter(
    own_target: dict[str, Any],
) -> None:
    work = own_target["work"]
    log = [json.loads(x) for x in (work / "train/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(r["total"])) for r in log)
    state = torch.load(
        next((work / "train/checkpoints").glob("step-*")) / "train_state.pt", weights_only=False
    )
    assert state["world_size"] == 2
    report = json.loads((work / "train/draft_vocab.json").read_text())
    assert report["draft_vocab_size"] == DRAFT_VOCAB and report["coverage"] == 1.0
    exported = json.loads((own_target["drafter"] / "config.json").read_text())
    assert exported["dspark_config"]["draft_vocab_size"] == DRAFT_VOCAB
    assert exported["dspark_config"]["target_name"] == "target"
    if own_target["kind"] == "llama3":
        assert exported["dspark_config"]["mask_token_id"] == 4


def test_sglang_serves_the_exported_drafter_with_the_targets_greedy_output(
    own_target: dict[str, Any],
) -> None:
    from transformers import AutoTokenizer

    from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs

    target = own_target["target"]
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for q in HELD_OUT
    ]
    spec = CpuEngineSpec(
        model_path=str(target),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(own_target["drafter"]),
        },
        env={"SGLANG_RAGGED_VERIFY_MODE": "static"},
    )
    with cpu_engine(spec) as engine:
        outputs = generate_outputs(engine, prompts, NEW_TOKENS)
    expected = hf_greedy(target, prompts, NEW_TOKENS)
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        assert list(out["output_ids"]) == ref, f"{own_target['kind']} prompt {i}"
        assert int(out["meta_info"]["spec_verify_ct"]) > 0, "the drafter never ran"
