"""F.interpolate (nearest, bilinear) and nn.Upsample against a per-pixel numpy reference of
PyTorch's documented index formulas (hypothesis over sizes, scale factors and align_corners),
float64 gradchecks, bad arguments, and compiled == eager (strict, forward and gradients)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.testing import gradcheck


def _nearest_source(dst, n_in, n_out, scale):
    # PyTorch's nearest_idx: float32 arithmetic, floor(dst * in/out) or floor(dst / scale).
    if n_out == n_in:
        return dst
    if n_out == 2 * n_in:
        return dst // 2
    ratio = np.float32(1.0 / scale) if scale else np.float32(n_in) / np.float32(n_out)
    return min(int(math.floor(np.float32(dst) * ratio)), n_in - 1)


def _linear_source(dst, n_in, n_out, scale, align_corners):
    """(i0, i1, lambda0, lambda1) by PyTorch's area_pixel_compute_source_index (float64)."""
    if n_out == n_in:
        return dst, dst, 1.0, 0.0
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        ratio = 1.0 / scale if scale else n_in / n_out
        src = max(ratio * (dst + 0.5) - 0.5, 0.0)
    i0 = min(int(math.floor(src)), n_in - 1)
    lam1 = min(max(src - i0, 0.0), 1.0)
    return i0, i0 + (i0 < n_in - 1), 1.0 - lam1, lam1


def reference(x, out_hw, mode, align_corners=False, scales=(None, None)):
    n, c, h, w = x.shape
    out = np.zeros((n, c, *out_hw))
    for i in range(out_hw[0]):
        for j in range(out_hw[1]):
            if mode == "nearest":
                si = _nearest_source(i, h, out_hw[0], scales[0])
                sj = _nearest_source(j, w, out_hw[1], scales[1])
                out[:, :, i, j] = x[:, :, si, sj]
            else:
                a0, a1, p0, p1 = _linear_source(i, h, out_hw[0], scales[0], align_corners)
                b0, b1, q0, q1 = _linear_source(j, w, out_hw[1], scales[1], align_corners)
                out[:, :, i, j] = p0 * (q0 * x[:, :, a0, b0] + q1 * x[:, :, a0, b1]) + p1 * (
                    q0 * x[:, :, a1, b0] + q1 * x[:, :, a1, b1]
                )
    return out


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(["nearest", "bilinear"]))
    hw = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    align = draw(st.booleans()) if mode == "bilinear" else None
    if draw(st.booleans()):
        size = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
        return dict(mode=mode, hw=hw, size=size, scale=None, align=align)
    scale = tuple(
        draw(
            st.sampled_from([0.5, 0.75, 1.0, 1.5, 1.7, 2.0, 2.5, 3.0]).filter(
                lambda s, n=n: n * s >= 1
            )
        )
        for n in hw
    )
    return dict(mode=mode, hw=hw, size=None, scale=scale, align=align)


@settings(max_examples=60, deadline=None)
@given(case=cases(), recompute=st.booleans())
def test_matches_pytorchs_index_formulas(case, recompute):
    x = np.random.default_rng(0).standard_normal((2, 3, *case["hw"]))
    got = F.interpolate(
        lucid.tensor(x),
        size=case["size"],
        scale_factor=case["scale"],
        mode=case["mode"],
        align_corners=case["align"],
        recompute_scale_factor=recompute if case["scale"] else None,
    )
    if case["size"] is not None:
        out_hw, scales = case["size"], (None, None)
    else:
        out_hw = tuple(math.floor(n * s) for n, s in zip(case["hw"], case["scale"], strict=True))
        scales = (None, None) if recompute else case["scale"]
    want = reference(x, out_hw, case["mode"], bool(case["align"]), scales)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    got32 = F.interpolate(
        lucid.tensor(x, dtype=lucid.float32),
        size=case["size"],
        scale_factor=case["scale"],
        mode=case["mode"],
        align_corners=case["align"],
        recompute_scale_factor=recompute if case["scale"] else None,
    )
    assert got32.dtype is lucid.float32
    np.testing.assert_allclose(got32.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_given_scale_factor_places_samples_unlike_the_output_size():
    # 10 * 0.35 -> 3 outputs; PyTorch reads floor(dst / 0.35) = 0, 2, 5, while the recomputed
    # scale (10 / 3) reads 0, 3, 6.
    x = lucid.tensor(np.arange(10.0).reshape(1, 1, 1, 10))
    assert F.interpolate(x, scale_factor=(1.0, 0.35)).flatten().tolist() == [0.0, 2.0, 5.0]
    recomputed = F.interpolate(x, scale_factor=(1.0, 0.35), recompute_scale_factor=True)
    assert recomputed.flatten().tolist() == [0.0, 3.0, 6.0]
    assert F.interpolate(x, size=(1, 3)).flatten().tolist() == [0.0, 3.0, 6.0]


def test_three_d_input_in_nearest_mode():
    x = lucid.tensor(np.arange(6.0).reshape(1, 2, 3))
    out = F.interpolate(x, scale_factor=2)
    assert out.tolist() == [[[0.0, 0.0, 1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0, 5.0, 5.0]]]
    assert tuple(F.interpolate(x, size=4).shape) == (1, 2, 4)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(scale_factor=2, mode="nearest"),
        dict(size=(3, 7), mode="nearest"),
        dict(size=(5, 2), mode="bilinear"),
        dict(scale_factor=(1.5, 0.5), mode="bilinear"),
        dict(size=(6, 5), mode="bilinear", align_corners=True),
    ],
)
def test_float64_gradients(kwargs):
    x = lucid.tensor(np.random.default_rng(1).standard_normal((2, 2, 4, 4)), requires_grad=True)
    w = lucid.tensor(np.random.default_rng(2).standard_normal(F.interpolate(x, **kwargs).shape))
    gradcheck(lambda t: (F.interpolate(t, **kwargs) * w).sum(), x)
    gradcheck(lambda t: F.interpolate(t, **kwargs).square().sum(), x)


def test_modules():
    x = lucid.randn(1, 2, 3, 3)
    up = lucid.nn.Upsample(scale_factor=2, mode="bilinear")
    np.testing.assert_array_equal(
        up(x).numpy(), F.interpolate(x, scale_factor=2, mode="bilinear").numpy()
    )
    corners = lucid.nn.UpsamplingBilinear2d(size=(5, 5))(x).numpy()
    np.testing.assert_allclose(corners[..., ::2, ::2], x.numpy(), rtol=1e-6)  # corners aligned
    assert tuple(lucid.nn.UpsamplingNearest2d(scale_factor=3)(x).shape) == (1, 2, 9, 9)
    assert "scale_factor=2.0" in repr(up)


def test_bad_arguments_raise_clear_errors():
    x = lucid.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x, size=2, scale_factor=2)
    with pytest.raises(ValueError, match="'bicubic' is not supported"):
        F.interpolate(x, size=2, mode="bicubic")
    with pytest.raises(ValueError, match="align_corners can only be set"):
        F.interpolate(x, size=2, align_corners=True)
    with pytest.raises(ValueError, match="expects a 4-d"):
        F.interpolate(lucid.randn(1, 1, 4), size=2, mode="bilinear")
    with pytest.raises(ValueError, match="gives an empty output"):
        F.interpolate(x, scale_factor=0.1)
    with pytest.raises(ValueError, match="size must be a positive int"):
        F.interpolate(x, size=(0, 2))
    with pytest.raises(TypeError, match="floating point"):
        F.interpolate(lucid.tensor(np.zeros((1, 1, 2, 2), np.int64)), size=3)
    with pytest.raises(ValueError, match="exactly one"):
        lucid.nn.Upsample()


@pytest.mark.parametrize("dtype", [lucid.float32, lucid.float64])
def test_compiled_forward_and_gradients_equal_eager(dtype):
    lucid.manual_seed(0)
    model = lucid.nn.Sequential(
        lucid.nn.Conv2d(2, 3, 3, padding=1, dtype=dtype),
        lucid.nn.Upsample(scale_factor=2, mode="nearest"),
        lucid.nn.Conv2d(3, 3, 1, dtype=dtype),
        lucid.nn.Upsample(size=(5, 11), mode="bilinear"),
        lucid.nn.UpsamplingBilinear2d(scale_factor=1.5),
    )
    x = lucid.randn(2, 2, 4, 4, dtype=dtype)
    tol = 1e-5 if dtype is lucid.float32 else 1e-12
    compiled = lucid.compile(model, strict=True)
    np.testing.assert_allclose(
        compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=tol, atol=tol
    )
    model(x).square().sum().backward()
    want = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    compiled(x).square().sum().backward()
    for p, w in zip(model.parameters(), want, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), w, rtol=tol * 10, atol=tol * 10)
