"""``benchmarks/draft_headroom.py``: its replay of greedy rounds counts what the reference
generator accepts, a tree branches slot 1 over the drafter's top tokens with the chain
``sample_block`` draws as its first branch, and the committed result's figures
follow from its raw counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_scripts import REPO, load_benchmark

from dspark_sglang.model import DSparkConfig, DSparkDrafter, sample_block
from dspark_sglang.model.checkpoint import load_drafter
from dspark_sglang.reference.generator import ReferenceGenerator
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.cost_table import additive_from_probes, from_probes, parse_cost_table
from dspark_sglang.scheduling.policies import build_policy

RESULT = REPO / "benchmarks" / "results" / "draft_headroom.json"
CHATS = ["Tell me a story about a cat.", "List three colours.", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("draft_headroom", "draft_headroom_bench")


@pytest.fixture(scope="module")
def drafter(tiny_chat_model: Any, tiny_drafters: dict[str, Path]) -> Any:
    folder = tiny_drafters["dspark"] / "checkpoints" / "step-000004" / "drafter"
    t = tiny_chat_model
    return load_drafter(folder, t.spec, t.embed_tokens, t.lm_head).eval()


@pytest.fixture(scope="module")
def prompts(tiny_chat_model: Any) -> list[list[int]]:
    return [tiny_chat_model.encode_chat([{"role": "user", "content": c}]) for c in CHATS]


@pytest.mark.parametrize(("shape", "ngram"), [("chain", 0), ("chain+copy", 2)])
def test_replay_counts_what_the_reference_generator_accepts(
    bench: Any, tiny_chat_model: Any, drafter: Any, prompts: list[list[int]], shape: str, ngram: int
) -> None:
    max_new = 40
    result = bench.measure(
        tiny_chat_model, drafter, prompts, max_new, [bench.Shape.parse(shape)], copy_ngram=2
    )
    gen = ReferenceGenerator(
        tiny_chat_model,
        drafter,
        build_policy("verify_all"),
        sampling=SamplingParams(temperature=0.0),
        context_copy_ngram=ngram,
    )
    ref = gen.generate(prompts, max_new)
    replayed = result["shapes"][shape]["accepted"]
    assert replayed == [[a for _, a in rounds] for rounds in ref.rounds]
    assert result["shapes"][shape]["tokens_per_round"] == pytest.approx(
        ref.accept_length_mean, abs=1e-4
    )
    if ngram:  # the greedy replies repeat themselves: copies are accepted, not just counted
        assert sum(map(sum, replayed)) > 0


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_a_tree_branches_slot_1_and_its_first_branch_is_the_chain(
    bench: Any, tiny_chat_model: Any, prompts: list[list[int]], head: str
) -> None:
    t = tiny_chat_model
    torch.manual_seed(3)
    cfg = DSparkConfig.for_target(
        t.spec,
        mask_token_id=t.default_mask_token_id(),
        num_hidden_layers=1,
        num_experts=2,
        num_experts_per_tok=1,
        intermediate_size=64,
        markov_rank=8,
        block_size=4,
        sliding_window=16,
        target_layer_ids=(0, 1, 2),
        markov_head_type=head,
    )
    drafter = DSparkDrafter(cfg, t.embed_tokens, t.lm_head).eval()
    assert drafter.markov_head is not None
    with torch.no_grad():  # the head's bias, not the target's peaked LM head, picks the drafts
        drafter.markov_head.markov_w2.weight.mul_(100.0)
        for name, param in drafter.markov_head.named_parameters():
            if name.startswith("joint_proj"):  # the RNN's state and previous token count
                param.mul_(30.0)
    (reply,) = bench.greedy_replies(t, prompts[:1], 12, drafter)
    blocks = bench.BlockCache(drafter, reply)
    for p in range(reply.prompt_len, reply.prompt_len + 8):
        anchor = reply.tokens[p]
        drawn = sample_block(drafter, blocks.at(p), torch.tensor([anchor]), temperature=0.0)
        chain = bench.branches(drafter, blocks.at(p), anchor, 1)
        tree = bench.branches(drafter, blocks.at(p), anchor, 3)
        assert tree.shape == (3, drafter.block_size)
        assert torch.equal(chain, drawn.tokens) and torch.equal(tree[:1], drawn.tokens)
        top3 = bench.slot1(drafter, blocks.at(p), anchor)[0].topk(3).indices
        assert tree[:, 0].tolist() == drafter.to_target_vocab(top3).tolist()


def test_common_prefix_takes_the_best_row(bench: Any) -> None:
    drafts = torch.tensor([[5, 6, 7], [5, 9, 9], [1, 2, 3]])
    assert bench.common_prefix(drafts, [5, 6, 0]) == 2
    assert bench.common_prefix(drafts, [5, 9, 9, 4]) == 3
    assert bench.common_prefix(drafts, [8]) == 0
    assert bench.common_prefix(drafts, [5]) == 1  # the path ends before the block does
    assert bench.common_prefix(drafts, []) == 0


def test_shape_names_are_checked(bench: Any) -> None:
    assert bench.Shape.parse("chain") == bench.Shape("chain", 1, False)
    assert bench.Shape.parse("tree8+copy") == bench.Shape("tree8+copy", 8, True)
    for bad in ("tree1", "tree", "chain+copy+copy", "beam4"):
        with pytest.raises(ValueError, match="use chain, treeM"):
            bench.Shape.parse(bad)


def test_verify_price_is_in_one_token_steps(bench: Any) -> None:
    staircase = from_probes([(1, 10.0), (8, 8.0), (16, 5.0)])
    assert bench.verify_price(staircase, 1) == pytest.approx(1.0)
    assert bench.verify_price(staircase, 15) == pytest.approx(10.0 / 8.0)  # floor lookup
    linear = additive_from_probes([(1, 1 / 0.100), (8, 1 / 0.110), (16, 1 / 0.130)])  # steps/s
    assert bench.verify_price(linear, 12) == pytest.approx(0.120 / 0.100)  # linear between


@pytest.mark.skipif(not RESULT.exists(), reason="no committed result yet")
def test_committed_figures_follow_from_the_raw_counts(bench: Any) -> None:
    result = json.loads(RESULT.read_text())
    settings = result["settings"]
    b = settings["block_size"]
    table = parse_cost_table(json.dumps(result["cost_table"])) if "cost_table" in result else None
    assert result["sets"]
    for per_set in result["sets"].values():
        assert len(per_set["prompt_tokens"]) == settings["num_prompts"]
        for name, row in per_set["shapes"].items():
            shape = bench.Shape.parse(name)
            assert (row["width"], row["copy"]) == (shape.width, shape.copy)
            assert row["verify_tokens_per_round"] == 1 + shape.width * b
            assert {k: row[k] for k in ("tokens", "rounds", "tokens_per_round")} == (
                bench.summary(row["accepted"])
            )
            for accepted in row["accepted"]:  # each prompt emits max_new tokens, no fewer
                assert all(0 <= a <= b for a in accepted)
                emitted = 1 + sum(a + 1 for a in accepted)
                assert emitted >= settings["max_new_tokens"] > emitted - accepted[-1] - 1
            if table is not None:
                price = bench.verify_price(table, row["verify_tokens_per_round"])
                assert row["verify_plain_steps"] == pytest.approx(price, abs=1e-4)
                assert row["ratio_ceiling"] == pytest.approx(
                    row["tokens_per_round"] / row["verify_plain_steps"], abs=1e-4
                )
        top = per_set["slot1_top_m"]
        assert top["positions"] == settings["num_prompts"] * (settings["max_new_tokens"] - 1)
        assert top["hits"] == sorted(top["hits"]) and top["hits"][-1] <= top["positions"]
        assert top["rate"] == [round(h / top["positions"], 4) for h in top["hits"]]
