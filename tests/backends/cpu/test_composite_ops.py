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


# --- scaled dot-product attention: the composite ``attention(q, k, v){alpha}`` when unmasked


def _attention_arrays(shape, lk, dtype, seed, mask):
    """q, k, v, dO of [B, H, L, D] heads and the mask (0.0, an additive or a bool tensor)."""
    rng = np.random.default_rng(seed)
    b, h, lq, d = shape
    q = rng.standard_normal(shape).astype(dtype)
    k, v = (rng.standard_normal((b, h, lk, d)).astype(dtype) for _ in range(2))
    d_out = rng.standard_normal(shape).astype(dtype)
    if mask == "additive":
        return q, k, v, d_out, rng.standard_normal((lq, lk)).astype(dtype)
    if mask == "bool":
        keep = rng.random((lq, lk)) < 0.7
        keep[:, 0] = True  # every query attends to one key at least
        return q, k, v, d_out, keep
    return q, k, v, d_out, None


def _sdpa_and_grad(mask_kind: str | None, scale: float | None):
    causal = mask_kind == "causal"

    def fn(q, k, v, g, *mask):
        attn_mask = mask[0] if mask else 0.0
        attrs = {"is_causal": causal, "scale": scale}
        return (
            apply("scaled_dot_product_attention", q, k, v, attn_mask, **attrs),
            *apply("scaled_dot_product_attention_backward", g, q, k, v, attn_mask, **attrs),
        )

    return fn


def test_lowering_emits_unmasked_attention_whole_and_decomposes_masked_attention():
    q, k, v, _, extra = _attention_arrays((2, 3, 5, 4), 6, "float32", 0, "additive")
    for fn in (
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
    ):
        plain = _prim_names(_lowered(fn, q, k, v))
        assert "prim.attention" in plain and "prim.softmax" not in plain
    for fn, arrays in (
        (lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), (q, k, v, extra)),
        # Heads of rank 3: the composite's rule refuses them, the same decomposition is used.
        (lambda a, b, c: F.scaled_dot_product_attention(a, b, c), (q[0], k[0], v[0])),
    ):
        names = _prim_names(_lowered(fn, *arrays))
        assert "prim.attention" not in names and "prim.softmax" in names


@settings(max_examples=12, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 1, 1), (2, 3, 5, 4), (1, 2, 9, 8)]),
    lk=st.sampled_from([1, 6]),
    dtype=st.sampled_from(["float32", "float64"]),
    mask=st.sampled_from([None, "additive", "bool", "causal"]),
    scale=st.sampled_from([None, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_compiled_and_interpreted_attention_equal_eager_forward_and_backward(
    shape, lk, dtype, mask, scale, seed
):
    q, k, v, d_out, extra = _attention_arrays(shape, lk, dtype, seed, mask)
    arrays = [q, k, v, d_out] + ([] if extra is None else [extra])
    fn = _sdpa_and_grad(mask, scale)
    eager = [t.numpy() for t in fn(*map(lucid.tensor, arrays))]
    module = _lowered(fn, *arrays)
    assert ("prim.attention" in _prim_names(module)) == (mask in (None, "causal"))
    tol = 1e-4 if dtype == "float32" else 1e-10
    for got in (
        [t.numpy() for t in lucid.compile(fn)(*map(lucid.tensor, arrays))],
        interpret_prim(module, arrays),  # the decomposition
        CPUBackend(cache=False).compile(module).run(arrays),  # the kernel
    ):
        for g, want in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_the_attention_kernel_equals_the_composite_decomposition(dtype, causal):
    from lucid.backends.cpu import Program
    from lucid.backends.cpu.testing import assert_match, decomposed, random_array

    rng = np.random.default_rng(11)
    arrays = [random_array(rng, s, dtype) for s in ((2, 3, 7, 4), (2, 3, 5, 4), (2, 3, 5, 6))]
    program = Program()
    slots = [program.feed(a.shape, dtype) for a in arrays]
    program.result(program.op("attention", *slots, alpha=0.25, causal=causal))
    (native,) = CPUBackend(cache=False).compile(program).run(arrays)
    assert_match(native, decomposed(program, arrays)[0], scale=10.0)
    assert_match(native, program.interpret(arrays)[0], scale=10.0)  # the kernel's own reference


def test_expansion_of_attention_keeps_the_values():
    q, k, v, _, _ = _attention_arrays((2, 2, 4, 3), 5, "float64", 12, None)
    module = _lowered(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=0.7), q, k, v)
    before = interpret_prim(module, [q, k, v])
    assert expand_composites(module) == 1
    module.verify()
    names = _prim_names(module)
    assert "prim.attention" not in names and "prim.softmax" in names
    np.testing.assert_array_equal(interpret_prim(module, [q, k, v])[0], before[0])


def test_attention_rule_refuses_what_the_kernel_does_not_take():
    with pytest.raises(P.PrimError, match="B, H, L, D"):
        P.infer("attention", [P.Aval((3, 4, 5), "f32")] * 3, {"alpha": 1.0})
    with pytest.raises(P.PrimError, match="not"):
        four = P.Aval((1, 2, 3, 4), "f32")
        P.infer("attention", [four, P.Aval((1, 2, 3, 5), "f32"), four], {"alpha": 1.0})
    with pytest.raises(P.PrimError, match="attention"):
        P.infer("attention", [P.Aval((1, 2, 3, 4), "i32")] * 3, {"alpha": 1.0})


def test_mpsgraph_recording_expands_attention_and_equals_eager():
    model = lucid.nn.MultiheadAttention(8, 2, batch_first=True)
    x = lucid.tensor(np.random.default_rng(13).standard_normal((2, 5, 8)).astype(np.float32))

    def fn(t):
        return model(t, t, t, need_weights=False)[0]

    with lucid.no_grad():
        eager = fn(x).numpy()
        assert "prim.attention" in _prim_names(_lowered(fn, x.numpy()))
        got = lucid.compile(fn, backend="mpsgraph-reference")(x).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)


def test_the_training_forward_returns_the_weights_its_gradient_reads():
    # The backward recomputes the weights; the CPU backend takes them from the forward kernel.
    layer = lucid.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = lucid.tensor(np.random.default_rng(14).standard_normal((2, 5, 8)).astype(np.float32))
    step = lucid.compile.fused_step(
        layer, lambda out, t: ((out - t) ** 2).mean(), lucid.optim.SGD(layer.parameters(), lr=0.1)
    )
    instrs = [r["instr"] for r in step.profile(x, x, repeats=1)]
    (forward,) = [i for i in instrs if "= attention{" in i]
    assert forward.count("f32[") == 2  # the output and the weights
    assert not any("softmax" in i for i in instrs)
