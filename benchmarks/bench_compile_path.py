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
from lucid.ir import import_trace
from lucid.passes import PassManager
from lucid.trace import trace


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


# CPU time of this process is reported next to wall time: on a shared, loaded machine the wall
# time measures the neighbours as much as the compiler.
def _time(f, repeat):
    wall, cpu = [], []
    result = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = f()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return (statistics.median(wall), statistics.median(cpu)), result


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

    stages: dict[str, tuple[float, float]] = {}
    stages["trace"], tr = _time(lambda: trace(fn, x), args.repeat)
    stages["import"], _ = _time(lambda: import_trace(tr), args.repeat)
    module = import_trace(tr)
    stages["verify"], _ = _time(module.verify, args.repeat)
    for spec in ("canonicalize", "cse", "dce"):
        one = PassManager(spec)
        modules = iter([import_trace(tr) for _ in range(args.repeat)])
        # each pass runs on the output of the ones before it, as in the pipeline
        prepared = []
        for m in modules:
            PassManager(",".join(_before(spec))).run(m)
            prepared.append(m)
        it = iter(prepared)
        stages[spec], _ = _time(lambda one=one, it=it: one.run(next(it)), args.repeat)
    pm.run(module)
    n_after = sum(1 for _ in module.walk()) - 3  # module, func, return

    print(f"compile path for a {len(tr.ops)}-op trace ({n_after} ops after the passes)")
    print(f"  {'stage':<14} {'wall ms':>8} {'cpu ms':>8}")
    for name, (wall, cpu) in stages.items():
        print(f"  {name:<14} {wall:8.1f} {cpu:8.1f}")
    total_wall = sum(w for w, _ in stages.values())
    total_cpu = sum(c for _, c in stages.values())
    print(f"  {'total':<14} {total_wall:8.1f} {total_cpu:8.1f}   (target < 150)")
    no_verify = (total_wall - stages["verify"][0], total_cpu - stages["verify"][1])
    print(f"  {'without verify':<14} {no_verify[0]:8.1f} {no_verify[1]:8.1f}")


def _before(spec: str) -> list[str]:
    order = ["canonicalize", "cse", "dce"]
    return order[: order.index(spec)]


if __name__ == "__main__":
    main()
