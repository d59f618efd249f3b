"""conv_transpose2d / nn.ConvTranspose2d against a direct numpy reference of PyTorch's
definition (every input pixel scatters weight * value to ``i * stride - padding + k * dilation``),
hypothesis over stride/padding/output_padding/dilation/groups, float64 gradchecks, the
output_size rule, bad arguments, and compiled == eager (forward and gradients)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.testing import gradcheck


def reference(x, w, b, stride, padding, output_padding, groups, dilation):
    n, c_in, h, wd = x.shape
    _, c_out_g, kh, kw = w.shape
    sizes = [
        (size - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + output_padding[i] + 1
        for i, (size, k) in enumerate(((h, kh), (wd, kw)))
    ]
    out = np.zeros((n, c_out_g * groups, *sizes))
    c_in_g = c_in // groups
    for ci in range(c_in):
        g = ci // c_in_g
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for c in range(kw):
                        y = i * stride[0] - padding[0] + a * dilation[0]
                        z = j * stride[1] - padding[1] + c * dilation[1]
                        if 0 <= y < sizes[0] and 0 <= z < sizes[1]:
                            out[:, g * c_out_g : (g + 1) * c_out_g, y, z] += (
                                x[:, ci, i, j, None] * w[ci, :, a, c]
                            )
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


@st.composite
def configs(draw):
    groups = draw(st.integers(1, 2))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    output_padding = tuple(
        draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)
    )
    hw = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    for i in range(2):
        out = (hw[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
        if out + output_padding[i] + 1 < 1:
            padding = (0, padding[1]) if i == 0 else (padding[0], 0)
    c_in, c_out = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    bias = draw(st.booleans())
    return dict(
        x_shape=(2, c_in, *hw),
        w_shape=(c_in, c_out // groups, *kernel),
        bias=bias,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        groups=groups,
        dilation=dilation,
    )


def _arrays(cfg, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(cfg["x_shape"])
    w = rng.standard_normal(cfg["w_shape"])
    b = rng.standard_normal(cfg["w_shape"][1] * cfg["groups"]) if cfg["bias"] else None
    return x, w, b


def _attrs(cfg):
    keys = ("stride", "padding", "output_padding", "groups", "dilation")
    return {k: cfg[k] for k in keys}


@settings(max_examples=40, deadline=None)
@given(cfg=configs())
def test_matches_pytorchs_definition(cfg):
    x, w, b = _arrays(cfg)
    got = F.conv_transpose2d(
        lucid.tensor(x), lucid.tensor(w), None if b is None else lucid.tensor(b), **_attrs(cfg)
    )
    np.testing.assert_allclose(got.numpy(), reference(x, w, b, **_attrs(cfg)), atol=1e-12)


@pytest.mark.parametrize(
    "attrs",
    [
        dict(stride=2, padding=1, output_padding=1),
        dict(stride=(3, 2), padding=(0, 2), output_padding=(2, 1), groups=2, dilation=(1, 2)),
        dict(stride=1, padding=0, output_padding=(1, 0), dilation=2),  # output_padding > padding
    ],
)
def test_float64_gradients(attrs):
    rng = np.random.default_rng(1)
    groups = attrs.get("groups", 1)
    x = lucid.tensor(rng.standard_normal((2, 2 * groups, 3, 3)), requires_grad=True)
    w = lucid.tensor(rng.standard_normal((2 * groups, 2, 2, 3)), requires_grad=True)
    b = lucid.tensor(rng.standard_normal(2 * groups), requires_grad=True)
    gradcheck(lambda x, w, b: F.conv_transpose2d(x, w, b, **attrs), x, w, b)


def test_module_shapes_parameters_and_output_size():
    lucid.manual_seed(0)
    m = lucid.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)
    assert tuple(m.weight.shape) == (4, 3, 3, 3) and tuple(m.bias.shape) == (6,)
    bound = 1 / np.sqrt(3 * 9)  # PyTorch's: fan_in from the (in, out/groups, kh, kw) weight
    assert np.abs(m.bias.numpy()).max() <= bound
    x = lucid.randn(2, 4, 5, 5)
    assert tuple(m(x).shape) == (2, 6, 9, 9)
    assert tuple(m(x, output_size=(10, 9)).shape) == (2, 6, 10, 9)
    assert tuple(m(x, output_size=[2, 6, 10, 10]).shape) == (2, 6, 10, 10)
    assert tuple(m(x[0]).shape) == (6, 9, 9)  # unbatched
    with pytest.raises(ValueError, match="valid sizes range from 9 to 10"):
        m(x, output_size=(11, 9))
    want = reference(
        x.numpy().astype(np.float64),
        m.weight.numpy().astype(np.float64),
        m.bias.numpy().astype(np.float64),
        stride=(2, 2),
        padding=(1, 1),
        output_padding=(1, 0),
        groups=2,
        dilation=(1, 1),
    )
    np.testing.assert_allclose(
        m(x, output_size=(10, 9)).detach().numpy(), want, rtol=1e-5, atol=1e-5
    )
    assert "output_padding" not in repr(m) and "groups=2" in repr(m)


def test_bad_arguments_raise_clear_errors():
    x, w = lucid.randn(1, 4, 3, 3), lucid.randn(4, 2, 3, 3)
    with pytest.raises(ValueError, match="output_padding .* must be smaller than either stride"):
        F.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="input has 3 channels but weight expects 4"):
        F.conv_transpose2d(lucid.randn(1, 3, 3, 3), w)
    with pytest.raises(ValueError, match="not divisible by groups"):
        F.conv_transpose2d(x, w, groups=3)
    with pytest.raises(ValueError, match="is not positive"):
        F.conv_transpose2d(x, w, padding=3)
    with pytest.raises(ValueError, match="bias must have shape"):
        F.conv_transpose2d(x, w, lucid.randn(3))
    with pytest.raises(ValueError, match="in_channels .* must be divisible by groups"):
        lucid.nn.ConvTranspose2d(3, 4, 2, groups=2)
    with pytest.raises(ValueError, match="output_padding"):
        lucid.nn.ConvTranspose2d(2, 2, 2, stride=1, output_padding=1)


@pytest.mark.parametrize("dtype", [lucid.float32, lucid.float64])
def test_compiled_forward_and_gradients_equal_eager(dtype):
    lucid.manual_seed(3)
    model = lucid.nn.Sequential(
        lucid.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1, dtype=dtype),
        lucid.nn.ReLU(),
        lucid.nn.ConvTranspose2d(4, 2, 2, stride=(1, 2), padding=0, output_padding=(0, 1),
                                 dilation=(2, 1), dtype=dtype),
    )  # fmt: skip
    x = lucid.randn(2, 3, 4, 5, dtype=dtype)
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
