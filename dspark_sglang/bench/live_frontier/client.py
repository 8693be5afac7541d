"""One cell against one server: SGLang's ``bench_serving`` as the client, the server's
counters read around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dspark_sglang.bench.live_frontier.rows import Cell

ACCEPTED = "dspark_accepted_length"
DRAFT_STEPS = "dspark_draft_request_steps_total"


def bench_command(
    base_url: str,
    dataset: Path,
    tokenizer: str,
    *,
    prompts: int,
    concurrency: int,
    temperature: float,
    output_len: int,
    seed: int,
    output_file: Path,
    python: str = sys.executable,
) -> list[str]:
    """SGLang's client, ``python -m sglang.bench_serving --backend sglang``, for one cell."""
    return [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--model",
        tokenizer,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--num-prompts",
        str(prompts),
        "--sharegpt-output-len",
        str(output_len),
        "--max-concurrency",
        str(concurrency),
        "--temperature",
        f"{temperature:g}",
        "--seed",
        str(seed),
        "--flush-cache",
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--output-file",
        str(output_file),
    ]


def parse_bench_output(text: str) -> dict[str, Any]:
    """The figures of bench_serving's ``--output-file`` (JSONL, one line per run: the last
    counts): output throughput, median TPOT and TTFT, completed requests, its accept length.

    ``ValueError`` when the file holds no result, a figure is missing, no request
    completed, or the median TPOT is not positive (no per-user speed).
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("bench_serving wrote no result line")
    doc = json.loads(lines[-1])
    need = ("completed", "output_throughput", "median_tpot_ms", "median_ttft_ms", "duration")
    missing = [k for k in need if doc.get(k) is None]
    if missing:
        raise ValueError(f"bench_serving's result has no {missing}")
    if doc["completed"] < 1:
        raise ValueError("bench_serving completed no request")
    tpot = float(doc["median_tpot_ms"])
    if not tpot > 0:
        raise ValueError(f"bench_serving's median TPOT is {tpot} ms: no per-user speed")
    accept = doc.get("accept_length")
    return {
        "completed": int(doc["completed"]),
        "total_output_tokens": doc.get("total_output_tokens"),
        "duration_s": float(doc["duration"]),
        "output_tok_s": float(doc["output_throughput"]),
        "median_tpot_ms": tpot,
        "user_tok_s": 1000.0 / tpot,
        "median_ttft_ms": float(doc["median_ttft_ms"]),
        "bench_accept_length": None if accept is None else float(accept),
    }


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Samples:
    """Every sample of a ``/metrics`` page: ``(sample name, labels) -> value``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def sample_sum(samples: Samples, name: str, **labels: str) -> float | None:
    """Sum of ``name``'s samples whose labels include ``labels``; None if it has none."""
    want = set(labels.items())
    values = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    return sum(values) if values else None


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float | None:
    a = sample_sum(after, name, **labels)
    if a is None:
        return None
    return a - (sample_sum(before, name, **labels) or 0.0)


def cell_counters(before: Samples, after: Samples) -> dict[str, float | None]:
    """What a server's counters say about the cell between two ``/metrics`` reads.

    ``accept_length``: tokens per request per verify round (accepted drafts + bonus) over
    the cell's rounds (``dspark_accepted_length`` sum / count); ``drafted_share``: the share
    of request-steps that ran the draft pass (``dspark_draft_request_steps_total``, label
    ``drafted``). None where the series is absent or counted nothing.
    """
    total = _delta(before, after, ACCEPTED + "_sum")
    rounds = _delta(before, after, ACCEPTED + "_count")
    drafted = _delta(before, after, DRAFT_STEPS, drafted="true")
    skipped = _delta(before, after, DRAFT_STEPS, drafted="false")
    steps = None if drafted is None and skipped is None else (drafted or 0.0) + (skipped or 0.0)
    return {
        "accept_length": total / rounds if total is not None and rounds else None,
        "drafted_share": (drafted or 0.0) / steps if steps else None,
    }


def _get(url: str, timeout: float = 30.0) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def run_cell(
    base_url: str,
    dataset: Path,
    tokenizer: str,
    cell: Cell,
    *,
    prompts: int,
    output_len: int,
    seed: int,
    timeout: float,
    workdir: Path,
    tag: str,
) -> dict[str, Any]:
    """One bench_serving run of ``cell`` against one server, with the server's counters."""
    before = parse_prometheus(_get(base_url + "/metrics"))
    out_file = workdir / f"{tag}.jsonl"
    log = workdir / f"{tag}.log"
    cmd = bench_command(
        base_url,
        dataset,
        tokenizer,
        prompts=prompts,
        concurrency=cell.concurrency,
        temperature=cell.temperature,
        output_len=output_len,
        seed=seed,
        output_file=out_file,
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if proc.returncode != 0 or not out_file.is_file():
        raise RuntimeError(
            f"bench_serving exited {proc.returncode} ({' '.join(cmd)}):\n"
            + log.read_text(errors="replace")[-3000:]
        )
    figures = parse_bench_output(out_file.read_text(encoding="utf-8"))
    if figures["completed"] != prompts:
        raise RuntimeError(
            f"bench_serving completed {figures['completed']} of {prompts} requests ({log})"
        )
    after = parse_prometheus(_get(base_url + "/metrics"))
    counters = cell_counters(before, after)
    if counters["accept_length"] is None:
        counters["accept_length"] = figures["bench_accept_length"]
    return {**figures, **counters, "seed": seed}
