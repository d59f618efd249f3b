"""Every registry op in float16 and bfloat16 through ``lucid.compile`` (the CPU backend) vs eager.

The ops and their inputs come from the registry and the lowering samples of
``tests/passes/test_lower_to_prim_ops.py`` (which a new op must have), so a new op is covered
here without an edit. Each op's half form is its first sample with the float32 operands and dtype
attributes in half precision; an op with no float32 sample gets every operand but its RNG state
and every dtype attribute in half precision.

Tolerance rule: eager and compiled code both compute a half op in float32 and round its result
once to the half format. Their float32 values differ only by float32 rounding (summation order,
fused loops, the math library), about 1e-6 relative, far below a half ulp, so the rounded results
agree except where a float32 value lies that close to a rounding boundary, and then by one ulp:
at most ``eps * |eager|`` (``eps`` = 2**-10 for float16, 2**-7 for bfloat16). An absolute ``eps``
covers results that cancel to near zero, where the float32 difference is relative to the
operands (of order 1), not to the result. Integer and bool results must be equal.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lucid
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._registry import ELEMENTWISE, PROMOTE, RANDOM, REGISTRY
from lucid.passes.lower_to_prim import lowering_status

_spec = importlib.util.spec_from_file_location(
    "lower_to_prim_half_samples",
    pathlib.Path(__file__).parents[1] / "passes" / "test_lower_to_prim_half.py",
)
_half_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_half_tests)
samples = _half_tests.samples

HALVES = {"float16": lucid.float16, "bfloat16": lucid.bfloat16}

# Ops eager refuses in half precision, with the message eager gives (checked below: an op that
# starts running in half must leave this list and join the comparisons).
REFUSED_IN_HALF = {
    "bitwise_and": "only integer and bool tensors are supported",
    "bitwise_not": "only integer and bool tensors are supported",
    "bitwise_or": "only integer and bool tensors are supported",
    "bitwise_xor": "only integer and bool tensors are supported",
    "one_hot": "indices must be an integer tensor",
    "randint": "dtype must be an integer type",
}

# Ops whose compiled half results differ from eager's, with the cause (strict xfails: a fix
# makes them pass, and the test then fails until the entry goes).
KNOWN_DIFFERENCES: dict[str, str] = {}

# Ops with no sample in the lowering tests (their draws are not eager's numbers).
EXTRA_SAMPLES = {
    "randperm": lambda r: ([samples.state(r)], {"n": 7, "dtype": lucid.float32}),
}


def _sample(name: str) -> tuple[list, dict]:
    """The op's first sample with something float32 in it, else its first sample."""
    makers = samples.SAMPLES.get(name) or [EXTRA_SAMPLES[name]]
    for i in range(len(makers)):
        if (name, i) in _half_tests.HALF_CASES:
            return _seeded(name, i)
    return _seeded(name, 0, makers[0])


def _seeded(name: str, i: int, maker=None) -> tuple[list, dict]:
    rng = np.random.default_rng(1000 + i + sum(map(ord, name)))
    return (maker or samples.SAMPLES[name][i])(rng)


def _in_half(name: str, operands: list, attrs: dict, half) -> tuple[list, dict]:
    """The half form of a sample: float32 operands and dtype attributes in ``half``; when the
    sample has no float32, every operand but the RNG state and every dtype attribute."""
    floating = any(
        isinstance(v, np.ndarray) and v.dtype == np.float32 for v in _flat(operands)
    ) or any(v is lucid.float32 for v in attrs.values())
    rng_state = 0 if RANDOM in REGISTRY[name].props else None

    def convert(v: Any, k: int | None) -> Any:
        if isinstance(v, list):
            return [convert(e, None) for e in v]
        if not isinstance(v, np.ndarray) or k == rng_state:
            return v
        return v.astype(half.numpy) if (v.dtype == np.float32 or not floating) else v

    out = [convert(v, k) for k, v in enumerate(operands)]
    if floating:
        return out, {k: half if v is lucid.float32 else v for k, v in attrs.items()}
    dtype_attrs = {k: half for k in ("dtype",) if k in REGISTRY[name].attrs}
    return out, {**attrs, **dtype_attrs}


def _flat(operands: list) -> list:
    return [e for v in operands for e in (v if isinstance(v, list) else [v])]


def _lowered(name: str) -> bool:
    return lowering_status(name) == "yes"


LOWERED = sorted(n for n in REGISTRY if _lowered(n))
COMPARED = [n for n in LOWERED if n not in REFUSED_IN_HALF]


def _one_op(name: str, operands: list, attrs: dict):
    """(the op on the sample's non-tensor operands as a function of its tensors, the sample's
    operands with tensors wrapped, the tensors)."""
    wrapped, arrays = samples._tensors(operands)

    def one_op(*inputs):
        it = iter(inputs)

        def bind(v: Any) -> Any:
            if isinstance(v, Tensor):
                return next(it)
            return [bind(e) for e in v] if isinstance(v, list) else v

        return apply(name, *(bind(v) for v in wrapped), **attrs)

    return one_op, wrapped, [Tensor._wrap(a) for a in arrays]


def _run(name: str, operands: list, attrs: dict) -> tuple[list, list, dict]:
    """(eager outputs, compiled outputs, the compiled wrapper's cache_info())."""
    one_op, wrapped, tensors = _one_op(name, operands, attrs)
    eager = apply(name, *wrapped, **attrs)
    compiled = lucid.compile(one_op)
    got = compiled(*tensors)
    as_list = lambda r: list(r) if isinstance(r, tuple) else [r]  # noqa: E731
    return as_list(eager), as_list(got), compiled.cache_info()


def assert_compiled_equals_eager(name: str, operands: list, attrs: dict, half) -> None:
    eager, got, info = _run(name, operands, attrs)
    assert not info["eager_only"], f"{name} in {half}: compile fell back: {info['reasons']}"
    assert info["entries"] == 1, info
    eps = float(ml_dtypes.finfo(half.numpy).eps)
    for k, (g, w) in enumerate(zip(got, eager, strict=True)):
        g, w, what = g.numpy(), w.numpy(), f"{name} output {k} in {half}: compiled vs eager"
        assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, w.dtype, g.shape, w.shape)
        if name == "randperm":  # the same law, not eager's numbers (see lowering/random.py)
            g, w = np.sort(g), np.sort(w)
        if w.dtype.kind in "fV":  # bfloat16 is numpy kind "V"
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=eps, atol=eps, equal_nan=True,
                err_msg=what,
            )  # fmt: skip
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def _cases():
    for name in COMPARED:
        for half in HALVES:
            marks = ()
            if name in KNOWN_DIFFERENCES:
                marks = pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[name])
            yield pytest.param(name, half, id=f"{name}-{half}", marks=marks)


@pytest.mark.parametrize("name,half", list(_cases()))
def test_op_in_half_compiles_and_equals_eager(name, half):
    half = HALVES[half]
    assert_compiled_equals_eager(name, *_in_half(name, *_sample(name), half), half)


@pytest.mark.parametrize("name", sorted(REFUSED_IN_HALF))
@pytest.mark.parametrize("half", list(HALVES))
def test_op_eager_refuses_in_half_is_refused_compiled_too(name, half):
    one_op, _, tensors = _one_op(name, *_in_half(name, *_sample(name), HALVES[half]))
    message = REFUSED_IN_HALF[name]
    try:
        one_op(*tensors)
    except TypeError as exc:
        assert message in str(exc), exc
    else:
        pytest.fail(f"{name} runs in {half} now: drop it from REFUSED_IN_HALF")
    with pytest.raises(TypeError, match=message):  # the same error, from the trace
        lucid.compile(one_op)(*tensors)


def test_every_registry_op_is_compared_refused_or_not_lowered():
    # An op that does not lower runs eagerly in every dtype (its reason is in docs/ops.md); every
    # other op is compared above or refused by eager with a stated reason.
    assert set(REFUSED_IN_HALF) <= set(LOWERED), set(REFUSED_IN_HALF) - set(LOWERED)
    assert set(KNOWN_DIFFERENCES) <= set(COMPARED)
    for name in REGISTRY:
        if not _lowered(name):
            assert lowering_status(name).startswith("no: "), name
        else:
            assert name in samples.SAMPLES or name in EXTRA_SAMPLES, f"{name}: no sample"


# --- hypothesis: every sample of every op (shapes and values from the seed), and the elementwise
# ops over broadcast shapes drawn by hypothesis.

ALL_CASES = [
    (n, i) for n, i in _half_tests.HALF_CASES if n in COMPARED and n not in KNOWN_DIFFERENCES
]


@given(
    case=st.sampled_from(ALL_CASES),
    half=st.sampled_from(list(HALVES.values())),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_sample_in_half_compiles_and_equals_eager(case, half, seed):
    name, i = case
    if not _half_tests._valid_in_float32(name, i, seed):
        seed = 1000 + i + sum(map(ord, name))  # a maker whose values fit only some seeds
    operands, attrs = samples.SAMPLES[name][i](np.random.default_rng(seed))
    assert_compiled_equals_eager(name, *_in_half(name, operands, attrs, half), half)


ELEMENTWISE_OPS = [n for n in COMPARED if ELEMENTWISE in REGISTRY[n].props]
ELEMENTWISE_OPS = [n for n in ELEMENTWISE_OPS if n not in KNOWN_DIFFERENCES]


@given(
    name=st.sampled_from(ELEMENTWISE_OPS),
    half=st.sampled_from(list(HALVES.values())),
    data=st.data(),
)
def test_elementwise_op_in_half_over_broadcast_shapes(name, half, data):
    operands, attrs = _in_half(name, *_sample(name), half)
    arrays = [k for k, v in enumerate(operands) if isinstance(v, np.ndarray)]
    if PROMOTE in REGISTRY[name].props:  # the broadcasting ops (add, where, pow, ...)
        shapes = data.draw(
            hnp.mutually_broadcastable_shapes(num_shapes=len(arrays), max_dims=4, max_side=5)
        ).input_shapes
    else:  # activations and their backward ops: operands of one shape
        shapes = [data.draw(hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))] * len(arrays)
    for k, shape in zip(arrays, shapes, strict=True):
        # The sample's own values, repeated to fill the shape: each stays in the op's domain.
        operands[k] = np.resize(operands[k], shape)
    assert_compiled_equals_eager(name, operands, attrs, half)
