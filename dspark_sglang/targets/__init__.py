"""Real small targets (SmolLM2-135M from a PyPI GGUF) and the HF target wrapper."""
