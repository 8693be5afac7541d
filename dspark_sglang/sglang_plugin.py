"""SGLang plugin entry point (``sglang.srt.plugins`` -> ``dspark_sglang.sglang_plugin:load``).

SGLang calls :func:`load` in the engine process and in every scheduler /
detokenizer process, before any model is built, so everything we add to
SGLang is registered here through its own plugin APIs (no patched files).
The import of the heavy parts is deferred into :func:`load` so that merely
discovering the entry point stays cheap.
"""

from __future__ import annotations


def load() -> None:
    """Register DSpark's algorithms/models and the CPU bridges (idempotent)."""
    from dspark_sglang.sglang_integration.plugin import install

    install()
