"""Scheduling: SGLang-compatible cost tables, the per-SLA scheduler config, policies.

Only the data formats are re-exported here; ``policies`` is imported explicitly
(``from dspark_sglang.scheduling import policies``) so loading a cost table or a
config never pulls in policy code.
"""

from dspark_sglang.scheduling.config import POLICIES, ConfigError, SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    CostModel,
    CostTable,
    CostTableError,
    SpsAdditiveCostTable,
    SpsCostTable,
    from_probes,
    load_cost_table,
    parse_cost_table,
    with_fixed_step_cost,
)

__all__ = [
    "POLICIES",
    "ConfigError",
    "CostModel",
    "CostTable",
    "CostTableError",
    "SchedulerConfig",
    "SpsAdditiveCostTable",
    "SpsCostTable",
    "from_probes",
    "load_cost_table",
    "parse_cost_table",
    "with_fixed_step_cost",
]
