"""Which foreign drafter layout a folder holds, from its ``config.json`` alone.

One home for the test every reader of a drafter folder applies before it picks a parser
(our loader, the launch checks, the worker, the demo, the CLI): no weights are read, and
nothing here imports torch. Our own layout is ``model_type: dspark_moe``
(``sglang_integration.launch.is_dspark_moe_drafter``).

A DeepSpec drafter names DeepSpec's Qwen3 draft class and keeps its draft fields at the
top level (``deepspec/modeling/dspark/qwen3/config.py`` in deepseek-ai/DeepSpec). A
config that names the same class but nests its fields under ``dflash_config`` or
``dspark_config`` is SGLang's native layout (``sglang/srt/speculative/dspark_components/
dspark_config.py`` reads those over the top level): SGLang loads it, our DeepSpec parser
does not claim it. A vLLM speculators DSpark drafter says ``speculators_model_type:
"dspark"`` (``src/speculators/models/dspark/config.py`` in vllm-project/speculators); it
is served by nothing here and must be imported (``SPECULATORS_IMPORT_COMMAND``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEEPSPEC_ARCHITECTURE",
    "IMPORT_COMMAND",
    "SPECULATORS_IMPORT_COMMAND",
    "is_deepspec_config",
    "is_deepspec_folder",
    "is_speculators_config",
]

#: The ``architectures`` entry of DeepSpec's Qwen3 drafter (and of SGLang's dense class).
DEEPSPEC_ARCHITECTURE = "Qwen3DSparkModel"
#: How a DeepSpec folder becomes ours (named in refusals of commands that need ours).
IMPORT_COMMAND = "dspark-sglang import-drafter --format deepspec --from DIR --to DIR --target T"
#: How a speculators DSpark folder becomes ours.
SPECULATORS_IMPORT_COMMAND = (
    "dspark-sglang import-drafter --format speculators --from DIR --to DIR --target T"
)
# Keys under which SGLang reads DSpark fields over the top level: another layout.
_NESTED = ("dflash_config", "dspark_config")


def is_deepspec_config(raw: Any) -> bool:
    """Whether a parsed ``config.json`` is DeepSpec's layout (see the module doc)."""
    return (
        isinstance(raw, Mapping)
        and raw.get("architectures") == [DEEPSPEC_ARCHITECTURE]
        and not any(k in raw for k in _NESTED)
    )


def is_speculators_config(raw: Any) -> bool:
    """Whether a parsed ``config.json`` is a vLLM speculators DSpark drafter's."""
    return isinstance(raw, Mapping) and raw.get("speculators_model_type") == "dspark"


def is_deepspec_folder(folder: str | Path) -> bool:
    """:func:`is_deepspec_config` of ``folder/config.json`` (False when it is unreadable)."""
    try:
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return is_deepspec_config(raw)
