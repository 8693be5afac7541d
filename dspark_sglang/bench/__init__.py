"""Benchmarks: figures that are measured, not asserted in tests (``dspark-sglang bench ...``).

``acceptance``: accepted length per round and position-wise conditional acceptance
of several drafters on the eval sets (the DSpark paper's Table/Figure 2 on CPU).
``sim_validation``: the serving simulator's predictions against a live SGLang server
(``bench sim-validation``). ``serve_contract``: the chart's default tier under load.
``alternate``: side-by-side timing of two or more functions for the scripts in ``benchmarks/``.
"""
