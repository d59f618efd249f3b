"""Test helpers: run one prim op natively and through the numpy reference interpreter."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lucid.backends.cpu import CPUBackend, Program
from lucid.ir import prim
from lucid.ir.prim import HALF, NUMPY_DTYPES, dtype_of, to_half, widen_half

FLOAT_NUMPY = {d: NUMPY_DTYPES[d] for d in ("f32", "f64", *sorted(HALF))}

TOLERANCE = {
    "f32": (2e-5, 2e-6),
    "f64": (1e-12, 1e-13),
    # one rounding of a float32 result: half a unit in the last place
    "f16": (2**-11, 2**-24),
    "bf16": (2**-8, 2**-133),
}


def run_both(
    name: str, arrays: list[np.ndarray], attrs: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(native result, reference result) of one prim op on ``arrays``."""
    program = Program()
    slots = [program.feed(a.shape, dtype_of(a)) for a in arrays]
    program.result(program.op(name, *slots, **(attrs or {})))
    native = CPUBackend(cache=False).compile(program).run(arrays)[0]
    return native, program.interpret(arrays)[0]


def decomposed(program: Program, feeds: list[np.ndarray]) -> list[np.ndarray]:
    """``program``'s results from the prim table alone: every composite op (``gelu``,
    ``layer_norm``, ...) runs as its decomposition, where ``Program.interpret`` runs the CPU
    kernels' own references."""
    env = dict(zip(program.feeds, feeds, strict=True))
    for ins in program.instrs:
        outs = prim.evaluate(ins.op, [env[s] for s in ins.inputs], ins.attrs)
        env.update(zip(ins.outputs, outs, strict=True))
    return [env[s] for s in program.results]


def assert_match(native: np.ndarray, ref: np.ndarray, scale: float = 1.0) -> None:
    assert native.dtype == ref.dtype, (native.dtype, ref.dtype)
    assert native.shape == ref.shape, (native.shape, ref.shape)
    if dtype_of(native) in TOLERANCE:
        rtol, atol = TOLERANCE[dtype_of(native)]
        np.testing.assert_allclose(
            widen_half(native),
            widen_half(ref),
            rtol=rtol * scale,
            atol=atol * scale,
            equal_nan=True,
        )
    else:
        np.testing.assert_array_equal(native, ref)


def check(
    name: str, arrays: list[np.ndarray], attrs: dict[str, Any] | None = None, scale: float = 1.0
) -> np.ndarray:
    native, ref = run_both(name, arrays, attrs)
    assert_match(native, ref, scale)
    return native


def random_array(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: str, positive: bool = False
) -> np.ndarray:
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in ("i32", "i64"):
        low = 1 if positive else -20
        return np.asarray(
            rng.integers(low, 21, size=shape), np.int32 if dtype == "i32" else np.int64
        )
    if dtype not in FLOAT_NUMPY:
        raise ValueError(f"random_array: unknown dtype {dtype!r}")
    values = rng.standard_normal(shape) * 3
    if positive:
        values = np.abs(values) + 0.1
    if dtype in HALF:
        return np.asarray(to_half(values, dtype))
    return np.asarray(values, FLOAT_NUMPY[dtype])


@contextlib.contextmanager
def sgemm_isa(name: str) -> Iterator[None]:
    """Lucid's GEMM on the micro-kernel ``name`` ("auto", "avx2" or "avx512") inside the block
    (back to "auto" after it)."""
    from lucid import _native

    _native.set_sgemm_isa(name)
    try:
        yield
    finally:
        _native.set_sgemm_isa("auto")


def draw_conv_layer(
    draw: Callable[[Any], Any], *, in_per_group: int = 3, out_per_group: int = 5, side: int = 9
) -> tuple[tuple, tuple, dict[str, Any]]:
    """(input shape, weight shape, attributes) of a random ``conv2d``: 1-2 groups, kernels of
    1-3, strides 1-2, padding below the kernel, sides up to ``side``. ``draw`` is hypothesis':
    wrap a call in ``st.composite``."""
    from hypothesis import strategies as st

    groups = draw(st.integers(1, 2))
    cg, og = draw(st.integers(1, in_per_group)), draw(st.integers(1, out_per_group))
    k = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 2))
    pad = draw(st.integers(0, k - 1))
    x = (
        draw(st.integers(1, 4)),
        cg * groups,
        draw(st.integers(k, side)),
        draw(st.integers(k, side)),
    )
    attrs = {
        "strides": (stride, stride),
        "dilation": (1, 1),
        "padding": (pad, pad, pad, pad),
        "groups": groups,
    }
    return x, (og * groups, cg, k, k), attrs
