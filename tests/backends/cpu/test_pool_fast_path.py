"""The unpadded max_pool2d fast path agrees with the reference, NaN propagation included."""

import numpy as np
import pytest

import lucid
from lucid.backends.cpu.testing import check, run_both
from lucid.ir import prim as prim_ops


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("kernel, strides", [((2, 2), (2, 2)), ((3, 2), (1, 2)), ((3, 3), (2, 1))])
def test_unpadded_max_pool_matches_reference_with_nans(dtype, kernel, strides):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32 if dtype == "f32" else np.float64)
    x[0, 1, 4, 3] = np.nan
    x[1, 2, 0, 0] = np.nan
    attrs = {"kernel": kernel, "strides": strides, "padding": (0, 0, 0, 0), "dilation": (1, 1)}
    y = check("max_pool2d", [x], attrs)
    assert np.isnan(y).any()


@pytest.mark.parametrize(
    "kernel,strides,padding,shape",
    [
        ((2, 2), (2, 2), (0, 0, 0, 0), (2, 3, 6, 8)),  # the unrolled non-overlapping path
        ((2, 2), (2, 2), (0, 0, 0, 0), (1, 2, 7, 5)),  # odd edges: uncovered rows/cols get 0
        ((3, 3), (2, 2), (1, 1, 1, 1), (2, 2, 7, 7)),  # the general path
    ],
)
def test_max_pool_grad_routes_ties_to_the_first_and_nans_to_the_last(
    kernel, strides, padding, shape
):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=shape).astype(np.float32)  # ties everywhere
    x[rng.random(shape) < 0.15] = np.nan
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "dilation": (1, 1)}
    out_shape = prim_ops.infer(
        "max_pool2d",
        [prim_ops.Aval(shape, "f32")],
        prim_ops.check_attrs(prim_ops.lookup("max_pool2d"), attrs),
    )[0].shape
    dy = rng.standard_normal(out_shape).astype(np.float32)
    native, ref = run_both("max_pool2d_grad", [dy, x], attrs)
    np.testing.assert_allclose(native, ref, rtol=1e-6, atol=1e-6)


def test_compiled_max_pool_gradient_equals_eager_autograd_with_ties_and_nans():
    x = np.random.default_rng(1).integers(0, 3, size=(2, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0, 0] = x[0, 0, 1, 1] = np.nan  # two NaNs in one window: the last one wins
    pool = lucid.nn.MaxPool2d(2)

    def loss(t):
        return (pool(t) * lucid.arange(16, dtype=lucid.float32).reshape(4, 4)).sum()

    xe = lucid.tensor(x, requires_grad=True)
    loss(xe).backward()
    xc = lucid.tensor(x, requires_grad=True)
    lucid.compile(loss)(xc).backward()
    np.testing.assert_array_equal(np.isnan(xc.grad.numpy()), np.isnan(xe.grad.numpy()))
    np.testing.assert_allclose(xc.grad.numpy(), xe.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize(
    "kernel, strides, padding, dilation, shape",
    [
        ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (2, 3, 9, 8)),  # a ResNet stem's pool
        ((3, 3), (2, 2), (1, 0, 1, 0), (1, 1), (1, 2, 8, 8)),  # padding on one side
        ((2, 3), (1, 2), (0, 1, 1, 0), (2, 1), (2, 2, 7, 9)),  # dilated rows
        ((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (1, 2, 2, 2)),  # no window inside the plane
        ((3, 3), (3, 3), (0, 0, 0, 0), (2, 2), (1, 1, 11, 11)),  # dilation without padding
    ],
)
def test_bordered_max_pool_matches_reference_with_nans_and_infinities(
    dtype, kernel, strides, padding, dilation, shape
):
    # Interior windows take the branch-free loop, border windows the bounds-checked one: both
    # must give the reference's value, a NaN tap anywhere in the window included.
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32 if dtype == "f32" else np.float64)
    x[rng.random(shape) < 0.1] = np.nan
    x[rng.random(shape) < 0.1] = -np.inf
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "dilation": dilation}
    check("max_pool2d", [x], attrs)


def _first_max_scan(x, kernel, strides, padding, dilation):
    """max_pool2d by a row-major scan of each window that keeps the first of equal values and
    takes every NaN (padding taps are -inf): the kernel's documented tie rule, signed zeros
    included (numpy's reference gives the value, not which zero)."""
    (kh, kw), (sh, sw), (pt, _, pl, _), (dh, dw) = kernel, strides, padding, dilation
    n, c, h, w = x.shape
    ho = (h + padding[0] + padding[1] - (kh - 1) * dh - 1) // sh + 1
    wo = (w + padding[2] + padding[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.empty((n, c, ho, wo), x.dtype)
    for idx in np.ndindex(n, c, ho, wo):
        best = None
        for i in range(kh):
            for j in range(kw):
                ih, iw = idx[2] * sh - pt + i * dh, idx[3] * sw - pl + j * dw
                v = x[idx[0], idx[1], ih, iw] if 0 <= ih < h and 0 <= iw < w else -np.inf
                if best is None or v > best or v != v:
                    best = v
        out[idx] = best
    return out


@pytest.mark.parametrize("padding", [(1, 1, 1, 1), (0, 0, 0, 0)])
def test_bordered_max_pool_keeps_the_first_of_equal_values_signed_zeros_included(padding):
    # Rows then columns regroup max_tap's row-major scan: among equal maxima (here +0.0 and
    # -0.0) the first in row-major order wins, so the sign bits equal the reference's.
    rng = np.random.default_rng(4)
    x = np.where(rng.random((2, 3, 9, 11)) < 0.5, np.float32(0.0), np.float32(-0.0))
    x[rng.random(x.shape) < 0.3] = -1.0
    attrs = {"kernel": (3, 3), "strides": (2, 2), "padding": padding, "dilation": (1, 2)}
    native, ref = run_both("max_pool2d", [x], attrs)
    np.testing.assert_array_equal(native, ref)
    want = _first_max_scan(x, **attrs)
    np.testing.assert_array_equal(np.signbit(native), np.signbit(want))
