"""The emitter op by op: every prim op's emission calls only the methods the emission table names
for it, and the reference builder's run equals the prim table's numpy semantics, including the
edge cases MPSGraph treats differently (integer division by zero, NaN/out-of-range casts, NaN in
max/relu, negative and out-of-range indices)."""

from __future__ import annotations

import numpy as np
import pytest

from lucid.backends.cpu.testing import random_array
from lucid.backends.mpsgraph.backend import MPSGraphExecutable
from lucid.backends.mpsgraph.emit import Val, emit_op, mps_dims
from lucid.backends.mpsgraph.reference import ReferenceBuilder, run_program
from lucid.backends.mpsgraph.selectors import EMISSIONS
from lucid.ir import prim as P

RNG = np.random.default_rng(7)


def f(*shape):
    return random_array(RNG, shape, "f32")


def i64(*shape):
    return random_array(RNG, shape, "i64")


def i32(*shape):
    return random_array(RNG, shape, "i32")


def emit_and_run(name, arrays, attrs):
    """Emit one prim op on placeholders, run it in the reference; rank-0 values are (1,) in the
    program (mps_dims), as the backend's boundary feeds them."""
    b = ReferenceBuilder()
    ins = [
        Val(b.placeholder(mps_dims(a.shape), P.dtype_of(a), f"input:{i}"), a.shape, P.dtype_of(a))
        for i, a in enumerate(arrays)
    ]
    outs, checks = emit_op(b, name, ins, attrs)
    prog = b.program(list(dict.fromkeys([o.id for o in outs] + checks)), [])
    res = run_program(prog, [a.reshape(mps_dims(a.shape)) for a in arrays])
    got = [r.reshape(o.shape) for r, o in zip(res, outs, strict=False)]
    return got, res[len(outs) :], prog


_NAN = np.array([np.nan, 1.0, -np.inf, np.inf, -0.0, 3e9, -3e9], np.float32)
CASES = [
    *[(n, [f(3, 4)], {}) for n in ("neg", "abs", "sign", "square", "relu", "exp", "sin", "cos",
                                   "tan", "tanh", "sigmoid", "erf", "floor", "ceil", "round")],
    *[(n, [np.abs(f(5)) + 0.1], {}) for n in ("log", "sqrt", "rsqrt", "reciprocal", "log1p")],
    ("relu", [_NAN], {}), ("relu", [i32(6)], {}), ("neg", [i64(4)], {}), ("sign", [i32(5)], {}),
    ("expm1", [np.array([1e-7, -1e-4, 0.3, -0.49, 0.7, 20.0, -30.0, np.inf, -np.inf, np.nan],
                        np.float32)], {}),
    ("log1p", [np.array([1e-7, -1e-4, 0.3, 5.0, -1.0, np.inf, np.nan, 1e30], np.float32)], {}),
    *[(n, [_NAN], {}) for n in ("isnan", "isinf", "isfinite")],
    ("logical_not", [f(4) > 0], {}),
    *[(n, [f(3, 1), f(4)], {}) for n in ("add", "sub", "mul", "div", "atan2", "maximum",
                                         "minimum", "eq", "ne", "lt", "le", "gt", "ge")],
    ("pow", [np.abs(f(3)) + 0.5, f(3)], {}),
    ("maximum", [_NAN, np.zeros(7, np.float32)], {}), ("minimum", [_NAN, _NAN[::-1].copy()], {}),
    ("maximum", [i64(5), i64(5)], {}), ("add", [i32(2, 3), i32(3)], {}),
    *[(n, [f(4) > 0, f(4) > 0], {}) for n in ("logical_and", "logical_or", "logical_xor")],
    *[(n, [np.array([7, -7, 7, -7, 0, 5, -9], np.int64), np.array([2, 2, -2, -2, 3, 0, 0],
                                                                   np.int64)], {})
      for n in ("floor_divide", "remainder")],
    ("floor_divide", [i32(4, 3), i32(3)], {}), ("remainder", [i32(6), i32(6)], {}),
    ("floor_divide", [f(6) * 5, f(6)], {}), ("remainder", [f(6) * 5, f(6)], {}),
    ("remainder", [f(4), np.array([0.0, -0.0, 2.5, -1.0], np.float32)], {}),
    ("select", [f(3, 4) > 0, f(3, 4), f(4)], {}),
    *[("cast", [_NAN], {"dtype": d}) for d in ("i32", "bool")],
    ("cast", [_NAN[[0, 1, 2, 4, 5, 6]]], {"dtype": "i64"}),
    ("cast", [i64(5) * 10**9], {"dtype": "i32"}), ("cast", [f(4) > 0], {"dtype": "f32"}),
    ("cast", [i32(5)], {"dtype": "f32"}),
    ("normalize", [f(2, 3), f(2, 1), np.abs(f(2, 1)), f(3), f(3)], {"epsilon": 1e-3}),
    ("matmul", [f(2, 3, 4), f(5, 4)], {"transpose_b": True}),
    ("matmul", [f(4, 3), f(2, 4, 5)], {"transpose_a": True}),
    ("matmul_accumulate", [f(3, 4), f(4, 2), f(3, 2), f(*())], {}),
    *[(n, [f(3, 4, 5)], {"axes": [0, 2]}) for n in ("reduce_sum", "reduce_mean", "reduce_max",
                                                    "reduce_min", "reduce_prod", "variance")],
    *[(n, [f(3, 4)], {"axes": [-1], "keepdims": True}) for n in ("reduce_max", "variance")],
    *[(n, [f(3, 4)], {"axes": []}) for n in ("reduce_sum", "variance")],
    ("reduce_max", [np.array([[1, np.nan], [2, 3]], np.float32)], {"axes": [1]}),
    ("reduce_min", [i64(3, 4)], {"axes": [0, 1]}),
    ("argmax", [f(3, 4)], {"axis": 1}), ("argmin", [f(3, 4)], {"axis": 0, "keepdims": True}),
    ("argsort", [np.round(f(3, 6))], {"axis": 1}),
    ("argsort", [np.array([[2, 1], [2, 0], [1, 1]], np.int64)], {"axis": 0, "descending": True}),
    ("argsort", [f(5) > 0], {"axis": 0, "descending": True}),
    ("softmax", [f(3, 4)], {"axis": -1}), ("log_softmax", [f(3, 4) * 30], {"axis": 0}),
    ("cumsum", [f(3, 4)], {"axis": 1, "exclusive": True, "reverse": True}),
    ("cumsum", [i64(5)], {"axis": 0}),
    ("reshape", [f(3, 4)], {"shape": [2, 6]}), ("reshape", [f(1, 1)], {"shape": []}),
    ("transpose", [f(2, 3, 4)], {"perm": [2, 0, 1]}),
    ("broadcast_to", [f(3, 1)], {"shape": [2, 3, 4]}),
    ("slice", [f(5, 6)], {"starts": [1, 0], "ends": [5, 6], "strides": [2, 1]}),
    ("concat", [f(2, 3), f(1, 3), f(4, 3)], {"axis": 0}),
    ("pad", [f(2, 3)], {"low": [1, 0], "high": [0, 2], "value": 1.5}),
    ("pad", [i64(2, 3)], {"low": [0, 1], "high": [1, 1], "value": -2.0}),
    ("gather", [f(5, 3), np.array([[0, -1], [4, 2]], np.int64)], {"axis": 0}),
    ("gather", [f(2, 5), np.array(3, np.int32)], {"axis": 1}),
    ("gather_along_axis", [f(4, 3), np.array([[0], [2], [1], [-1]], np.int64)], {"axis": 1}),
    ("scatter_add", [f(5, 3), np.array([[0, -1], [4, 0]], np.int64), f(2, 2, 3)], {"axis": 0}),
    ("scatter_add_along_axis",
     [f(4, 3), np.array([[0, 0], [2, 1], [1, 1], [-1, 0]], np.int64), f(4, 2)], {"axis": 1}),
    ("check_index", [np.array([[0, 3], [-2, 1]], np.int64)],
     {"low": -2, "high": 4, "message": "gather: index {} is out of bounds"}),
    ("one_hot", [np.array([0, 3, -1, 5, 2, 2**33 + 1], np.int64)], {"depth": 4}),
    ("one_hot", [np.array([[0, 1], [2, 9]], np.int32)], {"depth": 3, "axis": 0, "dtype": "i64"}),
    ("conv2d", [f(2, 4, 7, 6), f(6, 2, 3, 2)],
     {"strides": [2, 1], "padding": [1, 0, 2, 1], "groups": 2, "dilation": [1, 2]}),
    ("conv2d_data_grad", [f(2, 6, 3, 7), f(6, 2, 3, 2)],
     {"strides": [2, 1], "padding": [1, 0, 2, 1], "groups": 2, "dilation": [1, 2],
      "input_shape": [2, 4, 7, 6]}),
    ("conv2d_weights_grad", [f(2, 4, 7, 6), f(2, 6, 3, 7)],
     {"strides": [2, 1], "padding": [1, 0, 2, 1], "groups": 2, "dilation": [1, 2],
      "weight_shape": [6, 2, 3, 2]}),
    ("max_pool2d", [f(2, 3, 7, 6)],
     {"kernel": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1], "dilation": [1, 2]}),
    ("max_pool2d_grad", [f(2, 3, 4, 6), f(2, 3, 7, 6)],
     {"kernel": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1]}),
    *[("avg_pool2d", [f(2, 3, 7, 6)],
       {"kernel": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1], "count_include_pad": c})
      for c in (True, False)],
    ("avg_pool2d_grad", [f(2, 3, 4, 6)],
     {"kernel": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1], "input_shape": [2, 3, 7, 6],
      "count_include_pad": False}),
    ("constant", [], {"shape": [2, 3], "dtype": "f32", "value": list(range(6))}),
    ("constant", [], {"shape": [4], "dtype": "i64", "value": [-3.0]}),
    ("constant", [], {"shape": [], "dtype": "bool", "value": [1.0]}),
    ("fill", [f()], {"shape": [2, 2]}), ("fill", [i32()], {"shape": []}),
    ("random_uniform", [np.array([123, 7], np.int64)], {"shape": [3, 5], "low": -1.0, "high": 2.0}),
    ("random_uniform", [np.array([-2**62, 2**40 + 3], np.int64)], {"shape": [9]}),
    ("random_normal", [np.array([-5, 2**40], np.int64)], {"shape": [7], "mean": 1.0, "std": 2.0}),
]  # fmt: skip


@pytest.mark.parametrize("name,arrays,attrs", CASES, ids=[c[0] for c in CASES])
def test_emission_matches_the_prim_semantics_and_the_emission_table(name, arrays, attrs):
    got, checks, prog = emit_and_run(name, arrays, attrs)
    used = {c["selector"] for c in prog["calls"]}
    assert used <= set(EMISSIONS[name]), used - set(EMISSIONS[name])
    want = P.evaluate(name, arrays, attrs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)
    assert all(np.all(c) for c in checks)


def test_every_prim_op_has_a_case_and_every_main_method_is_called():
    assert {c[0] for c in CASES} == set(P.PRIM_OPS)
    called: dict[str, set[str]] = {}
    for name, arrays, attrs in CASES:
        _, _, prog = emit_and_run(name, arrays, attrs)
        called.setdefault(name, set()).update(c["selector"] for c in prog["calls"])
    for name, sels in EMISSIONS.items():
        assert sels[0] in called[name], (name, sels[0])


def _gather_executable(index: list[int]):
    b = ReferenceBuilder()
    x = Val(b.placeholder((4, 2), "f32", "input:0"), (4, 2), "f32")
    idx = Val(b.placeholder((len(index),), "i64", "input:1"), (len(index),), "i64")
    (out,), checks = emit_op(b, "gather", [x, idx], {"axis": 0})
    prog = b.program([out.id, x.id, *checks], [])
    return MPSGraphExecutable(
        prog, ["input:0", "input:1"], ["output:0", "update:input:0"], 2, [2], [(1, 0)],
        lambda feeds: run_program(prog, feeds),
    )  # fmt: skip


@pytest.mark.parametrize("bad", [4, -5, 2**32 + 1])
def test_an_index_out_of_range_raises_and_writes_nothing_back(bad):
    exe = _gather_executable([0, bad])
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    before = x.copy()
    with pytest.raises(IndexError, match="out of range"):
        exe.run([x, np.array([0, bad], np.int64)])
    np.testing.assert_array_equal(x, before)
    out = exe.run([x, np.array([3, -4], np.int64)])
    np.testing.assert_array_equal(out[0], before[[3, 0]])


def test_a_float_cast_saturates_to_the_integer_maximum():
    # prim.md: float -> int truncates, maps NaN to 0 and saturates out-of-range values.
    x = np.array([np.inf, 1e30, -1e30, 2.0**63, np.nan, -7.9], np.float32)
    (got,), _, _ = emit_and_run("cast", [x], {"dtype": "i64"})
    info = np.iinfo(np.int64)
    np.testing.assert_array_equal(got, [info.max, info.max, info.min, info.max, 0, -7])
    (got,), _, _ = emit_and_run("cast", [x], {"dtype": "i32"})
    info = np.iinfo(np.int32)
    np.testing.assert_array_equal(got, [info.max, info.max, info.min, info.max, 0, -7])
