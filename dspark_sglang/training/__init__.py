"""Drafter training: prompts, target-regenerated data, anchors, the DSpark loss, the trainer.

Entry point: ``dspark-sglang train --config configs/<x>.yaml`` (``training/pipeline.py``);
``discovery`` finds drafter checkpoints, ``export`` ships one (``export-drafter``).
"""
