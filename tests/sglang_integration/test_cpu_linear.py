"""The few-row oneDNN linear (``cpu_linear``): same results as SGLang's path, right rows only.

The hooks are called directly with a stand-in ``original`` that records its calls, so
each test shows which path served a shape. The engines of the other tests in this
folder run with the hooks installed (the plugin installs them on the CPU engine), so
their greedy-identity checks cover the hooks inside SGLang.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from dspark_sglang.sglang_integration import cpu_linear

pytestmark = pytest.mark.skipif(
    not cpu_linear.onednn_available(), reason="this torch build has no oneDNN packed linear"
)

# float32 dot products over 576 terms, summed in another order: a few ulps of the
# result's magnitude. 1e-5 relative (plus 1e-5 absolute for results near 0) is ~100 ulps.
RTOL = ATOL = 1e-5


class Recorder:
    """Stands in for the wrapped SGLang function: records calls, computes F.linear."""

    def __init__(self) -> None:
        self.calls = 0

    def linear(self, method: Any, layer: Any, x: torch.Tensor, bias: Any = None) -> torch.Tensor:
        del method
        self.calls += 1
        return F.linear(x, layer.weight, bias)

    def lm_head(self, processor: Any, h: torch.Tensor, head: Any, bias: Any = None, **kw: Any):
        del processor, bias, kw
        self.calls += 1
        return torch.matmul(h, head.weight.T)


def _layer(out_features: int = 96, in_features: int = 576, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(
        torch.randn(out_features, in_features, generator=gen) / 24, requires_grad=False
    )
    return layer


@pytest.mark.parametrize("rows", [2, 3, 8, 17, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_few_rows_match_f_linear(rows: int, with_bias: bool) -> None:
    layer = _layer()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    rec = Recorder()
    out = cpu_linear.linear_apply(rec.linear, None, layer, x, bias)
    assert rec.calls == 0, "a few-row input must take the packed path"
    torch.testing.assert_close(out, F.linear(x, layer.weight, bias), rtol=RTOL, atol=ATOL)


def test_three_dimensional_input_keeps_its_shape() -> None:
    layer = _layer()
    x = torch.randn(2, 4, 576, generator=torch.Generator().manual_seed(1))
    out = cpu_linear.linear_apply(Recorder().linear, None, layer, x)
    assert out.shape == (2, 4, 96)
    torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(1, 576),  # a decode step: MKL's one-row product is the fast one
        torch.randn(cpu_linear.MAX_ROWS + 1, 576),  # a prefill
        torch.randn(4, 576, dtype=torch.bfloat16),
        torch.randn(4, 576, requires_grad=True),
    ],
    ids=["one-row", "prefill", "bfloat16", "grad"],
)
def test_other_inputs_take_sglangs_path(x: torch.Tensor) -> None:
    layer = _layer()
    if x.dtype == torch.bfloat16:
        layer.weight.data = layer.weight.data.to(torch.bfloat16)
    rec = Recorder()
    cpu_linear.linear_apply(rec.linear, None, layer, x)
    assert rec.calls == 1


def test_amx_packed_layers_are_left_to_sglang() -> None:
    layer = _layer()
    layer.use_intel_amx_backend = True
    rec = Recorder()
    cpu_linear.linear_apply(rec.linear, None, layer, torch.randn(4, 576))
    assert rec.calls == 1


def test_a_weight_written_in_place_is_repacked() -> None:
    layer = _layer()
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(2))
    rec = Recorder()
    cpu_linear.linear_apply(rec.linear, None, layer, x)  # packs the weight
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # as a weight update would
    out = cpu_linear.linear_apply(rec.linear, None, layer, x)
    torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=RTOL, atol=ATOL)


def test_lm_head_few_rows_match_matmul() -> None:
    head = SimpleNamespace(weight=_layer(out_features=1000).weight, quant_method=None)
    processor = SimpleNamespace(use_fp32_lm_head=False, rl_on_policy_target=None)
    h = torch.randn(8, 576, generator=torch.Generator().manual_seed(3))
    rec = Recorder()
    logits = cpu_linear.compute_lm_head(rec.lm_head, processor, h, head, None, out=None)
    assert rec.calls == 0
    torch.testing.assert_close(logits, torch.matmul(h, head.weight.T), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "head_extra, processor_extra",
    [
        ({"set_lora": object()}, {}),
        ({"quant_method": SimpleNamespace()}, {}),  # some quantised head
        ({}, {"use_fp32_lm_head": True}),
        ({}, {"rl_on_policy_target": "x"}),
    ],
    ids=["lora", "quantised", "fp32-head", "rl-on-policy"],
)
def test_lm_heads_sglang_treats_specially_are_left_to_it(
    head_extra: dict[str, Any], processor_extra: dict[str, Any]
) -> None:
    head = SimpleNamespace(weight=_layer(out_features=1000).weight, quant_method=None)
    for key, value in head_extra.items():
        setattr(head, key, value)
    processor = SimpleNamespace(use_fp32_lm_head=False, rl_on_policy_target=None)
    for key, value in processor_extra.items():
        setattr(processor, key, value)
    rec = Recorder()
    cpu_linear.compute_lm_head(rec.lm_head, processor, torch.randn(8, 576), head, None)
    assert rec.calls == 1


def test_switch_is_read_and_bad_values_name_the_variable() -> None:
    assert cpu_linear.enabled({}) is True
    assert cpu_linear.enabled({cpu_linear.ENV: "0"}) is False
    with pytest.raises(ValueError, match=cpu_linear.ENV):
        cpu_linear.enabled({cpu_linear.ENV: "yes"})


def test_packed_copies_go_with_their_weights() -> None:
    cache = cpu_linear.PackedWeights()
    layer = _layer()
    cache.get(layer.weight)
    assert len(cache) == 1
    del layer
    assert len(cache) == 0


def test_draft_head_projection_takes_the_packed_path() -> None:
    head = SimpleNamespace(weight=_layer(out_features=1000).weight, quant_method=None)
    h = torch.randn(8, 576, generator=torch.Generator().manual_seed(4))
    calls = []

    def original(hidden: torch.Tensor, lm_head: Any) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return torch.matmul(hidden, lm_head.weight.T)

    out = cpu_linear.project_through_lm_head(original, h, head)
    torch.testing.assert_close(out, torch.matmul(h, head.weight.T), rtol=RTOL, atol=ATOL)
    cpu_linear.project_through_lm_head(original, h[:1], head)
    assert calls == [1]  # only the one-row call went to SGLang


def test_our_draft_matmuls_follow_the_installed_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _layer().weight
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(5))
    packed: list[int] = []
    real = cpu_linear.few_row_linear
    monkeypatch.setattr(cpu_linear, "few_row_linear", lambda *a: packed.append(1) or real(*a))
    monkeypatch.setattr(cpu_linear, "_active", False)
    torch.testing.assert_close(cpu_linear.linear(x, weight), F.linear(x, weight))
    assert packed == []
    monkeypatch.setattr(cpu_linear, "_active", True)
    out = cpu_linear.linear(x, weight)
    assert packed == [1]
    torch.testing.assert_close(out, F.linear(x, weight), rtol=RTOL, atol=ATOL)


def test_weights_made_under_inference_mode_are_packed() -> None:
    # The reduced-vocabulary draft head gathers its rows under inference_mode; such a
    # tensor has no version counter to read.
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        rows = _layer().weight.detach()[torch.arange(0, 96, 2)]
        out = cpu_linear.few_row_linear(x, rows)
        again = cpu_linear.few_row_linear(x, rows)
    torch.testing.assert_close(out, F.linear(x, rows), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(again, out)
