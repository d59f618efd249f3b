"""Layer norm's and attention's backward as composite prim ops (``layer_norm_grad``,
``attention_grad``): lowering emits them whole, the CPU backend runs their kernels (no matcher
re-finds them), the prim interpreter and MPSGraph expand their decompositions; the new second
derivative of layer norm against float64 finite differences; printed IR holding composites
parses back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid._dispatch import apply
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.testing import decomposed
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.ir import parse_ir, print_ir
from lucid.ir import prim as P
from lucid.ir.prim.dialect import make_prim_context
from lucid.ir.prim.expand import expand_composites
from lucid.ir.prim.interpreter import interpret_prim
from tests.passes.test_lower_to_prim import _lowered, _prim_names

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _layer_norm_backward(shape):
    def fn(dy, t, weight):
        return apply("layer_norm_backward", dy, t, weight, normalized_shape=shape, eps=1e-5)

    return fn


def _ln_arrays(shape, normalized, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return dy, x, (rng.standard_normal(normalized) + 1.0).astype(dtype)


@settings(max_examples=12, deadline=None)
@given(
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 17), (2, 3, 4)]),
    axes=st.integers(1, 2),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_grad_kernel_decomposition_and_eager_agree(shape, axes, dtype, seed):
    normalized = shape[-min(axes, len(shape)) :]
    arrays = _ln_arrays(shape, normalized, dtype, seed)
    fn = _layer_norm_backward(normalized)
    module = _lowered(fn, *arrays)
    # One composite whatever the number of normalized axes (over their flattening).
    assert _prim_names(module).count("prim.layer_norm_grad") == 1
    assert "prim.reduce_mean" not in _prim_names(module)
    eager = [t.numpy() for t in fn(*map(lucid.tensor, arrays))]
    tol = 2e-4 if dtype == "float32" else 1e-10
    for got in (
        interpret_prim(module, list(arrays)),  # the decomposition
        CPUBackend(cache=False).compile(module).run(list(arrays)),  # the kernel
        [t.numpy() for t in lucid.compile(fn)(*map(lucid.tensor, arrays))],
    ):
        for g, want in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, want, rtol=tol, atol=tol * max(1, np.abs(want).max()))


def _central(f, x: np.ndarray, direction: np.ndarray, eps: float = 1e-6) -> float:
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


@settings(max_examples=8, deadline=None)
@given(
    shape=st.sampled_from([(4,), (3, 5), (2, 3, 4)]),
    axes=st.integers(1, 2),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_backward_vjp_matches_float64_finite_differences(shape, axes, affine, seed):
    # The second derivative (layer_norm_backward's own VJP) is new math: check it along random
    # directions against central differences of the first derivative, the eager kernel.
    normalized = shape[-min(axes, len(shape)) :]
    rng = np.random.default_rng(seed)
    dy, x, w = (a.astype(np.float64) for a in _ln_arrays(shape, normalized, "float64", seed))
    cot = [rng.standard_normal(s) for s in (shape, normalized, normalized)]
    fn = _layer_norm_backward(normalized)

    def pairing(dy_, x_, w_) -> float:  # <cotangents, layer_norm_backward(dy, x, w)>
        outs = fn(lucid.tensor(dy_), lucid.tensor(x_), lucid.tensor(w_) if affine else 1.0)
        return sum(float((o.numpy() * c).sum()) for o, c in zip(outs, cot, strict=True))

    tensors = [lucid.tensor(a, requires_grad=True) for a in (dy, x, w)]
    outs = fn(*tensors[:2], tensors[2] if affine else 1.0)
    total = sum((o * lucid.tensor(c)).sum() for o, c in zip(outs, cot, strict=True))
    wrt = tensors if affine else tensors[:2]
    grads = lucid.autograd.grad(total, wrt)
    points = [dy, x, w]
    for i, grad in enumerate(grads):
        direction = rng.standard_normal(points[i].shape)

        def along(v, i=i):
            args = list(points)
            args[i] = v
            return pairing(*args)

        numeric = _central(along, points[i], direction)
        analytic = float((grad.numpy() * direction).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (i, numeric, analytic)


def _step_gradients(model, *inputs) -> dict[str, np.ndarray]:
    """The gradients a compiled SGD step (lr = 1) applies to ``model``'s parameters."""
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    opt = lucid.optim.SGD(model.parameters(), lr=1.0)
    lucid.compile.fused_step(model, lambda out: (out**2).mean(), opt)(*inputs)
    return {n: before[n] - p.numpy() for n, p in model.named_parameters()}


def _training_matches_eager(make, *inputs, rtol: float) -> None:
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    (ref(*inputs) ** 2).mean().backward()
    grads = _step_gradients(model, *inputs)
    for name, p in ref.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(grads[name], want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_compiled_layer_norm_training_over_two_axes_matches_eager():
    x = lucid.tensor(np.random.default_rng(3).standard_normal((4, 3, 5)).astype(np.float32))

    def make():
        return nn.Sequential(nn.Linear(5, 5), nn.LayerNorm((3, 5)), nn.Linear(5, 2))

    _training_matches_eager(make, x, rtol=1e-4)


# --- attention's backward: attention_grad(dO, q, k, v, P){alpha} -> (dq, dk, dv)


def _attention_grad_program(b, h, lq, lk, d, dv, dtype):
    p = Program()
    d_out = p.feed((b, h, lq, dv), dtype)
    q = p.feed((b, h, lq, d), dtype)
    k, v = p.feed((b, h, lk, d), dtype), p.feed((b, h, lk, dv), dtype)
    probs = p.feed((b, h, lq, lk), dtype)
    p.result(*p.op_results("attention_grad", d_out, q, k, v, probs, alpha=0.4))
    return p


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    lq=st.sampled_from([0, 1, 5, 13]),
    lk=st.sampled_from([0, 1, 6, 17]),
    d=st.sampled_from([3, 8, 12]),
    dv=st.sampled_from([4, 8]),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_attention_grad_kernel_equals_its_decomposition(b, h, lq, lk, d, dv, dtype, seed):
    # The dense form (three results, the one lowering emits) at unequal query and key lengths,
    # empty ones included (then the gradients without a product are zeros).
    p = _attention_grad_program(b, h, lq, lk, d, dv, dtype)
    rng = np.random.default_rng(seed)
    np_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    feeds = [rng.standard_normal(p.slots[s].shape).astype(np_dtype) for s in p.feeds]
    scores = feeds[-1].astype(np.float64)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=0.0))
    feeds[-1] = (weights / np.maximum(weights.sum(axis=-1, keepdims=True), 1e-30)).astype(np_dtype)
    got = CPUBackend(cache=False).compile(p).run(feeds)
    tol = 5e-5 if dtype == "f32" else 1e-12
    for reference in (decomposed(p, feeds), p.interpret(feeds)):
        for g, w in zip(got, reference, strict=True):
            assert g.shape == w.shape
            scale = max(1.0, np.abs(w).max(initial=0))
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


def _sdpa_backward(mask):
    def fn(q, k, v, g):
        return apply("scaled_dot_product_attention_backward", g, q, k, v, mask, scale=None,
                     is_causal=False)  # fmt: skip

    return fn


def test_lowering_emits_attention_grad_whole_with_the_weights():
    rng = np.random.default_rng(4)
    shapes = ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3))
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    g = rng.standard_normal((2, 2, 5, 3)).astype(np.float32)
    names = _prim_names(_lowered(_sdpa_backward(0.0), q, k, v, g))
    assert names.count("prim.attention_grad") == 1 and names.count("prim.softmax") == 1
    assert "prim.reduce_sum" not in names  # the gradient's math is inside the composite
    eager = [t.numpy() for t in _sdpa_backward(0.0)(*map(lucid.tensor, (q, k, v, g)))]
    compiled = lucid.compile(_sdpa_backward(0.0))(*map(lucid.tensor, (q, k, v, g)))
    for got, want in zip(compiled, eager, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


class CrossAttention(nn.Module):
    """Queries of length 4 over 7 learned memory positions: unequal lengths, no fused QKV."""

    def __init__(self):
        super().__init__()
        self.memory = nn.Parameter(lucid.randn(2, 7, 8))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, self.memory, self.memory, need_weights=False)[0]


def test_compiled_cross_attention_training_matches_eager():
    x = lucid.tensor(np.random.default_rng(5).standard_normal((2, 4, 8)).astype(np.float32))
    _training_matches_eager(CrossAttention, x, rtol=2e-4)


# --- MPSGraph: no kernels, so the recorded program is the expansion


def _recorded_methods(program: dict) -> list[str]:
    return [call["selector"] for call in program["calls"]]


@pytest.mark.parametrize("which", ["layer_norm_grad", "attention_grad"])
def test_mpsgraph_recording_expands_the_backward_composites(which):
    rng = np.random.default_rng(6)
    if which == "layer_norm_grad":
        arrays = list(_ln_arrays((3, 6), (6,), "float32", 6))
        fn = _layer_norm_backward((6,))
    else:
        arrays = [rng.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(4)]
        fn = _sdpa_backward(0.0)
    module = _lowered(fn, *arrays)
    assert f"prim.{which}" in _prim_names(module)
    want = interpret_prim(module, arrays)
    exe = MPSGraphReferenceBackend().compile(_lowered(fn, *arrays))
    methods = " ".join(_recorded_methods(exe.program))
    assert "reductionSum" in methods and "multiplication" in methods
    for got, w in zip(exe.run(arrays), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


# --- printed IR with composite ops parses back


def test_printed_ir_with_composite_ops_round_trips():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)

    def fn(q, g):
        out = lucid.nn.functional.gelu(q)
        return (*_sdpa_backward(0.0)(out, q, q, g), _layer_norm_backward((4,))(g, q, 1.0)[0])

    module = _lowered(fn, x, x)
    names = set(_prim_names(module))
    assert {"prim.gelu", "prim.attention_grad", "prim.layer_norm_grad"} <= names
    before = interpret_prim(module, [x, x])
    for generic in (False, True):
        text = print_ir(module, generic=generic)
        again = parse_ir(text, ctx=make_prim_context())
        again.verify()
        assert print_ir(again, generic=generic) == text
        for got, want in zip(interpret_prim(again, [x, x]), before, strict=True):
            np.testing.assert_array_equal(got, want)
    assert expand_composites(again) == 3
    assert not {f"prim.{n}" for n in P.COMPOSITE_OPS} & set(_prim_names(again))


def test_expansion_leaves_no_ops_for_results_nothing_reads():
    # Layer norm without a weight: dgamma and dbeta are unread, so are their column sums.
    dy, x, _ = _ln_arrays((3, 6), (6,), "float32", 8)

    def fn(g, t):
        return _layer_norm_backward((6,))(g, t, 1.0)[0]

    module = _lowered(fn, dy, x)
    want = interpret_prim(module, [dy, x])
    assert expand_composites(module) == 1
    assert "prim.reduce_sum" not in _prim_names(module)
    np.testing.assert_array_equal(interpret_prim(module, [dy, x])[0], want[0])


def test_malformed_attention_grad_instructions_raise_clear_errors():
    from lucid.backends.cpu.program import Instr

    def compile_with(outputs, attrs):
        p = _attention_grad_program(1, 2, 3, 4, 8, 8, "f32")
        (grad,) = [i for i in p.instrs if i.op == "attention_grad"]
        p.instrs[p.instrs.index(grad)] = Instr(
            "attention_grad", grad.inputs, outputs(p, grad), {"alpha": 0.4, **attrs}
        )
        p.results = list(p.instrs[-1].outputs)
        return CPUBackend(cache=False).compile(p)

    with pytest.raises(ValueError, match="3 outputs"):
        compile_with(lambda p, g: g.outputs[:1], {})
    fused = {"grad_cols": [0, 16, 32], "grad_width": [48]}
    with pytest.raises(ValueError, match="equal query and key lengths"):
        compile_with(lambda p, g: (p.new_slot((1, 3, 48), "f32"),), fused)
