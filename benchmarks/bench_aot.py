"""First-call latency, cold vs warm persistent compile cache: Lucid (its disk cache and
``load_compiled``), ``torch.compile`` (``TORCHINDUCTOR_CACHE_DIR``) and JAX
(``jax_compilation_cache_dir``), side by side, for workloads A–E.

Every measurement is a fresh process. It imports the framework and its compiler
(``lucid.compile``; ``torch._dynamo`` and ``torch._inductor``; ``jax``), builds the model and
the input, then times the first call: wrapping (``lucid.compile`` / ``torch.compile`` /
``jax.jit``), the call and, for JAX, ``block_until_ready``. ``cold`` runs with an empty cache
folder; ``warm`` runs again with the folder the cold run filled. Lucid's ``load`` row times
``load_compiled(path)`` plus its first call on a file saved beforehand. JAX caches only what
takes longer than ``jax_persistent_cache_min_compile_time_secs`` (1 s by default) to compile:
the warm column sets it and the minimum entry size to 0, so every compile is cached.

Each framework runs with its own interpreter, so the peers can live in another environment::

    python benchmarks/bench_aot.py --repeats 5 \\
        --torch-python $BENCH_VENV/bin/python --jax-python $BENCH_VENV/bin/python

``--lucid-python`` defaults to the running interpreter; a peer whose interpreter cannot import
it is reported as not installed (no figures, no ratio). Python's own bytecode cache is on for
the children (Lucid's in ``PYTHONPYCACHEPREFIX``, a folder of this run filled by untimed
processes first; the peers' installed packages have theirs), so no column pays for compiling
Python sources: users have ``.pyc`` files, and ``PYTHONDONTWRITEBYTECODE`` would otherwise
charge every lazily imported module to whichever column imports it first.

A last table gives Lucid's warm first call and ``load_compiled`` plus its first call in processes
that did not import the compiler beforehand (only ``import lucid``): what a script pays when a
disk-cache hit or a saved program spares it the compiler, xDSL included.

Prints one markdown row per workload: per column the median of ``--repeats`` processes in ms
with the range (min–max) in parentheses, and each framework's warm/cold ratio of medians. Then,
for Lucid, the warm process's second call and the median of its next calls (how far its first
run is above a steady one). ``--baseline-python`` (the interpreter of another Lucid tree, e.g.
a worktree of ``main``) runs that tree's Lucid children too, interleaved with this one's in
alternating order, through this same harness, and adds a before/after table::

    python benchmarks/bench_aot.py --repeats 5 --baseline-python ../base/.venv/bin/python
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
FRAMEWORKS = ("lucid", "torch", "jax")
STEADY_CALLS = 10  # calls after the second one, for the steady time of a warm process


# --- children: one first call each ----------------------------------------------------------
def _lucid_child(mode: str, wl: str, path: str) -> dict:
    import workloads as W

    import lucid
    from lucid.compile import load_compiled, save_compiled

    # As the peers' children, the compiler is imported before the timed region, unless the mode
    # ends in "-lazy": what a script that imports only lucid pays (a disk-cache hit and
    # load_compiled of a compiled module load no xDSL).
    mode, lazy = mode.removesuffix("-lazy"), mode.endswith("-lazy")
    if not lazy:
        import lucid.compile.training  # noqa: F401  (the training builder, the passes and xDSL)
        import lucid.ir.dialect  # noqa: F401

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
    result = {"ms": ms}
    if mode == "save":
        assert save_compiled(cm, path)
    elif mode == "compile":
        result["hit"] = bool(cm.timing()[0].get("from_disk"))
        # The calls after the first: how far the first run is above a steady one.
        later = []
        with lucid.no_grad():
            for _ in range(STEADY_CALLS + 1):
                t0 = time.perf_counter()
                cm(x)
                later.append((time.perf_counter() - t0) * 1e3)
        result["second_ms"] = later[0]
        result["steady_ms"] = statistics.median(later[1:])
    del out
    return result


def _torch_child(mode: str, wl: str, path: str) -> dict:
    import torch
    import torch._dynamo  # noqa: F401  (the compiler's import is not the first call's cost)
    import torch._inductor.config  # noqa: F401
    import workloads as W
    from torch._dynamo.utils import counters

    model = W.torch_model(wl).eval()
    x = torch.from_numpy(W.data(wl)[0])
    with torch.no_grad():
        t0 = time.perf_counter()
        cm = torch.compile(model)
        out = cm(x)
        ms = (time.perf_counter() - t0) * 1e3
    del out
    return {"ms": ms, "hit": counters["inductor"].get("fxgraph_cache_hit", 0) > 0}


def _jax_child(mode: str, wl: str, path: str) -> dict:
    import jax
    import workloads as W

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    apply, params = W.jax_forward(wl)
    x = jax.numpy.asarray(W.data(wl)[0])
    jax.block_until_ready((params, x))
    t0 = time.perf_counter()
    out = jax.jit(apply)(params, x)
    jax.block_until_ready(out)
    ms = (time.perf_counter() - t0) * 1e3
    return {"ms": ms}


def _child(framework: str, mode: str, wl: str, path: str) -> None:
    sys.path.insert(0, HERE)
    run = {"lucid": _lucid_child, "torch": _torch_child, "jax": _jax_child}[framework]
    print(json.dumps(run(mode, wl, path)))


# --- the parent: fresh processes, interleaved ---------------------------------------------------
def _available(python: str, framework: str) -> bool:
    module = {"lucid": "lucid.compile", "torch": "torch._inductor", "jax": "jax"}[framework]
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


PYCACHE: list[str] = []


def _run(python: str, framework: str, mode: str, wl: str, path: str, cache: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if PYCACHE and framework.startswith("lucid"):  # the peers' packages have their .pyc files
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    framework = "lucid" if framework.startswith("lucid") else framework
    for var in ("LUCID_COMPILE_DISK_CACHE", "LUCID_COMPILE_DISK_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR"):  # fmt: skip
        env.pop(var, None)
    if cache is not None and framework == "lucid":
        env["LUCID_COMPILE_DISK_CACHE"] = "1"
        env["LUCID_COMPILE_DISK_CACHE_DIR"] = cache
    if cache is not None and framework == "torch":
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    if framework == "jax":
        env.setdefault("JAX_PLATFORMS", "cpu")
        path = cache or path
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--child", framework, mode, wl, path],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{framework} {mode} {wl} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(values: list[float], absent: str = "not installed") -> str:
    if not values:
        return absent
    mid = statistics.median(values)
    digits = 0 if mid >= 10 else 1 if mid >= 1 else 2  # a steady call of E takes microseconds
    return f"{mid:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def _ratio(warm: list[float], cold: list[float]) -> str:
    if not warm or not cold:
        return "–"
    return f"{statistics.median(warm) / statistics.median(cold):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="ABCDE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--torch-repeats", type=int, default=None, help="torch.compile's rounds (its cold is slow)"
    )
    ap.add_argument("--lucid-python", default=sys.executable)
    ap.add_argument("--torch-python", default=None, help="interpreter with torch (off if unset)")
    ap.add_argument("--jax-python", default=None, help="interpreter with jax (off if unset)")
    ap.add_argument(
        "--baseline-python",
        default=None,
        help="interpreter of another Lucid tree: its Lucid children run interleaved with "
        "--lucid-python's (alternating order), and a before/after table follows",
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    pythons = {"lucid": args.lucid_python, "torch": args.torch_python, "jax": args.jax_python}
    active = [f for f in FRAMEWORKS if pythons[f] and _available(pythons[f], f)]
    lucids = ["lucid"] if "lucid" in active else []
    if args.baseline_python and lucids:
        if not _available(args.baseline_python, "lucid"):
            raise SystemExit(f"--baseline-python {args.baseline_python} cannot import lucid")
        pythons["lucid-baseline"] = args.baseline_python
        lucids.append("lucid-baseline")
    for f in FRAMEWORKS:
        if f not in active:
            why = f"not installed for {pythons[f]}" if pythons[f] else "not run (no interpreter)"
            print(f"<!-- {f}: {why} -->")
    print(
        "| workload | Lucid cold | Lucid warm | Lucid warm/cold | Lucid load_compiled "
        "| torch.compile cold | torch.compile warm | torch warm/cold "
        "| JAX cold | JAX warm | JAX warm/cold |"
    )
    print("|---|" + "---|" * 10)
    misses: list[str] = []
    pycache = tempfile.TemporaryDirectory()
    PYCACHE.append(pycache.name)
    later: dict[tuple[str, str], dict[str, list[float]]] = {}
    lazy_rows: list[str] = []
    for wl in args.workloads:
        times: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            paths = {v: os.path.join(tmp, f"{wl}-{v}.lucidc") for v in lucids}
            for v in lucids:  # untimed: fills the bytecode cache and saves the file
                warmup = os.path.join(tmp, f"{v}-warmup")
                _run(pythons[v], v, "save", wl, paths[v], warmup)
                _run(pythons[v], v, "compile", wl, paths[v], warmup)
                _run(pythons[v], v, "load", wl, paths[v], None)
            for r in range(args.repeats):  # interleaved: every framework once per round
                order = lucids if r % 2 == 0 else lucids[::-1]
                for f in order + [f for f in active if f != "lucid"]:
                    if f == "torch" and args.torch_repeats is not None and r >= args.torch_repeats:
                        continue
                    path = paths.get(f, os.path.join(tmp, f"{wl}.lucidc"))
                    cache = os.path.join(tmp, f"{f}-cache{r}")
                    cold = _run(pythons[f], f, "compile", wl, path, cache)
                    warm = _run(pythons[f], f, "compile", wl, path, cache)
                    times.setdefault(f"{f}-cold", []).append(cold["ms"])
                    times.setdefault(f"{f}-warm", []).append(warm["ms"])
                    if warm.get("hit") is False:
                        misses.append(f"{f} {wl} round {r}")
                    if f.startswith("lucid"):
                        load = _run(pythons[f], f, "load", wl, path, None)
                        times.setdefault(f"{f}-load", []).append(load["ms"])
                        for mode, cache_dir in (("compile-lazy", cache), ("load-lazy", None)):
                            lazy = _run(pythons[f], f, mode, wl, path, cache_dir)
                            times.setdefault(f"{f}-{mode}", []).append(lazy["ms"])
                        rows = later.setdefault((wl, f), {})
                        rows.setdefault("first", []).append(warm["ms"])
                        for k in ("second_ms", "steady_ms"):
                            rows.setdefault(k, []).append(warm[k])
        if "lucid-baseline" in lucids:
            for v in lucids:
                later[(wl, v)]["cells"] = [
                    _cell(times[f"{v}-cold"]),
                    _cell(times[f"{v}-warm"]),
                    _ratio(times[f"{v}-warm"], times[f"{v}-cold"]),
                    _cell(times[f"{v}-load"]),
                ]
        for v in lucids:
            lazy_rows.append(
                f"| {wl} | {'baseline' if v == 'lucid-baseline' else 'this tree'} "
                f"| {_cell(times[f'{v}-compile-lazy'])} | {_cell(times[f'{v}-load-lazy'])} |"
            )
        cells = [wl]
        for f in FRAMEWORKS:
            cold, warm = times.get(f"{f}-cold", []), times.get(f"{f}-warm", [])
            absent = "not installed" if pythons[f] else "not run"
            cells += [_cell(cold, absent), _cell(warm, absent), _ratio(warm, cold)]
            if f == "lucid":
                cells.append(_cell(times.get("lucid-load", [])))
        print("| " + " | ".join(cells) + " |", flush=True)
    if later:
        print(
            "\nLucid, a warm process's later calls (ms; median (min–max)): the first call "
            "(Lucid warm above) against the second and the median of the next "
            f"{STEADY_CALLS}, same processes"
        )
        print("| workload | variant | warm first call | 2nd call | steady call |")
        print("|---|---|---|---|---|")
        for (wl, v), rows in later.items():
            name = "baseline" if v == "lucid-baseline" else "this tree"
            print(f"| {wl} | {name} | {_cell(rows['first'])} | {_cell(rows['second_ms'])} "
                  f"| {_cell(rows['steady_ms'])} |")  # fmt: skip
    if lazy_rows:
        print(
            "\nLucid with the compiler not imported beforehand (a script that imports only "
            "lucid), ms; median (min–max): a warm first call and load_compiled + first call"
        )
        print(
            "| workload | variant | warm, no compiler import | load_compiled, no compiler import |"
        )
        print("|---|---|---|---|")
        print("\n".join(lazy_rows))
    if "lucid-baseline" in lucids:
        print("\nBefore/after (baseline: --baseline-python; after: --lucid-python), interleaved")
        print("| workload | variant | cold | warm | warm/cold | load_compiled |")
        print("|---|---|---|---|---|---|")
        for (wl, v), rows in later.items():
            name = "before" if v == "lucid-baseline" else "after"
            print(f"| {wl} | {name} | " + " | ".join(rows["cells"]) + " |")
    if misses:
        print(f"\nwarm runs that did not hit their cache: {', '.join(misses)}")
    pycache.cleanup()


if __name__ == "__main__":
    main()
