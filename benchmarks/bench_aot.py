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

Prints one markdown row per workload: per column the median of ``--repeats`` processes in ms
with the range (min–max) in parentheses, and each framework's warm/cold ratio of medians.
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


# --- children: one first call each ----------------------------------------------------------
def _lucid_child(mode: str, wl: str, path: str) -> dict:
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
    result = {"ms": ms}
    if mode == "save":
        assert save_compiled(cm, path)
    elif mode == "compile":
        result["hit"] = bool(cm.timing()[0].get("from_disk"))
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
    if PYCACHE and framework == "lucid":  # the peers' installed packages have their .pyc files
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
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
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


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
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    pythons = {"lucid": args.lucid_python, "torch": args.torch_python, "jax": args.jax_python}
    active = [f for f in FRAMEWORKS if pythons[f] and _available(pythons[f], f)]
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
    for wl in args.workloads:
        times: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{wl}.lucidc")
            if "lucid" in active:  # untimed: fills the bytecode cache and saves the file
                warmup = os.path.join(tmp, "lucid-warmup")
                _run(pythons["lucid"], "lucid", "save", wl, path, warmup)
                _run(pythons["lucid"], "lucid", "compile", wl, path, warmup)
                _run(pythons["lucid"], "lucid", "load", wl, path, None)
            for r in range(args.repeats):  # interleaved: every framework once per round
                for f in active:
                    if f == "torch" and args.torch_repeats is not None and r >= args.torch_repeats:
                        continue
                    cache = os.path.join(tmp, f"{f}-cache{r}")
                    cold = _run(pythons[f], f, "compile", wl, path, cache)
                    warm = _run(pythons[f], f, "compile", wl, path, cache)
                    times.setdefault(f"{f}-cold", []).append(cold["ms"])
                    times.setdefault(f"{f}-warm", []).append(warm["ms"])
                    if warm.get("hit") is False:
                        misses.append(f"{f} {wl} round {r}")
                    if f == "lucid":
                        load = _run(pythons[f], f, "load", wl, path, None)
                        times.setdefault("lucid-load", []).append(load["ms"])
        cells = [wl]
        for f in FRAMEWORKS:
            cold, warm = times.get(f"{f}-cold", []), times.get(f"{f}-warm", [])
            absent = "not installed" if pythons[f] else "not run"
            cells += [_cell(cold, absent), _cell(warm, absent), _ratio(warm, cold)]
            if f == "lucid":
                cells.append(_cell(times.get("lucid-load", [])))
        print("| " + " | ".join(cells) + " |", flush=True)
    if misses:
        print(f"\nwarm runs that did not hit their cache: {', '.join(misses)}")
    pycache.cleanup()


if __name__ == "__main__":
    main()
