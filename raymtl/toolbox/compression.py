"""Compression of the uplink (docs/ALGORITHMS.md §9.4): what a client sends is its update
Δ_k = w_k − w_t (float tensors only), never the model itself.

Three compressors, each applied per tensor v of d entries:

* top-k (Aji & Heafield 2017, "Sparse Communication for Distributed Gradient Descent"; with
  memory: Stich et al. 2018, "Sparsified SGD with Memory"): keep the k = ⌈r·d⌉ entries of
  largest |v_j| (k from the decimal the user wrote for r: 0.07 of 100 is 7, not the float
  product's 8; at least 1), ties broken by the lowest index; the others are 0.
  Sent: k indices (int32, int64 past 2³¹ − 1 entries) and k float32 values.
  bits = k·(32 + ⌈log₂ d⌉)   (⌈log₂ 1⌉ = 0: a one-entry tensor costs 32 bits).

* Stochastic quantisation, QSGD (Alistarh et al. 2017, "QSGD: Communication-Efficient SGD
  via Gradient Quantization and Encoding"), s levels:
      Q(v)_j = ‖v‖₂·sign(v_j)·ξ_j/s,
      ξ_j = ⌊s|v_j|/‖v‖₂⌋ + Bernoulli(s|v_j|/‖v‖₂ − ⌊s|v_j|/‖v‖₂⌋),
  so that E[Q(v)] = v (unbiased), and Q(0) = 0. The uniforms come from the caller's
  torch.Generator, drawn on the CPU (one float32 per entry, in name order, always drawn,
  even for a zero tensor) and then moved to the tensor's device, so that a run is the same
  on any device. Sent: ‖v‖₂ as one float32 and the signed levels sign(v_j)·ξ_j ∈ [−s, s]
  (int8 when s ≤ 127, int16 when s ≤ 32767, wider beyond).
  bits = 32 + d·(1 + ⌈log₂(s + 1)⌉)   (one sign bit and the level; no entropy coding:
  s = 1 -> 2 bits an entry, s = 127 -> 8).

* Scaled sign (EF-SignSGD, Karimireddy et al. 2019, "Error Feedback Fixes SignSGD and other
  Gradient Compression Schemes"): C(v) = (‖v‖₁/d)·sgn(v) with sgn(0) = +1, so that each
  entry is one bit. Sent: the scale ‖v‖₁/d as one float32 and the d signs bit-packed into
  ⌈d/8⌉ bytes (uint8, most significant bit first, as numpy.packbits; a bit 1 is +).
  bits = 32 + d.

Error feedback (any compressor C; Stich et al. 2018, Karimireddy et al. 2019): the client
keeps e_k (0 at first) and sends C(v) with v = Δ_k + e_k, then keeps e_k ← v − C(v), where
C(v) is exactly what the server decodes. Over rounds t = 1..T, Σ_t C(v_t) + e_T = Σ_t Δ_t
(up to float rounding): nothing is lost, only delayed.

The encoded form (the payload) is what would go on a wire: a flat dict of compact CPU
tensors, keyed "<name>/<part>", that travels through Ray's object store and decodes with
nothing but the codec's settings. Every tensor also carries "<name>/shape" (an int64 tensor
of its shape) so that decoding needs no model; these shapes are metadata that both sides
know, and they are NOT counted in the bits. The bits `encode` returns are the formulas
above exactly (the values sent as float32 count 32 bits whatever Δ's own dtype);
`bits_of` gives the same number from the shapes alone. Decoding gives dense float32 CPU
tensors. Only floating tensors are compressed; the caller sends no other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import torch

from raymtl.toolbox.settings import UplinkCodec

Tensors = dict[str, torch.Tensor]
Payload = dict[str, torch.Tensor]

SHAPE = "shape"
_INT32_MAX = 2**31 - 1


def _ceil_log2(n: int) -> int:
    """⌈log₂ n⌉ for n ≥ 1, exactly (integers, no float log): 1 -> 0, 4 -> 2, 5 -> 3."""
    return (n - 1).bit_length() if n >= 1 else 0


def keep_count(ratio: float, numel: int) -> int:
    """top-k's k = ⌈r·d⌉ from the decimal written for r, at least 1 (0 for an empty tensor)."""
    if numel == 0:
        return 0
    exact = Fraction(repr(float(ratio))) * numel
    return min(numel, max(1, math.ceil(exact)))


def _work(v: torch.Tensor) -> torch.Tensor:
    """The tensor flattened, in float32 (float64 stays float64) for the arithmetic."""
    flat = v.reshape(-1)
    return flat if flat.dtype == torch.float64 else flat.to(torch.float32)


# ---- top-k ----


def _topk_indices(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """The indices (ascending) of the k largest entries, ties by the lowest index: what a
    stable sort of −|v| keeps first. torch.topk breaks ties arbitrarily, so it only finds
    the k-th value t; all entries above t are kept, then those equal to t by index."""
    d = magnitude.numel()
    if k >= d:
        return torch.arange(d, device=magnitude.device)
    t = torch.topk(magnitude, k, sorted=False).values.min()
    above = torch.nonzero(magnitude > t).reshape(-1)
    at = torch.nonzero(magnitude == t).reshape(-1)[: k - above.numel()]
    chosen = torch.cat([above, at])
    if chosen.numel() != k:  # NaN somewhere: fall back to the definition itself
        chosen = torch.argsort(-magnitude, stable=True)[:k]
    return torch.sort(chosen).values


def _topk_encode(codec: UplinkCodec, v: torch.Tensor, generator: torch.Generator) -> Payload:
    flat = _work(v)
    d = flat.numel()
    indices = _topk_indices(flat.abs(), keep_count(codec.ratio, d))
    index_dtype = torch.int32 if d <= _INT32_MAX else torch.int64
    return {
        "indices": indices.to(index_dtype),
        "values": flat[indices].to(torch.float32),
    }


def _topk_decode(codec: UplinkCodec, parts: Payload, numel: int) -> torch.Tensor:
    dense = torch.zeros(numel, dtype=torch.float32)
    dense[parts["indices"].to(torch.int64)] = parts["values"].to(torch.float32)
    return dense


def _topk_bits(codec: UplinkCodec, numel: int) -> int:
    return keep_count(codec.ratio, numel) * (32 + _ceil_log2(numel))


# ---- QSGD ----


def _level_dtype(levels: int) -> torch.dtype:
    for dtype in (torch.int8, torch.int16, torch.int32):
        if levels <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def _qsgd_encode(codec: UplinkCodec, v: torch.Tensor, generator: torch.Generator) -> Payload:
    s = codec.levels
    flat = _work(v)
    d = flat.numel()
    uniform = torch.rand(d, generator=generator, dtype=torch.float32).to(flat.device)
    # The norm the server will multiply by is the float32 one sent, so ξ is drawn against it.
    norm = torch.linalg.vector_norm(flat).to(torch.float32)
    # Q(0) = 0: with ‖v‖ = 0 every ratio is 0 (no host sync to branch on it).
    divisor = torch.where(norm > 0, norm, torch.ones_like(norm)).to(flat.dtype)
    ratio = s * flat.abs() / divisor
    low = torch.floor(ratio)
    xi = low + (uniform.to(flat.dtype) < ratio - low).to(flat.dtype)
    xi = torch.clamp(xi, 0, s)  # float rounding can put s|v_j|/‖v‖ a hair above s
    sign = torch.where(flat < 0, -1.0, 1.0).to(flat.dtype)
    levels = (sign * xi).to(_level_dtype(s))
    return {"norm": norm.reshape(()), "levels": levels}


def _qsgd_decode(codec: UplinkCodec, parts: Payload, numel: int) -> torch.Tensor:
    norm = parts["norm"].to(torch.float32)
    return norm * parts["levels"].to(torch.float32) / codec.levels


def _qsgd_bits(codec: UplinkCodec, numel: int) -> int:
    return 32 + numel * (1 + _ceil_log2(codec.levels + 1))


# ---- scaled sign ----

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # most significant first, as numpy.packbits


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """numpy.packbits on any device: bools -> ⌈n/8⌉ uint8, the first bit the highest."""
    n = bits.numel()
    padded = torch.zeros(8 * ((n + 7) // 8), dtype=torch.int32, device=bits.device)
    padded[:n] = bits.to(torch.int32)
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.int32, device=bits.device)
    return (padded.reshape(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def _unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """numpy.unpackbits(packed)[:n] as bools."""
    shifts = torch.arange(7, -1, -1, dtype=torch.int32)
    bits = (packed.to(torch.int32).unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:n].to(torch.bool)


def _sign_encode(codec: UplinkCodec, v: torch.Tensor, generator: torch.Generator) -> Payload:
    flat = _work(v)
    d = flat.numel()
    scale = flat.abs().sum() / d if d else flat.new_zeros(())
    return {"scale": scale.to(torch.float32).reshape(()), "bits": _pack_bits(~(flat < 0))}


def _sign_decode(codec: UplinkCodec, parts: Payload, numel: int) -> torch.Tensor:
    positive = _unpack_bits(parts["bits"], numel)
    sign = torch.where(positive, 1.0, -1.0).to(torch.float32)
    return parts["scale"].to(torch.float32) * sign


def _sign_bits(codec: UplinkCodec, numel: int) -> int:
    return 32 + numel


# ---- dispatch ----


@dataclass(frozen=True)
class _Codec:
    encode: Callable[[UplinkCodec, torch.Tensor, torch.Generator], Payload]
    decode: Callable[[UplinkCodec, Payload, int], torch.Tensor]
    bits: Callable[[UplinkCodec, int], int]


CODECS: dict[str, _Codec] = {
    "topk": _Codec(_topk_encode, _topk_decode, _topk_bits),
    "qsgd": _Codec(_qsgd_encode, _qsgd_decode, _qsgd_bits),
    "sign": _Codec(_sign_encode, _sign_decode, _sign_bits),
}


def _codec(codec: UplinkCodec) -> _Codec:
    try:
        return CODECS[codec.kind]
    except KeyError:
        raise ValueError(
            f"unknown uplink codec {codec.kind!r}; known: {', '.join(CODECS)}"
        ) from None


def _numel(shape) -> int:
    return math.prod(int(n) for n in shape)


def bits_of(codec: UplinkCodec, shapes: dict[str, tuple]) -> int:
    """The exact bits of the tensors of these shapes, by §9.4's formulas (shapes not counted)."""
    impl = _codec(codec)
    return sum(impl.bits(codec, _numel(shape)) for shape in shapes.values())


def encode(codec: UplinkCodec, delta: Tensors, generator: torch.Generator) -> tuple[Payload, int]:
    """The payload of `delta` (compact CPU tensors keyed "<name>/<part>", names in order,
    "<name>/shape" first) and its exact bits. Each tensor is encoded on its own device."""
    impl = _codec(codec)
    payload: Payload = {}
    bits = 0
    for name, v in delta.items():
        if not torch.is_floating_point(v):
            raise TypeError(f"{name}: only floating tensors are compressed, not {v.dtype}")
        payload[f"{name}/{SHAPE}"] = torch.tensor(tuple(v.shape), dtype=torch.int64)
        for part, tensor in impl.encode(codec, v.detach(), generator).items():
            payload[f"{name}/{part}"] = tensor.to("cpu")
        bits += impl.bits(codec, v.numel())
    return payload, bits


def decode(codec: UplinkCodec, payload: Payload) -> Tensors:
    """The dense float32 CPU tensors a payload stands for, names in the order sent."""
    impl = _codec(codec)
    grouped: dict[str, Payload] = {}
    for key, tensor in payload.items():
        name, sep, part = key.rpartition("/")
        if not sep:
            raise ValueError(f"payload key {key!r} is not '<name>/<part>'")
        grouped.setdefault(name, {})[part] = tensor
    out: Tensors = {}
    for name, parts in grouped.items():
        if SHAPE not in parts:
            raise ValueError(f"payload has no {name}/{SHAPE}")
        shape = tuple(int(n) for n in parts.pop(SHAPE).tolist())
        out[name] = impl.decode(codec, parts, _numel(shape)).reshape(shape)
    return out


def compress(
    codec: UplinkCodec,
    delta: Tensors,
    residual: Tensors | None,
    generator: torch.Generator,
) -> tuple[Payload, int, Tensors | None]:
    """(payload, bits, the residual to keep). With codec.error_feedback: v = Δ + e (e = 0
    when `residual` is None), send encode(v), keep e' = v − decode(payload) on Δ's devices
    and dtypes. Without: encode(Δ), and None (a `residual` given is ignored)."""
    if not codec.error_feedback:
        payload, bits = encode(codec, delta, generator)
        return payload, bits, None
    if residual is not None and set(residual) != set(delta):
        raise ValueError(
            f"the residual's tensors {sorted(residual)} are not the update's {sorted(delta)}"
        )
    v = {
        name: x.detach()
        if residual is None
        else x.detach() + residual[name].to(device=x.device, dtype=x.dtype)
        for name, x in delta.items()
    }
    payload, bits = encode(codec, v, generator)
    sent = decode(codec, payload)
    kept = {name: x - sent[name].to(device=x.device, dtype=x.dtype) for name, x in v.items()}
    return payload, bits, kept
