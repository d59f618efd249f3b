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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke test")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # Must happen before numpy or the native module load their BLAS.
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "1")

import numpy as np  # noqa: E402

from lucid.backends.cpu import CPUBackend, Program, set_num_threads  # noqa: E402


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


def main() -> int:
    args = ARGS or _parse()
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
