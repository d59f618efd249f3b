"""Half precision in the prim table: ``f16`` (IEEE binary16) and ``bf16`` (bfloat16).

Storage is half, arithmetic is float32: an op on half operands computes on the operands widened
to float32 (exact) and rounds its result once to the storage type, which is what numpy does for
float16 and ml_dtypes for bfloat16 (so eager Lucid too). Reductions, softmax and the norms
accumulate in float32 or wider.

Rounding to half (``to_half``) is written out here on the bits, so that it is one explicit
definition a backend can port: round to nearest, ties to even, from the exact value of the
source (a float32, a float64 or an integer, never through an intermediate format); gradual
underflow to subnormals; values past the largest finite number become infinity. NaN stays NaN
with its sign, its payload as the reference libraries give it: to ``f16`` numpy keeps the
payload's top bits (and keeps the result a NaN), except from ``bf16``, where ml_dtypes gives the
canonical quiet NaN; to ``bf16`` ml_dtypes always gives the canonical quiet NaN.
"""

from __future__ import annotations

import numpy as np

from lucid._dtype import BFloat16Table

HALF = frozenset({"f16", "bf16"})
# bf16's numpy dtype is ml_dtypes', looked up on first use: importing ml_dtypes is slow, and only
# programs with bf16 values need it.
HALF_NUMPY = BFloat16Table({"f16": np.dtype(np.float16)}, name="bf16")
_F16 = HALF_NUMPY["f16"]

# (exponent bits, fraction bits) of each format
_FORMATS = {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52)}
_BITS_OF = {np.dtype(np.float32): ("f32", np.uint32), np.dtype(np.float64): ("f64", np.uint64)}
_ONE = np.uint64(1)


def is_half(array: np.ndarray) -> bool:
    """Whether ``array`` holds f16 or bf16 values."""
    dt = array.dtype
    return dt == _F16 or (dt.name == "bfloat16" and dt == HALF_NUMPY["bf16"])


def widen_half(array: np.ndarray) -> np.ndarray:
    """A half array as float32 (exact); any other array unchanged."""
    if not is_half(array):
        return array
    with np.errstate(invalid="ignore"):  # ml_dtypes flags a NaN it converts
        return array.astype(np.float32)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Per element of a uint64 array: the number of bits up to its highest set bit (0 for 0)."""
    n = np.zeros(v.shape, np.int64)
    v = v.copy()
    for step in (32, 16, 8, 4, 2, 1):
        big = v >= (_ONE << np.uint64(step))
        n += np.where(big, step, 0)
        v = np.where(big, v >> np.uint64(step), v)
    return n + (v > 0)


def _round_magnitude(sig: np.ndarray, exp2: np.ndarray, dtype: str) -> np.ndarray:
    """The bits (sign not included) of the finite value ``sig * 2**exp2`` rounded to ``dtype``:
    ``sig`` is a uint64 magnitude, ``exp2`` an int64 power of two."""
    ebits, fbits = _FORMATS[dtype]
    bias = (1 << (ebits - 1)) - 1
    top = _bit_length(sig) - 1 + exp2  # the power of two of the leading bit
    # Quantize at the target's unit in the last place: that of the leading bit's binade, or of
    # the subnormal range below the smallest normal. Far above the largest finite value any
    # exponent gives infinity; clamp it so the shifts below stay in range.
    binade = np.clip(top, 1 - bias, bias + 1)
    drop = binade - fbits - exp2  # low bits of sig below the target's last place
    right = np.clip(drop, 0, 63).astype(np.uint64)
    left = np.clip(-drop, 0, 63).astype(np.uint64)
    kept = np.where(drop > 0, sig >> right, sig << left)
    rest = sig & ((_ONE << right) - _ONE)
    halfway = (_ONE << right) >> _ONE
    up = (drop > 0) & ((rest > halfway) | ((rest == halfway) & (kept & _ONE).astype(bool)))
    # For a normal result kept holds the implicit leading bit, which adds the 1 that turns the
    # biased exponent (binade + bias - 1) into (binade + bias); a carry out of the fraction
    # moves into the exponent the same way, up to infinity.
    normal_base = ((binade + bias - 1).astype(np.uint64)) << np.uint64(fbits)
    bits = np.where((top >= 1 - bias) & (sig > 0), normal_base, 0) + kept + up
    inf = np.uint64(((1 << ebits) - 1) << fbits)
    return np.where((bits >= inf) | (top > bias), inf, bits)


def _nan_bits(src: str, payload: np.ndarray, dtype: str) -> np.ndarray:
    ebits, fbits = _FORMATS[dtype]
    exponent = ((1 << ebits) - 1) << fbits
    if dtype == "bf16" or src == "bf16":
        return np.full(payload.shape, exponent | (1 << (fbits - 1)), np.uint64)
    kept = payload >> np.uint64(_FORMATS[src][1] - fbits)
    return np.uint64(exponent) | np.where(kept == 0, _ONE, kept)


def to_half(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` (float, integer or bool) rounded to half ``dtype`` ("f16" or "bf16")."""
    a = np.asarray(array)
    if is_half(a):
        if a.dtype == HALF_NUMPY[dtype]:
            return a.copy()
        src = "f16" if a.dtype == HALF_NUMPY["f16"] else "bf16"
        wide = widen_half(a)
        bits = _float_to_half_bits(wide, "f32", dtype)
        nan = np.isnan(wide)
        if nan.any():  # a NaN between the half formats: the canonical quiet NaN, signed
            sign = (wide.view(np.uint32) >> np.uint32(31)).astype(np.uint64)
            canon = _nan_bits(src, np.zeros(a.shape, np.uint64), dtype)
            bits = np.where(nan, canon | (sign << np.uint64(15)), bits)
        return bits.astype(np.uint16).view(HALF_NUMPY[dtype])
    if a.dtype.kind in "biu":
        return _int_to_half(a, dtype)
    if a.dtype not in _BITS_OF:
        a = a.astype(np.float64)
    src = _BITS_OF[a.dtype][0]
    return _float_to_half_bits(a, src, dtype).astype(np.uint16).view(HALF_NUMPY[dtype])


def _float_to_half_bits(a: np.ndarray, src: str, dtype: str) -> np.ndarray:
    ebits, fbits = _FORMATS[src]
    raw = a.view(_BITS_OF[a.dtype][1]).astype(np.uint64)
    sign = raw >> np.uint64(ebits + fbits)
    field = ((raw >> np.uint64(fbits)) & np.uint64((1 << ebits) - 1)).astype(np.int64)
    fraction = raw & np.uint64((1 << fbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    normal = field > 0
    sig = np.where(normal, fraction | (_ONE << np.uint64(fbits)), fraction)
    exp2 = np.where(normal, field, 1) - bias - fbits
    special = field == (1 << ebits) - 1
    bits = _round_magnitude(np.where(special, 0, sig), np.where(special, 0, exp2), dtype)
    out_e, out_f = _FORMATS[dtype]
    inf = np.uint64(((1 << out_e) - 1) << out_f)
    bits = np.where(special, np.where(fraction == 0, inf, _nan_bits(src, fraction, dtype)), bits)
    return bits | (sign << np.uint64(out_e + out_f))


def _int_to_half(a: np.ndarray, dtype: str) -> np.ndarray:
    wide = a.astype(np.int64)
    negative = wide < 0
    # |INT64_MIN| does not fit int64; as uint64 it is exact.
    magnitude = np.where(negative, (~wide.astype(np.uint64)) + _ONE, wide.astype(np.uint64))
    out_e, out_f = _FORMATS[dtype]
    bits = _round_magnitude(magnitude, np.zeros(a.shape, np.int64), dtype)
    bits = bits | (negative.astype(np.uint64) << np.uint64(out_e + out_f))
    return bits.astype(np.uint16).view(HALF_NUMPY[dtype])
