"""SPS staircase profiler: measure, detect stairs, write SGLang cost tables, run fleet-wide.

Modules: ``backend`` (what is timed), ``measure`` (grid, repeats, refinement),
``stairs`` (cliff detector), ``artifacts`` (node/group profiles, merge, file
layout), ``plot``, ``hardware`` (fingerprints), ``job`` (one node's job),
``fleet`` (Ray driver), ``configmap`` (Kubernetes), ``rerender``; the ``profile`` command
is ``cli/profile.py``.
"""
