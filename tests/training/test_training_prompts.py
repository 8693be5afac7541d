"""Training prompt builders: deterministic, three domains, disjoint from the eval sets."""

from __future__ import annotations

import pytest

from dspark_sglang.data.evalsets import (
    Message,
    Prompt,
    load_gsm8k_test,
    load_humaneval,
    load_mtbench,
)
from dspark_sglang.training.prompts import (
    assert_disjoint,
    build_chat_prompts,
    build_code_prompts,
    build_training_prompts,
)


def test_builders_are_deterministic_and_domain_tagged() -> None:
    a = build_training_prompts(6, 6, 6, seed=3)
    b = build_training_prompts(6, 6, 6, seed=3)
    assert a == b
    assert [p.domain for p in a[:3]] == ["math", "code", "chat"]  # interleaved mix
    assert sum(p.domain == "code" for p in a) == 6
    assert len({p.id for p in a}) == 18
    assert build_code_prompts(6, seed=4) != build_code_prompts(6, seed=3)


def test_code_prompts_hold_real_dedented_stdlib_functions() -> None:
    import ast
    import re

    for p in build_code_prompts(12, seed=0):
        text = p.messages[0].content
        m = re.search(r"```python\n(.*)\n```", text, re.S)
        if m:  # the code-bearing templates must contain parseable Python
            ast.parse(m.group(1) + ("\n    ..." if "complete" in p.id else ""))
        assert p.id.startswith("code/") and p.messages[0].role == "user"


def test_chat_prompts_mix_prose_tasks_and_instructions() -> None:
    chat = build_chat_prompts(30, seed=0)
    assert len(chat) == 30
    instr = [p for p in chat if p.id.startswith("chat/instruction/")]
    assert len(instr) == 10
    for p in chat:
        assert len(p.messages[0].content) > 20


def test_training_prompts_are_disjoint_from_eval_sets() -> None:
    evals = [*load_gsm8k_test(), *load_humaneval(), *load_mtbench()]
    train = build_training_prompts(300, 100, 100, seed=0)
    assert_disjoint(train, evals)
    # and the check itself bites: a leaked eval prompt is refused
    leaked = Prompt(
        id="code/leak",
        domain="code",
        messages=(Message("user", "Please: " + evals[1400].messages[0].content),),
    )
    with pytest.raises(AssertionError, match="appears in the training prompts"):
        assert_disjoint([*train, leaked], evals)
    with pytest.raises(AssertionError, match="reuse eval ids"):
        assert_disjoint([evals[0]], evals)
