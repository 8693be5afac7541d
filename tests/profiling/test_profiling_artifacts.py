"""Node/group profiles: merge rules, deviation flags, on-disk layout, ConfigMaps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable

from dspark_sglang.profiling.artifacts import (
    NodeProfile,
    cost_table,
    merge_profiles,
    profile_paths,
    write_group,
)
from dspark_sglang.profiling.backend import BackendInfo
from dspark_sglang.profiling.configmap import (
    build_configmap,
    configmap_name,
    content_version,
    profile_id,
)
from dspark_sglang.profiling.hardware import HardwareFingerprint, detect_fingerprint
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig, Probe
from dspark_sglang.scheduling.cost_table import CostTableError, load_cost_table

H200 = HardwareFingerprint("cuda", "NVIDIA H200", 8, "570.86.15", "cuda12.8")
H100 = HardwareFingerprint("cuda", "NVIDIA H100 80GB HBM3", 8, "570.86.15", "cuda12.8")


def _probes(scale: float, sizes=(1, 2, 4, 8, 16)) -> tuple[Probe, ...]:
    out = []
    for b in sizes:
        sps = scale * (100.0 if b <= 4 else 70.0)
        out.append(Probe(b, sps, 1 / sps, 0.02, 10, 0.005))
    return tuple(out)


def _node(name: str, scale: float = 1.0, hw=H200, model="m", sizes=(1, 2, 4, 8, 16), tp=1):
    return NodeProfile(
        node=name,
        hardware=hw,
        backend=BackendInfo(kind="hf", model=model, dtype="float32", tp_size=tp, device="cuda"),
        grid=GridSpec(max_tokens=16),
        measure=MeasureConfig(),
        probes=_probes(scale, sizes),
        versions={"torch": "x"},
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:01:00+00:00",
    )


def test_merge_takes_the_median_and_flags_only_the_deviating_node() -> None:
    nodes = [_node("a", 1.0), _node("b", 1.02), _node("c", 0.7)]  # c: throttled by 30 %
    g = merge_profiles(nodes, threshold=0.10)
    assert g.flagged == ("c",)
    assert [p.steps_per_sec for p in g.probes] == pytest.approx(
        [100 * 1.0] * 3 + [70 * 1.0] * 2
    )  # median of (1.0, 1.02, 0.7) x curve
    assert g.deviation["a"] == pytest.approx(0.0)
    assert g.deviation["c"] == pytest.approx(0.3)


def test_merge_evaluates_different_grids_by_floor_lookup() -> None:
    g = merge_profiles([_node("a", sizes=(1, 4, 16)), _node("b", sizes=(1, 2, 8, 16))])
    assert [p.batch_tokens for p in g.probes] == [1, 2, 4, 8, 16]
    assert g.flagged == ()


def test_merge_rejects_mismatched_hardware_and_configuration() -> None:
    with pytest.raises(ValueError, match="mismatched hardware"):
        merge_profiles([_node("a"), _node("b", hw=H100)])
    with pytest.raises(ValueError, match="mismatched backend model"):
        merge_profiles([_node("a"), _node("b", model="other")])
    with pytest.raises(ValueError, match="duplicate node names"):
        merge_profiles([_node("a"), _node("a")])
    with pytest.raises(ValueError, match="no node profiles"):
        merge_profiles([])


def test_non_monotone_or_empty_probes_are_rejected() -> None:
    p = _probes(1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        NodeProfile(**{**_node("a").__dict__, "probes": (p[1], p[0])})
    with pytest.raises(ValueError, match="empty grid"):
        NodeProfile(**{**_node("a").__dict__, "probes": ()})
    with pytest.raises(ValueError, match="strictly increasing"):
        cost_table([p[0], p[0]])


def test_node_profile_round_trips_through_json() -> None:
    n = _node("a")
    again = NodeProfile.from_dict(json.loads(json.dumps(n.to_dict())))
    assert again == n and again.config_key == n.config_key
    with pytest.raises(ValueError, match="missing field 'probes'"):
        NodeProfile.from_dict({k: v for k, v in n.to_dict().items() if k != "probes"})


def test_write_group_layout_and_sglang_compatibility(tmp_path: Path) -> None:
    g = merge_profiles([_node("a"), _node("b", 1.01)])
    paths = write_group(tmp_path, g, plot=True)
    assert paths == profile_paths(tmp_path, H200.slug, "m", 1)
    assert paths.table == tmp_path / "cuda-nvidia-h200-8x" / "m-tp1.json"
    text = paths.table.read_text()
    sg = SGLangSpsCostTable.from_json(text)
    assert sg.to_json() == text
    assert sg.sample_batch_tokens == [1, 2, 4, 8, 16] and sg.max_batch_tokens == 16
    ours = load_cost_table(paths.table)
    assert list(ours.sample_steps_per_sec) == sg.sample_steps_per_sec
    meta = json.loads(paths.meta.read_text())
    for key in ("hardware", "versions", "model", "tp_size", "dtype", "grid", "date", "probes"):
        assert key in meta
    assert meta["nodes"] == ["a", "b"] and meta["flagged_nodes"] == []
    assert [(s["lo_tokens"], s["hi_tokens"]) for s in meta["stairs"]] == [(4, 8)]
    assert paths.plot.read_bytes()[:4] == b"\x89PNG"
    first = paths.table.read_bytes()
    write_group(tmp_path, g, plot=False)  # idempotent rewrite
    assert paths.table.read_bytes() == first
    assert not list(tmp_path.rglob("*.tmp"))


def test_cost_table_rejects_bad_probes_via_the_shared_table_class() -> None:
    bad = Probe(4, 1.0, 1.0, 0.0, 1)
    with pytest.raises(CostTableError, match="max_batch_tokens"):
        cost_table([bad], max_batch_tokens=2)


def test_configmap_manifest_is_valid_kubernetes(tmp_path: Path) -> None:
    import kubernetes_validate

    g = merge_profiles([_node("a")])
    paths = write_group(tmp_path, g, plot=False)
    meta = json.loads(paths.meta.read_text())
    cm = build_configmap(g.group, paths.table.read_text(), meta, namespace="serving")
    version = content_version(paths.table.read_text())
    assert cm["metadata"]["name"] == f"dspark-cost-table-cuda-nvidia-h200-8x-m-tp1-{version}"
    assert cm["immutable"] is True
    assert cm["metadata"]["labels"]["dspark-sglang.io/tp"] == "1"
    assert cm["data"]["sps.json"] == paths.table.read_text()
    SGLangSpsCostTable.from_json(cm["data"]["sps.json"])
    kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(cm)), "1.30.0", strict=True)
    with pytest.raises(ValueError, match="namespace"):
        build_configmap(g.group, paths.table.read_text(), meta, namespace="")


def test_configmap_name_is_hardware_plus_the_table_file_stem(tmp_path: Path) -> None:
    """Same identity as ``profiles/<hardware>/<model>-tp<N>.json``, by construction."""
    assert configmap_name("CPU AMD EPYC", "SmolLM2 135M", 1) == (
        "dspark-cost-table-cpu-amd-epyc-smollm2-135m-tp1"
    )
    for model, tp in (("qwen3-235b-a22b", 4), ("Qwen3 235B/A22B", 8), ("m", 16)):
        paths = profile_paths(tmp_path, H200.slug, model, tp)
        assert profile_id(H200.slug, model, tp) == f"{H200.slug}-{paths.table.stem}"
        assert configmap_name(H200.slug, model, tp) == (
            f"dspark-cost-table-{H200.slug}-{paths.table.stem}"
        )


def test_tp4_and_tp8_of_one_hardware_group_get_distinct_configmaps(tmp_path: Path) -> None:
    """Both used to publish dspark-cost-table-<hardware>, so one overwrote the other."""
    manifests = {}
    for tp in (4, 8):
        g = merge_profiles([_node("a", tp=tp, model="qwen3-235b-a22b")])
        paths = write_group(tmp_path, g, plot=False)
        meta = json.loads(paths.meta.read_text())
        manifests[tp] = build_configmap(g.group, paths.table.read_text(), meta)
    names = {tp: cm["metadata"]["name"].rsplit("-", 1)[0] for tp, cm in manifests.items()}
    assert names == {
        4: "dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp4",
        8: "dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp8",
    }
    assert {cm["metadata"]["labels"]["dspark-sglang.io/tp"] for cm in manifests.values()} == {
        "4",
        "8",
    }
    other_model = merge_profiles([_node("a", tp=8, model="qwen3-8b")])
    paths = write_group(tmp_path, other_model, plot=False)
    cm = build_configmap(
        other_model.group, paths.table.read_text(), json.loads(paths.meta.read_text())
    )
    assert cm["metadata"]["name"].rsplit("-", 1)[0] not in names.values()


def test_configmap_name_rejects_what_cannot_name_a_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hardware group '---' has no letters"):
        configmap_name("---", "m", 1)
    with pytest.raises(ValueError, match="model '/' has no letters"):
        configmap_name("h200", "/", 1)
    for bad_tp in (0, -4, 1.5, True, "8"):
        with pytest.raises(ValueError, match="tp_size must be an integer >= 1"):
            configmap_name("h200", "m", bad_tp)  # type: ignore[arg-type]
    long_model = "m" * 240
    with pytest.raises(ValueError, match="over Kubernetes' 253; profile with a shorter"):
        configmap_name("h200", long_model, 1)
    just_fits = "m" * (253 - len("dspark-cost-table-h200--tp1"))
    assert len(configmap_name("h200", just_fits, 1)) == 253

    g = merge_profiles([_node("a")])
    paths = write_group(tmp_path, g, plot=False)
    table, meta = paths.table.read_text(), json.loads(paths.meta.read_text())
    for key in ("model", "tp_size"):
        with pytest.raises(ValueError, match=f"meta has no '{key}'"):
            build_configmap(g.group, table, {k: v for k, v in meta.items() if k != key})
    with pytest.raises(ValueError, match="hardware_slug 'cuda-nvidia-h200-8x' does not match"):
        build_configmap(H100.slug, table, meta)
    with pytest.raises(
        ValueError, match=re.escape("table_file 'm-tp1.json' does not match 'm-tp8.json'")
    ):
        build_configmap(g.group, table, {**meta, "tp_size": 8})


def test_fingerprint_of_this_machine_and_bad_fingerprints() -> None:
    fp = detect_fingerprint("cpu")
    assert fp.kind == "cpu" and fp.device_count >= 1
    assert fp.slug.startswith("cpu-") and fp.slug == fp.slug.lower()
    assert HardwareFingerprint.from_dict(fp.to_dict()) == fp
    with pytest.raises(ValueError, match="missing field 'runtime'"):
        HardwareFingerprint.from_dict({k: v for k, v in fp.to_dict().items() if k != "runtime"})
    with pytest.raises(ValueError, match="kind must be"):
        HardwareFingerprint("tpu", "x", 1, "d", "r")
