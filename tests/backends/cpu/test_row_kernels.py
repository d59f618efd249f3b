"""Row kernels: ``layer_norm_grad``, ``gelu`` and ``gelu_grad`` (composite prim ops, emitted
whole by lowering), with the column sums ``rewrites/rows.py`` folds into them: native results
against the prim interpreter on the unfused program, the numpy references of the kernels, the
composites' decompositions, eager Lucid, float64 finite differences through ``fused_step``, and
bit-identical results on one thread and two."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import _native
from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.backends.cpu.testing import decomposed
from lucid.ir import prim

SHAPES = st.one_of(
    st.tuples(st.integers(1, 40)),
    st.tuples(st.integers(1, 70), st.integers(1, 40)),
    st.tuples(st.integers(1, 4), st.integers(1, 20), st.integers(1, 24)),
)


pytestmark = pytest.mark.usefixtures("fixed_threads")


def layer_norm_grad_program(shape, dtype="f32", column_sums=True):
    """Layer norm's backward as lowering emits it (the composite ``layer_norm_grad``: dx,
    dgamma, dbeta), with the column sums of dx (the bias gradient of the layer before)."""
    p = Program()
    x, dy, gamma = p.feed(shape, dtype), p.feed(shape, dtype), p.feed(shape[-1:], dtype)
    dx, dgamma, dbeta = p.op_results("layer_norm_grad", dy, x, gamma, epsilon=1e-5)
    p.result(dx, dgamma, dbeta)
    if column_sums:
        rows = p.op("reshape", dx, shape=(int(np.prod(shape[:-1])), shape[-1]))
        p.result(p.op("reduce_sum", rows, axes=(0,), keepdims=False))
    return p


def gelu_program(shape, dtype="f32", grad=True, bias_sum=True):
    """GELU (erf form) and its gradient as lowering emits them (composite prim ops), with the
    column sums of the gradient (the bias gradient of the layer before) when ``bias_sum``."""
    p = Program()
    x = p.feed(shape, dtype)
    p.result(p.op("gelu", x))
    if grad:
        dy = p.feed(shape, dtype)
        dx = p.op("gelu_grad", dy, x)
        p.result(dx)
        if bias_sum:
            lead = tuple(range(len(shape) - 1))
            p.result(p.op("reduce_sum", dx, axes=lead, keepdims=False))
    return p


def _feeds(p: Program, seed: int, scale: float = 1.5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.asarray(
            rng.standard_normal(p.slots[s].shape) * scale, p.slots[s].dtype.replace("f", "float")
        )
        for s in p.feeds
    ]


def _ops(p: Program) -> list[str]:
    return [i.op for i in fuse_kernels(p).instrs]


def _check(p: Program, feeds, dtype: str, condition: float = 1.0) -> None:
    """Native (fused) against the interpreter on the unfused program and on the fused one, and
    against the composite ops' decompositions; ``condition`` scales the tolerance (layer norm's
    gradient is ``rstd`` times a difference of terms, so rounding grows with ``rstd``: rows of
    nearly equal values)."""
    tol = (2e-5 if dtype == "f32" else 1e-12) * condition
    got = CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds])
    references = [p.interpret(feeds), fuse_kernels(p).interpret(feeds)]
    if any(ins.op in prim.COMPOSITE_OPS for ins in p.instrs):
        references.append(decomposed(p, feeds))
    for reference in references:
        for g, w in zip(got, reference, strict=True):
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale * 4)


def _rstd_max(x: np.ndarray) -> float:
    return float(np.max(1.0 / np.sqrt(x.astype(np.float64).var(axis=-1) + 1e-5)))


@settings(max_examples=40, deadline=None)
@given(
    shape=SHAPES,
    dtype=st.sampled_from(["f32", "f64"]),
    column_sums=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_grad_kernel_equals_its_decomposition(shape, dtype, column_sums, seed):
    p = layer_norm_grad_program(shape, dtype, column_sums)
    ops = _ops(p)
    # The column sums became a view of the kernel's fourth output: no reduction is left.
    assert [op for op in ops if op != "reshape"] == ["layer_norm_grad"]
    grad = next(i for i in fuse_kernels(p).instrs if i.op == "layer_norm_grad")
    assert len(grad.outputs) == (4 if column_sums else 3)
    feeds = _feeds(p, seed)
    _check(p, feeds, dtype, condition=max(1.0, _rstd_max(feeds[0])))


@settings(max_examples=40, deadline=None)
@given(
    shape=SHAPES,
    dtype=st.sampled_from(["f32", "f64"]),
    bias_sum=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gelu_and_its_gradient_kernels_equal_their_decompositions(shape, dtype, bias_sum, seed):
    p = gelu_program(shape, dtype, bias_sum=bias_sum)
    ops = _ops(p)
    # (a column sum of a single row is a reshape of the kernel's second output)
    assert sorted(op for op in ops if op != "reshape") == ["gelu", "gelu_grad"]
    grad = next(i for i in fuse_kernels(p).instrs if i.op == "gelu_grad")
    assert len(grad.outputs) == (2 if bias_sum else 1)
    _check(p, _feeds(p, seed, scale=3.0), dtype)


def test_gelu_forward_alone_and_at_extreme_inputs():
    p = gelu_program((5, 9), grad=False)
    assert _ops(p) == ["gelu"]
    x = np.array([-1e30, -50, -8, -4.5, -1, -1e-8, 0, 1e-8, 1, 4.5, 8, 50, 1e30] * 3 + [0.25] * 6)
    feeds = [x.reshape(5, 9).astype(np.float32)]
    _check(p, feeds, "f32")
    (y,) = CPUBackend(cache=False).compile(p).run(feeds)
    assert y[0, 0] == 0 and y.reshape(-1)[12] == np.float32(1e30)


def test_gelu_gradient_at_extreme_inputs_matches_the_prim_graph():
    # NaN and infinities as the lowered graph gives them (inf * 0 is NaN there too), huge
    # values whose square overflows, and rows that are not a multiple of the vector width.
    p = gelu_program((3, 13), bias_sum=False)
    x = np.array([np.nan, -np.inf, np.inf, -1e30, 1e30, -13.5, 13.5, -0.5, 0.5, 0, 3, -3, 9])
    dy = np.linspace(-2, 2, 39).reshape(3, 13)
    feeds = [np.tile(x, (3, 1)).astype(np.float32), dy.astype(np.float32)]
    _check(p, feeds, "f32")
    _, dx = CPUBackend(cache=False).compile(p).run(feeds)
    assert np.isnan(dx[:, :3]).all() and np.isfinite(dx[:, 3:]).all()


def test_large_inputs_split_across_threads_give_identical_results():
    # Above the size split across the worker pool, in chunks that do not depend on the count.
    for p in (layer_norm_grad_program((600, 130)), gelu_program((700, 128))):
        feeds = _feeds(p, 3)
        outs = []
        for n in (1, 2):
            set_num_threads(n)
            outs.append(CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds]))
        for a, b in zip(*outs, strict=True):
            np.testing.assert_array_equal(a, b)
        _check(p, feeds, "f32")


@pytest.mark.parametrize(
    ("instr", "slots", "message"),
    [
        (("gelu", [0], [1], {}), [((2, 3), "i32"), ((2, 3), "i32")], "float dtype"),
        (("gelu", [0], [1, 2], {}), [((2, 3), "f32")] * 3, "1 output"),
        (
            ("gelu_grad", [0, 1], [2], {}),
            [((2, 3), "f32"), ((3, 3), "f32"), ((3, 3), "f32")],
            "gradient has shape",
        ),
        (("gelu_grad", [0, 1], [2, 3], {}), [((2, 3), "f32")] * 3 + [((2,), "f32")], "declared"),
        (("gelu_grad", [0], [1], {}), [((2, 3), "f32")] * 2, "takes 2"),
        (
            ("layer_norm_grad", [0, 1, 2], [3, 4, 5], {"epsilon": 1e-5}),
            [
                ((2, 3), "f32"),
                ((2, 3), "f32"),
                ((2,), "f32"),
                ((2, 3), "f32"),
                ((3,), "f32"),
                ((3,), "f32"),
            ],
            "weight needs shape",
        ),
        (
            ("layer_norm_grad", [0, 1, 2], [3, 4], {"epsilon": 1e-5}),
            [((2, 3), "f32"), ((2, 3), "f32"), ((3,), "f32"), ((2, 3), "f32"), ((3,), "f32")],
            "3 or 4 outputs",
        ),
        (
            ("layer_norm_grad", [0, 1, 2], [3, 4, 5], {}),
            [
                ((2, 3), "f64"),
                ((2, 3), "f64"),
                ((3,), "f64"),
                ((2, 3), "f64"),
                ((3,), "f64"),
                ((3,), "f64"),
            ],
            "epsilon",
        ),
        (
            ("layer_norm_grad", [0, 1, 2], [3, 4, 5], {"epsilon": 1e-5}),
            [
                ((2, 3), "f32"),
                ((2, 3), "f64"),
                ((3,), "f32"),
                ((2, 3), "f32"),
                ((3,), "f32"),
                ((3,), "f32"),
            ],
            "share one dtype",
        ),
    ],
)
def test_validator_refuses_malformed_row_kernels(instr, slots, message):
    n_in = max(instr[1]) + 1
    desc = {
        "slots": slots,
        "instrs": [instr],
        "feeds": list(range(n_in)),
        "results": list(instr[2]),
    }
    with pytest.raises(ValueError, match=message):
        _native.validate(desc)


# -- end to end: a post-norm encoder's feed-forward half, eager vs compiled ---------------------


class Block(nn.Module):
    def __init__(self, d: int = 6, ffn: int = 10):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.up = nn.Linear(d, ffn)
        self.down = nn.Linear(ffn, d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        h = self.norm1(x + self.inp(x))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


def _loss(out):
    return (out * out).mean()


def _block(dtype):
    lucid.manual_seed(0)
    model = Block()
    for norm in (model.norm1, model.norm2):  # gamma and beta away from 1 and 0
        norm.weight.data = lucid.randn(6) * 0.5 + 1.0
        norm.bias.data = lucid.randn(6) * 0.5
    return model.double() if dtype == "f64" else model


def _step_ops(step) -> list[str]:
    entry = next(iter(step._entries.values()))
    return entry.executable.dump()


def test_compiled_block_matches_eager_and_uses_the_kernels():
    model = _block("f32").eval()
    x = lucid.randn(3, 5, 6)
    cm = lucid.compile(model)
    with lucid.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    # Inference: GELU runs in the up-projection's gemm epilogue (test_sgemm.py).
    rows = cm.profile(x, repeats=1)
    assert any(r["op"] == "gemm" and "activation=s'gelu'" in r["instr"] for r in rows)


def test_fused_step_gradients_match_finite_differences_in_float64():
    model = _block("f64")
    x = lucid.randn(3, 5, 6).double()
    before = {name: p.numpy().copy() for name, p in model.named_parameters()}

    def loss_at(name, flat_index, delta):
        params = dict(model.named_parameters())
        value = before[name].copy()
        value.reshape(-1)[flat_index] += delta
        params[name].data = lucid.tensor(value)
        with lucid.no_grad():
            out = float(_loss(model(x)).item())
        params[name].data = lucid.tensor(before[name].copy())
        return out

    opt = lucid.optim.SGD(model.parameters(), lr=1.0)
    step = lucid.compile.fused_step(model, _loss, opt)
    step(x)
    dump = _step_ops(step)
    assert "layer_norm_grad" in dump and "gelu_grad" in dump and "gelu(" in dump
    after = {name: p.numpy().copy() for name, p in model.named_parameters()}
    for name in before:
        params = dict(model.named_parameters())
        params[name].data = lucid.tensor(before[name].copy())
    eps = 1e-6
    for name in before:
        grad = before[name] - after[name]  # lr = 1
        for i in range(before[name].size):
            numeric = (loss_at(name, i, eps) - loss_at(name, i, -eps)) / (2 * eps)
            assert abs(grad.reshape(-1)[i] - numeric) <= 1e-7 + 1e-5 * abs(numeric), (name, i)


def test_fused_step_matches_eager_training_in_float32(sgd_training_matches_eager):
    compiled, eager = _block("f32"), _block("f32")
    sgd_training_matches_eager(compiled, eager, _loss, lucid.randn(4, 7, 6))
