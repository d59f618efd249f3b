"""First-call latency of a compiled model: cold compile vs a warm disk cache vs ``load_compiled``.

Each measurement runs in a fresh process (so no in-process cache helps), after ``import lucid``
and building the model; it times the first call (trace + compile + run), or ``load_compiled`` +
the first call. ``cold`` compiles with ``LUCID_COMPILE_DISK_CACHE=1`` on an empty folder (so it
includes writing the entry); ``warm`` repeats it with the folder filled by the cold run.

    python benchmarks/bench_aot.py [--workloads ABCDE] [--repeats 3]

Prints one markdown row per workload: the median of ``--repeats`` processes, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(mode: str, wl: str, path: str) -> None:
    sys.path.insert(0, HERE)
    import workloads as W

    import lucid
    from lucid.compile import load_compiled, save_compiled

    model = W.lucid_model(wl).eval()
    x = lucid.tensor(W.data(wl)[0])
    with lucid.no_grad():
        t0 = time.perf_counter()
        if mode == "load":
            out = load_compiled(path)(x)
        else:
            cm = lucid.compile(model)
            out = cm(x)
        ms = (time.perf_counter() - t0) * 1e3
        if mode == "save":
            assert save_compiled(cm, path)
    del out
    print(json.dumps({"ms": ms}))


def _run(mode: str, wl: str, path: str, cache: str | None) -> float:
    env = dict(os.environ)
    env.pop("LUCID_COMPILE_DISK_CACHE", None)
    if cache is not None:
        env["LUCID_COMPILE_DISK_CACHE"] = "1"
        env["LUCID_COMPILE_DISK_CACHE_DIR"] = cache
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, wl, path],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="ABCDE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    print("| workload | cold compile ms | warm disk cache ms | load_compiled ms | warm/cold |")
    print("|---|---|---|---|---|")
    for wl in args.workloads:
        cold, warm, load = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{wl}.lucidc")
            _run("save", wl, path, None)
            for r in range(args.repeats):
                cache = os.path.join(tmp, f"cache{r}")
                cold.append(_run("compile", wl, path, cache))
                warm.append(_run("compile", wl, path, cache))
                load.append(_run("load", wl, path, None))
        c, w, ld = (statistics.median(v) for v in (cold, warm, load))
        print(f"| {wl} | {c:.1f} | {w:.1f} | {ld:.1f} | {w / c:.2f} |", flush=True)


if __name__ == "__main__":
    main()
