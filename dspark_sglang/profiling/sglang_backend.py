"""GPU backend: time SGLang's own model runner (the real serving forward).

UNTESTED HERE: written against SGLang 0.5.23's ``sglang.benchmark.one_batch``
helpers (the same calls its latency benchmark makes) for a GPU machine; the dev
and CI machines have no GPU. ``scripts/profile_gpu.sh`` drives it.

A step of ``b`` tokens is one decode forward of ``b`` requests (one token each)
through ``ModelRunner.forward``, which replays the decode CUDA graph captured for
batch ``b`` (graphs are captured for every size up to ``max_batch_tokens`` when
the runner loads, so probing 1..2048 sees SGLang's real bucket padding: the
stairs the scheduler must know about). Each request has a ``context_len``-token
prefix prefilled once per probe (untimed), so attention reads a realistic KV
length. Verify forwards of ``n`` requests x ``w`` tokens (``n * w = b``) run the
same GEMMs on ``b`` rows; their attention differs slightly, which is the
documented approximation of this backend (SGLang's own profiler has the same
kind of caveat for its static-mode sweep).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dspark_sglang.profiling.backend import BackendInfo, Step


class SGLangRunnerBackend:
    """``Backend`` over SGLang's ``ModelRunner`` on one GPU (tp_size 1)."""

    def __init__(
        self,
        model_path: str,
        model_slug: str,
        *,
        max_batch_tokens: int,
        context_len: int = 128,
        tp_size: int = 1,
        dtype: str = "bfloat16",
        cuda_graphs: bool = True,
        mem_fraction_static: float = 0.85,
    ) -> None:
        if tp_size != 1:
            raise ValueError(
                "SGLangRunnerBackend runs tp_size=1 in-process; for TP>1 profile through a "
                "DSpark server with SGLang's sglang.benchmark.dspark_sps_profiler"
            )
        if max_batch_tokens < 1 or context_len < 1:
            raise ValueError("max_batch_tokens and context_len must be >= 1")
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("SGLangRunnerBackend needs a CUDA GPU")
        from sglang.benchmark import one_batch as ob
        from sglang.srt.server_args import PortArgs, ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        cli = [
            "--model-path", model_path,
            "--dtype", dtype,
            "--tp-size", "1",
            "--mem-fraction-static", str(mem_fraction_static),
            "--max-running-requests", str(max_batch_tokens),
            "--context-length", str(context_len + 1024),
        ]  # fmt: skip
        if not cuda_graphs:
            cli.append("--cuda-graph-backend-decode=disabled")
        server_args = ServerArgs.from_cli_args(parser.parse_args(cli))
        # As sglang.benchmark.one_batch.main: make the decode graphs cover every probe.
        graph_config: dict[str, Any] = {}
        explicit = server_args.cuda_graph_config
        if isinstance(explicit, ob.CudaGraphConfig):
            explicit = explicit.to_dict()
        graph_config = dict(explicit or {})
        decode = dict(graph_config.get(ob.Phase.DECODE) or {})
        decode["max_bs"] = max_batch_tokens
        graph_config[ob.Phase.DECODE] = decode
        ob.declare_resolution(
            server_args, "dspark_sglang.profiling", cuda_graph_config=graph_config
        )
        server_args.resolve_once()
        ob._set_envs_and_config(server_args)
        port_args = PortArgs.init_new(server_args)
        ob.publish(
            server_args,
            role="scheduler",
            ranks=ob.SpawnRanks(
                world_rank=ob.spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=0
            ),
        )
        ob._init_process_global_configs()
        self._ob = ob
        self._runner, _ = ob.load_model(server_args, port_args, 0, 0)
        self._context_len = context_len
        self._max = max_batch_tokens
        self._info = BackendInfo(
            kind="sglang",
            model=model_slug,
            dtype=dtype,
            tp_size=1,
            device=f"cuda:{torch.cuda.current_device()}",
            settings={
                "context_len": context_len,
                "cuda_graphs": cuda_graphs,
                "layout": "b requests x 1 token (SGLang decode forward, CUDA graph replay)",
                "mem_fraction_static": mem_fraction_static,
            },
        )

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def max_batch_tokens(self) -> int:
        return self._max

    def now(self) -> float:
        return time.perf_counter()

    def release(self) -> None:
        self._runner.clear()

    def prepare(self, batch_tokens: int) -> Step:
        if not 1 <= batch_tokens <= self._max:
            raise ValueError(f"batch_tokens {batch_tokens} outside [1, {self._max}]")
        runner = self._runner
        runner.clear()  # free the previous probe's requests and KV slots
        reqs = self._ob.prepare_synthetic_inputs_for_latency_test(batch_tokens, self._context_len)
        next_ids, _, batch = runner.extend(reqs)  # prefill the context (untimed)
        runner.synchronize()
        state = {"ids": next_ids}

        def step() -> None:
            state["ids"], _ = runner.decode(state["ids"], batch)
            runner.synchronize()

        return step
