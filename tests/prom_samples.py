"""Read the Prometheus samples an SGLang engine wrote to its multiprocess directory."""

from __future__ import annotations

from pathlib import Path

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def read_metrics(prom_dir: Path) -> Samples:
    """All samples SGLang's ``/metrics`` would aggregate from ``PROMETHEUS_MULTIPROC_DIR``
    (summed over every process that wrote there, subfolders included)."""
    from prometheus_client import CollectorRegistry, multiprocess

    samples: Samples = {}
    for sub in [prom_dir, *(p for p in prom_dir.iterdir() if p.is_dir())]:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(sub))
        for family in registry.collect():
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                samples[key] = samples.get(key, 0.0) + s.value
    return samples
