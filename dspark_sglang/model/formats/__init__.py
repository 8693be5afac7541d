"""Other projects' DSpark drafter layouts, read, checked and converted to and from ours.

``deepspec``: DeepSpec's ``Qwen3DSparkModel`` checkpoints (the layout SGLang's own
dense DSpark class loads). ``speculators``: vLLM speculators' DSpark checkpoints
(``speculators_model_type: dspark``), read, checked and imported to ours.
"""

from dspark_sglang.model.formats.deepspec import (
    DeepSpecConfig,
    check_checkpoint,
    expected_tensors,
    export_from_ours,
    import_to_ours,
)

__all__ = [
    "DeepSpecConfig",
    "check_checkpoint",
    "expected_tensors",
    "export_from_ours",
    "import_to_ours",
]
