"""Make torch's Python-level host read-backs raise, for "no host sync" tests.

CUDA graphs cannot capture a device->host sync (``.item()``, ``.tolist()``,
``bool(tensor)``, ``.cpu()``), and outside graphs every sync stalls the device.
Without a GPU, running code with these entry points of ``torch.Tensor`` patched to
raise stands in: a call of any of them fails the test, naming the method. The
implementation lives in the package (``sglang_integration.sync_probe``) because
the DSPARK_MOE worker installs the same trap inside SGLang's scheduler process
when a test asks for it (``DSPARK_TEST_SYNC_GUARD``).
"""

from __future__ import annotations

from dspark_sglang.sglang_integration.sync_probe import (
    SYNC_METHODS,
    HostSyncError,
    host_syncs_raise,
)

__all__ = ["SYNC_METHODS", "HostSyncError", "host_syncs_raise"]
