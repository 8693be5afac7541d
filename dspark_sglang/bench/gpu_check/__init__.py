"""Parts of the torch-only GPU check (``benchmarks/gpu_check.py`` is the driver).

Torch and ``dspark_sglang`` modules that do not import SGLang only: this package runs on
a GPU machine without SGLang (``scripts/gpu_check.sh``). ``common``: the problem sizes,
a check's result row and the target geometry. ``policies``: check 1, device scheduling
policies against the host ones. ``drafting``: check 2, the greedy draft loop captured as
a CUDA graph. Checks 3 (verification) and 4 (a training step) stay in the script, so
this package imports neither ``verify`` nor ``training``.
"""
