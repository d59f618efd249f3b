"""Causal attention as the ``attention`` composite (``causal=True``): lowering emits it for
``is_causal=True`` with no mask over [B, H, L, D] heads, forward and gradient; its decomposition
(numpy reference, IR expansion run by the prim interpreter) masks the scores above the top-left
aligned diagonal as PyTorch's is_causal does, also when the query and key lengths differ; the
compiled results (CPU kernel, MPSGraph reference builder) equal eager and float64 references,
and the gradients float64 finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ir import import_trace
from lucid.ir import prim as P
from lucid.ir.importer import forward_func
from lucid.ir.prim.expand import expand_composites
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace

SHAPES = st.tuples(
    st.integers(1, 2),  # batch
    st.integers(1, 3),  # heads
    st.sampled_from([1, 2, 5, 9]),  # query length
    st.sampled_from([1, 3, 5, 12]),  # key length
    st.sampled_from([1, 4, 8]),  # head dim
    st.sampled_from([1, 3, 8]),  # value dim
)


def causal_reference(q, k, v, alpha):
    """softmax(alpha Q Kᵀ, keys j <= query i) V in float64, the PyTorch is_causal semantics."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * alpha
    s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p @ v, p


def _arrays(shape, dtype, seed):
    b, h, lq, lk, d, dv = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, lq, d)).astype(dtype)
    k = rng.standard_normal((b, h, lk, d)).astype(dtype)
    v = rng.standard_normal((b, h, lk, dv)).astype(dtype)
    d_out = rng.standard_normal((b, h, lq, dv)).astype(dtype)
    return q, k, v, d_out


def _lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("lower-to-prim").run(module)
    module.verify()
    return module


def _prim_ops(module) -> list:
    return list(forward_func(module).body.blocks.first.ops)


def _sdpa_and_grad(q, k, v, g):
    attrs = {"is_causal": True, "scale": None}
    return (
        apply("scaled_dot_product_attention", q, k, v, 0.0, **attrs),
        *apply("scaled_dot_product_attention_backward", g, q, k, v, 0.0, **attrs),
    )


@settings(max_examples=25, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_the_decomposition_masks_the_top_left_triangle(shape, dtype, seed):
    q, k, v, _ = _arrays(shape, dtype, seed)
    (got,) = P.evaluate("attention", [q, k, v], {"alpha": 0.4, "causal": True})
    want, _ = causal_reference(q, k, v, 0.4)
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # Without the attribute the composite is unmasked: the attribute is what masks.
    (plain,) = P.evaluate("attention", [q, k, v], {"alpha": 0.4})
    if shape[3] > 1:  # a single key is all any query sees
        assert not np.allclose(plain, want, rtol=tol, atol=tol)


@settings(max_examples=15, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**16))
def test_lowering_emits_the_causal_composite_forward_and_backward(shape, seed):
    arrays = _arrays(shape, "float32", seed)
    ops = _prim_ops(_lowered(_sdpa_and_grad, *arrays))
    names = [op.name for op in ops]
    assert "prim.softmax" in names  # the gradient's recomputed weights
    assert "prim.select" in names  # ... masked
    composites = {
        op.name: op.prim_attrs()
        for op in ops
        if op.name in ("prim.attention", "prim.attention_grad")
    }
    assert composites["prim.attention"]["causal"] is True
    assert composites["prim.attention_grad"]["causal"] is True


def test_a_mask_tensor_or_rank_3_heads_keep_the_decomposed_form():
    q, k, v, _ = _arrays((2, 2, 5, 5, 4, 4), "float32", 0)
    mask = np.tril(np.ones((5, 5), dtype=bool))
    for fn, arrays in (
        (lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), (q, k, v, mask)),
        (
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
            (q[0], k[0], v[0]),
        ),
    ):
        names = {op.name for op in _prim_ops(_lowered(fn, *arrays))}
        assert "prim.attention" not in names and "prim.softmax" in names


@settings(max_examples=15, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_the_expansion_run_by_the_interpreter_equals_the_composite(shape, dtype, seed):
    arrays = list(_arrays(shape, dtype, seed))
    whole = interpret_prim(_lowered(_sdpa_and_grad, *arrays), arrays)
    module = _lowered(_sdpa_and_grad, *arrays)
    assert expand_composites(module) >= 2
    names = {op.name for op in _prim_ops(module)}
    assert "prim.attention" not in names and "prim.attention_grad" not in names
    expanded = interpret_prim(module, arrays)
    tol = 2e-5 if dtype == "float32" else 1e-12
    for got, want in zip(expanded, whole, strict=True):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    want, _ = causal_reference(*arrays[:3], 1.0 / np.sqrt(shape[4]))
    np.testing.assert_allclose(expanded[0], want, rtol=tol * 10, atol=tol * 10)


@settings(max_examples=20, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_compiled_causal_attention_equals_eager_forward_and_gradients(shape, dtype, seed):
    q, k, v, d_out = _arrays(shape, dtype, seed)
    outs = []
    for run in (F.scaled_dot_product_attention, lucid.compile(F.scaled_dot_product_attention)):
        tensors = [lucid.tensor(a, requires_grad=True) for a in (q, k, v)]
        out = run(*tensors, is_causal=True)
        (out * lucid.tensor(d_out)).sum().backward()
        outs.append([out.detach().numpy(), *(t.grad.numpy() for t in tensors)])
    tol = 1e-4 if dtype == "float32" else 1e-10
    for got, want in zip(outs[1], outs[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    want, _ = causal_reference(q, k, v, 1.0 / np.sqrt(shape[4]))
    np.testing.assert_allclose(outs[1][0], want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1, 2, 4, 4, 3, 2), (2, 1, 5, 3, 2, 3), (1, 1, 2, 6, 4, 4)])
def test_compiled_gradients_equal_float64_finite_differences(shape):
    q, k, v, d_out = _arrays(shape, "float64", 3)
    fn = lucid.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True))
    tensors = [lucid.tensor(a, requires_grad=True) for a in (q, k, v)]
    (fn(*tensors) * lucid.tensor(d_out)).sum().backward()
    rng = np.random.default_rng(7)
    eps = 1e-6
    for i, t in enumerate(tensors):
        direction = rng.standard_normal(t.shape)
        values = []
        for sign in (1.0, -1.0):
            moved = [a.copy() for a in (q, k, v)]
            moved[i] = moved[i] + sign * eps * direction
            out, _ = causal_reference(*moved, 1.0 / np.sqrt(shape[4]))
            values.append(float((out * d_out).sum()))
        numeric = (values[0] - values[1]) / (2 * eps)
        analytic = float((t.grad.numpy() * direction).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), i


@settings(max_examples=8, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**16))
def test_the_mpsgraph_reference_builder_equals_numpy(shape, seed):
    from lucid.backends.mpsgraph import MPSGraphReferenceBackend

    q, k, v, _ = _arrays(shape, "float32", seed)
    compiled = []
    real = MPSGraphReferenceBackend.compile

    def counting(self, module, **kw):  # the builder ran, not a fallback
        compiled.append(1)
        return real(self, module, **kw)

    MPSGraphReferenceBackend.compile = counting
    fn = lucid.compile(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
        backend="mpsgraph-reference",
    )
    try:
        with lucid.no_grad():
            got = fn(*map(lucid.tensor, (q, k, v))).numpy()
    finally:
        MPSGraphReferenceBackend.compile = real
    assert compiled
    want, _ = causal_reference(q, k, v, 1.0 / np.sqrt(shape[4]))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class _CausalBlock(lucid.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = lucid.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, _ = self.attn(x, x, x, need_weights=False, is_causal=True)
        return out


@pytest.mark.parametrize("saved_format", ["current", "lucid-cpu-program/1"])
def test_saved_causal_programs_load_and_older_formats_are_rebuilt(
    tmp_path, monkeypatch, saved_format
):
    # The CPU program format names the attention instruction's encoding: a program saved by a
    # Lucid whose attention had no ``causal`` is not imported, it is rebuilt from the saved IR.
    from lucid.backends.cpu import CPUBackend
    from lucid.compile import load_compiled, save_compiled

    current = CPUBackend.program_format
    if saved_format != "current":
        monkeypatch.setattr(CPUBackend, "program_format", saved_format)
    lucid.manual_seed(0)
    model = _CausalBlock().eval()
    x = lucid.tensor(np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32))
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        want = model(x).numpy()
        cm(x)
    path = tmp_path / "causal.lucid"
    assert save_compiled(cm, path)
    monkeypatch.setattr(CPUBackend, "program_format", current)
    loaded = load_compiled(path)
    np.testing.assert_allclose(loaded(x).numpy(), want, rtol=1e-5, atol=1e-5)
    source = loaded.timing()[0]["source"]
    assert source == ("program" if saved_format == "current" else "ir")
