"""The uplink's compressors (raymtl.toolbox.compression, docs/ALGORITHMS.md §9.4) on small
hand-computed vectors: what decodes, the exact bits, QSGD's unbiasedness, error feedback's
sum, and that the payload is compact. No Ray, no GPU needed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raymtl.toolbox.compression import (
    bits_of,
    compress,
    decode,
    encode,
    keep_count,
)
from raymtl.toolbox.settings import UplinkCodec

TOPK = UplinkCodec(kind="topk", ratio=0.5)
QSGD1 = UplinkCodec(kind="qsgd", levels=1)
SIGN = UplinkCodec(kind="sign")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def roundtrip(codec: UplinkCodec, values, seed: int = 0) -> tuple[torch.Tensor, int, dict]:
    payload, bits = encode(codec, {"w": torch.tensor(values, dtype=torch.float32)}, gen(seed))
    return decode(codec, payload)["w"], bits, payload


# ---- top-k ----


def test_topk_keeps_the_largest_magnitudes():
    decoded, bits, payload = roundtrip(TOPK, [1.0, -3.0, 2.0, 0.5])
    assert decoded.tolist() == [0.0, -3.0, 2.0, 0.0]
    assert bits == 2 * (32 + 2) == 68
    assert payload["w/indices"].tolist() == [1, 2]
    assert payload["w/values"].tolist() == [-3.0, 2.0]
    assert payload["w/indices"].dtype == torch.int32
    assert payload["w/values"].dtype == torch.float32
    assert payload["w/shape"].tolist() == [4]


def test_topk_ties_go_to_the_lowest_index():
    codec = UplinkCodec(kind="topk", ratio=0.25)
    decoded, _, _ = roundtrip(codec, [1.0, -2.0, 2.0, 1.0])  # k = 1: |-2| = |2|
    assert decoded.tolist() == [0.0, -2.0, 0.0, 0.0]
    codec = UplinkCodec(kind="topk", ratio=0.4)
    decoded, _, _ = roundtrip(codec, [1.0, 1.0, -1.0, 1.0, 1.0])  # k = 2, all tied
    assert decoded.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    decoded, _, _ = roundtrip(codec, [0.5, 1.0, 3.0, -1.0, 1.0])  # 3, then the first 1
    assert decoded.tolist() == [0.0, 1.0, 3.0, 0.0, 0.0]


def test_topk_matches_a_stable_sort_with_many_ties():
    values = torch.randint(-3, 4, (500,), generator=gen(3)).to(torch.float32)
    codec = UplinkCodec(kind="topk", ratio=0.13)
    k = keep_count(0.13, 500)
    expected = torch.sort(torch.argsort(-values.abs(), stable=True)[:k]).values
    payload, _ = encode(codec, {"w": values}, gen())
    assert payload["w/indices"].to(torch.int64).tolist() == expected.tolist()


def test_topk_with_nan_falls_back_to_the_stable_sort():
    values = torch.tensor([1.0, float("nan"), 2.0, 2.0, -5.0, 0.0])
    codec = UplinkCodec(kind="topk", ratio=0.5)
    expected = torch.sort(torch.argsort(-values.abs(), stable=True)[:3]).values
    payload, _ = encode(codec, {"w": values}, gen())
    assert payload["w/indices"].tolist() == expected.tolist() == [2, 3, 4]


def test_topk_count_from_the_decimal():
    assert 0.07 * 100 > 7  # the float product would keep 8
    assert keep_count(0.07, 100) == 7
    assert keep_count(0.001, 10) == 1  # at least one
    assert keep_count(1.0, 10) == 10
    assert keep_count(0.5, 0) == 0


def test_topk_bits():
    assert bits_of(UplinkCodec(kind="topk", ratio=0.5), {"w": (4,)}) == 68
    assert bits_of(UplinkCodec(kind="topk", ratio=0.5), {"b": ()}) == 32  # d = 1: no index
    assert bits_of(UplinkCodec(kind="topk", ratio=0.2), {"w": (5,)}) == 35  # ⌈log₂ 5⌉ = 3
    assert bits_of(UplinkCodec(kind="topk", ratio=0.07), {"w": (10, 10)}) == 7 * (32 + 7)
    assert bits_of(UplinkCodec(kind="topk", ratio=0.5), {"a": (4,), "b": (2, 2, 2)}) == 68 + 4 * (
        32 + 3
    )


def test_topk_payload_is_compact():
    d = 10_000
    codec = UplinkCodec(kind="topk", ratio=0.01)
    values = torch.randn(d, generator=gen(1))
    payload, bits = encode(codec, {"w": values}, gen())
    assert payload["w/indices"].numel() == payload["w/values"].numel() == 100
    sent = sum(t.numel() for key, t in payload.items() if not key.endswith("/shape"))
    assert sent == 200 < d
    assert bits == 100 * (32 + 14)
    decoded = decode(codec, payload)["w"]
    assert torch.count_nonzero(decoded) == 100
    kept = decoded != 0
    assert decoded[kept].abs().min() >= values[~kept].abs().max()


# ---- QSGD ----


def test_qsgd_one_level_decodes_to_zero_or_the_norm():
    for seed in range(20):
        decoded, bits, payload = roundtrip(QSGD1, [0.6, 0.8], seed)
        assert bits == 32 + 2 * 2 == 36
        assert payload["w/norm"].item() == pytest.approx(1.0)
        assert payload["w/levels"].dtype == torch.int8
        assert set(payload["w/levels"].tolist()) <= {0, 1}
        for value in decoded.tolist():
            assert value in (0.0, pytest.approx(1.0))


def test_qsgd_signs_and_levels():
    codec = UplinkCodec(kind="qsgd", levels=4)
    # ‖v‖ = 5: s|v|/‖v‖ = [2.4, 3.2, 0, 4]: levels ⌊·⌋ or ⌈·⌉, exact where whole.
    decoded, bits, payload = roundtrip(codec, [-3.0, 4.0, 0.0, 0.0], seed=5)
    levels = payload["w/levels"].tolist()
    assert levels[0] in (-2, -3) and levels[1] in (3, 4) and levels[2:] == [0, 0]
    assert decoded.tolist() == pytest.approx([5 * q / 4 for q in levels])
    assert bits == 32 + 4 * (1 + 3)
    decoded, _, payload = roundtrip(codec, [0.0, -2.0, 0.0], seed=5)  # one entry: exact
    assert payload["w/levels"].tolist() == [0, -4, 0]
    assert decoded.tolist() == [0.0, -2.0, 0.0]


def test_qsgd_of_zero_is_zero():
    decoded, bits, payload = roundtrip(QSGD1, [0.0, 0.0, 0.0])
    assert decoded.tolist() == [0.0, 0.0, 0.0]
    assert payload["w/norm"].item() == 0.0
    assert bits == 32 + 3 * 2


def test_qsgd_level_width():
    assert bits_of(UplinkCodec(kind="qsgd", levels=127), {"w": (10,)}) == 32 + 10 * 8
    assert bits_of(UplinkCodec(kind="qsgd", levels=128), {"w": (10,)}) == 32 + 10 * 9
    assert bits_of(UplinkCodec(kind="qsgd", levels=3), {"w": (10,)}) == 32 + 10 * 3
    big = UplinkCodec(kind="qsgd", levels=200)
    payload, _ = encode(big, {"w": torch.randn(10, generator=gen())}, gen())
    assert payload["w/levels"].dtype == torch.int16
    assert payload["w/norm"].shape == () and payload["w/norm"].dtype == torch.float32


def test_qsgd_is_unbiased():
    codec = UplinkCodec(kind="qsgd", levels=2)
    v = torch.tensor([0.3, -0.5, 0.1, 0.8, 0.0])
    norm = v.norm().item()
    generator = gen(7)
    draws = 4000
    total = torch.zeros_like(v)
    for _ in range(draws):
        payload, _ = encode(codec, {"w": v}, generator)
        total += decode(codec, payload)["w"]
    mean = total / draws
    # Var Q_j = (‖v‖/s)²·p(1 − p) ≤ (‖v‖/s)²/4; five standard errors of the mean.
    tolerance = 5 * (norm / 2) * 0.5 / math.sqrt(draws)
    assert torch.allclose(mean, v, atol=tolerance)


def test_qsgd_is_deterministic_per_generator():
    codec = UplinkCodec(kind="qsgd", levels=3)
    delta = {"a": torch.randn(50, generator=gen(1)), "b": torch.randn(3, 3, generator=gen(2))}
    first, _ = encode(codec, delta, gen(11))
    second, _ = encode(codec, delta, gen(11))
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert list(first) == list(second)


# ---- scaled sign ----


def test_sign_scales_the_signs():
    decoded, bits, payload = roundtrip(SIGN, [1.0, -3.0, 2.0, 0.0])
    assert payload["w/scale"].item() == 1.5
    assert decoded.tolist() == [1.5, -1.5, 1.5, 1.5]  # sgn(0) = +1
    assert bits == 36
    assert payload["w/bits"].dtype == torch.uint8
    assert payload["w/bits"].tolist() == [0b10110000]


def test_sign_payload_is_packed_bits():
    d = 21
    values = torch.randn(d, generator=gen(4))
    payload, bits = encode(SIGN, {"w": values}, gen())
    assert payload["w/bits"].dtype == torch.uint8
    assert payload["w/bits"].numel() == math.ceil(d / 8) == 3
    expected = np.packbits((values >= 0).numpy())
    assert payload["w/bits"].numpy().tolist() == expected.tolist()
    assert bits == 32 + d
    decoded = decode(SIGN, payload)["w"]
    scale = values.abs().sum().item() / d
    assert torch.allclose(decoded, torch.where(values >= 0, scale, -scale))


# ---- all codecs ----

CODECS = [
    UplinkCodec(kind="topk", ratio=0.3),
    UplinkCodec(kind="qsgd", levels=4),
    UplinkCodec(kind="sign"),
]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kind)
def test_shapes_names_and_bits(codec):
    delta = {
        "layer.0/weight": torch.randn(3, 4, generator=gen(1)),
        "layer.0/bias": torch.randn(4, generator=gen(2)),
        "scalar": torch.tensor(0.7),
        "empty": torch.zeros(0, 3),
        "conv.weight": torch.randn(2, 1, 3, 3, generator=gen(3), dtype=torch.float64),
    }
    payload, bits = encode(codec, delta, gen())
    assert all(t.device.type == "cpu" for t in payload.values())
    decoded = decode(codec, payload)
    assert list(decoded) == list(delta)
    for name, tensor in delta.items():
        assert decoded[name].shape == tensor.shape
        assert decoded[name].dtype == torch.float32
    assert bits == bits_of(codec, {name: tuple(t.shape) for name, t in delta.items()})
    assert payload["scalar/shape"].tolist() == [] and payload["scalar/shape"].dtype == torch.int64


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kind)
def test_non_float_tensors_are_refused(codec):
    with pytest.raises(TypeError):
        encode(codec, {"count": torch.tensor([3])}, gen())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kind)
def test_without_error_feedback(codec):
    delta = {"w": torch.randn(6, generator=gen(1))}
    payload, bits, kept = compress(codec, delta, None, gen(9))
    expected, expected_bits = encode(codec, delta, gen(9))
    assert kept is None and bits == expected_bits
    assert all(torch.equal(payload[key], expected[key]) for key in expected)


@pytest.mark.parametrize("kind", ["topk", "qsgd", "sign"])
def test_error_feedback_loses_nothing(kind):
    codec = UplinkCodec(kind=kind, ratio=0.2, levels=1, error_feedback=True)
    shapes = {"w": (4, 5), "b": (5,)}
    generator = gen(21)
    residual = None
    total_sent = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}
    total_delta = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}
    for t in range(6):
        delta = {name: torch.randn(shape, generator=gen(100 + t)) for name, shape in shapes.items()}
        payload, bits, residual = compress(codec, delta, residual, generator)
        assert bits == bits_of(codec, shapes)
        sent = decode(codec, payload)
        for name in shapes:
            total_sent[name] += sent[name].double()
            total_delta[name] += delta[name].double()
            assert residual[name].dtype == torch.float32
    for name in shapes:
        assert torch.allclose(
            total_sent[name] + residual[name].double(), total_delta[name], atol=1e-5
        )
    if kind == "topk":  # what top-k leaves out is carried, not lost
        assert any(torch.count_nonzero(r) > 0 for r in residual.values())


def test_error_feedback_first_round_residual():
    codec = UplinkCodec(kind="topk", ratio=0.5, error_feedback=True)
    delta = {"w": torch.tensor([1.0, -3.0, 2.0, 0.5])}
    payload, bits, residual = compress(codec, delta, None, gen())
    assert residual["w"].tolist() == [1.0, 0.0, 0.0, 0.5]
    # Next round: v = Δ + e = [2, -3, 2, 0.5] + ... keeps the 1 that was held back.
    payload, _, residual = compress(
        codec, {"w": torch.tensor([1.0, 0.0, 0.0, 0.0])}, residual, gen()
    )
    assert decode(codec, payload)["w"].tolist() == [2.0, 0.0, 0.0, 0.5]
    assert residual["w"].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_error_feedback_keeps_the_update_dtype():
    codec = UplinkCodec(kind="sign", error_feedback=True)
    delta = {"w": torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)}
    _, _, residual = compress(codec, delta, None, gen())
    assert residual["w"].dtype == torch.float64
    with pytest.raises(ValueError):
        compress(codec, delta, {"other": torch.zeros(3)}, gen())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.kind)
def test_cuda_matches_cpu(codec):
    delta = {"w": torch.randn(37, 3, generator=gen(1)), "b": torch.randn(5, generator=gen(2))}
    cpu, cpu_bits = encode(codec, delta, gen(5))
    cuda, cuda_bits = encode(codec, {n: t.cuda() for n, t in delta.items()}, gen(5))
    assert cuda_bits == cpu_bits and list(cuda) == list(cpu)
    for key in cpu:
        assert cuda[key].device.type == "cpu"
        assert cuda[key].dtype == cpu[key].dtype
        assert torch.allclose(cuda[key].double(), cpu[key].double(), atol=1e-6)
    ef = UplinkCodec(kind=codec.kind, ratio=codec.ratio, levels=codec.levels, error_feedback=True)
    _, _, residual = compress(ef, {n: t.cuda() for n, t in delta.items()}, None, gen(5))
    assert all(r.device.type == "cuda" for r in residual.values())
