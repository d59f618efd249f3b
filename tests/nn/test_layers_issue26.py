"""Layers PyTorch programs need (issue 26): RNN and the recurrent cells, channel dropout, pixel
shuffle, padding layers, InstanceNorm; against numpy references, finite differences, and
compiled equal to eager."""

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.testing import gradcheck

RNG = np.random.default_rng(26)


def _x(*shape, requires_grad=False):
    return lucid.tensor(RNG.standard_normal(shape), requires_grad=requires_grad)


def test_rnn_matches_the_elman_recurrence():
    rnn = nn.RNN(3, 4, num_layers=1, nonlinearity="relu").double()
    x = _x(5, 2, 3)
    out, h_n = rnn(x)
    w_ih, w_hh = rnn.weight_ih_l0.detach().numpy(), rnn.weight_hh_l0.detach().numpy()
    b = rnn.bias_ih_l0.detach().numpy() + rnn.bias_hh_l0.detach().numpy()
    h = np.zeros((2, 4))
    for t in range(5):
        h = np.maximum(x.numpy()[t] @ w_ih.T + h @ w_hh.T + b, 0)
        np.testing.assert_allclose(out.detach().numpy()[t], h, atol=1e-12)
    np.testing.assert_allclose(h_n.detach().numpy()[0], h, atol=1e-12)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


@pytest.mark.parametrize("cell", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_cells_gradients_by_finite_differences(cell):
    layer = cell(3, 2).double()
    x, h = _x(2, 3, requires_grad=True), _x(2, 2, requires_grad=True)

    def run(x, h):
        state = (h, h * 0.5) if cell is nn.LSTMCell else h
        out = layer(x, state)
        return (out[0] + out[1] if isinstance(out, tuple) else out).tanh().sum()

    gradcheck(run, x, h)
    unbatched = layer(_x(3))
    assert (unbatched[0] if isinstance(unbatched, tuple) else unbatched).shape == (2,)
    with pytest.raises(ValueError, match="hidden state"):
        layer(_x(2, 3), (_x(3, 2), _x(3, 2)) if cell is nn.LSTMCell else _x(3, 2))


def test_gru_cell_equals_a_one_step_gru():
    cell, gru = nn.GRUCell(3, 4).double(), nn.GRU(3, 4).double()
    gru.load_state_dict({k + "_l0": v for k, v in cell.state_dict().items()})
    x, h = _x(2, 3), _x(2, 4)
    np.testing.assert_allclose(
        cell(x, h).detach().numpy(), gru(x[None], h[None])[1][0].detach().numpy(), atol=1e-12
    )


@pytest.mark.parametrize(
    ("layer", "shape", "spatial"),
    [(nn.Dropout1d, (4, 6, 5), 1), (nn.Dropout2d, (4, 6, 3, 3), 2),
     (nn.Dropout3d, (16, 2, 2, 2), 3)],
)  # fmt: skip
def test_channel_dropout_zeroes_whole_channels(layer, shape, spatial):
    lucid.manual_seed(1)
    drop = layer(0.5)
    y = drop(lucid.ones(*shape)).numpy()
    per_channel = y.reshape(*shape[:-spatial], -1)
    assert set(np.unique(per_channel)) <= {0.0, 2.0}
    assert (per_channel.min(-1) == per_channel.max(-1)).all()
    assert 0 < (per_channel[..., 0] == 0).mean() < 1
    drop.eval()
    assert lucid.equal(drop(lucid.ones(*shape)), lucid.ones(*shape))
    with pytest.raises(ValueError, match="expected"):
        layer(0.5)(lucid.ones(2))
    with pytest.raises(ValueError, match="between 0 and 1"):
        layer(1.5)


def test_pixel_shuffle_places_channel_blocks_and_unshuffle_inverts_it():
    x = lucid.arange(8.0).reshape(1, 4, 1, 2)
    y = nn.PixelShuffle(2)(x)
    assert y.tolist() == [[[[0.0, 2.0, 1.0, 3.0], [4.0, 6.0, 5.0, 7.0]]]]
    z = _x(2, 3, 4, 6)
    assert lucid.equal(nn.PixelShuffle(2)(nn.PixelUnshuffle(2)(z)), z)
    with pytest.raises(ValueError, match="divisible"):
        nn.PixelShuffle(2)(_x(1, 3, 2, 2))


@pytest.mark.parametrize(
    ("layer", "np_mode", "padding"),
    [(nn.ReflectionPad2d((1, 2, 2, 0)), "reflect", ((2, 0), (1, 2))),
     (nn.ReplicationPad2d(2), "edge", ((2, 2), (2, 2))),
     (nn.CircularPad2d(1), "wrap", ((1, 1), (1, 1))),
     (nn.ZeroPad2d((0, 1, 1, 0)), "constant", ((1, 0), (0, 1)))],
)  # fmt: skip
def test_pad_layers_match_numpy(layer, np_mode, padding):
    x = _x(2, 3, 4, 5)
    want = np.pad(x.numpy(), ((0, 0), (0, 0), *padding), mode=np_mode)
    np.testing.assert_array_equal(layer(x).numpy(), want)
    assert nn.ConstantPad1d(1, 2.5)(lucid.zeros(1, 1, 1)).tolist() == [[[2.5, 0.0, 2.5]]]
    np.testing.assert_array_equal(
        nn.ReflectionPad1d(2)(x[0]).numpy(),
        np.pad(x.numpy()[0], ((0, 0), (0, 0), (2, 2)), "reflect"),
    )


def test_instance_norm_normalises_each_sample_channel():
    x = _x(2, 3, 4, 5).double()
    y = nn.InstanceNorm2d(3)(x).numpy()
    a = x.numpy()
    mean, var = a.mean((2, 3), keepdims=True), a.var((2, 3), keepdims=True)
    np.testing.assert_allclose(y, (a - mean) / np.sqrt(var + 1e-5), atol=1e-12)
    norm = nn.InstanceNorm1d(3, affine=True, track_running_stats=True)
    assert sorted(norm.state_dict()) == [
        "bias", "num_batches_tracked", "running_mean", "running_var", "weight"
    ]  # fmt: skip
    norm(_x(2, 3, 6))
    assert not np.allclose(norm.running_mean.numpy(), 0)
    with pytest.raises(ValueError, match="expected"):
        nn.InstanceNorm1d(3)(_x(2, 3, 4, 5))


def test_super_resolution_block_compiled_equals_eager(compiled_matches_eager):
    lucid.manual_seed(0)
    model = nn.Sequential(
        nn.ReflectionPad2d(1),
        nn.Conv2d(2, 8, 3),
        nn.InstanceNorm2d(8, affine=True),
        nn.ReLU(),
        nn.Dropout2d(0.2),
        nn.PixelShuffle(2),
        nn.ReplicationPad2d((0, 1, 1, 0)),
    ).double()
    model.eval()
    # The compiled layer_norm backward (which InstanceNorm uses) differs from eager by ~1e-8
    # relative in float64, independently of these layers; the tolerance allows for it.
    x = lucid.randn(2, 2, 5, 4, dtype=lucid.float64)
    compiled_matches_eager(model, x, forward_atol=1e-10, rtol=1e-5, atol=1e-6)


def test_rnn_compiled_equals_eager():
    lucid.manual_seed(0)
    rnn = nn.RNN(3, 4, num_layers=2, batch_first=True).double()
    x = lucid.randn(2, 5, 3, dtype=lucid.float64)
    compiled = lucid.compile(rnn, strict=True)
    out, h = compiled(x)
    ref, ref_h = rnn(x)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(h.detach().numpy(), ref_h.detach().numpy(), atol=1e-12)


@pytest.mark.parametrize(("layer", "shape"), [(nn.BatchNorm1d, (0, 3)),
                                              (nn.BatchNorm2d, (0, 3, 2, 2))])  # fmt: skip
def test_batch_norm_on_an_empty_batch_in_training_is_empty_eager_and_compiled(layer, shape):
    results = []
    for compiled in (False, True):
        bn = layer(3)
        with lucid.no_grad():
            bn.weight.fill_(2.0)
        run = lucid.compile(bn, strict=True) if compiled else bn
        x = lucid.zeros(*shape, requires_grad=True)
        y = run(x)
        y.sum().backward()
        results.append((y, bn, x))
    for y, bn, x in results:
        assert y.shape == shape and x.grad.shape == shape
        # As PyTorch: running statistics untouched, the batch counted, zero affine gradients.
        assert bn.running_mean.tolist() == [0.0] * 3 and bn.running_var.tolist() == [1.0] * 3
        assert int(bn.num_batches_tracked) == 1
        assert bn.weight.grad.tolist() == [0.0] * 3 and bn.bias.grad.tolist() == [0.0] * 3
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(3)(lucid.zeros(1, 3, *([1] * (len(shape) - 2))))
