"""Names SGLang imports at module level on CPU for tree-based speculation.

SGLang's EAGLE/NGRAM modules import these when ``is_cpu()``; the DSPARK and
plain-decoding paths this project runs never call them. They exist so those
imports succeed and fail loudly if a tree-speculation path is ever taken.
"""

from __future__ import annotations

from typing import NoReturn


def _not_implemented(name: str) -> NoReturn:
    raise NotImplementedError(
        f"sgl_kernel reference: {name} (tree speculation: EAGLE topk>1 / NGRAM) is not "
        "implemented; run DSPARK or plain decoding on CPU, or install the real sgl-kernel."
    )


def build_tree_kernel_efficient_cpu(*args: object, **kwargs: object) -> NoReturn:
    _not_implemented("build_tree_kernel_efficient_cpu")


def verify_tree_greedy_cpu(*args: object, **kwargs: object) -> NoReturn:
    _not_implemented("verify_tree_greedy_cpu")


def rotate_input_ids_cpu(*args: object, **kwargs: object) -> NoReturn:
    _not_implemented("rotate_input_ids_cpu")
