"""Data-parallel training over MPI: step time and all-reduce time at 1, 2 and 4 processes.

    python benchmarks/bench_distributed.py                       # B, D, F at 1, 2, 4 processes
    python benchmarks/bench_distributed.py --workloads B --procs 1 2 --steps 5

Each process trains its own replica of the workload (eager ``DistributedDataParallel``, SGD;
AdamW for F) on the workload's batch, so the global batch grows with the number of processes
(weak scaling). Per workload and process count it reports the median of:

- ``step``: forward + backward (with the bucketed all-reduce) + optimizer step;
- ``compute``: the same step inside ``no_sync()`` (no communication);
- ``all-reduce``: one blocking all-reduce of every gradient in one flat buffer, between barriers.

The launcher starts ``mpirun --oversubscribe -n N`` for each N; rank 0 prints one JSON line per
workload, which the launcher collects into a table. Each rank gets ``cores // N`` BLAS and
native threads (at least one). On a 2-core machine 4 processes share 2 cores: the 4-process rows
measure oversubscription, not scaling.
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


def _timed(fn, n: int) -> float:
    """Median milliseconds of ``n`` calls of ``fn``, every rank starting each call together."""
    import lucid.distributed as dist

    times = []
    for _ in range(n):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _measure(wl: str, steps: int) -> dict:
    """One workload's row on this rank: step, compute-only and all-reduce medians (ms)."""
    import numpy as np
    from workloads import data, lucid_loss, lucid_model

    import lucid
    import lucid.distributed as dist
    from lucid import optim
    from lucid.nn.parallel import DistributedDataParallel

    model = lucid_model(wl)
    ddp = DistributedDataParallel(model)
    opt = (optim.AdamW if wl == "F" else optim.SGD)(ddp.parameters(), lr=1e-3)
    loss_fn = lucid_loss(wl)
    x, y = data(wl, seed=dist.get_rank())
    args = (lucid.tensor(x),) if y is None else (lucid.tensor(x), lucid.tensor(y))

    def step() -> None:
        opt.zero_grad()
        loss_fn(ddp(args[0]), *args[1:]).backward()
        opt.step()

    step()  # warm-up: first-call allocations
    step_ms = _timed(step, steps)
    with ddp.no_sync():
        compute_ms = _timed(step, steps)
    n_bytes = sum(p._data.nbytes for p in model.parameters())
    flat = lucid.tensor(np.zeros(n_bytes // 4, dtype=np.float32))
    reduce_ms = _timed(lambda: dist.all_reduce(flat), max(steps, 5))
    return dict(
        workload=wl,
        procs=dist.get_world_size(),
        grad_mb=n_bytes / 2**20,
        step_ms=step_ms,
        compute_ms=compute_ms,
        allreduce_ms=reduce_ms,
    )


def _worker(workloads: list[str], steps: int) -> None:
    sys.path.insert(0, HERE)
    import lucid.distributed as dist

    dist.init_process_group("mpi")
    for wl in workloads:
        row = _measure(wl, steps)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(row), flush=True)
    dist.destroy_process_group()


def _launch(procs: int, workloads: list[str], steps: int, timeout: float) -> list[dict]:
    # One BLAS/native thread per core and rank: N ranks each starting a pool as wide as the
    # machine would run N times more threads than cores.
    threads = str(max(1, (os.cpu_count() or 1) // procs))
    pinned = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "LUCID_NUM_THREADS")
    command = [
        "mpirun",
        "--oversubscribe",
        "--allow-run-as-root",
        *[arg for name in pinned for arg in ("-x", f"{name}={threads}")],
        "-n",
        str(procs),
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--workloads",
        *workloads,
        "--steps",
        str(steps),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"mpirun -n {procs} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["B", "D", "F"])
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per mpirun job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.workloads, args.steps)
        return
    header = ("wl", "procs", "grad MB", "step ms", "compute ms", "allreduce ms")
    print("{:<3} {:>5} {:>8} {:>9} {:>11} {:>13}".format(*header), flush=True)
    for procs in args.procs:  # rows as each job ends: a long run shows its progress
        for r in _launch(procs, args.workloads, args.steps, args.timeout):
            print(
                f"{r['workload']:<3} {r['procs']:>5} {r['grad_mb']:>8.1f} {r['step_ms']:>9.1f} "
                f"{r['compute_ms']:>11.1f} {r['allreduce_ms']:>13.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
