"""Compiled half-precision inference against float32 on a GEMM-bound model (CPU backend).

A three-layer MLP (width 1024, batch 256: almost all of its time is in the GEMMs) compiled in
float32, float16 and bfloat16; prints the median time per call (ms, with the range over
repeats), the ratio to float32, and the bytes of weights and activations each holds.

    python benchmarks/bench_half.py --repeats 20

The machine may be shared: read the ranges, not only the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lucid
import lucid.nn as nn


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
    )


def timed(fn, repeats: int) -> list[float]:
    fn()  # compile and warm up
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    lucid.manual_seed(0)
    base = model(args.width).eval()
    x32 = lucid.randn(args.batch, args.width)
    rows = []
    for name in ("float32", "float16", "bfloat16"):
        dtype = getattr(lucid, name)
        m = model(args.width).eval()
        m.load_state_dict(base.state_dict())
        m = m.to(dtype)
        x = x32.to(dtype)
        compiled = lucid.compile(m)
        with lucid.no_grad():
            times = timed(lambda compiled=compiled, x=x: compiled(x), args.repeats)
        reasons = compiled.cache_info()["reasons"]
        weights = sum(p.numpy().nbytes for p in m.parameters())
        activations = x.numpy().nbytes * 3  # the input and two hidden layers
        rows.append(
            (
                name,
                statistics.median(times),
                min(times),
                max(times),
                weights,
                activations,
                "eager fallback" if reasons else "compiled",
            )
        )
    base_ms = rows[0][1]
    print(f"MLP {args.width}x{args.width} x3, batch {args.batch}, {args.repeats} repeats")
    print(
        f"{'dtype':9} {'median ms':>10} {'range':>17} {'vs f32':>7} {'weights':>9} "
        f"{'activ.':>9}  path"
    )
    for name, med, lo, hi, weights, activations, path in rows:
        print(
            f"{name:9} {med:10.2f} {lo:8.2f}-{hi:<8.2f} {med / base_ms:7.2f} "
            f"{weights / 2**20:7.1f}MB {activations / 2**20:7.2f}MB  {path}"
        )


if __name__ == "__main__":
    main()
