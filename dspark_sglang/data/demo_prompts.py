"""The chat prompts ``dspark-sglang demo`` decodes, with either engine.

GSM8K test questions when the fetched test file is there, else a few built-in
GSM8K-style questions, so the demo runs on a machine that has only the model.
"""

from __future__ import annotations

__all__ = ["DEMO_PROMPTS", "demo_chats"]

DEMO_PROMPTS: tuple[str, ...] = (
    "A baker makes 24 muffins and sells them in boxes of 4. Each box costs $6. "
    "How much money does the baker make if all boxes are sold?",
    "Tom has 3 times as many marbles as Sara. Sara has 12 marbles. "
    "How many marbles do they have together?",
    "A train travels 60 miles per hour for 2.5 hours. How far does it travel?",
    "Lisa reads 15 pages a day. Her book has 240 pages. How many days does she need to finish it?",
)
"""GSM8K-style questions used when the GSM8K test file has not been fetched."""


def demo_chats(n: int) -> list[list[dict[str, str]]]:
    """``n`` GSM8K test chats (the built-in questions if the test file is not fetched)."""
    from dspark_sglang.data.evalsets import GSM8K_INSTRUCTION, load_gsm8k_test

    try:
        return [p.chat() for p in load_gsm8k_test(limit=n)]
    except FileNotFoundError:
        qs = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(n)]
        return [[{"role": "user", "content": f"{q}\n{GSM8K_INSTRUCTION}"}] for q in qs]
