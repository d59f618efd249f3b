"""Parity with torch.nn: the same state_dict loaded into both frameworks gives the same outputs.

Skipped when torch is not installed.
"""

import numpy as np
import pytest

import lucid
import lucid.nn as nn

torch = pytest.importorskip("torch")
tnn = torch.nn

RNG = np.random.default_rng(7)


def _arr(*shape):
    return RNG.standard_normal(shape)


def _pair(a):
    return lucid.tensor(a), torch.from_numpy(np.array(a))


def _torch_state(module):
    return {k: torch.from_numpy(np.array(v._data)) for k, v in module.state_dict().items()}


def _lucid_state(module):
    return {k: lucid.tensor(v.detach().numpy()) for k, v in module.state_dict().items()}


def _close(ours, theirs, atol=1e-9):
    np.testing.assert_allclose(ours._data, theirs.detach().numpy(), atol=atol, rtol=1e-7)


def _sync(ours, theirs):
    """Randomize ours, copy into theirs (strict names), and check torch's names load back."""
    ours.double()
    theirs.double()
    with lucid.no_grad():
        for p in ours.parameters():
            p._data[...] = RNG.standard_normal(p.shape) * 0.5
    theirs.load_state_dict(_torch_state(ours), strict=True)
    result = ours.load_state_dict(_lucid_state(theirs), strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def _compare(ours, theirs, *arrays, train=False):
    _sync(ours, theirs)
    ours.train(train)
    theirs.train(train)
    inputs = [_pair(a) for a in arrays]
    out = ours(*[i[0] for i in inputs])
    ref = theirs(*[i[1] for i in inputs])
    return out, ref


@pytest.mark.parametrize(
    ("ours", "theirs", "shape"),
    [
        (lambda: nn.Linear(4, 3), lambda: tnn.Linear(4, 3), (2, 4)),
        (
            lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
            lambda: tnn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
            (2, 4, 9),
        ),
        (
            lambda: nn.Conv2d(2, 4, (3, 2), padding="same", dilation=2),
            lambda: tnn.Conv2d(2, 4, (3, 2), padding="same", dilation=2),
            (2, 2, 7, 6),
        ),
        (
            lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
            lambda: tnn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
            (1, 2, 5, 5),
        ),
        (lambda: nn.LayerNorm(5), lambda: tnn.LayerNorm(5), (3, 5)),
        (lambda: nn.GroupNorm(2, 4), lambda: tnn.GroupNorm(2, 4), (2, 4, 3)),
        (lambda: nn.MaxPool2d(3, 2, 1), lambda: tnn.MaxPool2d(3, 2, 1), (1, 2, 7, 7)),
        (lambda: nn.AvgPool2d(2), lambda: tnn.AvgPool2d(2), (1, 2, 6, 6)),
        (lambda: nn.AdaptiveAvgPool2d(3), lambda: tnn.AdaptiveAvgPool2d(3), (1, 2, 6, 6)),
        (
            lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True),
            lambda: tnn.MaxPool2d(3, 2, 1, ceil_mode=True),
            (1, 2, 6, 6),
        ),
        (
            lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False),
            lambda: tnn.AvgPool2d(3, 2, 1, count_include_pad=False),
            (1, 2, 6, 5),
        ),
        (lambda: nn.MaxPool1d(2), lambda: tnn.MaxPool1d(2), (2, 3, 7)),
        (lambda: nn.AvgPool1d(3, 1, 1), lambda: tnn.AvgPool1d(3, 1, 1), (2, 3, 7)),
        (lambda: nn.AdaptiveAvgPool1d(3), lambda: tnn.AdaptiveAvgPool1d(3), (2, 3, 7)),
        (lambda: nn.Flatten(), lambda: tnn.Flatten(), (2, 3, 4)),
        (lambda: nn.Softmax(), lambda: tnn.Softmax(), (2, 3, 4)),
        (lambda: nn.LeakyReLU(0.3), lambda: tnn.LeakyReLU(0.3), (3, 4)),
        (lambda: nn.GELU("tanh"), lambda: tnn.GELU("tanh"), (3, 4)),
        (lambda: nn.LogSoftmax(1), lambda: tnn.LogSoftmax(1), (3, 4)),
    ],
)
def test_stateless_and_simple_layers(ours, theirs, shape):
    out, ref = _compare(ours(), theirs(), _arr(*shape))
    _close(out, ref)


def test_rms_norm():
    if not hasattr(tnn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    out, ref = _compare(nn.RMSNorm(4, eps=1e-6), tnn.RMSNorm(4, eps=1e-6), _arr(3, 4))
    _close(out, ref)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_train_step_and_running_stats(momentum):
    ours, theirs = nn.BatchNorm2d(3, momentum=momentum), tnn.BatchNorm2d(3, momentum=momentum)
    x = _arr(4, 3, 2, 2)
    out, ref = _compare(ours, theirs, x, train=True)
    _close(out, ref)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        _close(getattr(ours, name), getattr(theirs, name))
    ours.eval()
    theirs.eval()
    a, b = _pair(_arr(2, 3, 2, 2))
    _close(ours(a), theirs(b))


def test_embedding_with_padding_idx():
    ours, theirs = nn.Embedding(6, 3, padding_idx=1), tnn.Embedding(6, 3, padding_idx=1)
    _sync(ours, theirs)
    idx = np.array([[0, 1, 5], [1, 2, 2]])
    _close(ours(lucid.tensor(idx)), theirs(torch.from_numpy(idx)))


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_with_masks(batch_first):
    ours = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    theirs = tnn.MultiheadAttention(8, 2, batch_first=batch_first)
    _sync(ours, theirs)
    ours.eval()
    theirs.eval()
    q = _arr(3, 2, 8) if not batch_first else _arr(2, 3, 8)
    kv = _arr(4, 2, 8) if not batch_first else _arr(2, 4, 8)
    mask = RNG.random((3, 4)) < 0.3
    mask[:, 0] = False  # keep every row attendable
    kpm = np.array([[False, False, False, True], [False, True, False, False]])
    lq, tq = _pair(q)
    lkv, tkv = _pair(kv)
    for avg in (True, False):
        out, w = ours(
            lq, lkv, lkv, key_padding_mask=lucid.tensor(kpm), attn_mask=lucid.tensor(mask),
            average_attn_weights=avg,
        )  # fmt: skip
        ref, rw = theirs(
            tq, tkv, tkv, key_padding_mask=torch.from_numpy(kpm), attn_mask=torch.from_numpy(mask),
            average_attn_weights=avg,
        )  # fmt: skip
        _close(out, ref)
        _close(w, rw)


def test_multihead_attention_kdim_vdim():
    ours = nn.MultiheadAttention(4, 2, kdim=3, vdim=5, batch_first=True)
    theirs = tnn.MultiheadAttention(4, 2, kdim=3, vdim=5, batch_first=True)
    _sync(ours, theirs)
    q, k, v = _arr(2, 3, 4), _arr(2, 5, 3), _arr(2, 5, 5)
    out, w = ours(*(lucid.tensor(a) for a in (q, k, v)))
    ref, rw = theirs(*(torch.from_numpy(a) for a in (q, k, v)))
    _close(out, ref)
    _close(w, rw)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    kw = {"dropout": 0.0, "activation": activation, "norm_first": norm_first, "batch_first": True}
    ours = nn.TransformerEncoderLayer(8, 2, 16, **kw)
    theirs = tnn.TransformerEncoderLayer(8, 2, 16, **kw)
    _sync(ours, theirs)
    ours.eval()
    theirs.eval()
    x = _arr(2, 4, 8)
    kpm = np.array([[False, False, True, True], [False, False, False, False]])
    _close(ours(lucid.tensor(x)), theirs(torch.from_numpy(x)))
    _close(
        ours(lucid.tensor(x), src_key_padding_mask=lucid.tensor(kpm)),
        theirs(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(kpm)),
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"num_layers": 2, "bidirectional": True, "batch_first": True},
        {"proj_size": 2, "bias": False},
    ],
)
def test_lstm(kw):
    ours, theirs = nn.LSTM(3, 4, **kw), tnn.LSTM(3, 4, **kw)
    _sync(ours, theirs)
    x = _arr(2, 5, 3)
    out, (h, c) = ours(lucid.tensor(x))
    ref, (rh, rc) = theirs(torch.from_numpy(x))
    _close(out, ref)
    _close(h, rh)
    _close(c, rc)


def test_losses():
    x, y = _arr(5, 4), RNG.integers(0, 4, 5)
    w = RNG.uniform(0.5, 2.0, 4)
    pairs = [
        (
            nn.CrossEntropyLoss(weight=lucid.tensor(w), label_smoothing=0.1),
            tnn.CrossEntropyLoss(weight=torch.from_numpy(w), label_smoothing=0.1),
        ),
        (nn.CrossEntropyLoss(ignore_index=2), tnn.CrossEntropyLoss(ignore_index=2)),
    ]
    for ours, theirs in pairs:
        _close(
            ours(lucid.tensor(x), lucid.tensor(y)), theirs(torch.from_numpy(x), torch.from_numpy(y))
        )
    a, b = _arr(3, 4), _arr(3, 4)
    for ours, theirs in [
        (nn.MSELoss(), tnn.MSELoss()),
        (nn.L1Loss(reduction="sum"), tnn.L1Loss(reduction="sum")),
        (nn.SmoothL1Loss(beta=0.5), tnn.SmoothL1Loss(beta=0.5)),
        (nn.HuberLoss(delta=0.5), tnn.HuberLoss(delta=0.5)),
    ]:
        _close(
            ours(lucid.tensor(a), lucid.tensor(b)), theirs(torch.from_numpy(a), torch.from_numpy(b))
        )
    p = RNG.uniform(0.05, 0.95, (3, 4))
    t = RNG.integers(0, 2, (3, 4)).astype(np.float64)
    pos = RNG.uniform(0.5, 2.0, 4)
    _close(
        nn.BCELoss()(lucid.tensor(p), lucid.tensor(t)),
        tnn.BCELoss()(torch.from_numpy(p), torch.from_numpy(t)),
    )
    _close(
        nn.BCEWithLogitsLoss(pos_weight=lucid.tensor(pos))(lucid.tensor(a), lucid.tensor(t)),
        tnn.BCEWithLogitsLoss(pos_weight=torch.from_numpy(pos))(
            torch.from_numpy(a), torch.from_numpy(t)
        ),
    )


def test_default_init_statistics_match_torch_bounds():
    # Same distributions (not the same numbers): the largest |w| of each is near the same bound.
    ours, theirs = nn.Conv2d(8, 16, 3), tnn.Conv2d(8, 16, 3)
    ob = np.abs(ours.weight._data).max()
    tb = theirs.weight.detach().abs().max().item()
    assert ob == pytest.approx(tb, rel=0.05)


def test_repr_matches_torch():
    # Norm layers are left out: newer torch versions add "bias=" to their reprs.
    def build(ns):
        return ns.Sequential(
            ns.Conv2d(1, 2, 3, stride=2, padding=1, bias=False),
            ns.Conv1d(2, 3, 3),
            ns.ReLU(),
            ns.MaxPool2d(2),
            ns.AvgPool2d(2),
            ns.AdaptiveAvgPool2d(1),
            ns.Flatten(),
            ns.Linear(2, 3),
            ns.Dropout(0.25),
            ns.GELU(),
            ns.LeakyReLU(),
            ns.Softmax(dim=1),
            ns.Embedding(5, 3, padding_idx=4),
            ns.LSTM(3, 4, num_layers=2, bidirectional=True),
            ns.CrossEntropyLoss(),
        )

    assert repr(build(nn)) == repr(build(tnn))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_layer(norm_first):
    kw = {"dropout": 0.0, "norm_first": norm_first, "batch_first": True}
    ours = nn.TransformerDecoderLayer(8, 2, 16, **kw)
    theirs = tnn.TransformerDecoderLayer(8, 2, 16, **kw)
    _sync(ours, theirs)
    tgt, mem = _arr(2, 3, 8), _arr(2, 5, 8)
    mkpm = np.array([[False, False, False, True, True], [False] * 5])
    causal = nn.Transformer.generate_square_subsequent_mask(3).double()
    ref_causal = tnn.Transformer.generate_square_subsequent_mask(3).double()
    np.testing.assert_array_equal(causal._data, ref_causal.numpy())
    out = ours(
        lucid.tensor(tgt), lucid.tensor(mem), tgt_mask=causal,
        memory_key_padding_mask=lucid.tensor(mkpm),
    )  # fmt: skip
    ref = theirs(
        torch.from_numpy(tgt), torch.from_numpy(mem), tgt_mask=ref_causal,
        memory_key_padding_mask=torch.from_numpy(mkpm),
    )  # fmt: skip
    _close(out, ref)


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_full_model_values_and_gradients(batch_first):
    kw = {"num_encoder_layers": 2, "num_decoder_layers": 1, "dim_feedforward": 16}
    ours = nn.Transformer(8, 2, dropout=0.0, batch_first=batch_first, **kw)
    theirs = tnn.Transformer(8, 2, dropout=0.0, batch_first=batch_first, **kw)
    _sync(ours, theirs)
    src, tgt = (_arr(2, 4, 8), _arr(2, 3, 8)) if batch_first else (_arr(4, 2, 8), _arr(3, 2, 8))
    (s, ts), (t, tt) = _pair(src), _pair(tgt)
    s.requires_grad_(True)
    ts.requires_grad_(True)
    mask = nn.Transformer.generate_square_subsequent_mask(3, dtype=lucid.float64)
    out = ours(s, t, tgt_mask=mask)
    ref = theirs(ts, tt, tgt_mask=torch.from_numpy(mask._data))
    _close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    _close(s.grad, ts.grad, atol=1e-8)
    for (name, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        np.testing.assert_allclose(p.grad._data, tp.grad.numpy(), atol=1e-8, err_msg=name)


@pytest.mark.parametrize(
    "kw",
    [{}, {"num_layers": 2, "bidirectional": True, "batch_first": True, "nonlinearity": "relu"},
     {"bias": False}],
)  # fmt: skip
def test_rnn(kw):
    ours, theirs = nn.RNN(3, 4, **kw), tnn.RNN(3, 4, **kw)
    _sync(ours, theirs)
    x = _arr(2, 5, 3)
    h0 = _arr(ours.num_layers * (2 if ours.bidirectional else 1), 2 if ours.batch_first else 5, 4)
    out, h = ours(lucid.tensor(x), lucid.tensor(h0))
    ref, rh = theirs(torch.from_numpy(x), torch.from_numpy(h0))
    _close(out, ref)
    _close(h, rh)


@pytest.mark.parametrize("cell", ["RNNCell", "GRUCell", "LSTMCell"])
def test_cells(cell):
    ours, theirs = getattr(nn, cell)(3, 4), getattr(tnn, cell)(3, 4)
    _sync(ours, theirs)
    x, h = _arr(2, 3), _arr(2, 4)
    if cell == "LSTMCell":
        state, ref_state = (
            (lucid.tensor(h), lucid.tensor(2 * h)),
            tuple(torch.from_numpy(a) for a in (h, 2 * h)),
        )
    else:
        state, ref_state = lucid.tensor(h), torch.from_numpy(h)
    for args, ref_args in [
        ((lucid.tensor(x), state), (torch.from_numpy(x), ref_state)),
        ((lucid.tensor(x),), (torch.from_numpy(x),)),
        ((lucid.tensor(x[0]),), (torch.from_numpy(x[0]),)),
    ]:
        out, ref = ours(*args), theirs(*ref_args)
        for o, r in zip(
            out if isinstance(out, tuple) else (out,),
            ref if isinstance(ref, tuple) else (ref,),
            strict=True,
        ):
            _close(o, r)


@pytest.mark.parametrize(
    ("name", "args", "shape"),
    [
        ("ReflectionPad1d", (2,), (2, 3, 6)),
        ("ReflectionPad2d", ((1, 0, 2, 1),), (2, 3, 4, 5)),
        ("ReplicationPad1d", ((1, 3),), (2, 3, 6)),
        ("ReplicationPad2d", (2,), (3, 4, 5)),
        ("ReplicationPad3d", (1,), (1, 2, 3, 4, 5)),
        ("ZeroPad2d", ((1, 2, 0, 3),), (2, 3, 4, 5)),
        ("ConstantPad1d", (2, 1.5), (2, 3, 6)),
        ("ConstantPad2d", (1, 3.5), (2, 3, 4, 5)),
        ("CircularPad2d", (1,), (2, 3, 4, 5)),
        ("PixelShuffle", (2,), (2, 8, 3, 5)),
        ("PixelUnshuffle", (2,), (2, 2, 6, 4)),
    ],
)
def test_padding_and_pixel_shuffle(name, args, shape):
    ours, theirs = getattr(nn, name)(*args), getattr(tnn, name)(*args)
    assert repr(ours) == repr(theirs)
    x = _arr(*shape)
    _close(ours(lucid.tensor(x)), theirs(torch.from_numpy(x)))


@pytest.mark.parametrize("cls", ["InstanceNorm1d", "InstanceNorm2d"])
@pytest.mark.parametrize("kw", [{}, {"affine": True, "track_running_stats": True}])
def test_instance_norm(cls, kw):
    ours, theirs = getattr(nn, cls)(3, **kw), getattr(tnn, cls)(3, **kw)
    if kw:
        _sync(ours, theirs)
    ours.double()
    theirs.double()
    shape = (2, 3, 7) if cls == "InstanceNorm1d" else (2, 3, 4, 5)
    for x in (_arr(*shape), _arr(*shape[1:])):
        _close(ours(lucid.tensor(x)), theirs(torch.from_numpy(x)))
    if kw:
        _close(ours.running_var, theirs.running_var)
        ours.eval()
        theirs.eval()
        x = _arr(*shape)
        _close(ours(lucid.tensor(x)), theirs(torch.from_numpy(x)))
