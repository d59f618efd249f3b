"""Inference latency on a busy machine: compiled Lucid against PyTorch, with and without one
competing CPU-bound process.

Workload A (MLP 784-256-10, batch 64) inference, one call at a time, each call timed on its
own. Every case runs in a fresh process of its own (Lucid's with this interpreter, PyTorch's
with ``--torch-python``, e.g. the benchmark venv's) that imports only its framework,
warms up and times ``--calls`` calls (fewer if they take over ``--max-s`` seconds). Each pass
runs every case under both conditions: "idle" (no competitor of ours; the machine's own load is
recorded) and "busy" (one child running ``while True: pass``, started before and killed after
the condition's cases). Conditions and cases are rotated from pass to pass so a slow spell of a
shared machine hits them alike.
Reported per case and condition: the median over passes of each process's median call, with
the range over passes, and the median over passes of each process's p99 and slowest call.

Cases: ``lucid`` (the default: ``--threads`` threads, fewer while the cores are contended),
``lucid fixed`` (``LUCID_ADAPTIVE_THREADS=0``: always ``--threads``), ``lucid 1 thread``,
``torch`` (``torch.set_num_threads(--threads)``) and ``torch 1 thread``. A peer that is not
installed is reported missing and never enters a comparison. Nothing is written unless asked:

    python benchmarks/bench_contention.py [--passes 3] [--calls 2000] [--max-s 20] [--threads 2]
        [--cases "lucid,torch"] [--torch-python PATH] [--json PATH]

``--overhead`` measures instead what watching the load costs a run when nothing changes: one
process runs a tiny executable (workload E's GEMM, 8x16 @ 16x16, one BLAS thread whatever the
setting) in alternating blocks with adaptation on and off, and prints both medians per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("lucid", "lucid fixed", "lucid 1 thread", "torch", "torch 1 thread")
CONDITIONS = ("idle", "busy")
WARMUP_S = 0.3


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per process")
    ap.add_argument(
        "--max-s", type=float, default=20.0, help="stop a process's timing after this long"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of cases")
    ap.add_argument(
        "--torch-python",
        default=os.environ.get("BENCH_TORCH_PYTHON", sys.executable),
        help="interpreter of the PyTorch cases (default: $BENCH_TORCH_PYTHON, else this one)",
    )
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per child process")
    ap.add_argument("--json", default=None, help="write the run's results to PATH")
    ap.add_argument("--overhead", action="store_true", help="cost of load watching per run")
    ap.add_argument("--blocks", type=int, default=20, help="--overhead: blocks per setting")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    return args


# --- child ------------------------------------------------------------------------------------
def lucid_call():
    import workloads as W

    import lucid

    x_np, _ = W.data("A")
    model = W.lucid_model("A").eval()
    x = lucid.tensor(x_np)
    cm = lucid.compile(model)

    def run():
        with lucid.no_grad():
            return cm(x)

    return run


def torch_call():
    import torch
    import workloads as W

    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    x_np, _ = W.data("A")
    model = W.torch_model("A").eval()
    x = torch.from_numpy(x_np)

    def run():
        with torch.no_grad():
            return model(x)

    return run


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_child(case: str, calls: int, max_s: float) -> dict:
    sys.path.insert(0, HERE)
    framework = case.split()[0]
    fn = lucid_call() if framework == "lucid" else torch_call()
    fn()  # compiles (Lucid); first-call set-up (PyTorch)
    t_end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < t_end:
        fn()
    times = []
    clock = time.perf_counter_ns
    stop = clock() + int(max_s * 1e9)
    for _ in range(calls):
        t0 = clock()
        fn()
        t1 = clock()
        times.append((t1 - t0) * 1e-6)
        if t1 > stop:
            break
    times.sort()
    out = {
        "median_ms": statistics.median(times),
        "p99_ms": percentile(times, 0.99),
        "max_ms": times[-1],
        "mean_ms": statistics.fmean(times),
        "calls": len(times),
    }
    if framework == "lucid":
        from lucid.backends import cpu

        out["threads"] = cpu.thread_stats()
    else:
        import torch

        out["threads"] = {"torch.get_num_threads": torch.get_num_threads()}
    return out


def overhead(args) -> int:
    """Median seconds per run of a tiny executable, load watching on against off, interleaved."""
    import numpy as np

    from lucid.backends.cpu import (
        CPUBackend,
        Program,
        set_adaptive_threads,
        set_num_threads,
        thread_stats,
    )

    set_num_threads(args.threads)
    p = Program()
    a, b = p.feed((8, 16)), p.feed((16, 16))
    p.result(p.op("matmul", a, b, transpose_a=False, transpose_b=False))
    ex = CPUBackend(cache=False).compile(p)
    feeds = [np.ones((8, 16), np.float32), np.ones((16, 16), np.float32)]
    per_block = max(1, args.calls)
    blocks: dict[bool, list[float]] = {True: [], False: []}

    def timed_block() -> float:
        ex.run(feeds)
        t0 = time.perf_counter()
        for _ in range(per_block):
            ex.run(feeds)
        return (time.perf_counter() - t0) / per_block

    # The block without watching runs at the thread count the last watching block ended with,
    # so the two differ only by the watching.
    effective = args.threads
    for i in range(args.blocks):
        for on in (True, False) if i % 2 == 0 else (False, True):
            if on:
                set_num_threads(args.threads)
                set_adaptive_threads(True)
                blocks[True].append(timed_block())
                effective = thread_stats()["effective"]
            else:
                set_adaptive_threads(False)
                set_num_threads(effective)
                blocks[False].append(timed_block())
    set_num_threads(args.threads)
    set_adaptive_threads(True)
    on_us = statistics.median(blocks[True]) * 1e6
    off_us = statistics.median(blocks[False]) * 1e6
    stats = thread_stats()
    print(
        f"tiny run, {args.blocks} blocks of {per_block} per setting: adaptive on {on_us:.3f} us, "
        f"off {off_us:.3f} us per run (difference {on_us - off_us:+.3f} us); "
        f"{stats['samples']} samples cost "
        f"{stats['sample_seconds'] * 1e6 / max(1, stats['samples']):.1f} us each"
    )
    return 0


# --- parent -----------------------------------------------------------------------------------
def case_env(case: str, threads: int) -> dict[str, str]:
    n = "1" if case.endswith("1 thread") else str(threads)
    env = dict(
        os.environ,
        BENCH_THREADS=n,
        LUCID_NUM_THREADS=n,
        OPENBLAS_NUM_THREADS=n,
        OMP_NUM_THREADS=n,
        MKL_NUM_THREADS=n,
        OPENBLAS_THREAD_TIMEOUT=os.environ.get("OPENBLAS_THREAD_TIMEOUT", "1"),
    )
    env.pop("LUCID_ADAPTIVE_THREADS", None)
    if case == "lucid fixed":
        env["LUCID_ADAPTIVE_THREADS"] = "0"
    return env


def torch_installed(python: str) -> bool:
    probe = subprocess.run(
        [python, "-c", "import torch"], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0


def spawn(case: str, args) -> dict:
    python = args.torch_python if case.startswith("torch") else sys.executable
    cmd = [python, os.path.abspath(__file__), "--child", case, "--calls", str(args.calls)]
    cmd += ["--max-s", str(args.max_s)]
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=args.timeout_s,
            env=case_env(case, args.threads),
            cwd=HERE,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout_s:.0f} s"}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = out.stderr.strip().splitlines()[-3:]
        return {"error": f"exit {out.returncode}: " + " | ".join(tail)}


def start_competitor() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)  # let it reach the scheduler's steady state
    return proc


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def summarize(results: list[dict]) -> dict | None:
    good = [r for r in results if "median_ms" in r]
    if not good:
        return None
    medians = [r["median_ms"] for r in good]
    return {
        "median_ms": statistics.median(medians),
        "range_ms": [min(medians), max(medians)],
        "p99_ms": statistics.median(r["p99_ms"] for r in good),
        "max_ms": statistics.median(r["max_ms"] for r in good),
        "worst_ms": max(r["max_ms"] for r in good),
        "passes": len(good),
    }


def fmt(s: dict | None) -> str:
    if s is None:
        return "failed"
    lo, hi = s["range_ms"]
    return f"{s['median_ms']:.3f} ({lo:.3f}-{hi:.3f}) p99 {s['p99_ms']:.2f} max {s['max_ms']:.1f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.calls, args.max_s)))
        return 0
    if args.overhead:
        return overhead(args)
    cases = list(args.cases)
    missing = []
    if any(c.startswith("torch") for c in cases) and not torch_installed(args.torch_python):
        missing = [c for c in cases if c.startswith("torch")]
        cases = [c for c in cases if c not in missing]
    runs: dict[tuple[str, str], list[dict]] = {(c, k): [] for c in cases for k in CONDITIONS}
    loads: dict[str, list[float]] = {k: [] for k in CONDITIONS}
    for p in range(args.passes):
        conditions = CONDITIONS if p % 2 == 0 else CONDITIONS[::-1]
        for condition in conditions:
            shift = p % len(cases)
            order = cases[shift:] + cases[:shift]
            competitor = start_competitor() if condition == "busy" else None
            try:
                la = load_average()
                if la is not None:
                    loads[condition].append(la)
                for case in order:
                    result = spawn(case, args)
                    runs[(case, condition)].append(result)
                    if "error" in result:
                        print(f"  {case} ({condition}): {result['error']}", file=sys.stderr)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
        print(f"pass {p + 1}/{args.passes} done", file=sys.stderr)
    table = {f"{c} | {k}": summarize(runs[(c, k)]) for c in cases for k in CONDITIONS}
    print(
        f"workload A inference, {args.threads} threads, {args.calls} calls per process, "
        f"{args.passes} passes; ms per call: median of process medians (range), "
        "median p99, median max"
    )
    width = max(len(c) for c in cases) + 2
    print(f"{'case':<{width}}{'idle':<48}one busy process")
    for c in cases:
        print(f"{c:<{width}}{fmt(table[f'{c} | idle']):<48}{fmt(table[f'{c} | busy'])}")
    for c in missing:
        print(f"{c:<{width}}missing: torch is not importable with {args.torch_python}")
    for k in CONDITIONS:
        seen = [r["threads"] for r in runs.get(("lucid", k), []) if "threads" in r]
        if seen:
            threads = sorted({t["effective"] for t in seen})
            others = [t["other_cores"] for t in seen]
            print(
                f"'lucid' at the end of its '{k}' processes: {threads} threads, other processes' "
                f"load {min(others):.2f}-{max(others):.2f} cores"
            )
        if loads[k]:
            print(f"load average during '{k}': {min(loads[k]):.1f}-{max(loads[k]):.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "child"},
                    "summary": table,
                    "missing": missing,
                    "load_average": loads,
                    "runs": {f"{c} | {k}": v for (c, k), v in runs.items()},
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
