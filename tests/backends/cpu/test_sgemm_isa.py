"""The two micro-kernels of Lucid's GEMM (native/src/sgemm.cpp): the AVX-512 tile where the CPU
has AVX-512, the AVX2 tile elsewhere or when forced. Both sum each element's products in the
same contraction blocks, in order, one FMA each, so they give the same bits: float32 products
over odd shapes, edges, transposes, row strides, alpha/beta, every epilogue and K beyond one
block; half GEMMs; compiled programs with a shared packed weight; at one and two threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import CPUBackend, set_num_threads
from lucid.backends.cpu.testing import sgemm_isa as _isa
from lucid.ir.prim import HALF, NUMPY_DTYPES
from tests.backends.cpu.test_gemm_shared_pack import _recurrent_program
from tests.backends.cpu.test_half_gemm import _bits, _lucid_sgemm, _random, native_kernel
from tests.backends.cpu.test_sgemm import _problem

pytestmark = [
    pytest.mark.usefixtures("fixed_threads"),
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
]


def _cpu_has_avx512() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return False
    flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    return {"avx512f", "avx512vl", "avx512dq"} <= set(flags.split())


def _on_each_isa(call):
    """call() on the AVX-512 kernel at every width (where the CPU has it) and on the AVX2 one."""
    with _isa("avx512"):
        best = call()
    with _isa("avx2"):
        avx2 = call()
    return best, avx2


def _product(a, b, c0, **kw) -> np.ndarray:
    """Lucid's sgemm into a copy of c0."""
    c = c0.copy()
    _native.sgemm(a, b, c, kernel="lucid", **kw)
    return c


def test_the_cpu_features_pick_the_kernel_and_avx2_can_be_forced():
    assert _native.sgemm_isa() == ("avx512" if _cpu_has_avx512() else "avx2")
    with _isa("avx2"):
        assert _native.sgemm_isa() == "avx2"
    assert _native.sgemm_isa() == ("avx512" if _cpu_has_avx512() else "avx2")
    with pytest.raises(ValueError, match="isa must be"):
        _native.set_sgemm_isa("sse")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 70),
    n=st.integers(1, 140),
    k=st.sampled_from([1, 7, 64, 255, 256, 257, 600]),
    ta=st.booleans(),
    tb=st.booleans(),
    pad=st.sampled_from([0, 3]),
    alpha=st.sampled_from([1.0, 0.5]),
    beta=st.sampled_from([0.0, 1.0, -0.75]),
    with_bias=st.booleans(),
    with_addend=st.booleans(),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    seed=st.integers(0, 2**16),
)
def test_both_kernels_give_the_same_bits(
    m, n, k, ta, tb, pad, alpha, beta, with_bias, with_addend, activation, seed
):
    rng = np.random.default_rng(seed)
    a, b, c0, bias, addend = _problem(rng, m, n, k, ta, tb, pad, with_bias, with_addend)

    kw = dict(transpose_a=ta, transpose_b=tb, alpha=alpha, beta=beta, bias=bias, addend=addend)
    best, avx2 = _on_each_isa(lambda: _product(a, b, c0, activation=activation, **kw))
    np.testing.assert_array_equal(_bits(best), _bits(avx2))


@pytest.mark.parametrize(
    "m,n,k,ta,tb",
    [(512, 512, 512, False, False), (16, 700, 300, False, True), (301, 97, 513, True, False)],
)
def test_both_kernels_give_the_same_bits_at_one_and_two_threads(m, n, k, ta, tb):
    rng = np.random.default_rng(7)
    a, b, c0, bias, addend = _problem(rng, m, n, k, ta, tb, 0, True, True)
    outs = []
    for threads in (1, 2):
        set_num_threads(threads)
        for isa in ("auto", "avx512", "avx2"):
            with _isa(isa):
                kw = dict(transpose_a=ta, transpose_b=tb, beta=0.5, bias=bias, addend=addend)
                outs.append(_product(a, b, c0, activation="gelu", **kw))
    for c in outs[1:]:
        np.testing.assert_array_equal(_bits(c), _bits(outs[0]))


@native_kernel
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 90),
    k=st.sampled_from([3, 100, 300]),
    ta=st.booleans(),
    tb=st.booleans(),
    a_type=st.sampled_from(("f32", "f16", "bf16")),
    b_type=st.sampled_from(("f32", "f16", "bf16")),
    c_type=st.sampled_from(("f32", "f16", "bf16")),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    seed=st.integers(0, 2**16),
)
def test_half_gemms_give_the_same_bits_on_both_kernels(
    m, n, k, ta, tb, a_type, b_type, c_type, activation, seed
):
    rng = np.random.default_rng(seed)
    a = _random(rng, (k, m) if ta else (m, k), a_type)
    b = _random(rng, (n, k) if tb else (k, n), b_type)
    bias = _random(rng, (n,), "f32")
    round_product = {"round_product": c_type} if c_type in HALF else {}

    def call():
        c = np.zeros((m, n), NUMPY_DTYPES[c_type])
        _native.gemm_mixed(
            a,
            b,
            c,
            transpose_a=ta,
            transpose_b=tb,
            alpha=0.5,
            bias=bias,
            activation=activation,
            **round_product,
        )
        return c

    best, avx2 = _on_each_isa(call)
    np.testing.assert_array_equal(_bits(best), _bits(avx2))


@native_kernel
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_program_with_a_shared_packed_weight_gives_the_same_bits_on_both_kernels(dtype):
    p = _recurrent_program(dtype)
    rng = np.random.default_rng(11)
    feeds = [_random(rng, p.slots[s].shape, p.slots[s].dtype) for s in p.feeds]
    with _lucid_sgemm():
        ex = CPUBackend(cache=False).compile(p)
        best, avx2 = _on_each_isa(lambda: ex.run([f.copy() for f in feeds])[0])
    np.testing.assert_array_equal(_bits(best), _bits(avx2))
    (reference,) = p.interpret([f.copy() for f in feeds])  # float32 sums in another order
    np.testing.assert_allclose(best, reference, rtol=1e-4, atol=1e-4)
