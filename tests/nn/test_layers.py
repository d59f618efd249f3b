"""Layers against independent numpy computations, and parameter gradients by finite differences."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid.testing import assert_close, gradcheck

RNG = np.random.default_rng(0)


def _x(*shape, dtype=lucid.float64, requires_grad=False):
    return lucid.tensor(RNG.standard_normal(shape), dtype=dtype, requires_grad=requires_grad)


def _np(t):
    return t._data


def _check_param_grads(model, *inputs, reduce=None):
    """gradcheck of every parameter of a float64 model (inputs fixed)."""
    model.double()
    params = list(model.parameters())

    def fn(*_ps):
        out = model(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        return out if reduce is None else reduce(out)

    gradcheck(fn, *params)


# --- Linear / Identity / Flatten
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_numpy(bias):
    layer = nn.Linear(4, 3, bias=bias).double()
    x = _x(2, 5, 4)
    expected = _np(x) @ _np(layer.weight).T + (_np(layer.bias) if bias else 0)
    assert_close(layer(x), expected)
    assert layer.weight.shape == (3, 4)
    assert repr(layer) == f"Linear(in_features=4, out_features=3, bias={bias})"


@given(lead=st.lists(st.integers(1, 3), max_size=3), features=st.integers(1, 4))
def test_linear_and_layer_norm_over_any_leading_dims(lead, features):
    layer = nn.Linear(features, 2).double()
    norm = nn.LayerNorm(features).double()
    x = _x(*lead, features)
    xd = _np(x)
    assert_close(layer(x), xd @ _np(layer.weight).T + _np(layer.bias))
    centred = xd - xd.mean(-1, keepdims=True)
    assert_close(norm(x), centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5))


def test_linear_gradients():
    _check_param_grads(nn.Linear(3, 2), _x(4, 3))


def test_linear_validation_and_dtype():
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(-1, 2)
    layer = nn.Linear(2, 2, dtype=lucid.float64)
    assert layer.weight.dtype == lucid.float64
    with pytest.raises(ValueError, match="unknown device"):
        nn.Linear(2, 2, device="tpu")


def test_identity_and_flatten():
    x = _x(2, 3, 4, 5)
    assert nn.Identity(54, foo=1)(x) is x
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 2)(x).shape == (24, 5)
    assert nn.Flatten(-2)(x).shape == (2, 3, 20)
    assert_close(nn.Flatten()(x), _np(x).reshape(2, 60))
    assert nn.Unflatten(1, (3, 20))(nn.Flatten()(x)).shape == (2, 3, 20)
    with pytest.raises(ValueError, match="start_dim"):
        nn.Flatten(2, 1)(x)


# --- convolution
def _conv2d_ref(x, w, b, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    oc, cpg, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    oh = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, oc, oh, ow))
    opg = oc // groups
    for o in range(oc):
        g = o // opg
        for i in range(oh):
            for j in range(ow):
                patch = x[
                    :,
                    g * cpg : (g + 1) * cpg,
                    i * stride[0] : i * stride[0] + dilation[0] * (kh - 1) + 1 : dilation[0],
                    j * stride[1] : j * stride[1] + dilation[1] * (kw - 1) + 1 : dilation[1],
                ]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    if b is not None:
        out += b[None, :, None, None]
    return out


@given(
    stride=st.integers(1, 2),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    bias=st.booleans(),
)
def test_conv2d_matches_numpy(stride, padding, dilation, groups, bias):
    conv = nn.Conv2d(4, 6, (3, 2), stride, padding, dilation, groups, bias=bias).double()
    x = _x(2, 4, 7, 6)
    ref = _conv2d_ref(
        _np(x),
        _np(conv.weight),
        _np(conv.bias) if bias else None,
        (stride,) * 2,
        (padding,) * 2,
        (dilation,) * 2,
        groups,
    )
    assert_close(conv(x), ref, atol=1e-10)
    assert conv.weight.shape == (6, 4 // groups, 3, 2)


def test_conv1d_matches_numpy_and_same_padding():
    conv = nn.Conv1d(2, 3, 3, padding="same", dilation=2).double()
    x = _x(2, 2, 9)
    ref = _conv2d_ref(
        _np(x)[:, :, None, :], _np(conv.weight)[:, :, None, :], _np(conv.bias), (1, 1), (0, 2),
        (1, 2), 1,
    )[:, :, 0, :]  # fmt: skip
    assert_close(conv(x), ref, atol=1e-10)
    assert conv(x).shape == (2, 3, 9)


def test_conv_gradients():
    _check_param_grads(nn.Conv2d(2, 2, 2, stride=1, padding=1, groups=2), _x(1, 2, 3, 3))
    _check_param_grads(nn.Conv1d(2, 2, 2, stride=2), _x(2, 2, 5))


def test_conv_validation_and_repr():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="strided"):
        nn.Conv2d(2, 2, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode"):
        nn.Conv2d(2, 2, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="4D"):
        nn.Conv2d(2, 2, 3)(_x(2, 5, dtype=lucid.float32))
    assert repr(nn.Conv2d(1, 2, 3, stride=2, padding=1, bias=False)) == (
        "Conv2d(1, 2, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)"
    )


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv_padding_modes(mode):
    np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    conv = nn.Conv2d(1, 2, 3, padding=1, padding_mode=mode).double()
    x = _x(1, 1, 4, 5)
    padded = np.pad(_np(x), ((0, 0), (0, 0), (1, 1), (1, 1)), mode=np_mode)
    ref = _conv2d_ref(padded, _np(conv.weight), _np(conv.bias), (1, 1), (0, 0), (1, 1), 1)
    assert_close(conv(x), ref, atol=1e-10)


# --- pooling
def _pool_ref(x, k, s, p, reduce, pad_value):
    x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=pad_value)
    oh = (x.shape[2] - k) // s + 1
    ow = (x.shape[3] - k) // s + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = reduce(x[:, :, i * s : i * s + k, j * s : j * s + k], axis=(2, 3))
    return out


@pytest.mark.parametrize(("k", "s", "p"), [(2, None, 0), (3, 2, 1), (2, 1, 1)])
def test_max_and_avg_pool2d(k, s, p):
    x = _x(2, 3, 6, 5)
    ref_max = _pool_ref(_np(x), k, s or k, p, np.max, -np.inf)
    assert_close(nn.MaxPool2d(k, s, p)(x), ref_max)
    ref_avg = _pool_ref(_np(x), k, s or k, p, np.mean, 0.0)
    assert_close(nn.AvgPool2d(k, s, p)(x), ref_avg, atol=1e-12)


def test_adaptive_avg_pool2d():
    x = _x(2, 3, 6, 4)
    assert_close(nn.AdaptiveAvgPool2d(1)(x), _np(x).mean(axis=(2, 3), keepdims=True))
    assert_close(
        nn.AdaptiveAvgPool2d((3, 2))(x), _np(x).reshape(2, 3, 3, 2, 2, 2).mean(axis=(3, 5))
    )


def test_pool_options_ceil_mode_count_include_pad_and_indices():
    x = _x(1, 2, 5, 5)
    xd = _np(x)
    padded = np.pad(xd, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    assert_close(nn.MaxPool2d(2, ceil_mode=True)(x), _pool_ref(padded, 2, 2, 0, np.max, -np.inf))
    sums = _pool_ref(xd, 3, 2, 1, np.sum, 0.0)
    counts = _pool_ref(np.ones_like(xd), 3, 2, 1, np.sum, 0.0)
    assert_close(nn.AvgPool2d(3, 2, 1, count_include_pad=False)(x), sums / counts, atol=1e-12)
    assert_close(nn.AvgPool2d(3, 2, 1, divisor_override=2)(x), sums / 2, atol=1e-12)
    values, indices = nn.MaxPool2d(2, return_indices=True)(x)
    flat = xd.reshape(1, 2, 25)
    np.testing.assert_array_equal(np.take_along_axis(flat, _np(indices).reshape(1, 2, -1), 2),
                                  _np(values).reshape(1, 2, -1))  # fmt: skip


def test_pool1d_and_adaptive_pool1d():
    x = _x(2, 3, 6)
    xd = _np(x)
    assert_close(nn.MaxPool1d(2)(x), xd.reshape(2, 3, 3, 2).max(-1))
    padded = np.pad(xd, ((0, 0), (0, 0), (1, 1)))
    windows = np.stack([padded[..., i : i + 3] for i in range(6)], axis=2)
    assert_close(nn.AvgPool1d(3, stride=1, padding=1)(x), windows.sum(-1) / 3, atol=1e-12)
    assert_close(nn.AdaptiveAvgPool1d(2)(x), xd.reshape(2, 3, 2, 3).mean(-1))


# --- normalization
def _bn_ref(x, w, b, eps, axes):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    shape = [1] * x.ndim
    shape[1] = -1
    return (x - mean) / np.sqrt(var + eps) * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize(
    ("cls", "shape", "axes"),
    [
        (nn.BatchNorm1d, (6, 3), (0,)),
        (nn.BatchNorm1d, (4, 3, 5), (0, 2)),
        (nn.BatchNorm2d, (4, 3, 2, 2), (0, 2, 3)),
    ],
)
def test_batchnorm_train_then_eval(cls, shape, axes):
    bn = cls(3, momentum=0.2).double()
    with lucid.no_grad():
        bn.weight._data[:] = [1.0, 2.0, 0.5]
        bn.bias._data[:] = [0.0, -1.0, 1.0]
    x = _x(*shape)
    xd = _np(x)
    assert_close(bn(x), _bn_ref(xd, _np(bn.weight), _np(bn.bias), 1e-5, axes))
    n = xd.size / 3
    mean = xd.mean(axis=axes)
    unbiased = xd.var(axis=axes) * n / (n - 1)
    assert_close(bn.running_mean, 0.2 * mean)
    assert_close(bn.running_var, 0.8 + 0.2 * unbiased)
    assert bn.num_batches_tracked.item() == 1
    bn.eval()
    y = _x(*shape)
    b_shape = [1] * len(shape)
    b_shape[1] = -1
    rm, rv = _np(bn.running_mean).reshape(b_shape), _np(bn.running_var).reshape(b_shape)
    expected = (_np(y) - rm) / np.sqrt(rv + 1e-5) * _np(bn.weight).reshape(b_shape)
    assert_close(bn(y), expected + _np(bn.bias).reshape(b_shape))
    # Eval leaves the statistics alone.
    assert_close(bn.running_mean, 0.2 * mean)
    assert bn.num_batches_tracked.item() == 1


def test_batchnorm_cumulative_average_and_no_tracking():
    bn = nn.BatchNorm1d(2, momentum=None).double()
    a, b = _x(5, 2), _x(7, 2)
    bn(a)
    bn(b)
    assert_close(bn.running_mean, (_np(a).mean(0) + _np(b).mean(0)) / 2)
    assert bn.num_batches_tracked.item() == 2
    free = nn.BatchNorm1d(2, track_running_stats=False, affine=False).double()
    assert free.running_mean is None and list(free.state_dict()) == []
    free.eval()  # no running statistics: eval still normalizes with batch statistics
    assert_close(free(a), (_np(a) - _np(a).mean(0)) / np.sqrt(_np(a).var(0) + 1e-5))


def test_batchnorm_state_dict_and_input_check():
    bn = nn.BatchNorm2d(3)
    assert list(bn.state_dict()) == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
    with pytest.raises(ValueError, match="expected 4D input"):
        bn(_x(2, 3, dtype=lucid.float32))


def test_batchnorm_gradients():
    _check_param_grads(nn.BatchNorm2d(2), _x(3, 2, 2, 1))


def test_layer_norm_rms_norm_group_norm():
    x = _x(2, 3, 4)
    ln = nn.LayerNorm(4).double()
    with lucid.no_grad():
        ln.weight._data[:] = RNG.standard_normal(4)
        ln.bias._data[:] = RNG.standard_normal(4)
    xd = _np(x)
    norm = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    assert_close(ln(x), norm * _np(ln.weight) + _np(ln.bias))
    ln2 = nn.LayerNorm((3, 4), elementwise_affine=False).double()
    m, v = xd.mean((1, 2), keepdims=True), xd.var((1, 2), keepdims=True)
    assert_close(ln2(x), (xd - m) / np.sqrt(v + 1e-5))
    assert list(ln2.parameters()) == []

    rms = nn.RMSNorm(4, eps=1e-6).double()
    with lucid.no_grad():
        rms.weight._data[:] = [1.0, 2.0, 3.0, 4.0]
    ref = xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6) * np.array([1, 2, 3, 4.0])
    assert_close(rms(x), ref)

    gn = nn.GroupNorm(2, 4).double()
    y = _x(2, 4, 3)
    grouped = _np(y).reshape(2, 2, 6)
    ref = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(
        grouped.var(-1, keepdims=True) + 1e-5
    )
    assert_close(gn(y), ref.reshape(2, 4, 3))
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


def test_norm_gradients():
    _check_param_grads(nn.LayerNorm(3), _x(2, 3))
    _check_param_grads(nn.RMSNorm(3), _x(2, 3))
    _check_param_grads(nn.GroupNorm(2, 4), _x(2, 4, 2))


# --- embedding
def test_embedding_lookup_and_padding_idx():
    emb = nn.Embedding(5, 3, padding_idx=-1).double()
    assert emb.padding_idx == 4
    assert not _np(emb.weight)[4].any()
    idx = lucid.tensor([[0, 4, 2], [4, 4, 1]])
    out = emb(idx)
    assert_close(out, _np(emb.weight)[_np(idx)])
    (out * _x(2, 3, 3)).sum().backward()
    grad = _np(emb.weight.grad)
    assert not grad[4].any()  # the padding row never receives gradient
    assert not grad[3].any()  # unused row
    assert grad[0].any() and grad[2].any()
    assert repr(emb) == "Embedding(5, 3, padding_idx=4)"
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(5, 3, padding_idx=5)


def test_embedding_from_pretrained():
    weights = lucid.tensor([[1.0, 2.0], [3.0, 4.0]])
    emb = nn.Embedding.from_pretrained(weights)
    assert not emb.weight.requires_grad
    assert_close(emb(lucid.tensor([1, 0])), [[3.0, 4.0], [1.0, 2.0]])


# --- dropout
def test_dropout_train_and_eval():
    drop = nn.Dropout(0.25)
    x = lucid.tensor(np.ones((200, 100)))
    y = _np(drop(x))
    kept = y != 0
    assert 0.72 < kept.mean() < 0.78
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    drop.eval()
    assert_close(drop(x), _np(x))
    assert_close(nn.Dropout(0.0)(x), _np(x))
    assert not _np(nn.Dropout(1.0)(x)).any()
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


# --- activations
_erf = np.vectorize(math.erf)


@pytest.mark.parametrize(
    ("module", "ref"),
    [
        (nn.ReLU(), lambda x: np.maximum(x, 0)),
        (nn.ReLU6(), lambda x: np.clip(x, 0, 6)),
        (nn.LeakyReLU(0.2), lambda x: np.where(x >= 0, x, 0.2 * x)),
        (nn.ELU(), lambda x: np.where(x > 0, x, np.expm1(x))),
        (nn.GELU(), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
        (
            nn.GELU("tanh"),
            lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        ),
        (nn.SiLU(), lambda x: x / (1 + np.exp(-x))),
        (nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
        (nn.Tanh(), np.tanh),
        (nn.Softplus(), lambda x: np.log1p(np.exp(x))),
        (nn.Hardtanh(), lambda x: np.clip(x, -1, 1)),
        (nn.Mish(), lambda x: x * np.tanh(np.log1p(np.exp(x)))),
        (nn.Softmax(dim=1), lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
        (nn.LogSoftmax(dim=-1), lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_activation_matches_numpy(module, ref):
    x = _x(3, 4) * 3
    assert_close(module(x), ref(_np(x)), atol=1e-10)


def test_softmax_implicit_dim_follows_torch():
    x = _x(2, 3)
    assert_close(nn.Softmax()(x), np.exp(_np(x)) / np.exp(_np(x)).sum(1, keepdims=True))
    v = _x(3)
    assert_close(nn.Softmax()(v), np.exp(_np(v)) / np.exp(_np(v)).sum())


def test_inplace_relu_writes_into_input():
    x = lucid.tensor([-1.0, 2.0, -3.0])
    out = nn.ReLU(inplace=True)(x)
    assert out is x and x.tolist() == [0.0, 2.0, 0.0]
    assert repr(nn.ReLU(inplace=True)) == "ReLU(inplace=True)"


def test_activation_validation():
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")
