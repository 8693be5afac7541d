"""Eval prompts of an acceptance run: the built-in eval sets, or the user's chat JSONL.

Both go through the target's chat template and number prompts in order, so
``skip`` ranges of different runs decode disjoint prompts (``load_eval_prompts``,
``load_prompt_file``); ``PromptFile`` records what a user's file gave and why rows
or prompts were left out, for the console and the result's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.targets.smollm2 import sha256_file


def load_eval_prompts(
    target: HFTarget,
    names: Sequence[str],
    num_prompts: int,
    cache_dir: str | Path | None = None,
    skip: int = 0,
) -> dict[str, list[list[int]]]:
    """Prompts ``skip .. skip + num_prompts - 1`` of each eval set, through the chat template.

    ``skip`` gives a split disjoint from another run's (e.g. STS is fitted on prompts
    the acceptance run never decoded, then scored on the acceptance run's rounds).
    """
    from dspark_sglang.data.evalsets import load_eval_set

    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    out: dict[str, list[list[int]]] = {}
    for name in names:
        prompts = load_eval_set(name, cache_dir=cache_dir, limit=skip + num_prompts)[skip:]
        if not prompts:
            raise ValueError(
                f"eval set {name!r} has no prompts after skipping {skip}; lower --skip-prompts"
            )
        out[name] = [target.encode_chat(p.chat()) for p in prompts]
    return out


@dataclass(frozen=True)
class PromptFile:
    """An eval set read from the user's chat JSONL (``bench acceptance --prompts NAME=FILE``).

    ``prompts`` are the token ids of the file's prompts ``skip .. skip + num_prompts - 1``
    that fit; ``rows`` counts the rows read (stopping after the last prompt needed),
    ``skipped``/``examples`` the rows and prompts left out and why (``chat_jsonl.SkipLog``);
    ``size``/``sha256`` identify the file in the result's metadata.
    """

    name: str
    path: Path
    prompts: tuple[tuple[int, ...], ...]
    rows: int
    skip: int
    skipped: Mapping[str, int]
    examples: tuple[str, ...]
    size: int
    sha256: str

    def summary(self) -> str:
        """One line, ``--prompts NAME: FILE: R rows -> P prompts`` and the skips below it."""
        from dspark_sglang.data.chat_jsonl import skip_lines

        after = f" after the first {self.skip}" if self.skip else ""
        line = f"--prompts {self.name}: {self.path}: {self.rows} rows -> "
        line += f"{len(self.prompts)} prompts{after}"
        return line + skip_lines(self.skipped, self.examples, "  ")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "bytes": self.size,
            "sha256": self.sha256,
            "rows": self.rows,
            "prompts": len(self.prompts),
            "skipped": dict(self.skipped),
        }


def load_prompt_file(
    target: HFTarget,
    name: str,
    path: str | Path,
    num_prompts: int,
    max_new_tokens: int,
    *,
    skip: int = 0,
    max_examples: int = 5,
) -> PromptFile:
    """Prompts ``skip .. skip + num_prompts - 1`` of a chat JSONL file, through the chat template.

    The file is read as the training data stage reads one (``data.chat_jsonl``): each
    assistant turn of a row is one prompt, the conversation before it, and a row ending
    with a user turn one more; a bad row gives none and is counted. Prompts are numbered
    in file order, so runs with disjoint ``skip`` ranges decode disjoint prompts: a
    prompt of the range that the chat template refuses (``template_error``) or that
    leaves fewer than ``max_new_tokens`` positions of the target's context
    (``over_context``) is counted and left out, not replaced. Raises ``ValueError``
    naming ``--prompts NAME``, the file and the fix when no prompt is left.
    """
    from dspark_sglang.data.chat_jsonl import (
        SkipLog,
        encode_or_skip,
        no_usable_prompt,
        read_chat_rows,
    )

    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    path = Path(path)
    source = f"--prompts {name}"
    if not path.is_file():
        raise FileNotFoundError(
            f"{source}: {path} not found; give an existing chat JSONL file (.jsonl or "
            ".jsonl.gz, OpenAI messages or ShareGPT conversations rows)"
        )
    context = target.spec.max_position_embeddings
    max_tokens = context - max_new_tokens
    limit = f"the target's context {context} - --max-new-tokens {max_new_tokens}"
    log, out, rows, seen = SkipLog(max_examples), [], 0, 0
    for row in read_chat_rows(path, log):
        rows += 1
        for k, p in enumerate(row.prompts("chat"), start=1):
            seen += 1
            if seen <= skip:
                continue
            where = f"{row.where} reply {k}"
            ids = encode_or_skip(
                p, where, target.encode_chat, log, max_tokens, too_long="over_context", limit=limit
            )
            if ids is not None:
                out.append(tuple(ids))
            if seen >= skip + num_prompts:
                break
        if seen >= skip + num_prompts:
            break
    rows += log.rows
    if not out and seen <= skip and rows > log.rows:
        raise ValueError(
            f"{source}: {path} has {seen} prompts ({rows} rows), none after skipping {skip}; "
            "lower --skip-prompts or give a file with more conversations"
        )
    if not out:
        raise no_usable_prompt(source, path, rows, log)
    return PromptFile(
        name=name,
        path=path,
        prompts=tuple(out),
        rows=rows,
        skip=skip,
        skipped=dict(log.counts),
        examples=tuple(log.examples),
        size=path.stat().st_size,
        sha256=sha256_file(path),
    )
