"""The live frontier benchmark's parts that need no server (``benchmarks/live_frontier.py``
starts the servers and runs the cells).

``engines``: the engines, what each runs (scheduler config from the chart's default tier)
and the prompt sets. ``client``: SGLang's ``bench_serving`` command for a cell, reading its
result file and the server's ``/metrics`` around it. ``rows``: rows (median and range over
the repeats), Pareto frontiers, the speed-up over ``mtp1`` at matched throughput, the
printed table. ``cells``: the per-cell record that lets a long grid resume. ``plot``: the PNG.
"""
