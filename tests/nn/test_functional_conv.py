"""conv1d / conv2d against a direct nested-loop reference; gradients by finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=True)


def ref_conv2d(x, w, b, stride, padding, dilation, groups):
    """Direct definition: out[n, o, i, j] = sum over the window of the o's group."""
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo))
    per_group = o // groups
    for oc in range(o):
        g = oc // per_group
        for i in range(ho):
            for j in range(wo):
                for ki in range(kh):
                    for kj in range(kw):
                        patch = xp[:, g * cg : (g + 1) * cg, i * sh + ki * dh, j * sw + kj * dw]
                        out[:, oc, i, j] += patch @ w[oc, :, ki, kj]
        if b is not None:
            out[:, oc] += b[oc]
    return out


conv_settings = st.fixed_dictionaries(
    {
        "stride": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "padding": st.tuples(st.integers(0, 2), st.integers(0, 2)),
        "dilation": st.tuples(st.integers(1, 2), st.integers(1, 2)),
        "groups": st.sampled_from([1, 2]),
        "kernel": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "bias": st.booleans(),
    }
)


@given(conv_settings)
def test_conv2d_matches_reference_over_settings(cfg):
    g = cfg["groups"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2 * g, 7, 6))
    w = rng.standard_normal((2 * g, 2, *cfg["kernel"]))
    b = rng.standard_normal(2 * g) if cfg["bias"] else None
    got = F.conv2d(
        lucid.tensor(x),
        lucid.tensor(w),
        None if b is None else lucid.tensor(b),
        stride=cfg["stride"],
        padding=cfg["padding"],
        dilation=cfg["dilation"],
        groups=g,
    )
    ph, pw = cfg["padding"]
    expected = ref_conv2d(x, w, b, cfg["stride"], (ph, ph, pw, pw), cfg["dilation"], g)
    assert_close(got, expected.astype(np.float32), rtol=1e-4, atol=1e-4)


@settings(max_examples=12)
@given(conv_settings)
def test_conv2d_gradients_over_settings(cfg):
    g = cfg["groups"]
    x = f64(1, 2 * g, 6, 5, seed=1)
    w = f64(2 * g, 2, *cfg["kernel"], seed=2)
    args = [x, w] + ([f64(w.shape[0], seed=3)] if cfg["bias"] else [])
    gradcheck(
        lambda *a: F.conv2d(
            *a, stride=cfg["stride"], padding=cfg["padding"], dilation=cfg["dilation"], groups=g
        ),
        *args,
    )


def test_conv2d_depthwise_and_same_padding_with_even_kernel():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 3, 5, 6)), rng.standard_normal((3, 1, 2, 4))
    got = F.conv2d(lucid.tensor(x), lucid.tensor(w), padding="same", groups=3)
    assert got.shape == (1, 3, 5, 6)
    # torch puts the odd extra padding after: total 1 -> (0, 1); total 3 -> (1, 2)
    expected = ref_conv2d(x, w, None, (1, 1), (0, 1, 1, 2), (1, 1), 3)
    assert_close(got, expected.astype(np.float32), rtol=1e-4, atol=1e-4)
    valid = F.conv2d(lucid.tensor(x), lucid.tensor(w), padding="valid", groups=3)
    assert valid.shape == (1, 3, 4, 3)


def test_conv2d_unbatched_input():
    x, w = f64(2, 4, 4), f64(3, 2, 3, 3, seed=1)
    out = F.conv2d(x, w, padding=1)
    assert out.shape == (3, 4, 4)
    batched = F.conv2d(x.detach().reshape(1, 2, 4, 4), w.detach(), padding=1)
    assert_close(out.detach(), batched.reshape(3, 4, 4))


def test_conv2d_double_backward_matches_finite_differences():
    x, w = f64(1, 2, 4, 4), f64(2, 2, 3, 3, seed=1)

    def input_grad_norm(a, b):
        (gx,) = lucid.autograd.grad((F.conv2d(a, b, padding=1) ** 2).sum(), a, create_graph=True)
        return gx

    gradcheck(input_grad_norm, x, w)

    def weight_grad(a, b):
        (gw,) = lucid.autograd.grad((F.conv2d(a, b, stride=2) ** 2).sum(), b, create_graph=True)
        return gw

    gradcheck(weight_grad, x, w)


@pytest.mark.parametrize("padding", [0, 2, "same"])
@pytest.mark.parametrize("groups", [1, 2])
def test_conv1d_matches_reference_and_gradients(padding, groups):
    x, w, b = f64(2, 4, 7), f64(4, 4 // groups, 3, seed=1), f64(4, seed=2)
    stride, dilation = 1, 2
    got = F.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    pad = (2, 2) if padding == "same" else (padding, padding)
    expected = ref_conv2d(
        x.detach().numpy()[:, :, None],
        w.detach().numpy()[:, :, None],
        b.detach().numpy(),
        (1, stride),
        (0, 0, *pad),
        (1, dilation),
        groups,
    )[:, :, 0]
    assert_close(got, expected, rtol=1e-10, atol=1e-12)
    gradcheck(
        lambda *a: F.conv1d(*a, stride=2, padding=1, dilation=1, groups=groups),
        f64(1, 4, 6),
        f64(2, 4 // groups, 2, seed=3),
        f64(2, seed=4),
    )


def test_conv2d_names_both_channel_counts_on_mismatch():
    x, w = (
        lucid.tensor(np.zeros((1, 3, 5, 5), np.float32)),
        lucid.tensor(np.zeros((4, 2, 3, 3), np.float32)),
    )
    with pytest.raises(ValueError, match="input has 3 channels but weight expects 2"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="input has 3 channels but weight expects 4"):
        F.conv2d(x, w, groups=2)
    with pytest.raises(ValueError, match="conv1d: input has 3 channels but weight expects 2"):
        F.conv1d(
            lucid.tensor(np.zeros((1, 3, 5), np.float32)),
            lucid.tensor(np.zeros((4, 2, 3), np.float32)),
        )


def test_conv_rejects_bad_arguments():
    x = lucid.tensor(np.zeros((1, 2, 5, 5), np.float32))
    w = lucid.tensor(np.zeros((4, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="strided"):
        F.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be"):
        F.conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match="bias must have shape"):
        F.conv2d(x, w, lucid.tensor(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        F.conv2d(x, w, dilation=3)
    with pytest.raises(TypeError, match="dtype"):
        F.conv2d(x, w.double())
    with pytest.raises(ValueError, match="4-d input"):
        F.conv2d(lucid.tensor(np.zeros((5, 5), np.float32)), w)
