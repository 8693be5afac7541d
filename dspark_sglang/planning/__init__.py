"""Serving simulator and SLA planner.

``traces`` (acceptance traces), ``workload`` (request lengths), ``simulator`` (step-level
serving simulation running the real scheduling policies), ``frontier`` (policy sweeps,
SLA-anchor table, budget curve, plots), ``planner`` (per-SLA Helm values), ``inputs``
(what ``simulate`` and ``plan`` read). Checking the simulator against a live SGLang
server is a benchmark: ``bench.sim_validation``.
Modules are imported explicitly; nothing is re-exported here so importing one does not
pull in matplotlib or the policies.
"""
