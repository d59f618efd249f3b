"""Pooling against loop references written from PyTorch's definitions; gradients by gradcheck."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0):
    # distinct values so the max of every window is unique (finite differences need that)
    rng = np.random.default_rng(seed)
    data = rng.permutation(int(np.prod(shape))).reshape(shape) * 0.1 + rng.uniform(0, 0.01, shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=True)


def out_size(size, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    if ceil_mode:
        o = math.ceil((size + 2 * p - eff) / s) + 1
        if (o - 1) * s >= size + p:
            o -= 1
        return o
    return (size + 2 * p - eff) // s + 1


def ref_max_pool2d(x, k, s, p, d, ceil_mode):
    n, c, h, w = x.shape
    ho, wo = (
        out_size(h, k[0], s[0], p[0], d[0], ceil_mode),
        out_size(w, k[1], s[1], p[1], d[1], ceil_mode),
    )
    vals = np.full((n, c, ho, wo), -np.inf)
    idx = np.zeros((n, c, ho, wo), dtype=np.int64)
    for i in range(ho):
        for j in range(wo):
            for a in range(k[0]):
                for b in range(k[1]):
                    r, col = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + b * d[1]
                    if 0 <= r < h and 0 <= col < w:
                        v = x[:, :, r, col]
                        better = v > vals[:, :, i, j]
                        vals[:, :, i, j] = np.where(better, v, vals[:, :, i, j])
                        idx[:, :, i, j] = np.where(better, r * w + col, idx[:, :, i, j])
    return vals, idx


def ref_avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override=None):
    n, c, h, w = x.shape
    ho, wo = (
        out_size(h, k[0], s[0], p[0], 1, ceil_mode),
        out_size(w, k[1], s[1], p[1], 1, ceil_mode),
    )
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            pool = (he - hs) * (we - ws)
            hs0, ws0, he0, we0 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            total = x[:, :, hs0:he0, ws0:we0].sum(axis=(2, 3))
            if divisor_override:
                div = divisor_override
            elif count_include_pad:
                div = pool
            else:
                div = (he0 - hs0) * (we0 - ws0)
            out[:, :, i, j] = total / div
    return out


pool_settings = st.fixed_dictionaries(
    {
        "kernel": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "stride": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "pad": st.tuples(st.integers(0, 1), st.integers(0, 1)),
        "dilation": st.tuples(st.integers(1, 2), st.integers(1, 2)),
        "ceil_mode": st.booleans(),
    }
).filter(lambda c: all(p <= k // 2 for p, k in zip(c["pad"], c["kernel"], strict=True)))


@settings(max_examples=12)
@given(pool_settings)
def test_max_pool2d_values_indices_and_gradients(cfg):
    x = f64(2, 2, 6, 7)
    args = (cfg["kernel"], cfg["stride"], cfg["pad"], cfg["dilation"], cfg["ceil_mode"])
    vals, idx = F.max_pool2d(x, *args, return_indices=True)
    ref_vals, ref_idx = ref_max_pool2d(x.detach().numpy(), *args)
    assert_close(vals, ref_vals)
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    assert idx.dtype is lucid.int64
    gradcheck(lambda t: F.max_pool2d(t, *args), f64(1, 1, 6, 7, seed=1))


@settings(max_examples=12)
@given(pool_settings, st.booleans())
def test_avg_pool2d_values_and_gradients(cfg, count_include_pad):
    args = (cfg["kernel"], cfg["stride"], cfg["pad"], cfg["ceil_mode"], count_include_pad)
    x = f64(2, 2, 5, 6)
    assert_close(F.avg_pool2d(x, *args), ref_avg_pool2d(x.detach().numpy(), *args), rtol=1e-10)
    gradcheck(lambda t: F.avg_pool2d(t, *args), f64(1, 1, 5, 6, seed=1))


def test_avg_pool2d_divisor_override():
    x = f64(1, 1, 4, 4)
    got = F.avg_pool2d(x, 2, divisor_override=3)
    assert_close(got, ref_avg_pool2d(x.detach().numpy(), (2, 2), (2, 2), (0, 0), False, True, 3))


def test_pool_defaults_stride_to_kernel_and_accepts_unbatched_input():
    x = f64(3, 4, 4)
    out = F.max_pool2d(x, 2)
    assert out.shape == (3, 2, 2)
    assert_close(
        out, ref_max_pool2d(x.detach().numpy()[None], (2, 2), (2, 2), (0, 0), (1, 1), False)[0][0]
    )


def ref_adaptive_avg(x, oh, ow):
    h, w = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, he = (i * h) // oh, -(-((i + 1) * h) // oh)
            ws, we = (j * w) // ow, -(-((j + 1) * w) // ow)
            out[..., i, j] = x[..., hs:he, ws:we].mean(axis=(-2, -1))
    return out


@pytest.mark.parametrize("output_size", [1, (2, 3), (3, None), (5, 7)])
def test_adaptive_avg_pool2d_values_and_gradients(output_size):
    x = f64(2, 2, 5, 7)
    got = F.adaptive_avg_pool2d(x, output_size)
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    ow = 7 if ow is None else ow
    assert_close(got, ref_adaptive_avg(x.detach().numpy(), oh, ow), rtol=1e-10)
    gradcheck(lambda t: F.adaptive_avg_pool2d(t, output_size), f64(1, 1, 5, 7, seed=2))


def test_pool1d_variants_match_2d_references():
    x = f64(2, 3, 9)
    xn = x.detach().numpy()[:, :, None]
    vals, idx = F.max_pool1d(x, 3, 2, 1, return_indices=True)
    rv, ri = ref_max_pool2d(xn, (1, 3), (1, 2), (0, 1), (1, 1), False)
    assert_close(vals, rv[:, :, 0])
    np.testing.assert_array_equal(idx.numpy(), ri[:, :, 0])
    assert_close(
        F.avg_pool1d(x, 4, 2, 2, count_include_pad=False),
        ref_avg_pool2d(xn, (1, 4), (1, 2), (0, 2), False, False)[:, :, 0],
    )
    assert_close(F.adaptive_avg_pool1d(x, 4), ref_adaptive_avg(xn, 1, 4)[:, :, 0])
    gradcheck(lambda t: F.max_pool1d(t, 2), f64(1, 2, 6, seed=3))
    gradcheck(lambda t: F.avg_pool1d(t, 3, 1, 1), f64(1, 2, 6, seed=3))


def test_pool_backward_ops_differentiate_twice():
    x = f64(1, 1, 4, 4)

    def grad_of(fn):
        def inner(t):
            (g,) = lucid.autograd.grad((fn(t) ** 2).sum(), t, create_graph=True)
            return g

        return inner

    gradcheck(grad_of(lambda t: F.avg_pool2d(t, 2, 1)), x)
    gradcheck(grad_of(lambda t: F.adaptive_avg_pool2d(t, 3)), x)
    gradcheck(grad_of(lambda t: F.max_pool2d(t, 2)), x)


def test_pool_rejects_bad_arguments():
    x = lucid.tensor(np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="at most half of the kernel"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="too small"):
        F.max_pool2d(x, 5)
    with pytest.raises(ValueError, match="3-d or 4-d input"):
        F.avg_pool2d(lucid.tensor(np.zeros((4, 4), np.float32)), 2)
    with pytest.raises(ValueError, match="divisor_override"):
        F.avg_pool2d(x, 2, divisor_override=0)
