"""SGLang's single-process tp=1 runtime for tests that build its layers without an engine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def single_process_runtime(ragged_verify_mode: str = "cap-accept") -> Iterator[None]:
    """SGLang's parallel state and runtime context for one process at tp=1 (its layers read
    them), with ``SGLANG_RAGGED_VERIFY_MODE`` set (a DSpark confidence head is built in every
    mode but ``static``); what this set up is torn down and the variable restored on exit.

    Torn down because the topology is stamped process-wide: a later engine start with
    ``tp_size=2`` in the same pytest process must not see it.
    """
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    from dspark_sglang.sglang_integration.server import free_port

    mode = os.environ.get("SGLANG_RAGGED_VERIFY_MODE")
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = ragged_verify_mode
    own_dist = not torch.distributed.is_initialized()
    if own_dist:
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
        )
    own_groups = not parallel_state.model_parallel_is_initialized()
    if own_groups:
        reset_context()
        publish(
            ServerArgs(model_path="dummy", device="cpu"),
            role="test",
            ranks=SpawnRanks(world_rank=0),
        )
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        parallel_state.initialize_model_parallel(backend="gloo")
    try:
        yield
    finally:
        if own_groups:
            parallel_state.destroy_model_parallel()
            reset_context()
        if own_dist:
            parallel_state.destroy_distributed_environment()
        if mode is None:
            os.environ.pop("SGLANG_RAGGED_VERIFY_MODE", None)
        else:
            os.environ["SGLANG_RAGGED_VERIFY_MODE"] = mode
