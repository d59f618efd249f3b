"""Batches of small GEMMs and large softmaxes are split across the native thread pool: results
must match the numpy reference and be bit-identical to one thread's, whatever the split."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lucid.backends.cpu import (
    CPUBackend,
    Program,
    get_num_threads,
    set_num_threads,
)
from lucid.backends.cpu.testing import assert_match, random_array
from lucid.ir.prim import dtype_of

SEEDS = st.integers(0, 2**32 - 1)


pytestmark = pytest.mark.usefixtures("fixed_threads")


@pytest.fixture
def restore_threads():
    n = get_num_threads()
    yield
    set_num_threads(n)


def run_threads(name, arrays, attrs, threads=(1, 2, 3)):
    """The op's reference result and its native result at each thread count."""
    p = Program()
    slots = [p.feed(a.shape, dtype_of(a)) for a in arrays]
    p.result(p.op(name, *slots, **attrs))
    ref = p.interpret(arrays)[0]
    outs, before = [], get_num_threads()
    try:
        for n in threads:
            set_num_threads(n)
            outs.append(CPUBackend(cache=False).compile(p).run(arrays)[0])
    finally:
        set_num_threads(before)
    return ref, outs


def check_split(name, arrays, attrs, scale=10.0, exact=True):
    ref, outs = run_threads(name, arrays, attrs)
    for out in outs[1 if exact else len(outs) :]:
        np.testing.assert_array_equal(out, outs[0])
    for out in outs:
        assert_match(out, ref, scale)


# OpenBLAS threads a GEMM of more multiply-adds than this itself (interface/gemm.c), and its
# split of N changes which columns its edge kernels compute: bit-identical only below it.
BLAS_SINGLE_THREAD_MACS = 65536 * 4


def one_blas_call_threaded_by_blas(a_shape, b_shape, ta) -> bool:
    """True when the runtime runs the batch as one GEMM with the batch folded into M (only the
    left operand batched) and that GEMM is large enough for OpenBLAS to split it."""
    if ta or int(np.prod(b_shape[:-2])) != 1:
        return False
    m_total, k = int(np.prod(a_shape[:-1])), a_shape[-1]
    return m_total * k * b_shape[-1] > BLAS_SINGLE_THREAD_MACS


# Attention's products in workload D: (batch, heads, seq, head_dim), both operands batched.
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("tb", [True, False])
def test_attention_shaped_batches(restore_threads, dtype, tb):
    rng = np.random.default_rng(0)
    q = random_array(rng, (16, 4, 64, 32), dtype)
    k = random_array(rng, (16, 4, 64, 32) if tb else (16, 4, 32, 64), dtype)
    check_split("matmul", [q, k], {"transpose_a": False, "transpose_b": tb})


@st.composite
def small_batched_case(draw):
    m, n, k = (draw(st.integers(1, 40)) for _ in range(3))
    batch = draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=12)
    )
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = (*batch.input_shapes[0], *((k, m) if ta else (m, k)))
    b = (*batch.input_shapes[1], *((n, k) if tb else (k, n)))
    return a, b, ta, tb


@settings(max_examples=25, deadline=None)
@given(case=small_batched_case(), dtype=st.sampled_from(["f32", "f64"]), seed=SEEDS)
def test_broadcast_batches_with_transposes(case, dtype, seed):
    a_shape, b_shape, ta, tb = case
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, a_shape, dtype), random_array(rng, b_shape, dtype)
    exact = not one_blas_call_threaded_by_blas(a_shape, b_shape, ta)
    check_split("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb}, exact=exact)


def test_gradient_shaped_batch_with_transposed_left(restore_threads):
    # dK = dS^T @ Q in attention's backward: transpose_a over a batch of 64.
    rng = np.random.default_rng(1)
    ds = random_array(rng, (16, 4, 64, 64), "f32")
    q = random_array(rng, (16, 4, 64, 32), "f32")
    check_split("matmul", [ds, q], {"transpose_a": True, "transpose_b": False})


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape", [(16, 4, 64, 64), (3, 40000), (70000, 1)])
def test_large_softmax_rows_split(restore_threads, name, dtype, shape):
    rng = np.random.default_rng(2)
    x = random_array(rng, shape, dtype) * 10
    x.reshape(-1)[::997] = np.inf if dtype == "f32" else -np.inf
    x.reshape(-1)[5] = np.nan
    check_split(name, [x], {"axis": -1})


def test_concurrent_runs_of_split_batches_are_independent(restore_threads):
    import threading

    set_num_threads(2)
    p = Program()
    a, b = p.feed((32, 64, 32)), p.feed((32, 32, 64))
    p.result(p.op("matmul", a, b, transpose_a=False, transpose_b=False))
    ex = CPUBackend(cache=False).compile(p)
    rng = np.random.default_rng(3)
    inputs = [
        [random_array(rng, (32, 64, 32), "f32"), random_array(rng, (32, 32, 64), "f32")]
        for _ in range(4)
    ]
    expected = [ex.run(f)[0] for f in inputs]
    got: dict = {}

    def worker(i):
        got[i] = [ex.run(inputs[i])[0] for _ in range(5)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i in range(4):
        assert len(got[i]) == 5
        for out in got[i]:
            np.testing.assert_array_equal(out, expected[i])


@pytest.mark.parametrize("mode", ["auto", "lucid"])
def test_entries_lucids_sgemm_takes_are_not_sent_to_the_blas_by_the_split(restore_threads, mode):
    # 64x64x64 is 2**18 multiply-adds: Lucid's sgemm takes it (auto mode's smallest product),
    # while the batch split handles up to 2**18; 7x27x260 goes to Lucid's sgemm in "lucid"
    # mode only. Sent to the BLAS by the split, an entry summed in another order than one
    # thread's loop did (a half GEMM test found one bf16 result one unit apart at 2 threads).
    from lucid import _native

    before = _native.sgemm_mode()
    _native.set_sgemm_mode(mode)
    try:
        rng = np.random.default_rng(5)
        for m, n, k in ((64, 64, 64), (7, 27, 260)):
            a = rng.standard_normal((4, m, k)).astype(np.float32)
            b = rng.standard_normal((4, k, n)).astype(np.float32)
            check_split("matmul", [a, b], {}, scale=float(k))
    finally:
        _native.set_sgemm_mode(before)
