"""nn.init: gains, fans, distribution bounds and moments, determinism, default layer inits."""

import math

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.nn import init


def _t(*shape, dtype=lucid.float32):
    return lucid.tensor(np.zeros(shape), dtype=dtype)


@pytest.mark.parametrize(
    ("name", "param", "expected"),
    [
        ("linear", None, 1.0),
        ("conv2d", None, 1.0),
        ("sigmoid", None, 1.0),
        ("tanh", None, 5 / 3),
        ("relu", None, math.sqrt(2)),
        ("leaky_relu", None, math.sqrt(2 / (1 + 0.01**2))),
        ("leaky_relu", 0.2, math.sqrt(2 / (1 + 0.04))),
        ("selu", None, 0.75),
    ],
)
def test_calculate_gain_matches_pytorch_table(name, param, expected):
    assert init.calculate_gain(name, param) == pytest.approx(expected)


def test_calculate_gain_rejects_unknown_and_bad_slope():
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="negative_slope"):
        init.calculate_gain("leaky_relu", True)


def test_fan_in_and_fan_out():
    assert init._calculate_fan_in_and_fan_out(_t(5, 3)) == (3, 5)
    assert init._calculate_fan_in_and_fan_out(_t(8, 4, 3, 2)) == (4 * 6, 8 * 6)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init._calculate_fan_in_and_fan_out(_t(5))
    with pytest.raises(ValueError, match="fan_in, fan_out"):
        init.kaiming_uniform_(_t(3, 3), mode="fan_avg")


def test_uniform_bounds_and_moments():
    t = init.uniform_(_t(200, 100), -2.0, 3.0)
    d = t._data
    assert d.min() >= -2.0 and d.max() < 3.0
    assert d.mean() == pytest.approx(0.5, abs=0.05)
    assert d.var() == pytest.approx(25 / 12, rel=0.05)


def test_normal_moments():
    d = init.normal_(_t(200, 100), 1.5, 0.5)._data
    assert d.mean() == pytest.approx(1.5, abs=0.02)
    assert d.std() == pytest.approx(0.5, rel=0.03)


def test_trunc_normal_bounds_and_std():
    d = init.trunc_normal_(_t(200, 100, dtype=lucid.float64), 0.0, 1.0, -2.0, 2.0)._data
    assert d.min() >= -2.0 and d.max() <= 2.0
    # Variance of N(0,1) truncated to [-2, 2]: 1 - 2 * 2 * phi(2) / (Phi(2) - Phi(-2)).
    phi2 = math.exp(-2) / math.sqrt(2 * math.pi)
    mass = math.erf(2 / math.sqrt(2))
    assert d.var() == pytest.approx(1 - 4 * phi2 / mass, rel=0.05)
    assert abs(d.mean()) < 0.02
    # Far-tail bounds still produce values inside them.
    tail = init.trunc_normal_(_t(1000, dtype=lucid.float64), 0.0, 1.0, 3.0, 4.0)._data
    assert tail.min() >= 3.0 and tail.max() <= 4.0 and tail.mean() < 3.5


def test_constant_ones_zeros_eye_dirac():
    assert (init.constant_(_t(2, 3), 0.25)._data == 0.25).all()
    assert (init.ones_(_t(4))._data == 1).all()
    assert not init.zeros_(lucid.tensor(np.ones(3)))._data.any()
    np.testing.assert_array_equal(init.eye_(_t(2, 3))._data, np.eye(2, 3))
    with pytest.raises(ValueError, match="2 dimensions"):
        init.eye_(_t(2, 2, 2))
    w = init.dirac_(_t(2, 2, 3, 3))._data
    # A Dirac conv weight copies channel c to output c through the kernel centre.
    expected = np.zeros((2, 2, 3, 3))
    expected[0, 0, 1, 1] = expected[1, 1, 1, 1] = 1
    np.testing.assert_array_equal(w, expected)


def test_xavier_bounds_and_std():
    fan_in, fan_out = 60, 40
    bound = math.sqrt(6 / (fan_in + fan_out)) * 2.0
    d = init.xavier_uniform_(_t(fan_out, fan_in), gain=2.0)._data
    assert np.abs(d).max() <= bound and np.abs(d).max() > 0.9 * bound
    big = init.xavier_normal_(_t(400, 300))._data
    assert big.std() == pytest.approx(math.sqrt(2 / 700), rel=0.03)


def test_kaiming_bounds_and_std():
    w = _t(300, 200)
    bound = math.sqrt(3) * math.sqrt(2) / math.sqrt(200)
    d = init.kaiming_uniform_(w, nonlinearity="relu")._data
    assert np.abs(d).max() <= bound and np.abs(d).max() > 0.95 * bound
    d = init.kaiming_normal_(_t(300, 200), mode="fan_out", nonlinearity="relu")._data
    assert d.std() == pytest.approx(math.sqrt(2) / math.sqrt(300), rel=0.03)
    # An empty tensor is left alone rather than dividing by a zero fan.
    assert init.kaiming_uniform_(_t(0, 3)).shape == (0, 3)


def test_orthogonal_rows_or_columns_are_orthonormal():
    tall = init.orthogonal_(_t(6, 3, dtype=lucid.float64))._data
    np.testing.assert_allclose(tall.T @ tall, np.eye(3), atol=1e-10)
    wide = init.orthogonal_(_t(3, 6, dtype=lucid.float64), gain=2.0)._data
    np.testing.assert_allclose(wide @ wide.T, 4 * np.eye(3), atol=1e-10)
    conv = init.orthogonal_(_t(4, 2, 3, dtype=lucid.float64))._data.reshape(4, 6)
    np.testing.assert_allclose(conv @ conv.T, np.eye(4), atol=1e-10)


def test_init_keeps_identity_dtype_and_works_on_parameters_that_require_grad():
    p = nn.Parameter(_t(3, 4))
    data = p._data
    before = p._version_count
    out = init.kaiming_uniform_(p, a=math.sqrt(5))
    assert out is p and p._data is data and p.requires_grad and p.grad_fn is None
    assert p.dtype == lucid.float32 and p._version_count > before
    assert np.abs(p._data).max() > 0


def test_bad_input():
    with pytest.raises(TypeError, match="expected a Tensor"):
        init.uniform_(np.zeros(3))
    with pytest.raises(ValueError, match="std"):
        init.normal_(_t(3), 0.0, -1.0)
    with pytest.raises(ValueError, match="a < b"):
        init.trunc_normal_(_t(3), a=1.0, b=0.0)


def test_manual_seed_reproduces_models():
    lucid.manual_seed(123)
    a = nn.Sequential(nn.Linear(4, 3), nn.Conv2d(2, 2, 3), nn.Embedding(5, 2))
    lucid.manual_seed(123)
    b = nn.Sequential(nn.Linear(4, 3), nn.Conv2d(2, 2, 3), nn.Embedding(5, 2))
    c = nn.Sequential(nn.Linear(4, 3), nn.Conv2d(2, 2, 3), nn.Embedding(5, 2))
    for p, q, r in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        np.testing.assert_array_equal(p._data, q._data)
        assert not np.array_equal(p._data, r._data)


def _bound_of(fan_in):
    return 1 / math.sqrt(fan_in)


@pytest.mark.parametrize(
    ("make", "fan_in"),
    [
        (lambda: nn.Linear(50, 40), 50),
        (lambda: nn.Conv2d(6, 40, 3), 6 * 9),
        (lambda: nn.Conv1d(4, 40, 5, groups=2), 2 * 5),
    ],
)
def test_default_layer_init_matches_pytorch(make, fan_in):
    # kaiming_uniform_(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same.
    layer = make()
    bound = _bound_of(fan_in)
    w, b = layer.weight._data, layer.bias._data
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.15)
    assert np.abs(b).max() <= bound and np.unique(b).size == b.size


def test_default_init_of_norms_embedding_attention_lstm():
    bn = nn.BatchNorm2d(3)
    assert (bn.weight._data == 1).all() and not bn.bias._data.any()
    assert not bn.running_mean._data.any() and (bn.running_var._data == 1).all()
    ln = nn.LayerNorm((2, 3))
    assert (ln.weight._data == 1).all() and ln.weight.shape == (2, 3)
    emb = nn.Embedding(300, 50, padding_idx=2)
    assert not emb.weight._data[2].any()
    rest = np.delete(emb.weight._data, 2, axis=0)
    assert rest.std() == pytest.approx(1.0, rel=0.05)
    mha = nn.MultiheadAttention(12, 3)
    bound = math.sqrt(6 / (12 + 36))  # xavier on the packed (3E, E) weight
    assert np.abs(mha.in_proj_weight._data).max() <= bound
    assert not mha.in_proj_bias._data.any() and not mha.out_proj.bias._data.any()
    lstm = nn.LSTM(3, 16)
    for p in lstm.parameters():
        assert np.abs(p._data).max() <= 0.25
