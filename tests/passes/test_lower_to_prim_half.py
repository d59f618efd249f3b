"""Every registry op in float16 and bfloat16 through ``lower-to-prim``: the samples of
``test_lower_to_prim_ops.py`` with their float32 operands (and float32 dtype attributes) in half
precision, the prim interpreter after lowering vs eager. Seeds (so shapes and values) come from
hypothesis. The default run takes each op's first sample; the others are marked slow."""

from __future__ import annotations

import importlib.util
import pathlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lucid
from lucid.ir import import_trace
from lucid.ir.importer import forward_func
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.passes.lower_to_prim import lower_module
from lucid.trace import trace

_spec = importlib.util.spec_from_file_location(
    "lower_to_prim_samples", pathlib.Path(__file__).parent / "test_lower_to_prim_ops.py"
)
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

# bfloat16 joins once eager Lucid stores it (ml_dtypes' numpy type).
HALF_DTYPES = [
    pytest.param(lucid.float16, id="float16"),
    pytest.param(
        lucid.bfloat16,
        id="bfloat16",
        marks=pytest.mark.skipif(lucid.bfloat16.numpy is None, reason="no eager bfloat16 yet"),
    ),
]
# Relative tolerance: a few units in the last place of each format.
TOLERANCE = {"float16": 1e-2, "bfloat16": 6e-2}


def _to_half(v, half):
    if isinstance(v, np.ndarray) and v.dtype == np.float32:
        return v.astype(half.numpy)
    if isinstance(v, list):
        return [_to_half(e, half) for e in v]
    return v


def half_sample(name: str, i: int, seed: int, half):
    operands, attrs = samples.SAMPLES[name][i](np.random.default_rng(seed))
    attrs = {k: half if v is lucid.float32 else v for k, v in attrs.items()}
    return [_to_half(v, half) for v in operands], attrs


def assert_close_half(got: np.ndarray, want: np.ndarray, half, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype == half.numpy:
        # Both round each op's result once; the float32 steps inside an op may differ.
        tol = TOLERANCE[half.name]
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol,
            equal_nan=True, err_msg=what,
        )  # fmt: skip
    else:
        samples.assert_same(got, want, what)


def _nan_to_num_as_pytorch(arrays: list[np.ndarray], half) -> list[np.ndarray]:
    # torch.nan_to_num replaces infinities by the extremes of the tensor's own dtype (float16's
    # 65504), which a kernel run on the float32-widened values would not give.
    x = arrays[0].astype(np.float32)
    info = ml_dtypes.finfo(half.numpy)
    out = np.where(
        np.isnan(x), 0, np.where(x == np.inf, info.max, np.where(x == -np.inf, info.min, x))
    )
    return [out.astype(half.numpy)]


# Ops whose half results follow PyTorch's documented behaviour rather than eager's kernel.
PYTORCH_REFERENCE = {"nan_to_num": _nan_to_num_as_pytorch}


def _valid_in_float32(name: str, i: int, seed: int) -> bool:
    try:
        samples.build(name, *samples.SAMPLES[name][i](np.random.default_rng(seed)))
    except (IndexError, ValueError, RuntimeError):
        return False
    return True


def _has_float32(name: str, i: int) -> bool:
    operands, attrs = samples.SAMPLES[name][i](np.random.default_rng(0))
    flat = [e for v in operands for e in (v if isinstance(v, list) else [v])]
    return any(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in flat) or any(
        v is lucid.float32 for v in attrs.values()
    )


# The samples with something float32 to turn into half precision.
HALF_CASES = [(n, i) for n, i in samples.CASES if _has_float32(n, i)]


def one_sample_per_op_by_default(cases: list[tuple[str, int]]) -> list:
    """``cases`` as ``name,i`` parameters: each op's first sample in the default run, its
    other samples marked slow (``.ci/run`` runs them after the main suite)."""
    seen: set[str] = set()
    params = []
    for name, i in cases:
        marks = [pytest.mark.slow] if name in seen else []
        seen.add(name)
        params.append(pytest.param(name, i, id=f"{name}-{i}", marks=marks))
    return params


HALF_CASE_PARAMS = one_sample_per_op_by_default(HALF_CASES)


@pytest.mark.parametrize("half", HALF_DTYPES)
@pytest.mark.parametrize("name,i", HALF_CASE_PARAMS)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_op_in_half_lowers_and_matches_eager(name, i, half, seed):
    if not _valid_in_float32(name, i, seed):
        # Some makers' values fit only some seeds (indices that must not be negative): then the
        # seed test_lower_to_prim_ops.py uses.
        seed = 1000 + i + sum(map(ord, name))
    module, arrays, eager = samples.build(name, *half_sample(name, i, seed, half))
    if name in PYTORCH_REFERENCE:
        eager = PYTORCH_REFERENCE[name](arrays, half)
    lower_module(module)
    got = interpret_prim(module, arrays)
    for k, (g, want) in enumerate(zip(got, eager, strict=True)):
        assert_close_half(g, want, half, f"{name} output {k}: prim interpreter vs eager {half}")


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.itemsize}") if a.dtype.kind in "fV" else a


@pytest.mark.parametrize("name,i", HALF_CASE_PARAMS)
def test_narrow_half_keeps_every_bit(name, i):
    # A half prim op is its float32 op plus one rounding: running ops on the half values
    # instead of their float32 casts changes no result bit.
    seed = 1000 + i + sum(map(ord, name))
    module, arrays, _ = samples.build(name, *half_sample(name, i, seed, lucid.float16))
    lower_module(module)
    wide = interpret_prim(module, arrays)
    PassManager("narrow-half").run(module)
    module.verify()
    for k, (got, want) in enumerate(zip(interpret_prim(module, arrays), wide, strict=True)):
        assert got.dtype == want.dtype, (name, k)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} output {k}")


def test_narrow_half_runs_a_half_matmul_directly():
    x = np.ones((2, 3), np.float16)
    w = np.ones((3, 4), np.float16)
    module, arrays, _ = samples.build("matmul", [x, w], {})
    lower_module(module)
    PassManager("narrow-half").run(module)
    names = [op.name for op in forward_func(module).body.blocks.first.ops]
    assert names == ["prim.matmul", "func.return"], names
    (out,) = interpret_prim(module, arrays)
    assert out.dtype == np.float16 and (out == 3).all()


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda a, b: lucid.nn.functional.mse_loss(a, b), id="mse_loss"),
        pytest.param(lambda a, b: lucid.linalg.vector_norm(a), id="vector_norm"),
    ],
)
def test_half_composites_keep_their_intermediates_in_float32(fn):
    # A registry op lowered to several prim ops keeps its intermediates in float32, as eager's
    # kernel does: 300**2 overflows float16, while the op's result fits.
    a = np.full(64, 300.0, np.float16)
    a[::2] = 0
    b = np.zeros(64, np.float16)
    module = import_trace(trace(fn, lucid.tensor(a), lucid.tensor(b)))
    lower_module(module)
    (got,) = interpret_prim(module, [a, b])
    want = fn(lucid.tensor(a.astype(np.float32)), lucid.tensor(b.astype(np.float32))).numpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(float(got), float(want), rtol=2e-3)
