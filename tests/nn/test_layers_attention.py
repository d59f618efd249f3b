"""MultiheadAttention, TransformerEncoderLayer and LSTM against numpy implementations."""

import math

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.testing import assert_close, gradcheck

RNG = np.random.default_rng(2)


def _x(*shape, requires_grad=False):
    return lucid.tensor(
        RNG.standard_normal(shape), dtype=lucid.float64, requires_grad=requires_grad
    )


def _np(t):
    return t._data


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mha_ref(mha, q, k, v, mask=None):
    """Batch-first numpy multi-head attention with torch's packed projection layout."""
    e, h = mha.embed_dim, mha.num_heads
    hd = e // h
    if mha.in_proj_weight is not None:
        w = _np(mha.in_proj_weight)
        wq, wk, wv = w[:e], w[e : 2 * e], w[2 * e :]
    else:
        wq, wk, wv = (_np(p) for p in (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight))
    b = _np(mha.in_proj_bias) if mha.in_proj_bias is not None else np.zeros(3 * e)
    n, lq, s = q.shape[0], q.shape[1], k.shape[1]
    qp = (q @ wq.T + b[:e]).reshape(n, lq, h, hd).transpose(0, 2, 1, 3)
    kp = (k @ wk.T + b[e : 2 * e]).reshape(n, s, h, hd).transpose(0, 2, 1, 3)
    vp = (v @ wv.T + b[2 * e :]).reshape(n, s, h, hd).transpose(0, 2, 1, 3)
    scores = qp @ kp.transpose(0, 1, 3, 2) / math.sqrt(hd)
    if mask is not None:
        scores = scores + mask
    attn = _softmax(scores)
    out = (attn @ vp).transpose(0, 2, 1, 3).reshape(n, lq, e)
    out = out @ _np(mha.out_proj.weight).T + _np(mha.out_proj.bias)
    return out, attn


def _randomize(module):
    # Non-zero biases so the reference checks their placement too.
    with lucid.no_grad():
        for p in module.parameters():
            p._data[...] = RNG.standard_normal(p.shape) * 0.5


def test_mha_parameter_names_and_shapes():
    mha = nn.MultiheadAttention(8, 2)
    assert [(n, p.shape) for n, p in mha.named_parameters()] == [
        ("in_proj_weight", (24, 8)),
        ("in_proj_bias", (24,)),
        ("out_proj.weight", (8, 8)),
        ("out_proj.bias", (8,)),
    ]
    kv = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, bias=False)
    assert [(n, p.shape) for n, p in kv.named_parameters()] == [
        ("q_proj_weight", (8, 8)),
        ("k_proj_weight", (8, 3)),
        ("v_proj_weight", (8, 5)),
        ("out_proj.weight", (8, 8)),
    ]
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(10, 3)


def test_mha_self_attention_sequence_first():
    mha = nn.MultiheadAttention(6, 3).double()
    _randomize(mha)
    x = _x(4, 2, 6)  # (L, N, E)
    out, weights = mha(x, x, x)
    xb = _np(x).transpose(1, 0, 2)
    ref, attn = _mha_ref(mha, xb, xb, xb)
    assert_close(out, ref.transpose(1, 0, 2), atol=1e-10)
    assert_close(weights, attn.mean(1), atol=1e-12)


def test_mha_cross_attention_batch_first_with_kdim_vdim_and_per_head_weights():
    mha = nn.MultiheadAttention(4, 2, kdim=3, vdim=5, batch_first=True).double()
    _randomize(mha)
    q, k, v = _x(2, 3, 4), _x(2, 5, 3), _x(2, 5, 5)
    out, weights = mha(q, k, v, average_attn_weights=False)
    ref, attn = _mha_ref(mha, _np(q), _np(k), _np(v))
    assert_close(out, ref, atol=1e-10)
    assert weights.shape == (2, 2, 3, 5)
    assert_close(weights, attn, atol=1e-12)


def test_mha_boolean_masks_block_positions():
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()
    _randomize(mha)
    x = _x(2, 3, 4)
    attn_mask = np.array([[False, True, False], [False, False, True], [True, False, False]])
    kpm = np.array([[False, False, True], [False, False, False]])
    out, weights = mha(
        x, x, x, attn_mask=lucid.tensor(attn_mask), key_padding_mask=lucid.tensor(kpm)
    )
    mask = (
        np.where(attn_mask, -np.inf, 0.0)[None, None]
        + np.where(kpm, -np.inf, 0.0)[:, None, None, :]
    )
    ref, attn = _mha_ref(mha, _np(x), _np(x), _np(x), mask)
    assert_close(out, ref, atol=1e-10)
    assert_close(weights, attn.mean(1), atol=1e-12)
    assert not _np(weights)[0, :, 2].any()  # padded key gets no weight


def test_mha_float_3d_mask_and_causal_flag():
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()
    _randomize(mha)
    x = _x(2, 3, 4)
    float_mask = RNG.standard_normal((4, 3, 3))  # (N * H, L, S)
    out, _ = mha(x, x, x, attn_mask=lucid.tensor(float_mask))
    ref, _ = _mha_ref(mha, _np(x), _np(x), _np(x), float_mask.reshape(2, 2, 3, 3))
    assert_close(out, ref, atol=1e-10)
    causal, w = mha(x, x, x, is_causal=True)
    tri = np.where(np.triu(np.ones((3, 3), bool), 1), -np.inf, 0.0)
    ref, _ = _mha_ref(mha, _np(x), _np(x), _np(x), tri)
    assert_close(causal, ref, atol=1e-10)
    assert not np.triu(_np(w)[0], 1).any()
    fused, _ = mha(x, x, x, is_causal=True, need_weights=False)
    assert_close(fused, ref, atol=1e-10)


def test_mha_without_weights_matches_and_unbatched_input():
    mha = nn.MultiheadAttention(4, 2).double()
    _randomize(mha)
    x = _x(3, 1, 4)
    with_w, _ = mha(x, x, x)
    without, none = mha(x, x, x, need_weights=False)
    assert none is None
    assert_close(without, _np(with_w), atol=1e-10)
    flat = lucid.tensor(_np(x)[:, 0])
    out, w = mha(flat, flat, flat)
    assert out.shape == (3, 4) and w.shape == (3, 3)
    assert_close(out, _np(with_w)[:, 0], atol=1e-10)


def test_mha_gradients():
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()
    x = _x(1, 2, 4)
    gradcheck(lambda *_: mha(x, x, x)[0], *mha.parameters())


def _layer_norm(x, w, b, eps=1e-5):
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def _encoder_ref(layer, x, act, mask=None):
    def sa(y):
        return _mha_ref(layer.self_attn, y, y, y, mask)[0]

    def ff(y):
        hidden = act(y @ _np(layer.linear1.weight).T + _np(layer.linear1.bias))
        return hidden @ _np(layer.linear2.weight).T + _np(layer.linear2.bias)

    def n1(y):
        return _layer_norm(y, _np(layer.norm1.weight), _np(layer.norm1.bias))

    def n2(y):
        return _layer_norm(y, _np(layer.norm2.weight), _np(layer.norm2.bias))

    if layer.norm_first:
        x = x + sa(n1(x))
        return x + ff(n2(x))
    x = n1(x + sa(x))
    return n2(x + ff(x))


_erf = np.vectorize(math.erf)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    layer = nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.1, activation=activation, batch_first=True, norm_first=norm_first
    ).double()
    _randomize(layer)
    layer.eval()  # dropout off
    x = _x(2, 3, 8)
    act = (
        (lambda v: np.maximum(v, 0))
        if activation == "relu"
        else (lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))))
    )
    assert_close(layer(x), _encoder_ref(layer, _np(x), act), atol=1e-9)
    kpm = np.array([[False, False, True], [False, False, False]])
    mask = np.where(kpm, -np.inf, 0.0)[:, None, None, :]
    assert_close(
        layer(x, src_key_padding_mask=lucid.tensor(kpm)),
        _encoder_ref(layer, _np(x), act, mask),
        atol=1e-9,
    )


def test_transformer_encoder_layer_names_and_sequence_first():
    layer = nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0).double()
    names = [n for n, _ in layer.named_parameters()]
    assert names[:4] == [
        "self_attn.in_proj_weight",
        "self_attn.in_proj_bias",
        "self_attn.out_proj.weight",
        "self_attn.out_proj.bias",
    ]
    assert names[4:] == [
        "linear1.weight",
        "linear1.bias",
        "linear2.weight",
        "linear2.bias",
        "norm1.weight",
        "norm1.bias",
        "norm2.weight",
        "norm2.bias",
    ]
    x = _x(3, 2, 4)  # (S, N, E)
    ref = _encoder_ref(layer, _np(x).transpose(1, 0, 2), lambda v: np.maximum(v, 0))
    assert_close(layer(x), ref.transpose(1, 0, 2), atol=1e-9)


def test_transformer_encoder_stacks_independent_copies():
    layer = nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(4)).double()
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight
    x = _x(1, 3, 4)
    expected = enc.norm(enc.layers[1](enc.layers[0](x)))
    assert_close(enc(x), _np(expected))
    assert len(list(enc.parameters())) == 2 * 12 + 2


# --- LSTM
def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def _lstm_ref(lstm, x, h0=None, c0=None):
    """Time-major numpy LSTM with torch's gate order (i, f, g, o) and parameter names."""
    dirs = 2 if lstm.bidirectional else 1
    hs = lstm.proj_size or lstm.hidden_size
    t_len, n = x.shape[:2]
    if h0 is None:
        h0 = np.zeros((lstm.num_layers * dirs, n, hs))
        c0 = np.zeros((lstm.num_layers * dirs, n, lstm.hidden_size))
    hn, cn = [], []
    inp = x
    for layer in range(lstm.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            p = {k: _np(v) for k, v in lstm.named_parameters()}
            h, c = h0[layer * dirs + d], c0[layer * dirs + d]
            out = [None] * t_len
            steps = range(t_len - 1, -1, -1) if d else range(t_len)
            for t in steps:
                gates = inp[t] @ p["weight_ih" + sfx].T + h @ p["weight_hh" + sfx].T
                if lstm.bias:
                    gates = gates + p["bias_ih" + sfx] + p["bias_hh" + sfx]
                i, f, g, o = np.split(gates, 4, axis=-1)
                c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
                h = _sigmoid(o) * np.tanh(c)
                if lstm.proj_size:
                    h = h @ p["weight_hr" + sfx].T
                out[t] = h
            outs.append(np.stack(out))
            hn.append(h)
            cn.append(c)
        inp = np.concatenate(outs, -1)
    return inp, np.stack(hn), np.stack(cn)


def test_lstm_parameter_names_follow_torch():
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    names = [(n, p.shape) for n, p in lstm.named_parameters()]
    assert names[:8] == [
        ("weight_ih_l0", (16, 3)),
        ("weight_hh_l0", (16, 4)),
        ("bias_ih_l0", (16,)),
        ("bias_hh_l0", (16,)),
        ("weight_ih_l0_reverse", (16, 3)),
        ("weight_hh_l0_reverse", (16, 4)),
        ("bias_ih_l0_reverse", (16,)),
        ("bias_hh_l0_reverse", (16,)),
    ]
    assert names[8] == ("weight_ih_l1", (16, 8))
    assert repr(lstm) == "LSTM(3, 4, num_layers=2, bidirectional=True)"


def test_lstm_single_layer_with_initial_state():
    lstm = nn.LSTM(3, 4).double()
    x, h0, c0 = _x(5, 2, 3), _x(1, 2, 4), _x(1, 2, 4)
    out, (hn, cn) = lstm(x, (h0, c0))
    ref, rh, rc = _lstm_ref(lstm, _np(x), _np(h0), _np(c0))
    assert_close(out, ref, atol=1e-12)
    assert_close(hn, rh, atol=1e-12)
    assert_close(cn, rc, atol=1e-12)


def test_lstm_stacked_bidirectional_batch_first():
    lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True).double()
    x = _x(2, 5, 3)  # (N, T, C)
    out, (hn, cn) = lstm(x)
    ref, rh, rc = _lstm_ref(lstm, _np(x).transpose(1, 0, 2))
    assert out.shape == (2, 5, 8)
    assert_close(out, ref.transpose(1, 0, 2), atol=1e-12)
    assert_close(hn, rh, atol=1e-12)
    assert_close(cn, rc, atol=1e-12)


def test_lstm_projection_no_bias_and_unbatched():
    lstm = nn.LSTM(3, 4, bias=False, proj_size=2).double()
    x = _x(4, 3)  # unbatched (T, C)
    out, (hn, cn) = lstm(x)
    ref, rh, rc = _lstm_ref(lstm, _np(x)[:, None])
    assert out.shape == (4, 2) and hn.shape == (1, 2) and cn.shape == (1, 4)
    assert_close(out, ref[:, 0], atol=1e-12)
    assert_close(hn, rh[:, 0], atol=1e-12)


def test_lstm_validation():
    lstm = nn.LSTM(3, 4)
    with pytest.raises(ValueError, match="input_size"):
        lstm(lucid.tensor(np.zeros((2, 1, 5), np.float32)))
    with pytest.raises(ValueError, match="h_0"):
        lstm(
            lucid.tensor(np.zeros((2, 1, 3), np.float32)),
            (lucid.tensor(np.zeros((2, 1, 4), np.float32)),) * 2,
        )
    with pytest.raises(ValueError, match="dropout"):
        nn.LSTM(3, 4, dropout=2.0)


def test_lstm_gradients():
    lstm = nn.LSTM(2, 2, num_layers=2).double()
    x = _x(3, 1, 2)
    gradcheck(lambda *_: lstm(x)[0], *lstm.parameters())


def test_lstm_unbatched_matches_batch_of_one():
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True).double()
    x = _x(4, 3)
    out, (h, c) = lstm(x)
    ref, rh, rc = _lstm_ref(lstm, _np(x)[:, None])
    assert out.shape == (4, 8) and h.shape == (4, 4)
    assert_close(out, ref[:, 0], atol=1e-12)
    assert_close(c, rc[:, 0], atol=1e-12)
    out2, _ = lstm(x, (h, c))
    ref2, _, _ = _lstm_ref(lstm, _np(x)[:, None], rh, rc)
    assert_close(out2, ref2[:, 0], atol=1e-12)


def test_transformer_causal_and_padding_masks_hide_what_they_should():
    lucid.manual_seed(0)
    model = nn.Transformer(8, 2, 1, 2, 16, dropout=0.0, batch_first=True).double()
    rng = np.random.default_rng(3)
    src, tgt = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 4, 8))
    mask = nn.Transformer.generate_square_subsequent_mask(4, dtype=lucid.float64)
    kpm = lucid.tensor(np.array([[False, False, False, True, True]] * 2))

    def run(s, t):
        out = model(
            lucid.tensor(s), lucid.tensor(t), tgt_mask=mask,
            src_key_padding_mask=kpm, memory_key_padding_mask=kpm,
        )  # fmt: skip
        return out._data

    base = run(src, tgt)
    later_tgt, padded_src = tgt.copy(), src.copy()
    later_tgt[:, 2:] += 1.0
    padded_src[:, 3:] += 1.0
    changed = run(src, later_tgt)
    np.testing.assert_allclose(changed[:, :2], base[:, :2], atol=1e-12)
    assert not np.allclose(changed[:, 2:], base[:, 2:])
    np.testing.assert_allclose(run(padded_src, tgt), base, atol=1e-12)
    # Every decoder layer has both attentions; every matrix is Xavier-initialised (non-zero).
    names = {n for n, _ in model.named_parameters()}
    assert "decoder.layers.1.multihead_attn.in_proj_weight" in names
    assert "decoder.norm.weight" in names and "encoder.norm.bias" in names
