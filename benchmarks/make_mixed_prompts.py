"""Write ``benchmarks/data/mixed_prompts.json``: math, code and chat prompts in ShareGPT format.

Why: ``python -m sglang.bench_serving --dataset-name sharegpt --dataset-path FILE`` is the
client users run against an SGLang server, and ``benchmarks/live_frontier.py`` runs it. It
reads a JSON list of items whose ``conversations`` hold a human turn (the prompt) and a
gpt turn (a reply). This file holds the first ``--per-set`` prompts of each of the
project's eval sets, read through ``dspark_sglang.data.evalsets`` (the loader every
benchmark uses, so the prompts are ``cpu_speedup.py``'s): GSM8K test (math), HumanEval
(code) and MT-Bench first turns (chat). Each item also has an ``id`` that starts with its
set's name (``gsm8k-``, ``humaneval-``, ``mtbench-``), so a subset (``math_code``) can be
selected by prefix.

The chat template is applied here, not by bench_serving: each human turn is the target's
chat template rendered as text around the prompt's messages, with the generation prompt,
exactly the tokens ``cpu_speedup.py`` sends (the script checks that the text tokenizes
back to them). bench_serving's own ``--apply-chat-template`` cannot be used with SmolLM2:
after rendering it deletes every occurrence of the tokenizer's ``bos_token`` from the
prompt, and SmolLM2's ``bos_token`` is ``<|im_start|>``, the marker that opens every
turn. So the file is SmolLM2's (the embedded target's); rebuild it with ``--model-path``
for another target.

The gpt turn is empty on purpose: the benchmark fixes the output length
(``--sharegpt-output-len``), and without that flag bench_serving prunes every item
(it drops replies under 2 tokens) instead of silently using a made-up reply length.

Usage: ``python benchmarks/make_mixed_prompts.py [--per-set 32] [--model-path DIR]
[--out benchmarks/data/mixed_prompts.json]``. The eval sets come from
``scripts/fetch_assets.sh`` (``scripts/setup.sh`` runs it); sources and licences are in
``benchmarks/data/README.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "mixed_prompts.json"
#: The eval sets, in file order; each item's ``id`` starts with ``<name>-``.
SETS = ("gsm8k", "humaneval", "mtbench")


def item_id(set_name: str, prompt_id: str) -> str:
    """``gsm8k`` + ``gsm8k_test/12`` -> ``gsm8k-12`` (the loader's index or the set's own id)."""
    return f"{set_name}-{prompt_id.rsplit('/', 1)[-1]}"


def sharegpt_item(set_name: str, prompt_id: str, text: str) -> dict[str, Any]:
    """One bench_serving ShareGPT item: the rendered prompt and an empty reply turn."""
    return {
        "id": item_id(set_name, prompt_id),
        "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": ""}],
    }


def render(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The chat template around ``messages`` as text, checked to tokenize back to the ids
    ``apply_chat_template`` gives (what ``cpu_speedup.py`` sends) the way a server tokenizes
    a text prompt."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
        ids = ids["input_ids"]
    if tokenizer.encode(text) != list(ids):
        raise ValueError(
            "the rendered chat text does not tokenize back to the template's token ids: a "
            "server tokenizing the text would see another prompt than cpu_speedup.py sends"
        )
    return str(text)


def build(tokenizer: Any, per_set: int) -> list[dict[str, Any]]:
    """``per_set`` prompts of each set in ``SETS``, in the loader's order."""
    from dspark_sglang.data.evalsets import load_eval_set

    items = []
    for name in SETS:
        prompts = load_eval_set(name, limit=per_set)
        if len(prompts) < per_set:
            raise ValueError(f"eval set {name!r} has {len(prompts)} prompts, --per-set {per_set}")
        items += [sharegpt_item(name, p.id, render(tokenizer, p.chat())) for p in prompts]
    ids = [it["id"] for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("two items share an id")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-set", type=int, default=32, help="prompts from each eval set")
    ap.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="target folder whose chat template is applied (default: the embedded SmolLM2)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.per_set < 1:
        ap.error(f"--per-set must be >= 1, got {args.per_set}")
    from transformers import AutoTokenizer

    from dspark_sglang.targets.smollm2 import ensure_smollm2

    model_path = args.model_path or Path(ensure_smollm2())
    items = build(AutoTokenizer.from_pretrained(str(model_path)), args.per_set)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(items, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    counts = {name: sum(it["id"].startswith(f"{name}-") for it in items) for name in SETS}
    print(f"wrote {args.out}: {len(items)} prompts {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
