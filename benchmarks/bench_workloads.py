"""Workloads A–E (docs/performance.md): Lucid eager, Lucid compiled and the peers, side by side.

A quick look only: the reference is ``bench_per_process.py``, which runs each case in a process
of its own (here three frameworks' thread pools share the cores and distort each other).
Every framework runs in this one process, and the timed rounds of a row's cases are interleaved
(one round of each case, then the next), so machine noise hits them alike. Reported per row: the
median time per call (of ``--rounds`` rounds, each long enough to time reliably), the ratio of
Lucid compiled to the best peer, the workload's target and whether it holds, and the first-call
(compile) latency. Peers that are not installed are marked missing.

    python benchmarks/bench_workloads.py [--mode infer|train|all] [--workloads ABCDE]
        [--threads 2] [--rounds 7] [--json results.json] [--chart chart.png] [--quick] [--memory]

Training rows (A with SGD and with Adam; B–E with SGD): Lucid eager, ``make_step`` (compiled
forward + backward) with the eager optimizer, ``fused_step`` (one executable per step: the
"lucid compiled" column), torch eager, torch.compile and JAX jit. ``--memory`` adds each case's
peak RSS growth, measured in a fresh process per case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["infer", "train", "all"], default="all")
    ap.add_argument("--workloads", default="ABCDE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-round-s", type=float, default=0.05)
    ap.add_argument("--json", default=None)
    ap.add_argument("--chart", default=None)
    ap.add_argument(
        "--no-torch-compile",
        action="store_true",
        help="skip torch.compile (its first call takes seconds per workload)",
    )
    ap.add_argument("--quick", action="store_true", help="few rounds: a smoke test, not a result")
    ap.add_argument(
        "--memory",
        action="store_true",
        help="training rows: peak RSS growth per framework, each in a fresh process (slow)",
    )
    ap.add_argument("--measure-memory", default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # Before any BLAS loads: the same thread count everywhere; idle pools stop spinning quickly.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "1")
    os.environ.setdefault(
        "XLA_FLAGS",
        f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}",
    )

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

# Target ratio of Lucid compiled to the best peer, per (mode, workload): docs/performance.md,
# "Workloads A–E".
TARGETS = {
    ("infer", "A"): 0.9,
    ("infer", "B"): 1.0,
    ("infer", "C"): 0.9,
    ("infer", "D"): 0.9,
    ("train", "A"): 0.9,
    ("train", "B"): 1.0,
    ("train", "C"): 0.9,
    ("train", "D"): 0.9,
    # F-H, at the sizes people train.
    **{(mode, wl): 0.9 for mode in ("infer", "train") for wl in W.LARGE},
}
# F-H: first call at most this times JAX jit's, peak memory at most this times the best peer's.
FIRST_CALL_VS_JAX = 0.5
PEAK_VS_BEST_PEER = 1.0
# E is measured against JAX jit only: infer at most 0.7x, train at most 1.0x.
E_TARGETS = {"infer": 0.7, "train": 1.0}
# The peers' times (ms) measured when the targets were set, for the reader; never used in a
# ratio (peers are measured in the same run or the ratio is left out).
REFERENCE_MS = {
    ("train", "A"): {"torch": 0.67, "torch.compile": 0.73, "jax": 0.50},
    ("infer", "A"): {"torch": 0.18, "torch.compile": 0.20, "jax": 0.20},
    ("train", "B"): {"torch": 18.0, "torch.compile": 15.4, "jax": 13.3},
    ("infer", "B"): {"torch": 5.7, "torch.compile": 6.0, "jax": 5.1},
    ("train", "C"): {"torch": 8.1, "torch.compile": 16.4, "jax": 23.0},
    ("infer", "C"): {"torch": 5.7, "torch.compile": 4.8, "jax": 3.8},
    ("train", "D"): {"torch": 10.9, "torch.compile": 10.6, "jax": 12.9},
    ("infer", "D"): {"torch": 3.8, "torch.compile": 3.1, "jax": 3.3},
    ("train", "E"): {"torch": 0.185, "torch.compile": 0.223, "jax": 0.012},
    ("infer", "E"): {"torch": 0.0118, "torch.compile": 0.021, "jax": 0.0072},
}
PEERS = ("torch", "torch.compile", "jax")


ROUND_PAUSE_S = 0.03


def calls_per_round(fn, min_round_s: float) -> int:
    """How many calls of ``fn`` take at least ``min_round_s`` (a power of two)."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_round_s or n >= 1 << 20:
            return n
        n *= 2


def per_call_seconds(fns: dict, rounds: int, min_round_s: float) -> dict:
    """Median over ``rounds`` of the mean time per call, for each of ``fns`` (name -> callable).

    Rounds are interleaved (one round of every case, then the next), so a slow spell of a shared
    machine hits every case of the row alike instead of whichever ran then. Before each round a
    short pause lets the previous framework's worker threads stop spinning (OpenMP and Eigen
    pools busy-wait after a call and would take the cores from the next case), then one untimed
    call wakes this framework's own threads."""
    counts = {name: calls_per_round(fn, min_round_s) for name, fn in fns.items()}
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(ROUND_PAUSE_S)
            fn()
            n = counts[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    return {name: float(np.median(t)) for name, t in times.items()}


def first_call_seconds(make) -> tuple[float, object]:
    t0 = time.perf_counter()
    fn = make()
    fn()
    return time.perf_counter() - t0, fn


# --- inference --------------------------------------------------------------------------------
FRAMEWORKS = ("lucid", "torch", "jax")


def framework_of(case: str) -> str:
    """The framework a case name belongs to ("lucid compiled" -> "lucid", "torch.compile" ->
    "torch")."""
    return case.split()[0].split(".")[0]


def infer_cases(wl: str, args, frameworks=FRAMEWORKS) -> dict[str, tuple]:
    """name -> (make() returning a zero-argument callable; it is called once to compile).

    Only the cases of ``frameworks`` are built (and only those frameworks imported); the peers
    copy Lucid's weights when Lucid is among them."""
    x_np, _ = W.data(wl)
    cases: dict[str, object] = {}
    model = None
    if "lucid" in frameworks:
        import lucid

        model = W.lucid_model(wl).eval()
        x = lucid.tensor(x_np)

        def lucid_eager():
            def run():
                with lucid.no_grad():
                    return model(x)

            return run

        def lucid_compiled():
            cm = lucid.compile(model)

            def run():
                with lucid.no_grad():
                    return cm(x)

            return run

        cases["lucid eager"] = lucid_eager
        cases["lucid compiled"] = lucid_compiled
    try:
        if "torch" not in frameworks:
            raise ImportError
        import torch

        torch.set_num_threads(args.threads)
        tm = W.torch_model(wl, lucid_ref=model).eval()
        tx = torch.from_numpy(x_np)

        def torch_eager():
            def run():
                with torch.no_grad():
                    return tm(tx)

            return run

        cases["torch"] = torch_eager
        if not args.no_torch_compile:

            def torch_compiled():
                cm = torch.compile(tm)

                def run():
                    with torch.no_grad():
                        return cm(tx)

                return run

            cases["torch.compile"] = torch_compiled
    except ImportError:
        pass
    try:
        if "jax" not in frameworks:
            raise ImportError
        import jax

        apply, params = W.jax_forward(wl)
        jx = jax.numpy.asarray(x_np)

        def jax_jit():
            f = jax.jit(apply)
            return lambda: f(params, jx).block_until_ready()

        cases["jax"] = jax_jit
    except ImportError:
        pass
    return cases


OPTIMIZERS = {
    "sgd": "SGD lr 0.01",
    "sgd_momentum": "SGD lr 0.01 momentum 0.9",
    "adam": "Adam lr 1e-3",
    "adamw": "AdamW lr 1e-3 weight decay 0.01",
}


def _lucid_train_cases(wl: str, opt_name: str, x_np, y_np) -> dict:
    """Lucid's training cases, plus the model under "model" (the peers copy its weights)."""
    import lucid

    cases: dict[str, object] = {}
    model = W.lucid_model(wl)
    loss_fn = W.lucid_loss(wl)
    x = lucid.tensor(x_np)
    extra = (lucid.tensor(y_np),) if y_np is not None else ()

    def lucid_opt():
        return W.optimizer(lucid.optim, opt_name, model.parameters())

    def lucid_eager():
        opt = lucid_opt()

        def run():
            opt.zero_grad()
            loss = loss_fn(model(x), *extra)
            loss.backward()
            opt.step()

        return run

    def lucid_make_step():
        opt = lucid_opt()
        step = lucid.compile.make_step(model, loss_fn)

        def run():
            opt.zero_grad()
            step(x, *extra).backward()
            opt.step()

        return run

    def lucid_fused():
        step = lucid.compile.fused_step(model, loss_fn, lucid_opt())
        return lambda: step(x, *extra)

    cases["lucid eager"] = lucid_eager
    cases["lucid make_step"] = lucid_make_step
    cases["lucid compiled"] = lucid_fused
    cases["model"] = model
    return cases


def train_cases(wl: str, args, opt_name: str = "sgd", frameworks=FRAMEWORKS) -> dict[str, object]:
    """Training rows: Lucid eager, ``make_step`` + eager optimizer, ``fused_step`` ("lucid
    compiled"), torch eager, torch.compile, JAX jit; all with ``opt_name`` (SGD or Adam). Only
    the cases of ``frameworks`` are built."""
    x_np, y_np = W.data(wl)
    cases: dict[str, object] = {}
    model = None
    if "lucid" in frameworks:
        cases.update(_lucid_train_cases(wl, opt_name, x_np, y_np))
        model = cases.pop("model")
    try:
        if "torch" not in frameworks:
            raise ImportError
        import torch

        torch.set_num_threads(args.threads)
        tm = W.torch_model(wl, lucid_ref=model)
        tl = W.torch_loss(wl)
        tx = torch.from_numpy(x_np)
        textra = (torch.from_numpy(y_np),) if y_np is not None else ()

        def torch_opt(m):
            return W.optimizer(torch.optim, opt_name, m.parameters())

        def torch_step(m):
            opt = torch_opt(m)

            def run():
                opt.zero_grad()
                loss = tl(m(tx), *textra)
                loss.backward()
                opt.step()

            return run

        cases["torch"] = lambda: torch_step(tm)
        if not args.no_torch_compile:

            def torch_compiled():
                opt = torch_opt(tm)

                @torch.compile
                def step():
                    opt.zero_grad()
                    loss = tl(tm(tx), *textra)
                    loss.backward()
                    opt.step()

                return step

            cases["torch.compile"] = torch_compiled
    except ImportError:
        pass
    try:
        if "jax" not in frameworks:
            raise ImportError
        import jax

        apply, params = W.jax_forward(wl, train=True)
        jl = W.jax_loss(wl)
        jx = jax.numpy.asarray(x_np)
        jextra = (jax.numpy.asarray(y_np),) if y_np is not None else ()

        def jax_jit():
            step, state = jax_train_step(lambda p, x, *e: jl(apply(p, x), *e), params, opt_name)
            box = {"st": state}

            def run():
                box["st"] = step(box["st"], jx, *jextra)
                jax.block_until_ready(box["st"])

            return run

        cases["jax"] = jax_jit
    except ImportError:
        pass
    return cases


def jax_train_step(loss, params, opt_name: str = "sgd"):
    """(step, state): a ``jax.jit`` training step of ``loss(params, x, *extra)`` with the
    optimizer ``opt_name`` of ``workloads.OPTIMIZER_SETTINGS``, updating as PyTorch's does;
    ``step(state, x, *extra)`` returns the next state."""
    import jax
    import jax.numpy as jnp

    tmap = jax.tree_util.tree_map
    settings = W.OPTIMIZER_SETTINGS[opt_name][1]
    lr = settings["lr"]

    @jax.jit
    def sgd_step(st, x, *e):
        g = jax.grad(loss)(st["p"], x, *e)
        if "m" not in st:
            return {"p": tmap(lambda a, b: a - lr * b, st["p"], g)}
        # PyTorch's momentum: the first step's buffer is the gradient itself.
        mu = settings["momentum"]
        m = tmap(lambda m, g: jnp.where(st["t"] > 0, mu * m + g, g), st["m"], g)
        return {"p": tmap(lambda a, b: a - lr * b, st["p"], m), "m": m, "t": st["t"] + 1.0}

    @jax.jit
    def adam_step(st, x, *e):
        b1, b2, eps = 0.9, 0.999, 1e-8
        g = jax.grad(loss)(st["p"], x, *e)
        t = st["t"] + 1.0
        p = st["p"]
        if "weight_decay" in settings:  # AdamW: decoupled decay first
            p = tmap(lambda p: p * (1 - lr * settings["weight_decay"]), p)
        m = tmap(lambda m, g: b1 * m + (1 - b1) * g, st["m"], g)
        v = tmap(lambda v, g: b2 * v + (1 - b2) * g * g, st["v"], g)
        c1, c2 = 1 - b1**t, 1 - b2**t
        p = tmap(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), p, m, v)
        return {"p": p, "m": m, "v": v, "t": t}

    zeros = tmap(jnp.zeros_like, params)
    if opt_name in ("adam", "adamw"):
        return adam_step, {"p": params, "m": zeros, "v": zeros, "t": jnp.float32(0.0)}
    if opt_name == "sgd_momentum":
        return sgd_step, {"p": params, "m": zeros, "t": jnp.float32(0.0)}
    return sgd_step, {"p": params}


def peak_memory_mb(mode: str, wl: str, case: str, opt_name: str, args) -> float | None:
    """Peak RSS growth (MB) of building and running ``case`` 20 times, in a fresh process (so
    every framework is measured the same way, allocator and compiler included)."""
    import subprocess

    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--measure-memory",
        f"{mode}:{wl}:{case}:{opt_name}",
        "--threads",
        str(args.threads),
    ]
    if args.no_torch_compile:
        cmd.append("--no-torch-compile")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def _measure_memory(spec: str, args) -> None:
    mode, wl, case, opt_name = spec.split(":")
    # Only the measured framework is imported (a blocked import makes its cases skip), so
    # another framework's import does not set the peak.
    needed = {"torch": "torch", "torch.compile": "torch", "jax": "jax"}.get(case)
    for framework in ("torch", "jax"):
        if framework != needed:
            sys.modules[framework] = None  # type: ignore[assignment]
    cases = infer_cases(wl, args) if mode == "infer" else train_cases(wl, args, opt_name)
    make = cases[case]
    base = high_water_mb()
    fn = make()
    for _ in range(20):
        fn()
    print(high_water_mb() - base)


def high_water_mb() -> float:
    """This process's peak RSS so far, MB: ``VmHWM``, which belongs to this process's address
    space (``ru_maxrss`` would start at the parent's RSS at fork time on Linux and hide
    everything below it); ``ru_maxrss`` where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def summarize(row: dict) -> dict:
    """Add the ratio of Lucid compiled to the best measured peer (for E: to JAX jit), its
    target and whether it holds, and the speed-ups over Lucid eager, to ``row``.

    A ratio is only ever taken against a peer measured in this run: with no peer installed the
    row says so (``peer_source``) and has no ratio; earlier peer figures stay in
    ``REFERENCE_MS`` for the reader, never in a ratio."""
    mode, wl = row["mode"], row["workload"]
    peers = {p: row["ms"][p] for p in PEERS if p in row["ms"]}
    row["peer_source"] = "measured" if peers else "no peer installed"
    compiled = row["ms"].get("lucid compiled")
    if wl == "E":
        base_name = "jax" if "jax" in peers else None
        target = E_TARGETS[mode]
    else:
        base_name = min(peers, key=peers.get) if peers else None
        target = TARGETS.get((mode, wl))
    if compiled is not None and base_name is not None:
        row["vs"] = base_name
        row["ratio"] = compiled / peers[base_name]
        row["target"] = target
        row["holds"] = row["ratio"] <= target
    eager = row["ms"].get("lucid eager")
    if compiled is not None and eager:
        row["speedup_vs_eager"] = eager / compiled
    made = row["ms"].get("lucid make_step")
    if made is not None and eager:
        row["make_step_speedup_vs_eager"] = eager / made
    return row


def run_row(mode: str, wl: str, args, opt_name: str | None = None) -> dict:
    if mode == "infer":
        cases = infer_cases(wl, args)
    else:
        opt_name = opt_name or "sgd"
        cases = train_cases(wl, args, opt_name)
    what = W.WORKLOADS[wl] + (f", {OPTIMIZERS[opt_name]}" if opt_name else "")
    row: dict = {"mode": mode, "workload": wl, "what": what, "ms": {}, "compile_s": {}}
    if opt_name:
        row["opt"] = opt_name
    ready = {}
    for name, make in cases.items():
        try:
            first, fn = first_call_seconds(make)
            row["compile_s"][name] = first
            calls_per_round(fn, 0.0)  # a peer failing on its second call is caught here
            ready[name] = fn
        except Exception as e:  # a peer failing must not hide the other rows
            row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
    for name, seconds in per_call_seconds(ready, args.rounds, args.min_round_s).items():
        row["ms"][name] = seconds * 1e3
    if getattr(args, "memory", False) and mode == "train":
        row["peak_mb"] = {
            name: peak_memory_mb(mode, wl, name, opt_name, args)
            for name in cases
            if name in row["ms"]
        }
    summarize(row)
    return row


def fmt_ms(v) -> str:
    if v is None:
        return "missing"
    return f"{v * 1e3:.1f} µs" if v < 0.1 else f"{v:.3f} ms"


def summary_cells(r: dict) -> tuple[str, str, str, str, str]:
    """Ratio (vs peer), target, holds, speedup over eager and first-call seconds of a row."""
    ratio = f"{r['ratio']:.2f} ({r['vs']})" if "ratio" in r else "-"
    tgt = f"<= {r['target']}" if r.get("target") else "-"
    holds = ("yes" if r["holds"] else "NO") if "holds" in r else "-"
    sp = f"{r['speedup_vs_eager']:.1f}x" if "speedup_vs_eager" in r else "-"
    cs = " / ".join(
        f"{r['compile_s'][c]:.3f}" if c in r["compile_s"] else "-"
        for c in ("lucid compiled", "torch.compile", "jax")
    )
    return ratio, tgt, holds, sp, cs


def print_table(rows: list[dict]) -> None:
    if any(r["mode"] == "train" for r in rows):
        print_train_table([r for r in rows if r["mode"] == "train"])
        rows = [r for r in rows if r["mode"] != "train"]
        if not rows:
            return
        print()
    cols = ["lucid eager", "lucid compiled", "torch", "torch.compile", "jax"]
    print(
        "| mode | wl | " + " | ".join(cols) + " | ratio (vs) | target | holds | vs eager |"
        " compile s (lucid / torch.compile / jax) |"
    )
    print("|" + "---|" * (len(cols) + 7))
    for r in rows:
        cells = [fmt_ms(r["ms"].get(c)) for c in cols]
        ratio, tgt, holds, sp, cs = summary_cells(r)
        print(
            f"| {r['mode']} | {r['workload']} | "
            + " | ".join(cells)
            + f" | {ratio} | {tgt} | {holds} | {sp} | {cs} |"
        )
    for r in rows:
        for name, err in r.get("errors", {}).items():
            print(f"note: {r['mode']} {r['workload']} {name}: {err}")


TRAIN_COLS = ["lucid eager", "lucid make_step", "lucid compiled", "torch", "torch.compile", "jax"]


def print_train_table(rows: list[dict]) -> None:
    """Training rows: "lucid compiled" is ``fused_step``; "lucid make_step" is the compiled
    forward + backward with the eager optimizer."""
    head = ["lucid eager", "make_step + eager opt", "fused_step", "torch", "torch.compile", "jax"]
    print(
        "| wl | opt | " + " | ".join(head) + " | ratio (vs) | target | holds | fused vs eager |"
        " first call s (fused / torch.compile / jax) | peak MB (eager / fused / torch / jax) |"
    )
    print("|" + "---|" * (len(head) + 8))
    for r in rows:
        cells = [fmt_ms(r["ms"].get(c)) for c in TRAIN_COLS]
        ratio, tgt, holds, sp, cs = summary_cells(r)
        mem = r.get("peak_mb", {})
        mb = " / ".join(
            f"{mem[c]:.0f}" if mem.get(c) is not None else "-"
            for c in ("lucid eager", "lucid compiled", "torch", "jax")
        )
        print(
            f"| {r['workload']} | {r.get('opt', '-')} | "
            + " | ".join(cells)
            + f" | {ratio} | {tgt} | {holds} | {sp} | {cs} | {mb} |"
        )
    for r in rows:
        for name, err in r.get("errors", {}).items():
            print(f"note: train {r['workload']} {name}: {err}")


def chart(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib missing, no chart written")
        return
    cols = ["lucid eager", "lucid compiled", "torch", "torch.compile", "jax"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels = [f"{r['mode']} {r['workload']}" for r in rows]
    width = 0.16
    for k, c in enumerate(cols):
        vals = [r["ms"].get(c, np.nan) for r in rows]
        ax.bar(np.arange(len(rows)) + (k - 2) * width, vals, width, label=c)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(rows)), labels)
    ax.set_ylabel("ms per call (log)")
    ax.set_title("Lucid vs peers, median time per call (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    args = ARGS
    if args.measure_memory:
        _measure_memory(args.measure_memory, args)
        return
    if args.quick:
        args.rounds, args.min_round_s = 3, 0.01
    modes = ["infer", "train"] if args.mode == "all" else [args.mode]
    rows = []
    for mode in modes:
        for wl in args.workloads:
            if mode == "train":
                # The training rows: A with SGD and with Adam, the others with SGD.
                for opt_name in W.train_optimizers(wl):
                    rows.append(run_row(mode, wl, args, opt_name))
                    print(f"done {mode} {wl} {opt_name}", file=sys.stderr)
                continue
            rows.append(run_row(mode, wl, args))
            print(f"done {mode} {wl}", file=sys.stderr)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "rows": rows}, f, indent=1)
    if args.chart:
        chart(rows, args.chart)


if __name__ == "__main__":
    main()
