"""Packed weights shared within a run (``gemm{share_b}``): a value read as operand B by several
products is packed once per run and the packing is never reused across runs (weights change
between them); results equal the unshared program's bit for bit (the same kernel and layout)."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid import _native
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.rewrites import fuse_kernels
from tests.backends.cpu.test_half_gemm import _lucid_sgemm, _random, native_kernel


def _recurrent_program(dtype: str, steps: int = 3) -> Program:
    """h_{t+1} = tanh(x_t @ W + h_t @ U), as an unrolled RNN: U is read once per step."""
    p = Program()
    n, d = 16, 64
    u = p.feed((d, d), dtype)
    xs = [p.feed((n, d), "f32") for _ in range(steps)]
    w = p.feed((d, d), "f32")
    wide_u = p.op("cast", u, dtype="f32") if dtype != "f32" else u
    h = p.op("tanh", p.op("matmul", xs[0], w))
    for x in xs[1:]:
        h = p.op("tanh", p.op("add", p.op("matmul", x, w), p.op("matmul", h, wide_u)))
    p.result(h)
    return p


@native_kernel
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_weight_read_every_step_is_packed_once_per_run_and_never_reused_across_runs(dtype):
    p = _recurrent_program(dtype)
    shared = [i for i in fuse_kernels(p).instrs if i.attrs.get("share_b")]
    assert len(shared) == 2 * 3 - 1  # W's three products and U's two
    rng = np.random.default_rng(5)
    with _lucid_sgemm():
        ex = CPUBackend(cache=False).compile(p)
        unfused = CPUBackend(fuse=False, cache=False).compile(p)
        for _ in range(2):  # new weights each run: the second run must not read the first's packing
            feeds = [_random(rng, p.slots[s].shape, p.slots[s].dtype) for s in p.feeds]
            before = _native.shared_pack_stats()
            (got,) = ex.run([f.copy() for f in feeds])
            after = _native.shared_pack_stats()
            assert after["packed"] - before["packed"] == 2  # W and U, once each
            assert after["reused"] - before["reused"] == 3
            (want,) = unfused.run([f.copy() for f in feeds])
            np.testing.assert_array_equal(got, want)
            (reference,) = p.interpret([f.copy() for f in feeds])
            np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


class _UnrolledLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(16, 32)

    def forward(self, x):
        state, outs = None, []
        for t in range(x.shape[1]):
            state = self.cell(x[:, t], state)
            outs.append(state[0])
        return (lucid.stack(outs, 1),)


@native_kernel
def test_an_lstm_trained_with_shared_packed_weights_matches_eager():
    # Weights change every step: a packing reused from an earlier run would show here.
    lucid.manual_seed(3)
    # An LSTM cell unrolled over the steps (nn.LSTM runs its recurrence as one op, whose kernel
    # reads W_hh in place): every step's product reads the same recurrent weight.
    eager, twin = _UnrolledLSTM(), _UnrolledLSTM()
    twin.load_state_dict(eager.state_dict())
    x = lucid.randn(8, 5, 16)

    def loss_of(out):
        return (out[0] ** 2).mean()

    with _lucid_sgemm():
        step = lucid.compile.fused_step(twin, loss_of, lucid.optim.SGD(twin.parameters(), lr=0.5))
        opt = lucid.optim.SGD(eager.parameters(), lr=0.5)
        before = _native.shared_pack_stats()
        for _ in range(3):
            step(x)
            opt.zero_grad()
            loss_of(eager(x)).backward()
            opt.step()
        after = _native.shared_pack_stats()
    assert step.cache_info()["reasons"] == {}
    assert after["reused"] > before["reused"]
    for (name, a), (_, b) in zip(twin.named_parameters(), eager.named_parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
