"""Compile time and memory against program size: per stage, fitted growth exponents, peers.

    python benchmarks/bench_compile_scaling.py [--models transformer,chain,lstm,resnet]
        [--modes infer,train] [--frameworks lucid,jax,torch.compile] [--quick]
        [--sizes transformer=1,2,4 --sizes chain:train=250,500] [--peer-sizes chain=250]
        [--budget-s 600] [--threads 2] [--repeats 1] [--lucid-backend cpu]
        [--json PATH] [--chart PATH] [--write]

Every (model, mode, size, framework) case runs in a fresh process that imports only its
framework, compiles a small warm-up program (so imports and one-time set-up stay out of the
figures; its first call is kept as ``warmup_s``), builds the model (``scaling_models.py``) and
times its first call: trace + compile + one run. Inference: ``lucid.compile(model)`` under
``no_grad``, ``torch.compile``, ``jax.jit``; training: ``lucid.compile.fused_step`` with Adam,
a ``torch.compile``d step, a ``jax.jit`` Adam step. Lucid's cases also report the time of every
compiler stage (``timing()``'s ``passes_ms``: import, each graph pass, ``lower-to-prim``, the
backend's passes, ``backend-compile``; training adds ``trace``, ``vjp`` and friends), the CPU
backend's own split of ``backend-compile`` (emitting, kernel fusion, elementwise fusion, the
native build: measured by wrapping those functions in the child, ``backend:*``), the rest of the
first call (tracing, binding and the run: ``rest``), the number of ops in the forward trace (the
program size) and the peak-RSS growth of the first call (``VmHWM``). The peers report their
first call and peak-RSS growth. ``--lucid-backend mpsgraph-reference`` compiles Lucid's cases for
MPSGraph instead (legalization, emission and binding, recorded by the numpy reference builder,
which also runs the first call: its ``rest`` is numpy's, not a Mac's).

A row is one (model, mode, size); its cases run back to back, their order rotated from row to
row, so a slow spell of the shared machine hits a row's frameworks alike. A case that fails or
overruns ``--budget-s`` ends its series: the larger sizes of that (model, mode, framework) are
skipped (said so in the table).

Per (model, mode) series the script fits a growth exponent per stage, log-log least squares of
the stage's milliseconds against the forward ops; stages that stay under ``SMALL_STAGE_MS`` at
every size are shown but not judged (timer noise). It prints the scale targets against the
results:

- every stage's exponent <= 1.15 (first call and peak memory too),
- ``fused_step`` first call of the depth-16 transformer <= 0.25x JAX's train step's,
- inference first call of the depth-16 transformer <= 0.5x JAX's,
- a graph of 10,000 ops (the 5,000-pair chain) compiles in under 10 s,
- compile peak memory linear (exponent <= 1.15).

``--write`` stores the run as the reference: ``benchmarks/results/compile_scaling.json`` and
``docs/compile_scaling.png`` (what docs/performance.md, "Scaling", shows). Without matplotlib no
chart is drawn; without a peer its cases are marked missing and its targets "not measured".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
REFERENCE_JSON = os.path.join(HERE, "results", "compile_scaling.json")
REFERENCE_CHART = os.path.join(REPO, "docs", "compile_scaling.png")

MODES = ("infer", "train")
FRAMEWORKS = ("lucid", "jax", "torch.compile")
FRAMEWORK_MODULES = {"lucid": "lucid", "jax": "jax", "torch.compile": "torch"}
DEFAULT_SIZES = {
    "transformer": (1, 2, 4, 8, 16, 32, 48),
    "chain": (250, 500, 1000, 2000, 4000, 8000),
    "lstm": (25, 50, 100, 200, 400),
    # All past fused_step's update-fusion limit (65,536 parameter elements, about 14 blocks):
    # a series crossing it would fit two different training programs.
    "resnet": (16, 24, 32, 48, 64, 96),
}
QUICK_SIZES = {
    "transformer": (1, 2, 4),
    "chain": (250, 500, 1000),
    "lstm": (25, 50, 100),
    "resnet": (1, 2, 4),
}
SIZE_NAMES = {"transformer": "depth", "chain": "pairs", "lstm": "T", "resnet": "blocks"}

# The scale targets: every stage linear, first calls well under JAX's.
MAX_EXPONENT = 1.15
TRAIN_VS_JAX = 0.25  # fused_step first call of the depth-16 transformer, over JAX's
INFER_VS_JAX = 0.5
PEER_DEPTH = 16
BIG_GRAPH_OPS = 10_000
BIG_GRAPH_S = 10.0
# A stage below this at every size is timer noise: its exponent is shown, not judged.
SMALL_STAGE_MS = 20.0
# Peak memory below this at every size is allocator noise, likewise.
SMALL_PEAK_MB = 8.0
# The warm-up program of every case's process: a chain of this many pairs (no measured size,
# so no cache of the framework serves the measured program from it).
WARMUP_PAIRS = 3


# --- arithmetic -------------------------------------------------------------------------------
def fit_exponent(sizes, values) -> float | None:
    """The slope of log(value) against log(size) by least squares: ``value ~ size**slope``.
    Points with a non-positive size or value are left out; None with fewer than two distinct
    sizes left."""
    pts = [
        (math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True) if s > 0 and v > 0
    ]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    return sxy / sxx


def series_exponents(points: list[dict]) -> dict[str, dict]:
    """Per stage of a Lucid series (``points``: its successful cases, each with ``n_ops``,
    ``stages_ms``, ``first_call_s`` and ``peak_mb``): ``exponent``, ``max_ms`` and ``judged``
    (False for a stage too small to time). ``first call`` and ``peak memory`` are fitted too."""
    out: dict[str, dict] = {}
    if not points:
        return out
    sizes = [p["n_ops"] for p in points]
    names: list[str] = []
    for p in points:
        names += [k for k in p["stages_ms"] if k not in names]
    for name in names:
        values = [p["stages_ms"].get(name, 0.0) for p in points]
        exponent = fit_exponent(sizes, values)
        out[name] = {
            "exponent": exponent,
            "max_ms": max(values),
            # A stage run at one size only (a pass that skips the others) has no slope to judge.
            "judged": exponent is not None and max(values) >= SMALL_STAGE_MS,
        }
    first = [p["first_call_s"] * 1e3 for p in points]
    out["first call"] = {
        "exponent": fit_exponent(sizes, first),
        "max_ms": max(first),
        "judged": max(first) >= SMALL_STAGE_MS,
    }
    peaks = [p.get("peak_mb") or 0.0 for p in points]
    out["peak memory"] = {
        "exponent": fit_exponent(sizes, peaks),
        "max_mb": max(peaks),
        "judged": max(peaks) >= SMALL_PEAK_MB,
    }
    return out


def _verdict(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def check_targets(results: list[dict], exponents: dict[str, dict]) -> list[dict]:
    """The scale targets against a run: one dict per target with ``target``, ``value``,
    ``limit`` and ``holds`` (None: not measured in this run). ``results`` are the cases (dicts
    with ``model``, ``mode``, ``size``, ``framework`` and, when they succeeded,
    ``first_call_s``); ``exponents`` maps "model mode" to ``series_exponents``."""
    ok = {
        (r["model"], r["mode"], r["size"], r["framework"]): r
        for r in results
        if "first_call_s" in r
    }
    targets: list[dict] = []
    worst = None
    worst_peak = None
    for series, stages in exponents.items():
        for stage, e in stages.items():
            if not e["judged"] or e["exponent"] is None:
                continue
            entry = (e["exponent"], f"{series}: {stage}")
            if stage == "peak memory":
                worst_peak = max(worst_peak or entry, entry)
            else:
                worst = max(worst or entry, entry)
    targets.append(_target("every stage's growth exponent", worst, MAX_EXPONENT))
    for mode, limit in (("train", TRAIN_VS_JAX), ("infer", INFER_VS_JAX)):
        lucid = ok.get(("transformer", mode, PEER_DEPTH, "lucid"))
        jax = ok.get(("transformer", mode, PEER_DEPTH, "jax"))
        ratio = (lucid["first_call_s"] / jax["first_call_s"], None) if lucid and jax else None
        what = "fused_step" if mode == "train" else "inference"
        targets.append(
            _target(f"{what} first call, transformer depth {PEER_DEPTH}, vs JAX", ratio, limit)
        )
    targets.append(big_graph_target(results))
    targets.append(_target("compile peak memory's growth exponent", worst_peak, MAX_EXPONENT))
    return targets


def _target(what: str, measured: tuple[float, str | None] | None, limit: float) -> dict:
    """A target's entry from ``(value, where)`` (None: not measured)."""
    value, where = measured if measured is not None else (None, None)
    return {
        "target": what,
        "value": value,
        "where": where,
        "limit": limit,
        "holds": _verdict(value, limit),
    }


def big_graph_target(results: list[dict]) -> dict:
    """The first call of the smallest Lucid inference chain of at least BIG_GRAPH_OPS ops (the
    chain has two ops per pair: the size is known before it runs); a case over the budget
    counts as a miss, with the budget as a lower bound."""
    chains = sorted(
        (
            r
            for r in results
            if (r["model"], r["mode"], r["framework"]) == ("chain", "infer", "lucid")
            and (r.get("n_ops") or 2 * r["size"] + 1) >= BIG_GRAPH_OPS
            and ("first_call_s" in r or r.get("over_budget"))
        ),
        key=lambda r: r["size"],
    )
    target = _target(f"a {BIG_GRAPH_OPS:,}-op graph compiles (first call, s)", None, BIG_GRAPH_S)
    if chains:
        r = chains[0]
        value = r.get("first_call_s", r.get("budget_s"))
        over = "first_call_s" not in r
        target.update(
            value=value,
            where=f"chain {r['size']} pairs" + (": over the budget" if over else ""),
            holds=False if over else _verdict(value, BIG_GRAPH_S),
        )
    return target


def schedule(rows: list[tuple], frameworks: list[str]) -> list[tuple]:
    """The run order: for each row (model, mode, size), its frameworks back to back, the order
    rotated by one from row to row (so no framework always runs first, after a quiet spell)."""
    order = []
    for i, row in enumerate(rows):
        k = i % len(frameworks) if frameworks else 0
        order += [(*row, fw) for fw in frameworks[k:] + frameworks[:k]]
    return order


def planned_rows(models, modes, sizes: dict) -> list[tuple]:
    """(model, mode, size) of every row: per model and mode, the sizes (``sizes[model, mode]``)
    in increasing order."""
    return [(m, mode, n) for m in models for mode in modes for n in sorted(sizes[m, mode])]


# --- arguments --------------------------------------------------------------------------------
def parse_sizes(specs: list[str]) -> dict[tuple[str, str], tuple[int, ...]]:
    """``["transformer=1,2,4", "chain:train=250,500"]`` -> {(model, mode): sizes}: a spec
    without ``:MODE`` sets both modes, a later spec overrides an earlier one."""
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        model, _, mode = name.partition(":")
        if not sep or model not in DEFAULT_SIZES or mode not in ("", *MODES):
            raise ValueError(
                f"--sizes {spec!r}: expected MODEL[:MODE]=N,N,... with MODEL in "
                f"{list(DEFAULT_SIZES)} and MODE in {list(MODES)}"
            )
        try:
            sizes = tuple(int(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"--sizes {spec!r}: sizes must be integers") from None
        if not sizes or min(sizes) < 1:
            raise ValueError(f"--sizes {spec!r}: give at least one size, each at least 1")
        for m in (mode,) if mode else MODES:
            out[model, m] = sizes
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_SIZES))
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument(
        "--sizes",
        action="append",
        default=[],
        help="MODEL[:MODE]=N,N,... (repeatable); default: the issue's sizes (--quick: small ones)",
    )
    ap.add_argument(
        "--peer-sizes",
        action="append",
        default=[],
        help="MODEL[:MODE]=N,N,... (repeatable): the sizes the peers run at (default: all; "
        "torch.compile's training step takes about a minute at any size)",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes of every model")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="per case: a case over it is stopped and ends its series",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--lucid-backend",
        default="cpu",
        help="the backend Lucid's cases compile for (cpu, or mpsgraph-reference: the MPSGraph "
        "emission recorded and run by its numpy reference builder)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="fresh processes per case; the fits take each stage's median (a stage of tens of "
        "milliseconds moves by 20%% from one process to the next, which bends one-shot fits)",
    )
    ap.add_argument(
        "--lucid-python",
        default=None,
        help="interpreter for Lucid's cases (default: the one running this script)",
    )
    ap.add_argument("--json", default=None, help="write the run's results to PATH")
    ap.add_argument("--chart", default=None, help="write the log-log chart (PNG) to PATH")
    ap.add_argument(
        "--write",
        action="store_true",
        help="store the run as the reference (benchmarks/results/compile_scaling.json and "
        "docs/compile_scaling.png)",
    )
    ap.add_argument(
        "--report",
        default=None,
        help="measure nothing: report (tables, exponents, targets; --json/--chart/--write) the "
        "cases of PATH, a JSON this script wrote or the .partial.jsonl it appends as it runs",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return args
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for given, allowed, flag in (
        (args.models, DEFAULT_SIZES, "--models"),
        (args.modes, MODES, "--modes"),
        (args.frameworks, FRAMEWORKS, "--frameworks"),
    ):
        bad = [g for g in given if g not in allowed]
        if bad or not given:
            ap.error(f"{flag}: unknown or empty {bad or given}; choose from {list(allowed)}")
    if args.budget_s <= 0 or args.threads < 1:
        ap.error("--budget-s must be positive and --threads at least 1")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.lucid_python is not None and not os.access(args.lucid_python, os.X_OK):
        ap.error(f"--lucid-python {args.lucid_python!r} is not an executable")
    try:
        given = parse_sizes(args.sizes)
        args.peer_plan = parse_sizes(args.peer_sizes)
    except ValueError as e:
        ap.error(str(e))
    base = QUICK_SIZES if args.quick else DEFAULT_SIZES
    args.size_plan = {
        (m, mode): given.get((m, mode), base[m]) for m in args.models for mode in MODES
    }
    return args


# --- child ------------------------------------------------------------------------------------
class _SelfTimer:
    """Milliseconds spent inside wrapped functions, each counted once (a wrapped function
    called by another wrapped one is taken out of its caller's time)."""

    def __init__(self):
        self.ms: dict[str, float] = {}
        self._stack: list[list[float]] = []

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                t0, inner = self._stack.pop()
                total = time.perf_counter() - t0
                self.ms[name] = self.ms.get(name, 0.0) + (total - inner) * 1e3
                if self._stack:
                    self._stack[-1][1] += total

        return timed


# The CPU backend's steps inside ``backend-compile``: (module, attribute, stage name). Looked up
# when called, so wrapping the module attribute catches them; a name the backend no longer has
# is skipped (its time stays in ``backend:other``).
BACKEND_STEPS = (
    ("lucid.backends.cpu.emit", "emit_program", "backend:emit"),
    ("lucid.backends.cpu.rewrites", "fuse_kernels", "backend:fuse-kernels"),
    ("lucid.backends.cpu.fuse_elementwise", "fuse_elementwise", "backend:fuse-elementwise"),
)


class _NativeProxy:
    """The backend's ``_native`` module with ``compile`` timed."""

    def __init__(self, native, timer: _SelfTimer):
        self._native = native
        self.compile = timer.wrap("backend:native-build", native.compile)

    def __getattr__(self, name):
        return getattr(self._native, name)


@contextlib.contextmanager
def backend_split():
    """Time the CPU backend's steps while the block runs: yields the timer."""
    import importlib

    timer = _SelfTimer()
    undo = []
    for module_name, attr, stage in BACKEND_STEPS:
        try:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
        except (ImportError, AttributeError):
            continue
        setattr(module, attr, timer.wrap(stage, original))
        undo.append((module, attr, original))
    try:
        backend = importlib.import_module("lucid.backends.cpu.backend")
        undo.append((backend, "_native", backend._native))
        backend._native = _NativeProxy(backend._native, timer)
    except (ImportError, AttributeError):
        pass
    try:
        yield timer
    finally:
        for module, attr, original in reversed(undo):
            setattr(module, attr, original)


def _lucid_case(model_name: str, mode: str, n: int, x_np, backend: str = "cpu") -> dict:
    import bench_workloads as BW
    import scaling_models as SM

    import lucid

    model = SM.lucid_model(model_name, n)
    x = lucid.tensor(x_np)
    base = BW.high_water_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    with backend_split() as timer:
        if mode == "infer":
            model.eval()
            compiled = lucid.compile(model, backend=backend)
            with lucid.no_grad():
                compiled(x)
        else:
            opt = lucid.optim.Adam(model.parameters(), lr=1e-3)
            compiled = lucid.compile.fused_step(
                model, lambda out: (out * out).mean(), opt, backend=backend
            )
            compiled(x)
    first, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    extra = {}
    if mode == "train":
        from lucid.compile.training.entries import _fuse_updates

        extra["fused_updates"] = _fuse_updates(model.parameters())
    peak = BW.high_water_mb() - base
    rows = compiled.timing()
    if not rows:  # nothing compiled: the first call ran eagerly, there is nothing to time
        raise RuntimeError(f"the {backend} compile fell back to eager")
    passes = dict(rows[0]["passes_ms"])
    stages = dict(passes)
    split = dict(timer.ms)
    if "backend-compile" in stages and split:
        whole = stages.pop("backend-compile")
        stages.update(split)
        stages["backend:other"] = max(whole - sum(split.values()), 0.0)
    stages["rest"] = max(first * 1e3 - sum(passes.values()), 0.0)
    from lucid.trace import trace

    with lucid.no_grad():
        n_ops = len(trace(model, x).ops)
    return {
        "first_call_s": first,
        "first_call_cpu_s": cpu,
        "peak_mb": peak,
        "passes_ms": passes,
        "stages_ms": stages,
        "n_ops": n_ops,
        "compile_ms": rows[0]["compile_ms"] if rows else None,
        "version": getattr(lucid, "__version__", None),
        **extra,
    }


def _torch_case(model_name: str, mode: str, n: int, x_np, threads: int) -> dict:
    import bench_workloads as BW
    import scaling_models as SM
    import torch

    torch.set_num_threads(threads)
    model = SM.torch_model(model_name, n)
    x = torch.from_numpy(x_np)
    base = BW.high_water_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if mode == "infer":
        model.eval()
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(x)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        @torch.compile
        def step():
            opt.zero_grad()
            out = model(x)
            (out * out).mean().backward()
            opt.step()

        step()
    return {
        "first_call_s": time.perf_counter() - t0,
        "first_call_cpu_s": time.process_time() - cpu0,
        "peak_mb": BW.high_water_mb() - base,
        "version": torch.__version__,
    }


def _jax_case(model_name: str, mode: str, n: int, x_np) -> dict:
    import bench_workloads as BW
    import jax
    import scaling_models as SM

    apply, params = SM.jax_model(model_name, n, train=mode == "train")
    x = jax.numpy.asarray(x_np)
    base = BW.high_water_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if mode == "infer":
        jax.jit(apply)(params, x).block_until_ready()
    else:
        step, state = BW.jax_train_step(lambda p, x: (apply(p, x) ** 2).mean(), params, "adam")
        jax.block_until_ready(step(state, x))
    return {
        "first_call_s": time.perf_counter() - t0,
        "first_call_cpu_s": time.process_time() - cpu0,
        "peak_mb": BW.high_water_mb() - base,
        "version": jax.__version__,
    }


def run_child(spec: str, threads: int, backend: str = "cpu") -> dict:
    """Build and first-call one case in this (fresh) process."""
    model_name, mode, size, framework = spec.split(":")
    n = int(size)
    for other, module in FRAMEWORK_MODULES.items():
        if other != framework:
            sys.modules[module] = None  # type: ignore[assignment]
    import scaling_models as SM

    def first_call(model: str, size: int) -> dict:
        x_np = SM.input_array(model, size)
        if framework == "lucid":
            return _lucid_case(model, mode, size, x_np, backend)
        if framework == "torch.compile":
            return _torch_case(model, mode, size, x_np, threads)
        return _jax_case(model, mode, size, x_np)

    # The framework's imports and one-time set-up are paid by a warm-up compile of another
    # program, so the first call measured is the compile of this size alone.
    warmup = first_call("chain", WARMUP_PAIRS)
    return dict(first_call(model_name, n), warmup_s=warmup["first_call_s"])


# --- parent -----------------------------------------------------------------------------------
def thread_env(threads: int) -> dict[str, str]:
    import bench_per_process as BP

    return BP.thread_env(threads)


def interpreter(framework: str, args) -> str:
    if framework == "lucid" and args.lucid_python:
        return args.lucid_python
    return sys.executable


def installed(framework: str, args) -> bool:
    import bench_per_process as BP

    return BP._importable(FRAMEWORK_MODULES[framework], interpreter(framework, args))


def spawn(case: tuple, args) -> dict:
    """Run one case in a fresh process within the budget: its result, or ``error``."""
    model, mode, size, framework = case
    cmd = [
        interpreter(framework, args),
        os.path.abspath(__file__),
        "--child",
        f"{model}:{mode}:{size}:{framework}",
        "--threads",
        str(args.threads),
        "--lucid-backend",
        args.lucid_backend,
    ]
    env = dict(os.environ, **thread_env(args.threads))
    env.pop("LUCID_COMPILE_DISK_CACHE", None)  # every compile measured from scratch
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.budget_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {
            "error": f"over the {args.budget_s:.0f} s budget",
            "over_budget": True,
            "budget_s": args.budget_s,
        }
    try:
        result = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = out.stderr.strip().splitlines()[-3:]
        return {"error": f"exit {out.returncode}: " + " | ".join(tail)}
    result["process_s"] = time.perf_counter() - t0
    return result


def run_plan(args, spawn_case=spawn, on_case=None) -> list[dict]:
    """Every planned case, in ``schedule`` order, ``args.repeats`` times: as that many passes
    over the whole plan, the order reversed every other pass, so a machine whose speed drifts
    over minutes shifts every size alike instead of bending the growth fits (back-to-back
    repeats in increasing sizes put every series' largest sizes last). A case is the median of
    its runs (``median_run``). A failed or over-budget run ends its series: its larger sizes are
    not run again and are recorded as skipped. Missing frameworks are recorded as missing.
    ``on_case(run)`` is called after each run (the case's fields and ``pass``)."""
    rows = planned_rows(args.models, args.modes, args.size_plan)
    present = [fw for fw in args.frameworks if installed(fw, args)]
    peer_plan = getattr(args, "peer_plan", {})
    order = [
        c
        for c in schedule(rows, present)
        if c[3] == "lucid" or c[2] in peer_plan.get((c[0], c[1]), (c[2],))
    ]
    runs: dict[tuple, list[dict]] = {}
    failed_at: dict[tuple, int] = {}  # series -> the smallest size that failed
    for p in range(max(1, getattr(args, "repeats", 1))):
        for model, mode, n, fw in order if p % 2 == 0 else order[::-1]:
            series = (model, mode, fw)
            if n >= failed_at.get(series, n + 1):
                continue  # the series ended at or below this size
            run = spawn_case((model, mode, n, fw), args)
            runs.setdefault((model, mode, n, fw), []).append(run)
            if on_case is not None:
                on_case(_case(model, mode, n, fw, **run, **{"pass": p}))
            shown = f"{run['first_call_s']:.2f} s" if "first_call_s" in run else run["error"]
            print(f"{model} {mode} {SIZE_NAMES[model]} {n} {fw}: {shown}", file=sys.stderr)
            if "error" in run:
                failed_at[series] = min(n, failed_at.get(series, n))
    return assemble(rows, args.frameworks, present, runs)


def assemble(rows: list[tuple], frameworks: list[str], present: list[str], runs: dict) -> list:
    """The cases of a plan from its runs (``runs[model, mode, size, framework]``: a list): per
    series in increasing size, each case's ``median_run``; after a failed case, the larger sizes
    are skipped; a framework not ``present`` is missing."""
    results: list[dict] = []
    ended: dict[tuple, str] = {}
    for model, mode, n in rows:
        for fw in frameworks:
            if fw not in present:
                results.append(_case(model, mode, n, fw, missing=True))
                continue
            series = (model, mode, fw)
            if series in ended:
                results.append(_case(model, mode, n, fw, skipped=ended[series]))
                continue
            case_runs = runs.get((model, mode, n, fw))
            if not case_runs:
                continue  # not planned (a peer's size it does not run at)
            result = median_run(case_runs)
            results.append(_case(model, mode, n, fw, **result))
            if "error" in result:
                ended[series] = f"after {SIZE_NAMES[model]} {n}: {result['error']}"
    return results


def median_run(runs: list[dict]) -> dict:
    """One case from its repeated runs: the first failure if any ran out, else every number's
    median (each stage's in ``stages_ms``/``passes_ms``), with the first call's range."""
    failed = [r for r in runs if "error" in r]
    if failed or len(runs) == 1:
        return failed[0] if failed else runs[0]
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
        elif isinstance(value, dict):
            out[key] = {k: statistics.median(r[key].get(k, 0.0) for r in runs) for k in value}
    firsts = [r["first_call_s"] for r in runs]
    out.update(repeats=len(runs), first_call_range_s=[min(firsts), max(firsts)])
    return out


def _case(model: str, mode: str, n: int, framework: str, **fields) -> dict:
    return {"model": model, "mode": mode, "size": n, "framework": framework, **fields}


def all_exponents(results: list[dict]) -> dict[str, dict]:
    """``series_exponents`` of every Lucid series, keyed "model mode", over its comparable
    points (``comparable_points``)."""
    series: dict[str, list[dict]] = {}
    for r in results:
        if r["framework"] == "lucid" and "stages_ms" in r:
            series.setdefault(f"{r['model']} {r['mode']}", []).append(r)
    return {
        k: series_exponents(comparable_points(sorted(v, key=lambda r: r["size"]))[0])
        for k, v in series.items()
    }


def comparable_points(points: list[dict]) -> tuple[list[dict], list[dict]]:
    """The points of a series (sorted by size) that compile the same kind of program as its
    largest, and the others. ``fused_step`` concatenates the parameters into one update chain
    up to a parameter count (``fused_updates``, recorded per training case): the sizes below
    that limit build a different training program (one update chain instead of one per
    parameter), so a series that crosses it would fit two programs' costs as one growth."""
    if not points or "fused_updates" not in points[-1]:
        return points, []
    regime = points[-1]["fused_updates"]
    kept = [p for p in points if p.get("fused_updates", regime) == regime]
    return kept, [p for p in points if p.get("fused_updates", regime) != regime]


def cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if result.get("missing"):
        return "not installed"
    if "skipped" in result:
        return "skipped"
    if "error" in result:
        return "over budget" if result.get("over_budget") else "error"
    return f"{result['first_call_s']:.2f} s, {result['peak_mb']:.0f} MB"


def print_tables(results: list[dict], exponents: dict, frameworks: list[str]) -> None:
    by_key = {(r["model"], r["mode"], r["size"], r["framework"]): r for r in results}
    rows = sorted({(r["model"], r["mode"], r["size"]) for r in results}, key=_row_order)
    print("\nfirst call (trace + compile + one run) and its peak-RSS growth")
    print("| model | mode | size | ops | " + " | ".join(frameworks) + " | lucid / jax |")
    print("|" + "---|" * (len(frameworks) + 5))
    for model, mode, n in rows:
        lucid = by_key.get((model, mode, n, "lucid"), {})
        jax = by_key.get((model, mode, n, "jax"), {})
        ratio = (
            f"{lucid['first_call_s'] / jax['first_call_s']:.2f}"
            if "first_call_s" in lucid and "first_call_s" in jax
            else "-"
        )
        cells = " | ".join(cell(by_key.get((model, mode, n, fw))) for fw in frameworks)
        print(
            f"| {model} | {mode} | {SIZE_NAMES[model]} {n} | {lucid.get('n_ops', '-')} | "
            f"{cells} | {ratio} |"
        )
    for r in results:
        what = r.get("error") or (f"skipped {r['skipped']}" if "skipped" in r else None)
        if what:
            print(f"note: {r['model']} {r['mode']} {r['size']} {r['framework']}: {what}")
    print("\nLucid's growth exponents per stage (log-log fit against forward ops; * = judged)")
    for model, mode in sorted(
        {(r["model"], r["mode"]) for r in results if r["framework"] == "lucid"}
    ):
        series = [
            r for r in results if (r["model"], r["mode"], r["framework"]) == (model, mode, "lucid")
        ]
        _, left_out = comparable_points(sorted(series, key=lambda r: r["size"]))
        if left_out:
            sizes = ", ".join(str(r["size"]) for r in left_out)
            print(
                f"  ({model} {mode}: {SIZE_NAMES[model]} {sizes} left out of the fits: its "
                "parameters fit fused_step's one concatenated update chain, a different "
                "program from the larger sizes' per-parameter updates)"
            )
    for series, stages in exponents.items():
        ordered = sorted(stages.items(), key=lambda kv: -(kv[1].get("max_ms") or 0.0))
        parts = []
        for name, e in ordered:
            exp = "-" if e["exponent"] is None else f"{e['exponent']:.2f}"
            size = f"{e['max_mb']:.0f} MB" if "max_mb" in e else f"{e['max_ms']:.0f} ms"
            parts.append(f"{name} {exp}{'*' if e['judged'] else ''} ({size})")
        print(f"  {series}: " + "; ".join(parts))


def _row_order(row: tuple) -> tuple:
    model, mode, n = row
    return (list(DEFAULT_SIZES).index(model), MODES.index(mode), n)


def print_targets(targets: list[dict]) -> None:
    print("\n| target | limit | result | holds |")
    print("|---|---|---|---|")
    for t in targets:
        value = "not measured" if t["value"] is None else f"{t['value']:.2f}"
        if t.get("where"):
            value += f" ({t['where']})"
        holds = {None: "-", True: "yes", False: "NO"}[t["holds"]]
        print(f"| {t['target']} | <= {t['limit']} | {value} | {holds} |")


def chart(results: list[dict], path: str) -> bool:
    """Log-log chart: first call per framework against size, one panel per (model, mode), and
    Lucid's largest stages; False (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib missing, no chart written")
        return False
    panels = sorted({(r["model"], r["mode"]) for r in results}, key=lambda p: _row_order((*p, 0)))
    cols = min(4, len(panels)) or 1
    nrows = math.ceil(len(panels) / cols) or 1
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, (model, mode) in zip(axes.flat, panels, strict=False):
        sel = [r for r in results if (r["model"], r["mode"]) == (model, mode)]
        for fw in FRAMEWORKS:
            pts = sorted(
                (r["size"], r["first_call_s"])
                for r in sel
                if r["framework"] == fw and "first_call_s" in r
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{fw} first call")
        lucid = sorted(
            (r for r in sel if r["framework"] == "lucid" and "stages_ms" in r),
            key=lambda r: r["size"],
        )
        if lucid:
            top = sorted(lucid[-1]["stages_ms"], key=lambda k: -lucid[-1]["stages_ms"][k])[:3]
            for stage in top:
                ax.plot(
                    [r["size"] for r in lucid],
                    [r["stages_ms"].get(stage, float("nan")) / 1e3 for r in lucid],
                    linestyle="--",
                    linewidth=1,
                    label=f"lucid {stage}",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{model} {mode}", fontsize=9)
        ax.set_xlabel(SIZE_NAMES[model], fontsize=8)
        ax.set_ylabel("seconds", fontsize=8)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Compile time against program size (log-log; slope 1 = linear)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.threads, args.lucid_backend)))
        return 0
    started = time.time()
    load_before = _load()
    json_path = args.json or (REFERENCE_JSON if args.write else None)
    chart_path = args.chart or (REFERENCE_CHART if args.write else None)
    if args.report:
        results = load_cases(args.report)
    else:
        # Each case is appended as it ends, so a run stopped early keeps what it measured
        # (``--report`` reads it back).
        import tempfile

        partial = json_path or os.path.join(tempfile.gettempdir(), "compile_scaling.json")
        partial += ".partial.jsonl"
        os.makedirs(os.path.dirname(os.path.abspath(partial)), exist_ok=True)
        open(partial, "w").close()
        print(f"each run is appended to {partial} as it ends", file=sys.stderr)

        def keep(case: dict) -> None:
            with open(partial, "a") as f:
                f.write(json.dumps(case) + "\n")

        import bench_per_process as BP

        BP.compile_lucid_bytecode(interpreter("lucid", args))
        results = run_plan(args, on_case=keep)
    exponents = all_exponents(results)
    targets = check_targets(results, exponents)
    print_tables(results, exponents, args.frameworks)
    print_targets(targets)
    meta = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "minutes": (time.time() - started) / 60,
        "load_average": [load_before, _load()],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "threads": args.threads,
        "lucid_backend": args.lucid_backend,
        "budget_s": args.budget_s,
        "sizes": sizes_of(results),
        "frameworks": args.frameworks,
        "command": " ".join(
            ["python benchmarks/bench_compile_scaling.py", *(argv or sys.argv[1:])]
        ),
    }
    if args.report:
        # The run's own facts (when, how long, how loaded, its command), not this report's.
        meta.update(run_facts(args.report))
        meta["reported_from"] = args.report
    print(
        f"\n{meta['minutes']:.1f} min; load average {meta['load_average'][0]} -> "
        f"{meta['load_average'][1]} on {meta['machine']['cpus']} cores"
    )
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(
                dict(meta, results=results, exponents=exponents, targets=targets), f, indent=1
            )
        print(f"wrote {json_path}")
        if not args.report:
            os.remove(partial)  # the JSON holds every case now
    if chart_path and chart(results, chart_path):
        print(f"wrote {chart_path}")
    return 0


def sizes_of(results: list[dict]) -> dict[str, list[int]]:
    """Each "model mode" of the cases -> the sizes they cover, in increasing order."""
    out: dict[str, set[int]] = {}
    for r in results:
        out.setdefault(f"{r['model']} {r['mode']}", set()).add(r["size"])
    return {k: sorted(v) for k, v in out.items()}


def load_cases(path: str) -> list[dict]:
    """The cases of a JSON this script wrote (its ``results``) or of a ``.partial.jsonl``."""
    with open(path) as f:
        text = f.read()
    if not path.endswith(".jsonl"):
        return json.loads(text)["results"]
    # A partial file holds runs (one line each): the cases are their medians.
    runs: dict[tuple, list[dict]] = {}
    for line in text.splitlines():
        if line.strip():
            run = json.loads(line)
            key = (run.pop("model"), run.pop("mode"), run.pop("size"), run.pop("framework"))
            run.pop("pass", None)
            runs.setdefault(key, []).append(run)
    rows = sorted({k[:3] for k in runs}, key=_row_order)
    frameworks = [fw for fw in FRAMEWORKS if any(k[3] == fw for k in runs)]
    return assemble(rows, frameworks, frameworks, runs)


# What a saved JSON says about the run that measured it, kept when ``--report`` rewrites it.
RUN_FACTS = (
    "started_utc",
    "minutes",
    "load_average",
    "machine",
    "threads",
    "lucid_backend",
    "budget_s",
    "command",
)


def run_facts(path: str) -> dict:
    """The facts of the run a JSON this script wrote was measured in (empty for a partial file,
    which holds only cases)."""
    if path.endswith(".jsonl"):
        return {}
    with open(path) as f:
        saved = json.load(f)
    return {k: saved[k] for k in RUN_FACTS if k in saved}


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


sys.path.insert(0, HERE)

if __name__ == "__main__":
    sys.exit(main())
