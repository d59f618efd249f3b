"""Compare two Lucid checkouts side by side: compiled inference and ``fused_step`` per workload.

Each (checkout, case) runs in a fresh process of its own with that checkout's venv, cases
interleaved and the checkout order alternated over passes; prints medians and ranges in ms.

    python benchmarks/bench_ab.py OLD_CHECKOUT NEW_CHECKOUT --passes 4

A checkout needs ``.venv`` with Lucid installed (the README's install command). Cases are
``<workload>:<infer|sgd|adam>`` (workloads A-E of benchmarks/workloads.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import contextlib, json, os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import lucid
from workloads import data, lucid_loss, lucid_model
wl, kind = sys.argv[1].split(":")
x_np, y_np = data(wl)
model = lucid_model(wl)
x = lucid.tensor(x_np)
if kind == "infer":
    model.eval()
    cm = lucid.compile(model)
    fn, ctx = (lambda: cm(x)), lucid.no_grad()
else:
    opt = (lucid.optim.SGD(model.parameters(), lr=0.01) if kind == "sgd"
           else lucid.optim.Adam(model.parameters(), lr=1e-3))
    step = lucid.compile.fused_step(model, lucid_loss(wl), opt)
    args = (x,) if y_np is None else (x, lucid.tensor(y_np))
    fn, ctx = (lambda: step(*args)), contextlib.nullcontext()
def run(n):
    with ctx:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t
run(1)
n = 1
while run(n) < 0.05:
    n *= 2
times = sorted(run(n) / n for _ in range(7))
print(json.dumps({"median_ms": times[3] * 1e3}))
"""

DEFAULT_CASES = "A:infer,B:infer,C:infer,D:infer,E:infer,A:sgd,A:adam,D:sgd,E:sgd"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    cases = args.cases.split(",")
    env = dict(os.environ, LUCID_NUM_THREADS=str(args.threads))
    results: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in cases}
    for p in range(args.passes):
        for case in cases:
            for t in list(trees) if p % 2 == 0 else list(trees)[::-1]:
                python = os.path.join(trees[t], ".venv", "bin", "python")
                out = subprocess.run(
                    [python, "-c", CHILD, case],
                    cwd=trees[t],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if out.returncode != 0:
                    print(f"{t} {case} failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                results[(t, case)].append(json.loads(out.stdout.splitlines()[-1])["median_ms"])
    print(f"{'case':9} {'old ms [range]':>26} {'new ms [range]':>26} {'new/old':>8}")
    for case in cases:
        old, new = results[("old", case)], results[("new", case)]
        if old and new:
            mo, mn = statistics.median(old), statistics.median(new)
            print(
                f"{case:9} {mo:9.3f} [{min(old):.3f}-{max(old):.3f}] "
                f"{mn:9.3f} [{min(new):.3f}-{max(new):.3f}] {mn / mo:8.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
