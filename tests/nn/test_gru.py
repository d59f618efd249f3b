"""nn.GRU against a numpy reference written from torch's documented equations (gates r, z, n),
a float64 gradcheck, and torch itself when installed."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.testing import gradcheck


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference_gru(x, h0, params, num_layers, bidirectional, bias):
    """torch.nn.GRU's documentation, time-major x (L, N, H_in), h0 (layers * D, N, H):
    r = s(W_ir x + b_ir + W_hr h + b_hr), z = s(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h."""
    dirs = 2 if bidirectional else 1
    layer_in = x
    h_n = []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w_ih, w_hh = params["weight_ih" + sfx], params["weight_hh" + sfx]
            hidden = w_hh.shape[1]
            b_ih = params["bias_ih" + sfx] if bias else np.zeros(3 * hidden)
            b_hh = params["bias_hh" + sfx] if bias else np.zeros(3 * hidden)
            w_ir, w_iz, w_in = np.split(w_ih, 3)
            w_hr, w_hz, w_hn = np.split(w_hh, 3)
            b_ir, b_iz, b_in = np.split(b_ih, 3)
            b_hr, b_hz, b_hn = np.split(b_hh, 3)
            h = h0[layer * dirs + d]
            seq = [None] * len(layer_in)
            steps = range(len(layer_in) - 1, -1, -1) if d else range(len(layer_in))
            for t in steps:
                xt = layer_in[t]
                r = _sigmoid(xt @ w_ir.T + b_ir + h @ w_hr.T + b_hr)
                z = _sigmoid(xt @ w_iz.T + b_iz + h @ w_hz.T + b_hz)
                n = np.tanh(xt @ w_in.T + b_in + r * (h @ w_hn.T + b_hn))
                h = (1 - z) * n + z * h
                seq[t] = h
            outs.append(np.stack(seq))
            h_n.append(h)
        layer_in = np.concatenate(outs, axis=-1)
    return layer_in, np.stack(h_n)


def _params(gru):
    return {k: v.detach().numpy() for k, v in gru.named_parameters()}


CONFIGS = list(
    itertools.product([1, 2], [True, False], [False, True], [False, True], [False, True])
)


@pytest.mark.parametrize(("num_layers", "bias", "batch_first", "bidirectional", "with_h0"), CONFIGS)
def test_matches_reference(num_layers, bias, batch_first, bidirectional, with_h0):
    lucid.manual_seed(num_layers * 16 + bias * 8 + batch_first * 4 + bidirectional * 2 + with_h0)
    gru = nn.GRU(3, 4, num_layers, bias, batch_first, bidirectional=bidirectional).double()
    rng = np.random.default_rng(0)
    L, N, D = 5, 2, 2 if bidirectional else 1
    x = rng.standard_normal((L, N, 3))
    h0 = (
        rng.standard_normal((num_layers * D, N, 4)) if with_h0 else np.zeros((num_layers * D, N, 4))
    )
    want_out, want_h = reference_gru(x, h0, _params(gru), num_layers, bidirectional, bias)
    inp = lucid.tensor(x.transpose(1, 0, 2) if batch_first else x, dtype=lucid.float64)
    args = (lucid.tensor(h0, dtype=lucid.float64),) if with_h0 else ()
    out, h_n = gru(inp, *args)
    got_out = out.detach().numpy()
    if batch_first:
        got_out = got_out.transpose(1, 0, 2)
    assert out.shape == ((N, L, D * 4) if batch_first else (L, N, D * 4))
    assert h_n.shape == (num_layers * D, N, 4)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h_n.detach().numpy(), want_h, rtol=1e-12, atol=1e-14)


def test_unbatched_input():
    gru = nn.GRU(3, 4, num_layers=2, bidirectional=True).double()
    rng = np.random.default_rng(1)
    x, h0 = rng.standard_normal((6, 3)), rng.standard_normal((4, 4))
    out, h_n = gru(lucid.tensor(x, dtype=lucid.float64), lucid.tensor(h0, dtype=lucid.float64))
    want_out, want_h = reference_gru(x[:, None], h0[:, None], _params(gru), 2, True, True)
    assert out.shape == (6, 8) and h_n.shape == (4, 4)
    np.testing.assert_allclose(out.detach().numpy(), want_out[:, 0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h_n.detach().numpy(), want_h[:, 0], rtol=1e-12, atol=1e-14)


def test_parameters_names_shapes_and_init():
    gru = nn.GRU(5, 7, num_layers=2, bidirectional=True)
    shapes = {k: tuple(v.shape) for k, v in gru.named_parameters()}
    assert shapes["weight_ih_l0"] == (21, 5) and shapes["weight_hh_l0"] == (21, 7)
    assert shapes["weight_ih_l1_reverse"] == (21, 14) and shapes["bias_hh_l1_reverse"] == (21,)
    assert len(shapes) == 16
    bound = 1 / math.sqrt(7)
    for p in gru.parameters():
        assert p.dtype == lucid.float32 and p.requires_grad
        assert np.abs(p.detach().numpy()).max() <= bound
    assert len(list(nn.GRU(2, 3, bias=False).parameters())) == 2
    assert repr(nn.GRU(2, 3, 2, batch_first=True)) == "GRU(2, 3, num_layers=2, batch_first=True)"


def test_gradcheck_float64():
    lucid.manual_seed(0)
    gru = nn.GRU(2, 2, num_layers=2, bidirectional=True).double()
    x = lucid.randn(2, 1, 2, dtype=lucid.float64, requires_grad=True)
    h0 = lucid.randn(4, 1, 2, dtype=lucid.float64, requires_grad=True)

    # output and h_n together, so one check covers both; weights of both layers and directions
    def both(x, h0, w, b):
        out, h_n = gru(x, h0)
        return lucid.cat([out.reshape(-1), h_n.reshape(-1)])

    gradcheck(both, x, h0, gru.weight_hh_l0, gru.bias_ih_l1_reverse)
    gradcheck(lambda x: gru(x)[0], x)  # the zero-initial-state path


def test_dropout_between_layers():
    lucid.manual_seed(0)
    gru = nn.GRU(3, 4, num_layers=2, dropout=1.0).double()
    x = lucid.randn(4, 2, 3, dtype=lucid.float64)
    params = _params(gru)
    out, h_n = gru(x)  # training: layer 1 sees only zeros
    zeros_in = np.zeros((4, 2, 4))
    layer1 = {k.replace("_l1", "_l0"): v for k, v in params.items() if "_l1" in k}
    want, _ = reference_gru(zeros_in, np.zeros((1, 2, 4)), layer1, 1, False, True)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-12, atol=1e-14)
    gru.eval()
    out_eval, _ = gru(x)
    want_eval, _ = reference_gru(x.numpy(), np.zeros((2, 2, 4)), params, 2, False, True)
    np.testing.assert_allclose(out_eval.detach().numpy(), want_eval, rtol=1e-12, atol=1e-14)
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        nn.GRU(3, 4, dropout=0.5)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda g: g(lucid.randn(2, 3, 4, 5)), ValueError, "Expected input to be 2D or 3D"),
        (lambda g: g(lucid.randn(2, 3, 5)), ValueError, "Expected 3, got 5"),
        (lambda g: g(lucid.randn(2, 3, 3), lucid.zeros(1, 3, 4)), RuntimeError, r"\(2, 3, 4\)"),
        (lambda g: g(lucid.randn(2, 3, 3), lucid.zeros(2, 4)), RuntimeError, "should also be 3-D"),
        (lambda g: g(lucid.randn(0, 3, 3)), ValueError, "no time steps"),
    ],
)
def test_bad_inputs(make, error, match):
    with pytest.raises(error, match=match):
        make(nn.GRU(3, 4, num_layers=2))


def test_bad_options():
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        nn.GRU(3, 4, dropout=1.5)
    with pytest.raises((TypeError, ValueError), match="hidden_size"):
        nn.GRU(3, 0)


def test_trains_and_state_dict_round_trip():
    lucid.manual_seed(0)
    gru, head = nn.GRU(2, 8, batch_first=True), nn.Linear(8, 1)
    params = list(gru.parameters()) + list(head.parameters())
    opt = lucid.optim.Adam(params, lr=0.05)
    x = lucid.randn(16, 3, 2)
    y = x.sum((1, 2)).unsqueeze(1)  # the sum of the sequence
    losses = []
    for _ in range(25):
        opt.zero_grad()
        out, h = gru(x)
        loss = ((head(h[0]) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    other = nn.GRU(2, 8, batch_first=True)
    other.load_state_dict(gru.state_dict())
    np.testing.assert_array_equal(other(x)[1].detach().numpy(), gru(x)[1].detach().numpy())


def test_compiled_forward_matches_eager():
    lucid.manual_seed(0)
    gru = nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x = lucid.randn(2, 3, 3)
    with lucid.no_grad():
        want_out, want_h = gru(x)
        got_out, got_h = lucid.compile(gru)(x)
    np.testing.assert_allclose(got_out.numpy(), want_out.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_h.numpy(), want_h.numpy(), rtol=1e-5, atol=1e-6)


def test_matches_torch_if_installed():
    torch = pytest.importorskip("torch")
    ours = nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True).double()
    theirs = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True).double()
    theirs.load_state_dict(
        {k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()}
    )
    x = np.random.default_rng(0).standard_normal((2, 5, 3))
    h0 = np.random.default_rng(1).standard_normal((4, 2, 4))
    o, h = ours(lucid.tensor(x, dtype=lucid.float64), lucid.tensor(h0, dtype=lucid.float64))
    to, th = theirs(torch.from_numpy(x), torch.from_numpy(h0))
    np.testing.assert_allclose(o.detach().numpy(), to.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h.detach().numpy(), th.detach().numpy(), rtol=1e-10, atol=1e-12)
