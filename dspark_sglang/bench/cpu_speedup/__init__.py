"""The CPU speed benchmark's parts (``benchmarks/cpu_speedup.py`` parses flags and writes the JSON).

``grid``: the engines (plain, DSPARK_MOE per policy, NGRAM), the grid's cells and which
prompts each cell sends. ``rows``: a row per cell and speculative engine against plain
(median and range over the repeats, identity and near-ties at temperature 0), its
contract and the printed table. ``run``: each engine's start-up settings, the prompts
through the chat template, and one repeat with the engines taking turns cell by cell.
"""
