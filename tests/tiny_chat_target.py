"""A tiny chat target, drafters and eval sets on disk, for ``bench acceptance`` tests (fast).

The target is a real HF folder (random 4-layer Llama with a peaked head + a
character-level tokenizer with a ChatML template), the drafters are tiny untrained
DSpark / DFlash-style / AR checkpoints written by the real save functions in the
layouts the trainer writes, and the eval sets are small files in the fetched
layouts. ``tests/bench`` (the measurement) and ``tests/cli`` (the command) get them
through the session fixtures in ``tests/conftest.py`` (``tiny_chat_dir``,
``tiny_chat_model``, ``tiny_drafters``, ``tiny_eval_cache``), so both build them once.
"""

from __future__ import annotations

import gzip
import json
import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dspark_sglang.model import DSparkConfig, DSparkDrafter, save_drafter
from dspark_sglang.model.ar_drafter import ARDrafter, ARDrafterConfig, save_ar_drafter
from dspark_sglang.targets.hf_target import HFTarget

B = 4
LAYER_IDS = (0, 1, 2)
SPECIALS = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>", "<mask>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        mask_token="<mask>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    return fast


def save_tiny_chat_target(path: Path) -> Path:
    """A saved HF chat model at ``path``: random 4-layer Llama (peaked head) + char tokenizer."""
    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_tiny_drafters(target: HFTarget, root: Path) -> dict[str, Path]:
    """Untrained drafters saved under ``root`` the way `dspark-sglang train` saves them."""
    spec = target.spec
    common = {
        "num_hidden_layers": 1,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "intermediate_size": 64,
        "block_size": B,
        "sliding_window": 16,
        "target_layer_ids": LAYER_IDS,
    }
    torch.manual_seed(1)
    dspark = DSparkDrafter(
        DSparkConfig.for_target(
            spec, mask_token_id=target.default_mask_token_id(), markov_rank=8, **common
        ),
        target.embed_tokens,
        target.lm_head,
    )
    dflash = DSparkDrafter(
        DSparkConfig.for_target(
            spec,
            mask_token_id=target.default_mask_token_id(),
            markov_head_type="none",
            enable_confidence_head=False,
            confidence_head_with_markov=False,
            **common,
        ),
        target.embed_tokens,
        target.lm_head,
    )
    ar = ARDrafter(
        ARDrafterConfig(
            hidden_size=spec.hidden_size,
            vocab_size=spec.vocab_size,
            target_layer_ids=LAYER_IDS,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            intermediate_size=64,
            block_size=B,
        ),
        target.embed_tokens,
        target.lm_head,
    )
    # Layouts the trainer writes: run_dir/checkpoints/step-N/drafter, and plain folders.
    run = root / "dspark_run"
    save_drafter(dspark, run / "checkpoints" / "step-000002" / "drafter")
    save_drafter(dspark, run / "checkpoints" / "step-000004" / "drafter")
    save_drafter(dflash, root / "dflash" / "step-000004" / "drafter")
    save_ar_drafter(ar, root / "ar")
    (run / "config.json").write_text('{"name": "a training config, not a drafter"}')
    return {"dspark": run, "dflash": root / "dflash" / "step-000004", "ar": root / "ar"}


def write_tiny_eval_sets(root: Path) -> Path:
    """Eval sets under ``root/assets`` in the fetched layouts (3 prompts each); returns ``root``
    (a ``DSPARK_CACHE_DIR``)."""
    assets = root / "assets"
    (assets / "gsm8k").mkdir(parents=True)
    (assets / "humaneval").mkdir()
    (assets / "mt_bench").mkdir()
    qs = ["Tom has 3 apples and buys 4. How many?", "2 + 5 = ?", "Half of 18 is?"]
    (assets / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": q, "answer": "#### 7"}) + "\n" for q in qs)
    )
    with gzip.open(assets / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        for i, stub in enumerate(["def add(a, b):\n", "def neg(x):\n", "def one():\n"]):
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": stub}) + "\n")
    turns = [["Write a haiku.", "Again."], ["Say hi.", "Bye."], ["Name a color.", "Why?"]]
    (assets / "mt_bench" / "question.jsonl").write_text(
        "".join(json.dumps({"question_id": 81 + i, "turns": t}) + "\n" for i, t in enumerate(turns))
    )
    return root


#: Short user turns for tests that regenerate replies (cycled).
CHAT_TEXTS = ("hi", "2+2?", "a poem", "sum 1..9", "list 3 colours", "why?", "ok", "go on")


def encoded_chats(target: Any, n: int, prefix: str = "c") -> list[Any]:
    """``n`` one-turn chats as ``EncodedPrompt``s (ids ``<prefix><i>``), ``CHAT_TEXTS``
    cycled, encoded with ``target``'s chat template."""
    from dspark_sglang.training.datagen import EncodedPrompt

    return [
        EncodedPrompt(
            id=f"{prefix}{i}",
            domain="chat",
            prompt_ids=target.encode_chat(
                [{"role": "user", "content": CHAT_TEXTS[i % len(CHAT_TEXTS)]}]
            ),
        )
        for i in range(n)
    ]
