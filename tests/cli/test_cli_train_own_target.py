"""From a chat JSONL and an HF target folder to a served, deployed drafter, by the guide's commands.

The commands are docs/train-your-own-target.md's own shell blocks, read from the page and
run as written with its folders (``/models``, ``/runs``, ``/data``) moved under a test
directory (``tests/own_target_guide.py``), so page and test cannot drift. The training
config is the page's YAML block with the same folders moved and its sizes shrunk (a
1-layer drafter, 32-token replies, 4 steps). For two tiny random targets with their real
config classes (``tests/tiny_hf_targets.py``: a Qwen3 with tied embeddings, a Llama-3 with
an untied head and its chat template) the ``own_target`` fixture runs steps 2 to 4:

2. ``dspark-sglang train --stage data`` on a messages/ShareGPT JSONL with
   ``data.generator: sglang``: SGLang's CPU ``Engine`` regenerates every assistant turn;
3. ``torchrun --nproc-per-node 2 -m dspark_sglang.cli train --stage train --device cpu``:
   two gloo processes train a reduced-vocabulary DSpark drafter for a few steps
   (inside ``unshare --net`` with only loopback up, so the rendezvous store and gloo
   reach nothing but 127.0.0.1);
4. ``dspark-sglang export-drafter --target <folder>``;

then the exported drafter is loaded under ``--speculative-algorithm DSPARK_MOE`` in
SGLang's real engine, whose greedy output on held-out chat prompts must equal the
target's own (HF transformers greedy), with every request going through verify rounds.

The ``own_target_deployed`` fixture runs steps 5 to 8 on the trained Qwen3 only: two
``bench acceptance`` runs on disjoint splits of a held-out chat JSONL (``--prompts``,
``--eval-sets none``), ``calibrate`` and the export with ``--sts``, a CPU ``profile``,
``plan`` and ``helm template``. Together they cost about two minutes on two cores, mostly
the acceptance runs and the profile, and nothing in them depends on the target's family
(the family-specific parts, the chat template, the mask token and the tied or untied
head, are covered by steps 2 to 4 and the serving test on both targets).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from chart_tools import helm_bin
from hf_greedy import hf_greedy
from own_target_guide import (
    DATA_FILES,
    at_root,
    guide_blocks,
    guide_commands,
    provide_data,
    run_guide_command,
)
from tiny_hf_targets import save_tiny_target

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 16
DRAFT_VOCAB = 1024
BLOCK = 4
#: Five OpenAI-style and two ShareGPT conversations: 7 assistant turns, and one
#: conversation that ends with a user turn.
CHATS = DATA_FILES["/data/my_chats.jsonl"]
#: The page's held-out chats (steps 5 and 7): other conversations, 10 prompts (one row
#: with two replies, one ending with a user turn), two disjoint splits of 5.
HELD_OUT_CHATS = DATA_FILES["/data/heldout.jsonl"]
HELD_OUT = ["Give me a synonym for fast.", "How many legs does a spider have?"]
#: What the test changes in the page's config: sizes a 2-core test trains in seconds.
SMALL = {
    "data": {"max_prompt_tokens": 256, "max_new_tokens": 32, "gen_batch_size": 4},
    "drafter": {
        "block_size": BLOCK,
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
    "run": {"checkpoint_every": 4, "log_every": 1, "threads": 1},
}


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = ["unshare", "--net", "ip", "link", "set", "lo", "up"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def _config(kind: str, root: Path) -> dict[str, Any]:
    """The page's config (folders under ``root``), shrunk by ``SMALL``."""
    ((_, block),) = guide_blocks("yaml")
    cfg = _merge(yaml.safe_load(at_root(block, root)), SMALL)
    if kind == "llama3":
        # A Llama-3 tokenizer has no mask token to detect: name one, as the page says.
        cfg["data"]["mask_token_id"] = 4
    return cfg


def _commands(first: int, last: int) -> list[str]:
    return [c for section, c in guide_commands() if first <= section <= last]


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def own_target(
    request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    if not _netns_available():
        pytest.skip("needs `unshare --net` for a loopback-only torchrun")
    kind = request.param
    root = tmp_path_factory.mktemp(f"own_{kind}")
    target = save_tiny_target(kind, root / "models/my-target", smollm2_path)
    provide_data(root)  # CHATS and HELD_OUT_CHATS where the page reads them
    (root / "my-target.yaml").write_text(yaml.safe_dump(_config(kind, root)))
    commands = _commands(2, 4)
    assert [c.split()[:2] for c in commands] == [
        ["dspark-sglang", "train"],
        ["torchrun", "--nproc-per-node"],
        ["dspark-sglang", "export-drafter"],
    ]
    for command in commands:
        run_guide_command(command, root, netns=command.startswith("torchrun"))
    return {
        "kind": kind,
        "root": root,
        "run": root / "runs/my-target",
        "target": target,
        "drafter": root / "models/my-target-dspark",
    }


@pytest.fixture(scope="module")
def own_target_deployed(own_target: dict[str, Any]) -> dict[str, Any]:
    if own_target["kind"] != "qwen3":
        pytest.skip("steps 5 to 8 run on the Qwen3 target only (module docstring)")
    logs = [run_guide_command(c, own_target["root"], helm=helm_bin()) for c in _commands(5, 8)]
    assert len(logs) == 7
    return {**own_target, "logs": logs}


def test_sglang_regenerated_every_assistant_turn(own_target: dict[str, Any]) -> None:
    from dspark_sglang.training.datagen import load_responses

    records = load_responses(own_target["run"] / "data")
    # 7 assistant turns + 1 conversation ending with a user turn = 8 prompts.
    assert len(records) == 8
    assert all(0 < len(r.response_ids) <= 32 for r in records)
    manifest = json.loads((own_target["run"] / "data/responses/manifest.json").read_text())
    assert manifest["generator"] == "sglang"


def test_two_gloo_processes_trained_a_reduced_vocabulary_drafter(
    own_target: dict[str, Any],
) -> None:
    work = own_target["run"]
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
    assert exported["dspark_config"]["target_name"] == "my-target"
    assert exported["dspark_config"]["block_size"] == BLOCK
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


# --------------------------------------------------------------------------- steps 5 to 8


def _sts_temperatures(path: Path) -> list[float]:
    from dspark_sglang.calibration.sts import load_sts

    return list(load_sts(path).temperatures)


def test_calibration_fits_sts_on_one_split_and_ships_it_with_the_drafter(
    own_target_deployed: dict[str, Any],
) -> None:
    from dspark_sglang.results import local_path

    run = own_target_deployed["run"]
    fit = json.loads((run / "calib/acceptance.json").read_text())
    held_out = json.loads((run / "traces/acceptance.json").read_text())
    assert (fit["command"]["skip_prompts"], held_out["command"]["skip_prompts"]) == (5, 0)
    for report in (fit, held_out):
        assert report["drafters"] == ["dspark"] and report["command"]["num_prompts"] == 5
        assert local_path(report["target"]["path"]) == own_target_deployed["target"]
        assert report["domains"] == ["heldout"] and report["command"]["eval_sets"] == []
        recorded = report["command"]["prompts"]["heldout"]
        assert recorded["sha256"] == hashlib.sha256(HELD_OUT_CHATS.read_bytes()).hexdigest()
        assert recorded["prompts"] == 5 and recorded["skipped"] == {}
        assert report["results"]["dspark"]["heldout"]["num_requests"] == 5
    for split in ("calib", "traces"):
        names = sorted(p.name for p in (run / split / "dspark").iterdir())
        assert names == ["heldout.jsonl", "rollouts_heldout.jsonl"]
    assert "held-out mean ECE" in own_target_deployed["logs"][2]
    temperatures = _sts_temperatures(run / "sts.json")
    assert len(temperatures) == BLOCK
    shipped = own_target_deployed["drafter"] / "sts.json"
    assert shipped.read_bytes() == (run / "sts.json").read_bytes()


def _profile(run: Path) -> Path:
    (table,) = (run / "profiles").glob("*/my-target-tp1.json")
    return table


def test_the_profile_is_a_cost_table_of_the_own_target(
    own_target_deployed: dict[str, Any],
) -> None:
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable

    table = _profile(own_target_deployed["run"])
    sg = SpsCostTable.from_json(table.read_text())
    assert sg.max_batch_tokens == 256 and sg.sample_batch_tokens[0] == 1
    meta = json.loads(table.with_name("my-target-tp1.meta.json").read_text())
    assert meta["model"] == "my-target" and meta["nodes"] == ["my-node"]
    assert table.with_name("my-target-tp1.configmap.yaml").is_file()


def _planned(run: Path) -> dict[str, Any]:
    return yaml.safe_load((run / "values-planned.yaml").read_text())


def test_the_plan_writes_one_tier_per_sla_with_the_table_and_the_fit(
    own_target_deployed: dict[str, Any],
) -> None:
    run = own_target_deployed["run"]
    values = _planned(run)
    assert values["model"] == {"slug": "my-target"}
    tiers = {t["name"]: t for t in values["slaTiers"]}
    assert sorted(tiers) == ["sla-20", "sla-40"]
    table = json.loads(_profile(run).read_text())
    temperatures = _sts_temperatures(run / "sts.json")
    for name, tier in tiers.items():
        assert tier["minTokensPerSecPerUser"] == float(name.removeprefix("sla-"))
        assert tier["scheduler"]["blockSize"] == BLOCK
        assert tier["scheduler"]["maxRunningRequests"] >= 1
        inline = tier["costTable"]["inline"]
        assert inline["sample_batch_tokens"] == table["sample_batch_tokens"]
        assert inline["sample_steps_per_sec"] == pytest.approx(table["sample_steps_per_sec"])
        assert tier["sts"]["inline"]["temperatures"] == pytest.approx(temperatures)


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_chart_serves_each_planned_tier_with_the_own_drafter(
    own_target_deployed: dict[str, Any],
) -> None:
    run = own_target_deployed["run"]
    docs = [d for d in yaml.safe_load_all((run / "manifests.yaml").read_text()) if d]
    tiers = {t["name"]: t for t in _planned(run)["slaTiers"]}
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == len(tiers) == 2
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    table = json.loads(_profile(run).read_text())
    for dep in deployments:
        tier = tiers[dep["metadata"]["labels"]["dspark-sglang.io/sla-tier"]]
        pod = dep["spec"]["template"]["spec"]
        (server,) = [c for c in pod["containers"] if "--model-path" in c.get("args", [])]
        args = server["args"]
        assert _arg(args, "--model-path") == str(own_target_deployed["target"])
        assert _arg(args, "--speculative-draft-model-path") == str(own_target_deployed["drafter"])
        assert _arg(args, "--speculative-algorithm") == "DSPARK_MOE"
        assert _arg(args, "--speculative-num-draft-tokens") == str(BLOCK + 1)
        assert _arg(args, "--max-running-requests") == str(tier["scheduler"]["maxRunningRequests"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        sps = json.loads(configmaps[volumes["cost-table"]["configMap"]["name"]]["sps.json"])
        assert sps["sample_batch_tokens"] == table["sample_batch_tokens"]
        sts = json.loads(configmaps[volumes["sts"]["configMap"]["name"]]["sts.json"])
        assert sts["temperatures"] == pytest.approx(_sts_temperatures(run / "sts.json"))
