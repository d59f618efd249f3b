"""float16 and bfloat16 in eager Lucid, with PyTorch's CPU semantics as the contract.

PyTorch's CPU kernels compute half-precision ops in float32 and round the result once
(``at::opmath_type``): sums, means, softmax, norms and matmul accumulate in float32. Every registry
op is checked against that reference: the op run on float32 copies of the half inputs, rounded to
the half format. Separate tests pin the cases where numpy's own float16 arithmetic (which rounds
every partial sum) differs materially.
"""

from __future__ import annotations

import importlib.util
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._registry import RANDOM, REGISTRY

# The lowering tests' half module: its sample table (SAMPLES) and how the default run picks
# samples (each op's first; the others under slow).
_half_spec = importlib.util.spec_from_file_location(
    "lowering_half",
    os.path.join(os.path.dirname(__file__), "..", "passes", "test_lower_to_prim_half.py"),
)
_half = importlib.util.module_from_spec(_half_spec)
_half_spec.loader.exec_module(_half)
SAMPLES = _half.samples.SAMPLES

HALF = {"float16": lucid.float16, "bfloat16": lucid.bfloat16}
CASES = [(n, i) for n in sorted(SAMPLES) for i in range(len(SAMPLES[n]))]
CASE_PARAMS = _half.one_sample_per_op_by_default(CASES)


def _to_half(v, dt):
    """float32 arrays rounded to ``dt`` (other operands unchanged); also the float32 copy."""
    if isinstance(v, list):
        pairs = [_to_half(e, dt) for e in v]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(v, np.ndarray) and v.dtype == np.float32:
        h = v.astype(dt.numpy)
        return Tensor._wrap(h), Tensor._wrap(h.astype(np.float32))
    if isinstance(v, np.ndarray):
        return Tensor._wrap(v), Tensor._wrap(v.copy())
    return v, v


def _outputs(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("dtype_name", sorted(HALF))
@pytest.mark.parametrize("name,i", CASE_PARAMS)
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_registry_op_in_half_matches_float32_rounded_once(name, i, dtype_name, seed):
    dt = HALF[dtype_name]
    operands, attrs = SAMPLES[name][i](np.random.default_rng(seed))
    pairs = [_to_half(v, dt) for v in operands]
    half_in = [p[0] for p in pairs]
    f32_in = [p[1] for p in pairs]
    opdef = REGISTRY[name]
    if opdef.resolve_attrs is not None:  # defaults of the half format (its limits, its eps)
        attrs = opdef.resolve_attrs(half_in, opdef.bind_attrs(attrs))
    try:
        want = _outputs(apply(name, *f32_in, **attrs))
    except (ValueError, IndexError, TypeError, RuntimeError, np.linalg.LinAlgError):
        return  # rounding made the sample invalid (e.g. a singular matrix): nothing to compare
    got = _outputs(apply(name, *half_in, **attrs))
    converted = any(
        isinstance(v, np.ndarray) and v.dtype == np.float32
        for op in operands
        for v in (op if isinstance(op, list) else [op])
    )
    names_a_dtype = any(isinstance(a, lucid.dtype) for a in attrs.values())
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (name, k)
        if w.dtype is lucid.float32 and converted and not names_a_dtype:
            # PyTorch's promotion: half inputs give a half result.
            assert g.dtype is dt, (name, k, g.dtype)
        else:
            assert g.dtype is w.dtype or (w.dtype is lucid.float32 and g.dtype is dt), (name, k)
        if RANDOM in REGISTRY[name].props:
            continue
        if g.dtype is dt:
            with np.errstate(over="ignore"):
                ref = w.numpy().astype(dt.numpy).astype(np.float32)
            eps = lucid.finfo(dt).eps
            np.testing.assert_allclose(
                g.numpy().astype(np.float32),
                ref,
                rtol=eps,
                atol=eps,
                equal_nan=True,
                err_msg=f"{name} output {k} in {dt}",
            )
        elif g.dtype.is_floating_point:
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            np.testing.assert_array_equal(g.numpy(), w.numpy())


# --- where numpy's float16 arithmetic differs from PyTorch's


@pytest.mark.parametrize("dt", [lucid.float16, lucid.bfloat16])
def test_sums_accumulate_in_float32(dt):
    # 4096 ones: a half accumulator stops at 2048 (float16) or 256 (bfloat16).
    ones = lucid.ones(4096, dtype=dt)
    assert ones.sum().item() == 4096.0
    assert ones.cumsum(0)[-1].item() == 4096.0
    assert ones.mean().item() == 1.0
    assert (lucid.ones(1, 4096, dtype=dt) @ lucid.ones(4096, 1, dtype=dt)).item() == 4096.0
    assert (
        nn.functional.linear(lucid.ones(1, 4096, dtype=dt), lucid.ones(1, 4096, dtype=dt)).item()
        == 4096.0
    )


def test_numpy_float16_cumsum_would_lose_the_count():
    # The reason for the float32 compute: numpy's own float16 running sum stalls.
    assert np.cumsum(np.ones(4096, np.float16))[-1] == 2048


@pytest.mark.parametrize("dt", [lucid.float16, lucid.bfloat16])
def test_softmax_and_layer_norm_of_half_inputs(dt):
    x = lucid.tensor([[100.0, 101.0, 99.0]]).to(dt)  # exact in both formats
    p = lucid.softmax(x, dim=-1)
    assert p.dtype is dt
    want = np.exp([-1.0, 0.0, -2.0]) / np.exp([-1.0, 0.0, -2.0]).sum()
    np.testing.assert_allclose(p.float().numpy()[0], want, rtol=lucid.finfo(dt).eps)
    y = nn.functional.layer_norm(x, (3,))
    assert y.dtype is dt
    np.testing.assert_allclose(
        y.float().numpy()[0], [0.0, 1.2247, -1.2247], atol=4 * lucid.finfo(dt).eps
    )


@pytest.mark.parametrize("dt", [lucid.float16, lucid.bfloat16])
def test_dtype_dependent_defaults_use_the_half_format(dt):
    info = lucid.finfo(dt)
    x = lucid.tensor([float("inf"), -float("inf"), float("nan"), 1.0]).to(dt)
    assert lucid.nan_to_num(x).float().tolist() == [info.max, info.min, 0.0, 1.0]
    # The registry op resolves them itself (compiled code and any caller of apply agree).
    assert apply("nan_to_num", x).float().tolist() == [info.max, info.min, 0.0, 1.0]
    assert apply("nan_to_num", x, posinf=2.0).float().tolist() == [2.0, info.min, 0.0, 1.0]
    # rms_norm's eps defaults to the input dtype's machine epsilon, as torch.
    z = nn.functional.rms_norm(lucid.zeros(1, 4, dtype=dt) + 0.03125, (4,))
    want = 0.03125 / np.sqrt(0.03125**2 + info.eps)
    np.testing.assert_allclose(z.float().numpy(), want, rtol=2 * info.eps)


def test_overflow_rounds_to_inf_and_subnormals_survive():
    big = lucid.tensor([60000.0]).half()
    assert np.isinf((big * 2).item())
    tiny = lucid.tensor([2.0**-24]).half()  # the smallest float16 subnormal
    assert (tiny * 1).item() == 2.0**-24
    assert (lucid.tensor([3e38]).bfloat16() * 10).isinf().item()


# --- type promotion as PyTorch


def test_promotion_between_half_types_and_scalars():
    h = lucid.ones(2, dtype=lucid.float16)
    b = lucid.ones(2, dtype=lucid.bfloat16)
    assert (h + b).dtype is lucid.float32
    assert (b * 2.5).dtype is lucid.bfloat16  # a Python scalar does not promote
    assert (h + 1).dtype is lucid.float16
    assert (b + lucid.tensor(1.0)).dtype is lucid.bfloat16  # 0-d float32 tensor: same category
    assert (lucid.ones(2, dtype=lucid.int64) + lucid.tensor(1.0).bfloat16()).dtype is lucid.bfloat16
    assert (b + lucid.ones(2)).dtype is lucid.float32
    assert (h + lucid.ones(2, dtype=lucid.float64)).dtype is lucid.float64
    assert lucid.where(lucid.tensor([True, False]), h, b).dtype is lucid.float32
    assert lucid.cat([h, b]).dtype is lucid.float32


def test_half_values_read_back_as_python_floats():
    b = lucid.tensor([1.5, -2.25]).bfloat16()
    assert b.tolist() == [1.5, -2.25] and all(type(v) is float for v in b.tolist())
    assert type(b[0].item()) is float and b[0].item() == 1.5
    assert "dtype=lucid.bfloat16" in repr(b)


@pytest.mark.parametrize("dt", [lucid.float16, lucid.bfloat16])
def test_gradients_of_half_leaves_are_half(dt):
    w = lucid.randn(3, 4).to(dt).requires_grad_()
    x = lucid.randn(2, 3).to(dt)
    (x @ w).tanh().sum().backward()
    assert w.grad.dtype is dt
    w32 = lucid.tensor(w.detach().float().numpy(), requires_grad=True)
    (x.float() @ w32).tanh().sum().backward()
    np.testing.assert_allclose(
        w.grad.float().numpy(), w32.grad.numpy(), rtol=0.05, atol=4 * lucid.finfo(dt).eps
    )


# --- the tensor and module API


def test_tensor_conversions():
    x = lucid.randn(3)
    assert x.half().dtype is lucid.float16
    assert x.bfloat16().dtype is lucid.bfloat16
    assert x.to(lucid.bfloat16).dtype is lucid.bfloat16
    assert x.to("bfloat16").dtype is lucid.bfloat16
    assert x.to(dtype=lucid.half).dtype is lucid.float16
    assert x.type(lucid.BFloat16Tensor).dtype is lucid.bfloat16
    assert x.bfloat16().type() == "lucid.BFloat16Tensor"
    np.testing.assert_array_equal(
        x.bfloat16().numpy(), x.numpy().astype(ml_dtypes.bfloat16)
    )  # round to nearest even, as torch


@pytest.mark.parametrize("method,dt", [("half", lucid.float16), ("bfloat16", lucid.bfloat16)])
def test_module_casts_floating_parameters_and_buffers_only(method, dt):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    weight = model[0].weight
    out = getattr(model, method)()
    assert out is model and model[0].weight is weight  # cast in place, same Parameter
    assert {p.dtype for p in model.parameters()} == {dt}
    bn = model[1]
    assert bn.running_mean.dtype is dt and bn.running_var.dtype is dt
    assert bn.num_batches_tracked.dtype is lucid.int64  # not floating: untouched
    assert model.to(lucid.float32)[0].weight.dtype is lucid.float32
    assert model.to(dt)[0].bias.dtype is dt
    y = model.train()(lucid.randn(5, 3).to(dt))
    assert y.dtype is dt


def test_set_default_dtype():
    assert lucid.get_default_dtype() is lucid.float32
    try:
        lucid.set_default_dtype(lucid.bfloat16)
        assert lucid.get_default_dtype() is lucid.bfloat16
        assert lucid.tensor([1.0]).dtype is lucid.bfloat16
        assert lucid.zeros(2).dtype is lucid.bfloat16
        assert lucid.randn(2).dtype is lucid.bfloat16
        assert nn.Linear(2, 2).weight.dtype is lucid.bfloat16
        assert (lucid.ones(2, dtype=lucid.int64) * 0.5).dtype is lucid.bfloat16
        lucid.set_default_dtype(lucid.float64)
        assert lucid.tensor([1.0]).dtype is lucid.float64
        with pytest.raises(TypeError, match="floating"):
            lucid.set_default_dtype(lucid.int32)
    finally:
        lucid.set_default_dtype(lucid.float32)
    assert lucid.tensor([1.0]).dtype is lucid.float32


def test_finfo_has_torchs_fields_and_values():
    # torch.finfo's values (https://pytorch.org/docs/stable/type_info.html).
    f16 = lucid.finfo(lucid.float16)
    assert (f16.bits, f16.eps, f16.max, f16.min) == (16, 2.0**-10, 65504.0, -65504.0)
    assert f16.tiny == f16.smallest_normal == 2.0**-14 and f16.resolution == 0.001
    bf16 = lucid.finfo(lucid.bfloat16)
    assert (bf16.bits, bf16.eps, bf16.tiny, bf16.resolution) == (16, 2.0**-7, 2.0**-126, 0.01)
    assert bf16.max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max) == -bf16.min
    assert bf16.smallest_normal == 2.0**-126
    f32 = lucid.finfo(lucid.float32)
    assert (f32.bits, f32.eps, f32.resolution) == (32, 2.0**-23, 1e-6)
    assert lucid.finfo().bits == 32
    with pytest.raises(TypeError, match="floating"):
        lucid.finfo(lucid.int32)
