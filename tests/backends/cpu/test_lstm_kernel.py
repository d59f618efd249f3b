"""The LSTM recurrence on the CPU backend: lowering emits the composites ``lstm``/``lstm_grad``
whole, the native kernel (lstm.cpp) equals their decomposition (the prim interpreter) and eager
Lucid, and compiled inference, backward and ``fused_step`` training equal eager."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid import _native, nn
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.backends.cpu import CPUBackend
from lucid.backends.cpu.program import Program
from lucid.compile import fused_step
from lucid.ir import import_trace
from lucid.ir.importer import forward_func
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace

TOL = {"float32": 3e-5, "float64": 1e-11}


def _lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("lower-to-prim").run(module)
    module.verify()
    return module


def _prim_ops(module) -> list:
    return [op for op in forward_func(module).body.blocks.first.ops if op.name.startswith("prim")]


def _operands(length, batch, hidden, dtype, seed, bias):
    rng = np.random.default_rng(seed)
    shapes = [(length, batch, 4 * hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden)]
    arrays = [(rng.standard_normal(s) * 0.8).astype(dtype) for s in shapes]
    if bias:
        arrays.append(rng.standard_normal(4 * hidden).astype(dtype))
    # Gradients of outputs, h_n, c_n, and of the saved cells (a loss that reads them).
    seq, state = (length, batch, hidden), (batch, hidden)
    grads = [rng.standard_normal(s).astype(dtype) for s in (seq, state, state, seq)]
    return arrays, grads


def _forward_and_backward(reverse, bias, cells_grad):
    def fn(projected, h0, c0, w_hh, *rest):
        b_hh = rest[0] if bias else 0.0
        dy, dh, dc, d_cells = rest[1:] if bias else rest
        outputs, h_n, c_n, cells, gates = apply(
            "lstm_recurrence", projected, h0, c0, w_hh, b_hh, reverse=reverse
        )
        grads = apply(
            "lstm_recurrence_backward",
            dy, dh, dc, d_cells if cells_grad else 0.0, 0.0, h0, c0, w_hh, outputs, cells, gates,
            reverse=reverse,
        )  # fmt: skip
        return (outputs, h_n, c_n, cells, gates, *grads)

    return fn


def _check_paths(length, batch, hidden, dtype, reverse, bias, cells_grad, seed):
    arrays, grads = _operands(length, batch, hidden, dtype, seed, bias)
    fn = _forward_and_backward(reverse, bias, cells_grad)
    feeds = arrays + grads
    eager = [v.numpy() for v in fn(*(lucid.tensor(a) for a in feeds))]
    module = _lowered(fn, *feeds)
    names = {op.name for op in _prim_ops(module)}
    assert {"prim.lstm", "prim.lstm_grad"} <= names and "prim.sigmoid" not in names
    native = CPUBackend(cache=False).compile(module).run(feeds)
    interpreted = interpret_prim(module, feeds)  # the unrolled decomposition
    for got in (native, interpreted):
        for g, want in zip(got, eager, strict=True):
            np.testing.assert_allclose(g, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize(
    "length, batch, hidden, dtype, reverse, bias, cells_grad",
    [
        (3, 2, 5, "float32", False, True, False),
        (4, 3, 2, "float64", True, False, True),
        # Wide enough for the worker pool to split the rows and for sgemm's full tiles.
        (3, 16, 40, "float32", True, True, True),
    ],
)
def test_native_kernels_equal_the_decomposition_and_eager(
    length, batch, hidden, dtype, reverse, bias, cells_grad
):
    _check_paths(length, batch, hidden, dtype, reverse, bias, cells_grad, seed=0)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 5),
    batch=st.integers(1, 7),
    hidden=st.integers(1, 9),
    dtype=st.sampled_from(["float32", "float64"]),
    reverse=st.booleans(),
    bias=st.booleans(),
    cells_grad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_native_kernels_equal_eager_over_shapes(
    length, batch, hidden, dtype, reverse, bias, cells_grad, seed
):
    _check_paths(length, batch, hidden, dtype, reverse, bias, cells_grad, seed)


def test_inference_saves_nothing_and_tanh_saturates_cleanly():
    """Inference lowers to lstm without the saved cells and gates; large pre-activations (tanh
    and sigmoid saturated) give eager's values."""
    arrays, _ = _operands(2, 3, 4, "float32", 1, True)
    arrays[0] = arrays[0] * 40

    def fn(p, h, c, w, b):
        return apply("lstm_recurrence", p, h, c, w, b)[:3]

    module = _lowered(fn, *arrays)
    (op,) = [op for op in _prim_ops(module) if op.name == "prim.lstm"]
    assert len(op.results) == 3
    eager = [v.numpy() for v in fn(*(lucid.tensor(a) for a in arrays))]
    for g, want in zip(CPUBackend(cache=False).compile(module).run(arrays), eager, strict=True):
        np.testing.assert_allclose(g, want, rtol=3e-5, atol=3e-6)


def test_native_program_equals_its_interpretation_and_rejects_malformed_instructions():
    p = Program()
    x, h, c = p.feed((2, 1, 8)), p.feed((1, 2)), p.feed((1, 2))
    w, b = p.feed((8, 2)), p.feed(())
    p.result(*p.op_results("lstm", x, h, c, w, b))
    desc = p.describe()
    _native.validate(desc)
    feeds, _ = _operands(2, 1, 2, "float32", 3, False)
    feeds.append(np.zeros((), np.float32))
    for got, want in zip(CPUBackend(cache=False).compile(p).run(feeds), p.interpret(feeds),
                         strict=True):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-6)
    bad = p.describe()
    bad["instrs"][0][1].pop()  # no bias operand
    with pytest.raises(ValueError, match="lstm takes 5 operands"):
        _native.validate(bad)
    bad = p.describe()
    bad["instrs"][0][1][1] = bad["instrs"][0][1][3]  # w_hh where h0 goes
    with pytest.raises(ValueError, match="h0 must be"):
        _native.validate(bad)
    bad = p.describe()
    bad["instrs"][0][3]["save"] = True  # five outputs asked, three given
    with pytest.raises(ValueError, match="lstm with save has 5 outputs"):
        _native.validate(bad)


class _LanguageModel(nn.Module):
    def __init__(self, bidirectional):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.rnn = nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(10 if bidirectional else 5, 11)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out).reshape(-1, 11)


def _train(compiled, bidirectional, backend="cpu"):
    lucid.manual_seed(0)
    model = _LanguageModel(bidirectional)
    opt = lucid.optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt, backend=backend) if compiled else None
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(3):
        x = lucid.tensor(rng.integers(0, 11, (3, 4)))
        y = lucid.tensor(rng.integers(0, 11, (12,)))
        if step is not None:
            loss = step(x, y)
        else:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        losses.append(float(loss.detach().numpy()))
    return losses, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_step_with_adam_equals_eager_training(bidirectional):
    eager_losses, eager_params = _train(False, bidirectional)
    losses, params = _train(True, bidirectional)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for name, want in eager_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_mpsgraph_reference_backend_runs_the_expansion():
    eager_losses, eager_params = _train(False, False)
    losses, params = _train(True, False, backend="mpsgraph-reference")
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for name, want in eager_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_compiled_inference_and_gradients_equal_eager():
    lucid.manual_seed(2)
    lstm = nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    x = lucid.randn(5, 3, 4)
    h0, c0 = lucid.randn(4, 3, 6), lucid.randn(4, 3, 6)
    with lucid.no_grad():
        eager = lstm(x, (h0, c0))
        compiled = lucid.compile(lstm, strict=True)(x, (h0, c0))
    for got, want in zip((compiled[0], *compiled[1]), (eager[0], *eager[1]), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)

    def grads(fn):
        lstm.zero_grad()
        inputs = [t.clone().requires_grad_() for t in (x, h0, c0)]
        out, (h_n, c_n) = fn(inputs[0], (inputs[1], inputs[2]))
        ((out * out).sum() + h_n.sum() + (c_n * 0.5).sum()).backward()
        return [t.grad.numpy() for t in inputs] + [p.grad.numpy() for p in lstm.parameters()]

    want = grads(lstm)
    got = grads(lucid.compile(lstm, strict=True))  # the compiled forward and its VJP
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("reverse", [False, True])
def test_native_kernels_at_workload_h_sizes(reverse):
    """N = 16, H = 512 (workload H's layer): the GEMMs split across the pool in full tiles."""
    arrays, grads = _operands(6, 16, 512, "float32", 0, True)
    arrays[0] *= 0.1
    arrays[3] *= 0.05
    fn = _forward_and_backward(reverse, True, True)
    feeds = arrays + grads
    eager = [v.numpy() for v in fn(*(lucid.tensor(a) for a in feeds))]
    native = CPUBackend(cache=False).compile(_lowered(fn, *feeds)).run(feeds)
    for got, want in zip(native, eager, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
