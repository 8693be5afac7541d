"""Offline benchmarks over the reference generator (``dspark-sglang bench ...``).

``acceptance``: accepted length per round and position-wise conditional acceptance
of several drafters on the eval sets (the DSpark paper's Table/Figure 2 on CPU).
"""
