"""The LSTM recurrence as one op (``lstm_recurrence``) and its backpropagation through time
(``lstm_recurrence_backward``): equal to the unrolled cell (``lstm_cell``, Lucid ops) forward and
backward, and to float64 finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid.ops.rnn import lstm_cell, lstm_recurrence
from lucid.testing import gradcheck


def _t(rng, *shape, dtype=lucid.float64, grad=True, scale=0.5):
    return lucid.tensor(rng.standard_normal(shape) * scale, dtype=dtype, requires_grad=grad)


def _unrolled_direction(xs, h, c, w_ih, w_hh, b_ih, b_hh, reverse):
    """The reference: the unrolled cell over the steps (the maths nn.LSTM ran before)."""
    outs = [None] * len(xs)
    for t in range(len(xs) - 1, -1, -1) if reverse else range(len(xs)):
        h, c = lstm_cell(xs[t], h, c, w_ih, w_hh, b_ih, b_hh)
        outs[t] = h
    return lucid.stack(outs, 0), h, c


def _unrolled_lstm(x, hx, params, num_layers, has_biases, bidirectional):
    """A multi-layer LSTM over a (L, N, I) input from unrolled cells."""
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    h0, c0 = hx
    h_n, c_n, layer_input = [], [], x
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            idx = layer * dirs + d
            w_ih, w_hh, *biases = params[idx * per : (idx + 1) * per]
            b_ih, b_hh = biases if has_biases else (None, None)
            y, h, c = _unrolled_direction(
                list(layer_input.unbind(0)), h0[idx], c0[idx], w_ih, w_hh, b_ih, b_hh, d == 1
            )
            outs.append(y)
            h_n.append(h)
            c_n.append(c)
        layer_input = outs[0] if dirs == 1 else lucid.cat(outs, -1)
    return layer_input, lucid.stack(h_n, 0), lucid.stack(c_n, 0)


def _params(rng, input_size, hidden, num_layers, dirs, has_biases):
    params = []
    for layer in range(num_layers):
        width = input_size if layer == 0 else hidden * dirs
        for _ in range(dirs):
            params += [_t(rng, 4 * hidden, width), _t(rng, 4 * hidden, hidden)]
            if has_biases:
                params += [_t(rng, 4 * hidden), _t(rng, 4 * hidden)]
    return params


def _grads(outputs, wrt, rng):
    loss = sum((o * lucid.tensor(rng.standard_normal(o.shape))).sum() for o in outputs)
    return lucid.autograd.grad(loss, wrt, allow_unused=True)


def _check_against_unrolled(length, batch, hidden, input_size, num_layers, bidirectional,
                            has_biases, given_state, batch_first, unbatched, seed):  # fmt: skip
    rng = np.random.default_rng(seed)
    batch = 1 if unbatched else batch
    dirs = 2 if bidirectional else 1
    params = _params(rng, input_size, hidden, num_layers, dirs, has_biases)
    x = _t(rng, length, batch, input_size)
    state = (num_layers * dirs, batch, hidden)
    h0, c0 = (_t(rng, *state), _t(rng, *state)) if given_state else (None, None)
    zeros = lucid.zeros(*state, dtype=lucid.float64)
    ref = _unrolled_lstm(x, (h0 if given_state else zeros, c0 if given_state else zeros), params,
                         num_layers, has_biases, bidirectional)  # fmt: skip

    # The same sequence as nn.LSTM's callers give it: batch-first or unbatched when asked.
    inp, hx = x, (h0, c0) if given_state else None
    if unbatched:
        inp = x.reshape(length, input_size)
        if given_state:
            hx = (h0.reshape(state[0], hidden), c0.reshape(state[0], hidden))
    elif batch_first:
        inp = x.transpose(0, 1)
    out, (h_n, c_n) = F.lstm(inp, hx, params, num_layers, batch_first, has_biases,
                             bidirectional=bidirectional)  # fmt: skip
    if unbatched:
        out, h_n, c_n = out.unsqueeze(1), h_n.unsqueeze(1), c_n.unsqueeze(1)
    elif batch_first:
        out = out.transpose(0, 1)
    for got, want in zip((out, h_n, c_n), ref, strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12,
                                   atol=1e-12)  # fmt: skip
    wrt = [x, *params] + ([h0, c0] if given_state else [])
    got = _grads((out, h_n, c_n), wrt, np.random.default_rng(seed + 1))
    want = _grads(ref, wrt, np.random.default_rng(seed + 1))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "case",
    [
        dict(num_layers=2, bidirectional=True, has_biases=True, given_state=True,
             batch_first=True, unbatched=False),
        dict(num_layers=1, bidirectional=False, has_biases=False, given_state=False,
             batch_first=False, unbatched=True),
    ],
)  # fmt: skip
def test_lstm_equals_the_unrolled_cell_forward_and_backward(case):
    _check_against_unrolled(length=4, batch=2, hidden=3, input_size=5, seed=0, **case)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 6),
    batch=st.integers(1, 3),
    hidden=st.integers(1, 5),
    num_layers=st.integers(1, 2),
    bidirectional=st.booleans(),
    has_biases=st.booleans(),
    given_state=st.booleans(),
    layout=st.sampled_from(["seq_first", "batch_first", "unbatched"]),
    seed=st.integers(0, 2**16),
)
def test_lstm_equals_the_unrolled_cell_over_shapes(
    length, batch, hidden, num_layers, bidirectional, has_biases, given_state, layout, seed
):
    _check_against_unrolled(length, batch, hidden, 3, num_layers,
                            bidirectional, has_biases, given_state, layout == "batch_first",
                            layout == "unbatched", seed)  # fmt: skip


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_recurrence_gradients_match_finite_differences(reverse, bias):
    rng = np.random.default_rng(3)
    length, batch, hidden = 3, 2, 2
    projected = _t(rng, length, batch, 4 * hidden)
    h0, c0, w_hh = _t(rng, batch, hidden), _t(rng, batch, hidden), _t(rng, 4 * hidden, hidden)
    b_hh = _t(rng, 4 * hidden) if bias else None
    cot = [lucid.tensor(rng.standard_normal(s)) for s in [(length, batch, hidden), (batch, hidden)]]

    def fn(p, h, c, w, *b):
        outputs, h_n, c_n = lstm_recurrence(p, h, c, w, b[0] if b else None, reverse)
        return (outputs * cot[0]).sum() + (h_n * cot[1]).sum() + (c_n * c_n).sum()

    gradcheck(fn, projected, h0, c0, w_hh, *([b_hh] if bias else []))


def test_gradients_of_the_saved_cells_and_gates_are_not_dropped():
    """The op's saved intermediates are outputs too: a loss that reads them gets their
    gradient (the backward op takes it), checked against finite differences."""
    rng = np.random.default_rng(4)
    projected = _t(rng, 3, 2, 8)
    h0, c0, w_hh = _t(rng, 2, 2), _t(rng, 2, 2), _t(rng, 8, 2)

    def fn(p, h, c, w):
        outputs, _, _, cells, gates = apply("lstm_recurrence", p, h, c, w, 0.0, reverse=True)
        return outputs.sum() + (cells * cells).sum() + (gates * gates.tanh()).sum()

    gradcheck(fn, projected, h0, c0, w_hh)


def test_half_projections_are_promoted_to_the_state_dtype():
    """Under autocast the input projection may be half while state and weights are float32:
    the recurrence runs in float32, as the unrolled cell's promotion did."""
    rng = np.random.default_rng(5)
    p = _t(rng, 2, 1, 4, dtype=lucid.float32, grad=False)
    h, c = _t(rng, 1, 1, dtype=lucid.float32, grad=False), _t(rng, 1, 1, dtype=lucid.float32)
    w = _t(rng, 4, 1, dtype=lucid.float32, grad=False)
    outputs, h_n, _ = lstm_recurrence(p.to(lucid.float16), h, c, w)
    want, _, _ = lstm_recurrence(p.to(lucid.float16).to(lucid.float32), h, c, w)
    assert outputs.dtype is lucid.float32
    np.testing.assert_allclose(outputs.detach().numpy(), want.detach().numpy(), rtol=1e-6)


def test_bad_operands_raise_clear_errors():
    rng = np.random.default_rng(6)
    p, h, c = _t(rng, 2, 1, 8), _t(rng, 1, 2), _t(rng, 1, 2)
    w = _t(rng, 8, 2)
    with pytest.raises(ValueError, match="4 \\* hidden_size rows"):
        apply("lstm_recurrence", p, h, c, _t(rng, 6, 2), 0.0)
    with pytest.raises(ValueError, match="expected h0 of shape"):
        apply("lstm_recurrence", p, _t(rng, 2, 2), c, w, 0.0)
    with pytest.raises(ValueError, match="no time steps"):
        apply("lstm_recurrence", _t(rng, 0, 1, 8), h, c, w, 0.0)
    with pytest.raises(ValueError, match="b_hh must be"):
        apply("lstm_recurrence", p, h, c, w, _t(rng, 7))
    with pytest.raises(TypeError, match="one floating dtype"):
        apply("lstm_recurrence", p, h.to(lucid.float32), c, w, 0.0)
