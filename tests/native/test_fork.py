"""fork() while another thread runs compiled code (issue 15, item 11).

Lucid's fork handlers wait for runs in progress (and so for their BLAS calls and worker-pool
jobs) before the process forks; the child gets a fresh worker pool and can run compiled code.
Each scenario runs in a subprocess with a timeout, since the failure mode is a hang."""

import os
import subprocess
import sys
import textwrap

FORK_SCRIPT = textwrap.dedent(
    """
    import os, random, sys, threading, time
    import numpy as np
    from lucid import _native

    _native.set_num_threads(2)
    n, depth = 128, 6
    slots = [((n, n), "f32"), ((n, n), "f32")]
    instrs, cur = [], 0
    for _ in range(depth):
        slots.append(((n, n), "f32"))
        instrs.append(("matmul", [cur, 1], [len(slots) - 1],
                       {"transpose_a": False, "transpose_b": False}))
        cur = len(slots) - 1
    # A long chain of slow elementwise ops: split across Lucid's worker pool.
    big = 1 << 17
    slots += [((big,), "f32"), ((big,), "f32"), ((big,), "f32")]
    instrs.append(("sqrt", [len(slots) - 3], [len(slots) - 2], {}))
    instrs.append(("exp", [len(slots) - 2], [len(slots) - 1], {}))
    desc = {"slots": slots, "instrs": instrs, "feeds": [0, 1, len(slots) - 3],
            "results": [cur, len(slots) - 1]}
    ex = _native.compile(desc, cache=False)
    rng = np.random.default_rng(0)
    x = rng.random((n, n), dtype=np.float32)
    w = np.eye(n, dtype=np.float32)
    y = rng.random(big, dtype=np.float32)
    feeds = [x, w, y]
    expected = ex.run(feeds)

    stop = threading.Event()
    runs = [0]
    def busy():
        while not stop.is_set():
            out = ex.run(feeds)
            if not all(np.array_equal(a, b) for a, b in zip(out, expected)):
                print("wrong result in the parent's thread", flush=True)
                os._exit(5)
            runs[0] += 1
    threads = [threading.Thread(target=busy) for _ in range(int(sys.argv[1]))]
    for t in threads:
        t.start()
    rng = random.Random(0)
    for i in range(int(sys.argv[2])):
        time.sleep(rng.random() * 0.02)
        pid = os.fork()
        if pid == 0:
            out = ex.run(feeds)
            os._exit(0 if all(np.array_equal(a, b) for a, b in zip(out, expected)) else 4)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print(f"child {i} hung", flush=True)
                os._exit(2)
            time.sleep(0.005)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"child {i} exited with {code}", flush=True)
            os._exit(3)
    stop.set()
    for t in threads:
        t.join()
    print("ok", runs[0], flush=True)
    """
)


def run_fork_script(threads: int, forks: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(threads), str(forks)],
        capture_output=True,
        text=True,
        timeout=150,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="2"),
    )


def test_fork_while_other_threads_run_compiled_calls_with_two_blas_threads():
    proc = run_fork_script(threads=2, forks=10)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    word, runs = proc.stdout.split()
    assert word == "ok" and int(runs) > 0
