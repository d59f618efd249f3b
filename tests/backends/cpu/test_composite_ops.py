"""Composite prim ops (``lucid.ir.prim.composite``: GELU, its gradient, layer norm): lowering
emits them whole, the CPU backend runs its kernels, the prim interpreter and the MPSGraph backend
(which has no kernel) expand the decomposition; every path equals eager Lucid, forward and
backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.backends.cpu import CPUBackend
from lucid.ir import import_trace
from lucid.ir import prim as P
from lucid.ir.importer import forward_func
from lucid.ir.prim.expand import expand_composites
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace

TOL = {"float32": 2e-5, "float64": 1e-12}


def _lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("lower-to-prim").run(module)
    module.verify()
    return module


def _prim_names(module) -> set[str]:
    return {op.name for op in forward_func(module).body.blocks.first.ops}


def _arrays(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    return x, rng.standard_normal(shape).astype(dtype)


def test_lowering_emits_gelu_and_its_gradient_whole():
    x, dy = _arrays((4, 6), "float32", 0)
    forward = _lowered(lambda t: F.gelu(t), x)
    backward = _lowered(lambda t, g: apply("gelu_backward", g, t, approximate="none"), x, dy)
    assert "prim.gelu" in _prim_names(forward) and "prim.erf" not in _prim_names(forward)
    assert "prim.gelu_grad" in _prim_names(backward) and "prim.erf" not in _prim_names(backward)
    # The tanh form is not a composite: it lowers to its ops.
    assert "prim.tanh" in _prim_names(_lowered(lambda t: F.gelu(t, approximate="tanh"), x))


@settings(max_examples=15, deadline=None)
@given(
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 17)]),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_compiled_and_interpreted_gelu_equal_eager_forward_and_backward(shape, dtype, seed):
    x, dy = _arrays(shape, dtype, seed)

    def fn(t, g):
        return apply("gelu", t, approximate="none"), apply(
            "gelu_backward", g, t, approximate="none"
        )

    eager = [v.numpy() for v in fn(lucid.tensor(x), lucid.tensor(dy))]
    compiled = [v.numpy() for v in lucid.compile(fn)(lucid.tensor(x), lucid.tensor(dy))]
    module = _lowered(fn, x, dy)
    interpreted = interpret_prim(module, [x, dy])  # the composites' decompositions
    native = CPUBackend(cache=False).compile(module).run([x, dy])  # the kernels
    for got in (compiled, interpreted, native):
        for g, want in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, want, rtol=TOL[dtype], atol=TOL[dtype])


def test_compiled_gelu_gradient_equals_eager_autograd():
    x, _ = _arrays((5, 8), "float32", 3)
    w = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32)

    def loss(t, weight):
        return (F.gelu(t @ weight) ** 2).sum()

    grads = []
    for run in (loss, lucid.compile(loss)):
        t, weight = lucid.tensor(x, requires_grad=True), lucid.tensor(w, requires_grad=True)
        run(t, weight).backward()
        grads.append((t.grad.numpy(), weight.grad.numpy()))
    for g, want in zip(grads[1], grads[0], strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_expansion_replaces_every_composite_and_keeps_the_values():
    x, dy = _arrays((3, 9), "float64", 5)

    def fn(t, g):
        return F.gelu(t) * g, apply("gelu_backward", g, t, approximate="none")

    module = _lowered(fn, x, dy)
    before = interpret_prim(module, [x, dy])
    assert expand_composites(module, keep={"gelu"}) == 1  # gelu_grad only
    assert "prim.gelu" in _prim_names(module) and "prim.gelu_grad" not in _prim_names(module)
    assert expand_composites(module) == 1
    module.verify()
    names = _prim_names(module)
    assert not {f"prim.{n}" for n in P.COMPOSITE_OPS} & names and "prim.erf" in names
    for got, want in zip(interpret_prim(module, [x, dy]), before, strict=True):
        np.testing.assert_array_equal(got, want)  # the same prim ops, run by the same table


def test_composite_rules_refuse_what_their_kernels_do_not_take():
    with pytest.raises(P.PrimError, match="gelu"):
        P.infer("gelu", [P.Aval((3,), "i32")], {})
    with pytest.raises(P.PrimError, match="rank"):
        P.infer("gelu_grad", [P.Aval((), "f32"), P.Aval((), "f32")], {})
    with pytest.raises(P.PrimError, match="differ"):
        P.infer("gelu_grad", [P.Aval((1, 3), "f32"), P.Aval((2, 3), "f32")], {})


def test_a_0d_gelu_gradient_lowers_to_its_decomposition():
    x, dy = np.float32(0.7), np.float32(-1.5)

    def fn(t, g):
        return apply("gelu_backward", g, t, approximate="none")

    module = _lowered(fn, np.asarray(x), np.asarray(dy))
    assert "prim.gelu_grad" not in _prim_names(module)
    eager = fn(lucid.tensor(x), lucid.tensor(dy)).numpy()
    np.testing.assert_allclose(lucid.compile(fn)(lucid.tensor(x), lucid.tensor(dy)).numpy(), eager)


def test_mpsgraph_recording_expands_gelu_and_equals_eager():
    model = lucid.nn.Sequential(lucid.nn.Linear(6, 16), lucid.nn.GELU(), lucid.nn.Linear(16, 3))
    x = lucid.tensor(np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32))
    with lucid.no_grad():
        eager = model(x).numpy()
        got = lucid.compile(model, backend="mpsgraph-reference")(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-6)


@settings(max_examples=10, deadline=None)
@given(
    shape=st.sampled_from([(9,), (3, 5), (2, 3, 17)]),
    dtype=st.sampled_from(["float32", "float64"]),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_compiled_and_interpreted_layer_norm_equal_eager_forward_and_backward(
    shape, dtype, affine, seed
):
    x, dy = _arrays(shape, dtype, seed)
    rng = np.random.default_rng(seed + 1)
    params = [rng.standard_normal(shape[-1:]).astype(dtype) for _ in range(2)] if affine else []

    def fn(t, *affine_params):
        return F.layer_norm(t, shape[-1:], *affine_params, eps=1e-5)

    arrays = [x, *params]
    eager = fn(*map(lucid.tensor, arrays)).numpy()
    module = _lowered(fn, *arrays)
    assert "prim.layer_norm" in _prim_names(module)
    tol = 1e-4 if dtype == "float32" else 1e-10
    for got in (
        lucid.compile(fn)(*map(lucid.tensor, arrays)).numpy(),
        interpret_prim(module, arrays)[0],  # the decomposition
        CPUBackend(cache=False).compile(module).run(arrays)[0],  # the kernel
    ):
        np.testing.assert_allclose(got, eager, rtol=tol, atol=tol)
    grads = []
    for run in (fn, lucid.compile(fn)):
        tensors = [lucid.tensor(a, requires_grad=True) for a in arrays]
        (run(*tensors) * lucid.tensor(dy)).sum().backward()
        grads.append([t.grad.numpy() for t in tensors])
    # The backward is autodiff's (statistics recomputed), folded by the CPU backend into one
    # layer_norm_grad kernel whose summation order differs from eager's.
    grad_tol = 1e-3 if dtype == "float32" else 1e-6
    for got, want in zip(grads[1], grads[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=grad_tol, atol=grad_tol)


def test_layer_norm_over_several_axes_is_not_the_composite():
    x, _ = _arrays((2, 3, 4), "float32", 7)
    module = _lowered(lambda t: F.layer_norm(t, (3, 4)), x)
    assert "prim.layer_norm" not in _prim_names(module) and "prim.normalize" in _prim_names(module)


def test_mpsgraph_recording_expands_layer_norm_and_equals_eager():
    model = lucid.nn.Sequential(lucid.nn.Linear(6, 16), lucid.nn.LayerNorm(16))
    x = lucid.tensor(np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32))
    with lucid.no_grad():
        eager = model(x).numpy()
        got = lucid.compile(model, backend="mpsgraph-reference")(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)
