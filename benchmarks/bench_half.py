"""Compiled half-precision inference against float32 on a GEMM-bound model (CPU backend).

A three-layer MLP (width 1024, batch 256: almost all of its time is in the GEMMs) compiled in
float32, float16 and bfloat16. The three run interleaved, pass after pass (each pass times
``--repeats`` calls of each), so a load that comes and goes on a shared machine hits all of
them. Prints per dtype the median time per call (ms) with the range of the per-pass medians,
the half/float32 time ratio (median and range over the passes), and the bytes of weights and
of activations: the input, the output and the compiled program's scratch arena (its
intermediates).

    python benchmarks/bench_half.py --passes 5 --repeats 10 [--threads 1]

The machine may be shared: read the ranges, not only the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lucid
import lucid.nn as nn

DTYPES = ("float32", "float16", "bfloat16")


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
    )


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def arena_bytes(compiled) -> int:
    """Scratch bytes of the executable serving the compiled model (0 when none is found)."""
    entries = getattr(compiled, "_entries", {})
    for entry in entries.values():
        executable = getattr(getattr(entry, "graph", None), "executable", None)
        if executable is not None:
            return int(executable.arena_bytes)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10, help="calls per dtype per pass")
    parser.add_argument("--threads", type=int, default=None, help="CPU backend threads")
    args = parser.parse_args()
    if args.threads is not None:
        from lucid.backends.cpu import set_num_threads

        set_num_threads(args.threads)
    lucid.manual_seed(0)
    base = model(args.width).eval()
    x32 = lucid.randn(args.batch, args.width)
    calls, info = {}, {}
    for name in DTYPES:
        dtype = getattr(lucid, name)
        m = model(args.width).eval()
        m.load_state_dict(base.state_dict())
        m = m.to(dtype)
        x = x32.to(dtype)
        compiled = lucid.compile(m)
        with lucid.no_grad():
            out = compiled(x)  # compile and warm up
            compiled(x)
        calls[name] = lambda compiled=compiled, x=x: compiled(x)
        reasons = compiled.cache_info()["reasons"]
        info[name] = {
            "weights": sum(p.numpy().nbytes for p in m.parameters()),
            "activations": x.numpy().nbytes + out.numpy().nbytes + arena_bytes(compiled),
            "path": "eager fallback" if reasons else "compiled",
        }
    per_pass = {name: [] for name in DTYPES}
    every = {name: [] for name in DTYPES}
    with lucid.no_grad():
        for _ in range(args.passes):
            for name in DTYPES:
                times = timed(calls[name], args.repeats)
                per_pass[name].append(statistics.median(times))
                every[name].extend(times)
    threads = f", {args.threads} thread(s)" if args.threads else ""
    print(
        f"MLP {args.width}x{args.width} x3, batch {args.batch}: {args.passes} interleaved passes "
        f"of {args.repeats} calls per dtype{threads}"
    )
    print(
        f"{'dtype':9} {'median ms':>10} {'pass range':>15} {'vs f32':>7} {'ratio range':>12} "
        f"{'weights':>9} {'activ.':>9}  path"
    )
    for name in DTYPES:
        ratios = [h / f for h, f in zip(per_pass[name], per_pass["float32"], strict=True)]
        i = info[name]
        print(
            f"{name:9} {statistics.median(every[name]):10.2f} "
            f"{min(per_pass[name]):7.2f}-{max(per_pass[name]):<7.2f} "
            f"{statistics.median(ratios):7.2f} {min(ratios):5.2f}-{max(ratios):<6.2f} "
            f"{i['weights'] / 2**20:7.1f}MB {i['activations'] / 2**20:7.2f}MB  {i['path']}"
        )


if __name__ == "__main__":
    main()
