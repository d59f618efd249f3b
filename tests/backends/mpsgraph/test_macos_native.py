"""The real MPSGraph backend on a Mac: the zoo compiled natively, compared with the reference
builder and with eager, and the time of a cache hit. Runs only on macOS with Metal and the native
MPSGraph part built; skipped elsewhere with the reason. Run it with::

    .venv/bin/python -m pytest tests/backends/mpsgraph/test_macos_native.py -v -rs
"""

from __future__ import annotations

import importlib.util
import pathlib
import time

import numpy as np
import pytest

from lucid.backends.mpsgraph.backend import MPSGraphBackend, MPSGraphReferenceBackend
from lucid.backends.mpsgraph.native import NativeBuilder, native_status

_ok, _reason = native_status()
pytestmark = pytest.mark.skipif(not _ok, reason=f"needs the native MPSGraph backend: {_reason}")

_spec = importlib.util.spec_from_file_location(
    "mpsgraph_zoo_native", pathlib.Path(__file__).with_name("_zoo.py")
)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

# MPSGraph may run float32 math with reduced-precision paths; calibrate on real hardware.
TOL = {"rtol": 2e-3, "atol": 2e-4}


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_native_zoo_matches_reference_and_eager(name, train):
    eager, native, model, twin = zoo.eager_and_compiled(MPSGraphBackend(), name, train)
    _, reference, _, _ = zoo.eager_and_compiled(MPSGraphReferenceBackend(), name, train)
    for n, r, e in zip(native, reference, eager, strict=True):
        np.testing.assert_allclose(n, r, **TOL)
        np.testing.assert_allclose(n, e, **TOL)
    for k, v in zoo.buffers(model).items():
        np.testing.assert_allclose(zoo.buffers(twin)[k], v, **TOL, err_msg=k)


def test_a_cache_hit_is_much_faster_than_a_compile():
    make, inputs = zoo.zoo()["cnn"]
    model = make()
    model.eval()
    x = [zoo.Tensor._wrap(a) for a in inputs(np.random.default_rng(0))]
    module, _ = zoo.lowered(model, model, x)
    program, _ = MPSGraphReferenceBackend().record(module)
    t0 = time.perf_counter()
    NativeBuilder().compile(program, cache=True)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    NativeBuilder().compile(program, cache=True)
    hit = time.perf_counter() - t0
    print(f"MPSGraph compile {first * 1e3:.1f} ms, cache hit {hit * 1e3:.3f} ms")
    assert hit < first / 10


def test_native_index_error_and_random_stream():
    zoo.check_index_error_and_random_stream(MPSGraphBackend())


def test_lucid_compile_on_mpsgraph_matches_the_reference_and_eager():
    zoo.compare_backends("mpsgraph", "mpsgraph-reference", TOL)
