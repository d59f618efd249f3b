"""Time the compile path a new input shape pays: trace -> import -> verify -> canonicalize,cse,dce.

    python benchmarks/bench_compile_path.py [--ops 1000] [--repeat 7]

The program is a 1,000-op straight-line trace of the kind models produce: linear layers,
activations, scalar arithmetic with constants, reshapes and reductions, with some redundancy for
the passes to find. Prints the median milliseconds of each stage and the total (target: under
150 ms on a 2-core x86-64 machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import lucid
import lucid.nn.functional as F
from lucid.compile import trace
from lucid.ir import import_trace
from lucid.passes import PassManager


def build_program(n_ops: int):
    """A function of one (32, 64) input whose trace has about ``n_ops`` ops, and its weights."""
    rng = np.random.default_rng(0)
    weights = [
        lucid.tensor(rng.standard_normal((64, 64)).astype(np.float32) * 0.1) for _ in range(8)
    ]
    bias = lucid.tensor(np.zeros(64, np.float32))
    per_block = 10  # ops one block records

    def fn(x):
        h = x
        for i in range(max(1, n_ops // per_block)):
            w = weights[i % len(weights)]
            y = F.linear(h, w, bias)  # 1
            y = F.relu(y) * 1 + 0  # 3 (two identities for canonicalize)
            z = (y * 0.5).exp()  # 2
            z2 = (y * 0.5).exp()  # 2 (common subexpressions for cse)
            h = (z - z2).reshape(32, 64) + h  # 2 (a no-op reshape)
        return h.sum(1)

    return fn


def _time(f, repeat):
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = f()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)

    fn = build_program(args.ops)
    x = lucid.tensor(np.ones((32, 64), np.float32))
    pm = PassManager("canonicalize,cse,dce")
    # warm up: imports, op-class generation, type caches
    pm.run(import_trace(trace(fn, x)))

    t_trace, tr = _time(lambda: trace(fn, x), args.repeat)
    t_import, _ = _time(lambda: import_trace(tr), args.repeat)
    modules = [import_trace(tr) for _ in range(args.repeat)]
    t_verify, _ = _time(lambda: modules[0].verify(), args.repeat)
    per_pass: dict[str, list[float]] = {}
    t_passes = []
    for m in modules:
        report = pm.run(m)
        t_passes.append(report.total_seconds * 1e3)
        for name, ms in report.passes_ms().items():
            per_pass.setdefault(name, []).append(ms)
    n_before = len(tr.ops)
    n_after = sum(1 for _ in modules[0].walk()) - 3  # module, func, return
    total = t_trace + t_import + t_verify + statistics.median(t_passes)

    print(f"compile path for a {n_before}-op trace ({n_after} ops after the passes), median ms")
    print(f"  trace          {t_trace:8.1f}")
    print(f"  import         {t_import:8.1f}")
    print(f"  verify         {t_verify:8.1f}")
    for name, ms in per_pass.items():
        print(f"  {name:<14} {statistics.median(ms):8.1f}")
    print(f"  total          {total:8.1f}   (target < 150; without verify {total - t_verify:.1f})")


if __name__ == "__main__":
    main()
