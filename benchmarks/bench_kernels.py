"""Kernel-level benchmark of the native CPU runtime against numpy doing the same work.

Each case compiles a small prim program (cached executable, fused as the CPU backend does) and
times ``executable.run(feeds)`` against a numpy function computing the same result, interleaved
round by round in one process so machine noise hits both alike. Reported: median time per call,
the ratio native/numpy, and the target where one exists (matmul and conv within 1.2x of numpy,
a fused elementwise chain faster than numpy's separate calls).

Threading: both BLAS copies (numpy's and the native module's) get ``--threads`` threads through
OPENBLAS_NUM_THREADS, and OPENBLAS_THREAD_TIMEOUT is set low so one idle pool does not spin
against the other (see docs/backend-cpu.md). Usage::

    python benchmarks/bench_kernels.py [--threads 1] [--rounds 15] [--json out.json] [--quick]

``--sgemm`` times Lucid's float32 GEMM (native/src/sgemm.cpp) against the native module's own
BLAS (``scipy-openblas32``) on the GEMM shapes of workloads A, B and D (forward and backward),
interleaved, at a fixed thread count (the adaptive thread policy off): median and range.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke test")
    ap.add_argument(
        "--sgemm",
        action="store_true",
        help="instead: Lucid's float32 GEMM against the BLAS on the workloads' shapes",
    )
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # Must happen before numpy or the native module load their BLAS.
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "1")

import numpy as np  # noqa: E402

from lucid import _native  # noqa: E402
from lucid.backends.cpu import (  # noqa: E402
    CPUBackend,
    Program,
    set_adaptive_threads,
    set_num_threads,
)


def _timed(fn, min_time: float = 0.02) -> float:
    """Seconds per call of fn, from a batch of calls lasting about min_time."""
    fn()
    n, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / n
        n *= 2 if elapsed < min_time / 4 else 1
        n = max(n, int(n * min_time / max(elapsed, 1e-9)))


def compare(native, reference, rounds: int) -> tuple[float, float]:
    """Median seconds per call of each, measured in alternating rounds."""
    a, b = [], []
    for _ in range(rounds):
        a.append(_timed(native))
        b.append(_timed(reference))
    return float(np.median(a)), float(np.median(b))


def _compile(build):
    p = Program()
    build(p)
    return CPUBackend().compile(p)


def case_matmul(m, k, n):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    ex = _compile(lambda p: p.result(p.op("matmul", p.feed((m, k)), p.feed((k, n)))))
    np.testing.assert_allclose(ex.run([a, b])[0], a @ b, rtol=1e-3, atol=1e-3)
    return (lambda: ex.run([a, b])), (lambda: a @ b)


def numpy_conv2d(x, w, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * kh * kw)  # im2col copy
    out = cols @ w.reshape(o, -1).T
    return np.ascontiguousarray(out.reshape(n, h, wd, o).transpose(0, 3, 1, 2))


def case_conv(n, c, o, size):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, size, size)).astype(np.float32)
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)

    def build(p):
        p.result(p.op("conv2d", p.feed(x.shape), p.feed(w.shape), padding=(1, 1, 1, 1)))

    ex = _compile(build)
    np.testing.assert_allclose(ex.run([x, w])[0], numpy_conv2d(x, w, 1), rtol=1e-3, atol=1e-3)
    return (lambda: ex.run([x, w])), (lambda: numpy_conv2d(x, w, 1))


def case_softmax(rows, cols):
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    ex = _compile(lambda p: p.result(p.op("softmax", p.feed(x.shape), axis=-1)))

    def reference():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    np.testing.assert_allclose(ex.run([x])[0], reference(), rtol=1e-4, atol=1e-6)
    return (lambda: ex.run([x])), reference


def case_layer_norm(rows, cols):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    g, b = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))

    def build(p):
        xs, gs, bs = p.feed(x.shape), p.feed((cols,)), p.feed((cols,))
        mean = p.op("reduce_mean", xs, axes=[-1], keepdims=True)
        var = p.op("variance", xs, axes=[-1], keepdims=True)
        p.result(p.op("normalize", xs, mean, var, gs, bs, epsilon=1e-5))

    ex = _compile(build)

    def reference():
        m = x.mean(axis=-1, keepdims=True)
        v = x.var(axis=-1, keepdims=True)
        return (x - m) / np.sqrt(v + np.float32(1e-5)) * g + b

    np.testing.assert_allclose(ex.run([x, g, b])[0], reference(), rtol=1e-3, atol=1e-4)
    return (lambda: ex.run([x, g, b])), reference


def case_fused_chain(rows, cols):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    scale = np.float32(1.5)

    def build(p):
        xs, bs = p.feed(x.shape), p.feed((cols,))
        k = p.op("constant", shape=(), dtype="f32", value=[1.5])
        h = p.op("relu", p.op("add", p.op("mul", xs, k), bs))
        p.result(p.op("sub", p.op("mul", h, xs), bs))

    ex = _compile(build)

    def reference():
        return np.maximum(x * scale + b, 0) * x - b

    np.testing.assert_allclose(ex.run([x, b])[0], reference(), rtol=1e-5, atol=1e-5)
    return (lambda: ex.run([x, b])), reference


def case_tiny_graph():
    """relu(x @ W + b), x 8x16: the whole cost of running a cached executable."""
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 16), (16,)))

    def build(p):
        xs, ws, bs = p.feed((8, 16)), p.feed((16, 16)), p.feed((16,))
        p.result(p.op("relu", p.op("add", p.op("matmul", xs, ws), bs)))

    ex = _compile(build)
    return (lambda: ex.run([x, w, b])), (lambda: np.maximum(x @ w + b, 0))


def case_bare_call():
    """One 1-element op: the fixed cost of a run, against one numpy call."""
    x = np.ones(1, np.float32)
    ex = _compile(lambda p: p.result(p.op("neg", p.feed((1,)))))
    return (lambda: ex.run([x])), (lambda: np.negative(x))


CASES = [
    ("matmul 64x784 @ 784x256", lambda: case_matmul(64, 784, 256), 1.2),
    ("matmul 256x1024 @ 1024x1024", lambda: case_matmul(256, 1024, 1024), 1.2),
    ("conv2d 64x1x28x28, 16 3x3 pad 1", lambda: case_conv(64, 1, 16, 28), 1.2),
    ("conv2d 64x16x14x14, 32 3x3 pad 1", lambda: case_conv(64, 16, 32, 14), 1.2),
    ("softmax 256x1000 (last axis)", lambda: case_softmax(256, 1000), None),
    ("layer norm 1024x128", lambda: case_layer_norm(1024, 128), None),
    ("fused chain, 5 ops on 1024x1024", lambda: case_fused_chain(1024, 1024), 1.0),
    ("cached run: relu(x@W+b) 8x16", case_tiny_graph, None),
    ("cached run: 1-element neg", case_bare_call, None),
]


# (name, M, K, N, transpose_a, transpose_b): C[M, N] = op(A)[M, K] @ op(B)[K, N]. Forward
# products read the weight [out, in] transposed; dX = dY @ W, dW = dYᵀ @ X.
SGEMM_SHAPES = [
    ("A fc1 fwd", 64, 784, 256, False, True),
    ("A fc2 fwd", 64, 256, 10, False, True),
    ("A fc1 dX", 64, 256, 784, False, False),
    ("A fc1 dW", 256, 64, 784, True, False),
    ("A fc2 dX", 64, 10, 256, False, False),
    ("A fc2 dW", 10, 64, 256, True, False),
    ("B fc1 fwd", 256, 784, 1024, False, True),
    ("B fc2 fwd", 256, 1024, 1024, False, True),
    ("B fc2 dX", 256, 1024, 1024, False, False),
    ("B fc2 dW", 1024, 256, 1024, True, False),
    ("B fc1 dW", 1024, 256, 784, True, False),
    ("D qkv fwd", 1024, 128, 384, False, True),
    ("D ffn1 fwd", 1024, 128, 512, False, True),
    ("D ffn2 fwd", 1024, 512, 128, False, True),
    ("D proj fwd", 1024, 128, 128, False, True),
    ("D ffn2 dX", 1024, 128, 512, False, False),
    ("D ffn2 dW", 128, 1024, 512, True, False),
    ("1024^3", 1024, 1024, 1024, False, False),
]


def sgemm_table(rounds: int) -> list[dict]:
    """Lucid's sgemm against the BLAS per shape, interleaved round by round."""
    set_adaptive_threads(False)
    rng = np.random.default_rng(0)
    # Out of OpenBLAS's slow single-thread start state, as the runtime does before its first
    # single-threaded run (parallel.cpp, prime_single_thread_blas).
    ones = np.ones((64, 128), np.float32), np.ones((128, 512), np.float32)
    _native.sgemm(*ones, np.zeros((64, 512), np.float32), kernel="blas")
    rows = []
    print(f"{'shape (M x K x N)':34s} {'lucid us (range)':>24s} {'blas us (range)':>24s} "
          f"{'ratio':>6s} {'lucid GF/s':>10s} {'blas GF/s':>9s} {'rule':>5s}")  # fmt: skip
    for name, m, k, n, ta, tb in SGEMM_SHAPES:
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        times: dict[str, list[float]] = {"lucid": [], "blas": []}
        calls = {
            kernel: partial(_native.sgemm, a, b, c, transpose_a=ta, transpose_b=tb, kernel=kernel)
            for kernel in times
        }
        for _ in range(rounds):
            for kernel, ts in times.items():
                ts.append(_timed(calls[kernel], 0.01))
        lucid, blas = (np.array(times[k]) for k in ("lucid", "blas"))
        flops = 2.0 * m * n * k
        rule = "lucid" if _native.sgemm_chosen(ta, tb, m, n, k) else "blas"
        label = f"{name} {m}x{k}x{n}{' ta' if ta else ''}{' tb' if tb else ''}"
        print(
            f"{label:34s} {np.median(lucid) * 1e6:9.1f} ({lucid.min() * 1e6:6.0f}-"
            f"{lucid.max() * 1e6:6.0f}) {np.median(blas) * 1e6:9.1f} ({blas.min() * 1e6:6.0f}-"
            f"{blas.max() * 1e6:6.0f}) {np.median(lucid / blas):6.2f} "
            f"{flops / np.median(lucid) / 1e9:10.1f} {flops / np.median(blas) / 1e9:9.1f} "
            f"{rule:>5s}"
        )
        rows.append({"shape": label, "lucid_s": lucid.tolist(), "blas_s": blas.tolist(),
                     "ratio_median": float(np.median(lucid / blas)), "rule": rule})  # fmt: skip
    return rows


def main() -> int:
    args = ARGS or _parse()
    if args.sgemm:
        set_num_threads(args.threads)
        rounds = 3 if args.quick else args.rounds
        print(f"threads={args.threads} rounds={rounds} sgemm: Lucid's kernel vs the BLAS")
        rows = sgemm_table(rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"threads": args.threads, "rounds": rounds, "sgemm": rows}, f, indent=2)
        return 0
    set_num_threads(args.threads)
    rounds = 3 if args.quick else args.rounds
    rows = []
    print(f"threads={args.threads} rounds={rounds} numpy={np.__version__}")
    print(f"{'case':40s} {'native':>11s} {'numpy':>11s} {'ratio':>7s}  target")
    for name, make, target in CASES:
        native, reference = make()
        t_native, t_numpy = compare(native, reference, rounds)
        ratio = t_native / t_numpy
        verdict = (
            "" if target is None else (f"<= {target}: " + ("ok" if ratio <= target else "MISS"))
        )
        print(f"{name:40s} {t_native * 1e6:9.1f}us {t_numpy * 1e6:9.1f}us {ratio:7.2f}  {verdict}")
        rows.append(
            {"case": name, "native_s": t_native, "numpy_s": t_numpy, "ratio": ratio,
             "target": target, "ok": None if target is None else ratio <= target}
        )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": rounds, "rows": rows}, f, indent=2)
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
