"""LSTM cell and multi-layer LSTM against a numpy reference of torch's documented equations."""

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0, scale=0.5):
    data = np.random.default_rng(seed).standard_normal(shape) * scale
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=True)


def arr(t):
    return t.detach().numpy()


def sig(x):
    return 1 / (1 + np.exp(-x))


def ref_cell(x, h, c, w_ih, w_hh, b_ih, b_hh):
    gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
    i, f, g, o = np.split(gates, 4, axis=-1)
    c2 = sig(f) * c + sig(i) * np.tanh(g)
    return sig(o) * np.tanh(c2), c2


def ref_lstm(x, h0, c0, params, num_layers, bidirectional):
    """x (L, N, I); params flat per layer/direction: w_ih, w_hh, b_ih, b_hh."""
    dirs = 2 if bidirectional else 1
    hs, cs = [], []
    inp = x
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh, b_ih, b_hh = params[4 * k : 4 * k + 4]
            h, c = h0[k], c0[k]
            seq = np.zeros((inp.shape[0], inp.shape[1], w_hh.shape[1]))
            order = range(inp.shape[0] - 1, -1, -1) if d else range(inp.shape[0])
            for t in order:
                h, c = ref_cell(inp[t], h, c, w_ih, w_hh, b_ih, b_hh)
                seq[t] = h
            outs.append(seq)
            hs.append(h)
            cs.append(c)
        inp = np.concatenate(outs, -1)
    return inp, np.stack(hs), np.stack(cs)


def make_params(input_size, hidden, num_layers, dirs, seed=10):
    params = []
    for layer in range(num_layers):
        in_size = input_size if layer == 0 else hidden * dirs
        for d in range(dirs):
            s = seed + 10 * layer + 5 * d
            params += [
                f64(4 * hidden, in_size, seed=s),
                f64(4 * hidden, hidden, seed=s + 1),
                f64(4 * hidden, seed=s + 2),
                f64(4 * hidden, seed=s + 3),
            ]
    return params


def test_lstm_cell_values_and_gradients():
    x, h, c = f64(2, 3, seed=1), f64(2, 4, seed=2), f64(2, 4, seed=3)
    w_ih, w_hh, b_ih, b_hh = make_params(3, 4, 1, 1)
    h2, c2 = F.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
    rh, rc = ref_cell(*(arr(t) for t in (x, h, c, w_ih, w_hh, b_ih, b_hh)))
    assert_close(h2, rh, rtol=1e-10)
    assert_close(c2, rc, rtol=1e-10)
    gradcheck(lambda *a: F.lstm_cell(*a)[0] + F.lstm_cell(*a)[1], x, h, c, w_ih, w_hh, b_ih, b_hh)


def test_lstm_cell_without_biases_and_unbatched():
    x, h, c = f64(3, seed=1), f64(4, seed=2), f64(4, seed=3)
    w_ih, w_hh = make_params(3, 4, 1, 1)[:2]
    h2, c2 = F.lstm_cell(x, h, c, w_ih, w_hh)
    rh, rc = ref_cell(arr(x), arr(h), arr(c), arr(w_ih), arr(w_hh), 0.0, 0.0)
    assert_close(h2, rh, rtol=1e-10)
    assert_close(c2, rc, rtol=1e-10)


@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, False), (2, True)])
def test_lstm_matches_reference(num_layers, bidirectional):
    dirs = 2 if bidirectional else 1
    x = f64(5, 2, 3, seed=1)
    h0, c0 = f64(num_layers * dirs, 2, 4, seed=2), f64(num_layers * dirs, 2, 4, seed=3)
    params = make_params(3, 4, num_layers, dirs)
    out, (h_n, c_n) = F.lstm(x, (h0, c0), params, num_layers, bidirectional=bidirectional)
    ro, rh, rc = ref_lstm(
        arr(x), arr(h0), arr(c0), [arr(p) for p in params], num_layers, bidirectional
    )
    assert out.shape == (5, 2, 4 * dirs)
    assert_close(out, ro, rtol=1e-10)
    assert_close(h_n, rh, rtol=1e-10)
    assert_close(c_n, rc, rtol=1e-10)


def test_lstm_batch_first_zero_state_and_unbatched():
    x = f64(2, 3, 3, seed=1)  # (N, L, I)
    params = make_params(3, 4, 1, 1)
    out, (h_n, _) = F.lstm(x, None, params, batch_first=True)
    zeros = np.zeros((1, 2, 4))
    ro, rh, _ = ref_lstm(
        np.swapaxes(arr(x), 0, 1), zeros, zeros, [arr(p) for p in params], 1, False
    )
    assert_close(out, np.swapaxes(ro, 0, 1), rtol=1e-10)
    assert_close(h_n, rh, rtol=1e-10)
    single, (h1, c1) = F.lstm(x[0], None, params)  # unbatched (L, I)
    assert single.shape == (3, 4) and h1.shape == (1, 4) and c1.shape == (1, 4)
    assert_close(single, np.swapaxes(ro, 0, 1)[0], rtol=1e-10)


def test_lstm_gradients_through_time():
    x = f64(3, 1, 2, seed=1)
    h0, c0 = f64(1, 1, 2, seed=2), f64(1, 1, 2, seed=3)
    params = make_params(2, 2, 1, 1)
    gradcheck(lambda a, h, c, *p: F.lstm(a, (h, c), list(p))[0], x, h0, c0, *params)


def test_lstm_rejects_wrong_parameter_count_and_state_shape():
    x = f64(3, 2, 3)
    params = make_params(3, 4, 1, 1)
    with pytest.raises(ValueError, match="expected 8 parameter tensors"):
        F.lstm(x, None, params, num_layers=2)
    with pytest.raises(ValueError, match=r"h0 of shape \(1, 2, 4\)"):
        F.lstm(x, (f64(1, 3, 4), f64(1, 3, 4)), params)
    with pytest.raises(ValueError, match="4 \\* hidden_size"):
        F.lstm_cell(f64(2, 3), f64(2, 4), f64(2, 4), f64(12, 3), f64(16, 4))
