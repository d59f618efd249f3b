"""FractionalMaxPool2d/3d and AdaptiveLogSoftmaxWithLoss against numpy references written from
PyTorch's documented algorithms (and torch itself when importable): values, indices, gradients
(float64 finite differences) and compiled equal to eager."""

import itertools

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid import nn
from lucid.testing import gradcheck

# --- fractional max pooling ---------------------------------------------------------------------


def _ref_starts(u, size, out, kernel):
    """torch's interval generation: trunc((i + u) alpha) - trunc(u alpha), the last window at
    size - kernel."""
    if out == 1:
        return [size - kernel]
    alpha = (size - kernel) / (out - 1)
    return [int((i + u) * alpha) - int(u * alpha) for i in range(out - 1)] + [size - kernel]


def ref_fractional_max_pool(x, kernel, out, samples):
    """Loop reference over (N, C, *spatial): values and flat indices, first maximum wins."""
    dims = len(kernel)
    n, c, *spatial = x.shape
    sample_of_dim = (1, 0) if dims == 2 else (0, 1, 2)
    values = np.zeros((n, c, *out))
    indices = np.zeros((n, c, *out), dtype=np.int64)
    for b, ch in itertools.product(range(n), range(c)):
        starts = [
            _ref_starts(samples[b, ch, sample_of_dim[d]], spatial[d], out[d], kernel[d])
            for d in range(dims)
        ]
        for o in itertools.product(*(range(k) for k in out)):
            best, best_index = -np.inf, -1
            for w in itertools.product(*(range(k) for k in kernel)):
                pos = tuple(starts[d][o[d]] + w[d] for d in range(dims))
                if x[(b, ch, *pos)] > best:
                    best, best_index = x[(b, ch, *pos)], np.ravel_multi_index(pos, spatial)
            values[(b, ch, *o)], indices[(b, ch, *o)] = best, best_index
    return values, indices


CASES = [
    ((2, 3, 9, 7), 2, (4, 3)),
    ((1, 2, 6, 6), (3, 2), (2, 5)),
    ((2, 2, 5, 6, 7), 2, (3, 2, 4)),
    ((1, 1, 4, 4, 4), (1, 2, 3), (4, 1, 2)),
]


@pytest.mark.parametrize("shape,kernel,out", CASES)
def test_fractional_max_pool_values_and_indices(shape, kernel, out):
    rng = np.random.default_rng(0)
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64)  # no ties
    dims = len(shape) - 2
    samples = rng.uniform(size=(shape[0], shape[1], dims))
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    values, indices = pool(
        lucid.tensor(x), kernel, out, return_indices=True, _random_samples=lucid.tensor(samples)
    )
    kernel_t = kernel if isinstance(kernel, tuple) else (kernel,) * dims
    want_values, want_indices = ref_fractional_max_pool(x, kernel_t, out, samples)
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(indices.numpy(), want_indices)
    assert indices.dtype == lucid.int64


@pytest.mark.parametrize("shape,kernel,out", CASES[::3])  # 2-D and the smallest 3-D case
def test_fractional_max_pool_gradient_and_compiled(shape, kernel, out):
    rng = np.random.default_rng(1)
    dims = len(shape) - 2
    samples = lucid.tensor(rng.uniform(size=(shape[0], shape[1], dims)))
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    x = lucid.tensor(rng.standard_normal(shape), requires_grad=True)
    gradcheck(lambda t: pool(t, kernel, out, _random_samples=samples), x)
    compiled = lucid.compile(lambda t, s: pool(t, kernel, out, _random_samples=s), strict=True)
    np.testing.assert_array_equal(
        compiled(x, samples).detach().numpy(),
        pool(x, kernel, out, _random_samples=samples).detach().numpy(),
    )


def test_fractional_max_pool_modules_ratio_unbatched_and_randomness():
    x = lucid.randn(3, 10, 10)
    m = nn.FractionalMaxPool2d(3, output_ratio=0.5, return_indices=True)
    values, indices = m(x)
    assert values.shape == (3, 5, 5) and indices.shape == (3, 5, 5)
    flat = x.reshape(3, -1)
    np.testing.assert_array_equal(
        flat.gather(1, indices.reshape(3, -1)).numpy(), values.reshape(3, -1).numpy()
    )
    lucid.manual_seed(5)
    a = nn.FractionalMaxPool3d(2, output_size=3)(lucid.randn(2, 2, 7, 7, 7))
    assert a.shape == (2, 2, 3, 3, 3)
    lucid.manual_seed(5)
    b = nn.FractionalMaxPool3d(2, output_size=3)(lucid.randn(2, 2, 7, 7, 7))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    draws = {
        tuple(nn.FractionalMaxPool2d(2, output_size=4)(x).reshape(-1).numpy().round(6))
        for _ in range(6)
    }
    assert len(draws) > 1, "every call draws fresh window positions"


def test_fractional_max_pool_bad_input():
    with pytest.raises(ValueError, match="output size or a pooling ratio"):
        nn.FractionalMaxPool2d(2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.FractionalMaxPool2d(2, output_ratio=1.5)
    with pytest.raises(ValueError, match="does not fit"):
        F.fractional_max_pool2d(lucid.randn(1, 1, 4, 4), 3, (3, 3))
    with pytest.raises(ValueError, match="_random_samples"):
        F.fractional_max_pool2d(lucid.randn(1, 1, 6, 6), 2, 3, _random_samples=lucid.rand(1, 1, 3))
    with pytest.raises(ValueError, match="4-d or 5-d"):
        F.fractional_max_pool3d(lucid.randn(6, 6), 2, 3)


def test_fractional_max_pool_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8))
    samples = rng.uniform(size=(2, 3, 2))
    got, got_i = F.fractional_max_pool2d(
        lucid.tensor(x), (2, 3), (4, 3), return_indices=True, _random_samples=lucid.tensor(samples)
    )
    want, want_i = torch.nn.functional.fractional_max_pool2d(
        torch.tensor(x), (2, 3), (4, 3), return_indices=True, _random_samples=torch.tensor(samples)
    )
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(got_i.numpy(), want_i.numpy())


# --- adaptive log-softmax -----------------------------------------------------------------------


def _log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def ref_adaptive_log_prob(m, x):
    """Every class's log-probability from the module's weights: shortlist classes from the head,
    cluster i's classes as head[shortlist + i] + the cluster's own log-softmax."""
    head_w = m.head.weight.detach().numpy()
    head = _log_softmax(x @ head_w.T + (m.head.bias.detach().numpy() if m.head_bias else 0))
    pieces = [head[:, : m.shortlist_size]]
    for i, cluster in enumerate(m.tail):
        hidden = x @ cluster[0].weight.detach().numpy().T
        pieces.append(
            _log_softmax(hidden @ cluster[1].weight.detach().numpy().T)
            + head[:, m.shortlist_size + i : m.shortlist_size + i + 1]
        )
    return np.concatenate(pieces, 1)


@pytest.mark.parametrize("head_bias", [False, True])
def test_adaptive_log_softmax_against_reference(head_bias):
    lucid.manual_seed(0)
    m = nn.AdaptiveLogSoftmaxWithLoss(8, 12, [3, 7, 10], div_value=2.0, head_bias=head_bias)
    m = m.double()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 8))
    target = np.array([0, 2, 5, 8, 11, 9])
    full = ref_adaptive_log_prob(m, x)
    with lucid.no_grad():
        output, loss = m(lucid.tensor(x), lucid.tensor(target))
        single = m(lucid.tensor(x[1]), lucid.tensor(target[1]))
        log_prob, predicted = m.log_prob(lucid.tensor(x)), m.predict(lucid.tensor(x))
    np.testing.assert_allclose(output.numpy(), full[np.arange(6), target], rtol=1e-12)
    np.testing.assert_allclose(loss.numpy(), -full[np.arange(6), target].mean(), rtol=1e-12)
    np.testing.assert_allclose(log_prob.numpy(), full, rtol=1e-12)
    np.testing.assert_allclose(np.exp(full).sum(1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(predicted.numpy(), full.argmax(1))
    np.testing.assert_allclose(single.output.numpy(), full[1, target[1]], rtol=1e-12)


def test_adaptive_log_softmax_gradients_and_compiled():
    lucid.manual_seed(1)
    m = nn.AdaptiveLogSoftmaxWithLoss(6, 9, [2, 5], div_value=2.0).double()
    x = lucid.tensor(np.random.default_rng(4).standard_normal((5, 6)), requires_grad=True)
    target = lucid.tensor([0, 3, 6, 8, 1])
    gradcheck(lambda t: m(t, target).loss, x)
    for p in m.parameters():  # each weight's gradient through the loss, one at a time
        gradcheck(lambda _: m(x.detach(), target).loss, p)
    compiled = lucid.compile(lambda t, y: m(t, y).loss, strict=True)
    np.testing.assert_allclose(
        compiled(x, target).detach().numpy(), m(x, target).loss.detach().numpy(), rtol=1e-12
    )


def test_adaptive_log_softmax_bad_input():
    with pytest.raises(ValueError, match="cutoffs"):
        nn.AdaptiveLogSoftmaxWithLoss(4, 10, [5, 3])
    with pytest.raises(ValueError, match="cutoffs"):
        nn.AdaptiveLogSoftmaxWithLoss(4, 10, [3, 10])
    m = nn.AdaptiveLogSoftmaxWithLoss(4, 10, [3])
    with pytest.raises(RuntimeError, match="Target values should be in"):
        m(lucid.randn(2, 4), lucid.tensor([1, 10]))
    with pytest.raises(RuntimeError, match="same size"):
        m(lucid.randn(2, 4), lucid.tensor([1, 2, 3]))
    with pytest.raises(RuntimeError, match="multi-target"):
        m(lucid.randn(2, 4), lucid.tensor([[1, 2]]))


def test_adaptive_log_softmax_matches_torch():
    torch = pytest.importorskip("torch")
    lucid.manual_seed(2)
    ours = nn.AdaptiveLogSoftmaxWithLoss(8, 12, [3, 7], div_value=2.0, head_bias=True).double()
    theirs = torch.nn.AdaptiveLogSoftmaxWithLoss(8, 12, [3, 7], div_value=2.0, head_bias=True)
    theirs = theirs.double()
    with torch.no_grad():
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            q.copy_(torch.tensor(p.detach().numpy()))
    x = np.random.default_rng(5).standard_normal((6, 8))
    target = [0, 2, 5, 8, 11, 9]
    xo, xt = lucid.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, loss = ours(xo, lucid.tensor(target))
    want_out, want_loss = theirs(xt, torch.tensor(target))
    np.testing.assert_allclose(out.detach().numpy(), want_out.detach().numpy(), rtol=1e-12)
    loss.backward()
    want_loss.backward()
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-10)
