"""SGLang 0.5.23's own DSpark config parser reads our config.json unchanged, dtype included."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dspark_sglang.model.config import DSparkConfig
from dspark_sglang.model.drafter import DSparkDrafter


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sglang_parses_dspark_and_dflash_fields(
    make_config: Callable[..., DSparkConfig],
) -> None:
    from sglang.srt.speculative.dspark_components.dspark_config import (
        parse_dspark_draft_config,
    )

    cfg = make_config(block_size=5, markov_head_type="gated", markov_rank=48)
    hf = json.loads(json.dumps(cfg.to_hf_dict()))
    parsed = parse_dspark_draft_config(draft_hf_config=hf)
    assert parsed.gamma == 5
    assert parsed.target_layer_ids == list(cfg.target_layer_ids)
    assert parsed.mask_token_id == cfg.mask_token_id
    assert parsed.markov_rank == 48
    assert parsed.markov_head_type == "gated"
    assert parsed.num_hidden_layers == cfg.num_hidden_layers


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_sglang_heads_load_our_weights_and_agree(head_type: str) -> None:
    """Our head state_dicts load strictly into SGLang's head classes; biases match."""
    import torch
    from sglang.srt.models.dspark import (
        DSparkConfidenceHead,
        GatedMarkovHead,
        RNNHead,
        VanillaMarkov,
    )

    from dspark_sglang.model.heads import ConfidenceHead
    from dspark_sglang.model.heads import GatedMarkovHead as OurGated
    from dspark_sglang.model.heads import RNNMarkovHead as OurRNN
    from dspark_sglang.model.heads import VanillaMarkovHead as OurVanilla

    v, r, h = 50, 8, 12
    ours = {"vanilla": OurVanilla(v, r), "gated": OurGated(v, r, h), "rnn": OurRNN(v, r, h)}[
        head_type
    ]
    theirs = {
        "vanilla": VanillaMarkov(vocab_size=v, markov_rank=r),
        "gated": GatedMarkovHead(vocab_size=v, markov_rank=r, hidden_size=h),
        "rnn": RNNHead(vocab_size=v, markov_rank=r, hidden_size=h),
    }[head_type]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    prev = torch.randint(0, v, (4, 3), generator=g)
    hidden = torch.randn(4, 3, h, generator=g)
    state_ours = ours.init_state(hidden[:, 0])
    state_theirs = theirs.init_state(hidden[:, 0])
    for k in range(3):
        b_ours, state_ours = ours.step(prev[:, k], hidden[:, k], state_ours)
        b_theirs, state_theirs = theirs.step_bias(
            prev[:, k], hidden_states=hidden[:, k], state=state_theirs
        )
        torch.testing.assert_close(b_ours, b_theirs)

    conf_ours = ConfidenceHead(h, r, with_markov=True)
    conf_theirs = DSparkConfidenceHead(hidden_size=h, markov_rank=r, with_markov=True)
    conf_theirs.load_state_dict(conf_ours.state_dict(), strict=True)
    e = ours.prev_embedding(prev)
    torch.testing.assert_close(conf_ours(hidden, e), conf_theirs(hidden, e))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sglang_dtype_auto_follows_the_saved_torch_dtype(
    tmp_path: Path, make_drafter: Callable[..., DSparkDrafter]
) -> None:
    import torch
    from sglang.srt.configs.model_config import _get_and_verify_dtype
    from transformers import AutoConfig

    from dspark_sglang.model.checkpoint import save_drafter
    from dspark_sglang.sglang_integration.draft_checkpoint import register_hf_config

    register_hf_config()
    folder = save_drafter(make_drafter(), tmp_path / "bf16", dtype=torch.bfloat16)
    hf = AutoConfig.from_pretrained(str(folder))
    assert _get_and_verify_dtype(hf, "auto") == torch.bfloat16
