"""Run the real-device MPSGraph tests, each in a process of its own.

    .venv/bin/python tests/backends/mpsgraph/run_macos_tests.py [-k EXPR] [--list]

MPSGraph reports many failures by aborting the process (``LLVM ERROR``, failed assertions), which
would take every later test down with it; so each test of ``test_macos_native.py`` runs in its
own ``pytest`` process, and the summary names each passed, failed, skipped and crashed test
(with the signal) and the machine. Exit status 1 when any failed or crashed. ``--list`` only
prints the test ids. Elsewhere than on an Apple Silicon Mac every test is skipped with the reason.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

MODULE = Path(__file__).with_name("test_macos_native.py")
REPO = Path(__file__).resolve().parents[3]
# The project's addopts (-q, "not slow") replaced: one -q, every test of the module.
PYTEST = [sys.executable, "-m", "pytest", "-o", "addopts=", "--import-mode=importlib", "-q"]


def collect(keyword: str | None) -> list[str]:
    """The test ids of the module (pytest's own collection, keyword-filtered)."""
    command = [*PYTEST, "--collect-only", str(MODULE)]
    if keyword:
        command += ["-k", keyword]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    if out.returncode not in (0, 5) or (not ids and out.returncode != 5):
        raise SystemExit(f"collection failed:\n{out.stdout}\n{out.stderr}")
    return ids


def outcome(test_id: str) -> tuple[str, str]:
    """(passed | failed | skipped | crashed, detail) of one test in a fresh process."""
    proc = subprocess.run(
        [*PYTEST, "-rs", "-p", "no:cacheprovider", test_id],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode < 0:
        return "crashed", f"signal {-proc.returncode}: " + (proc.stderr.strip()[-300:] or last)
    if proc.returncode == 0:
        return ("skipped" if "skipped" in last and "passed" not in last else "passed"), last
    return "failed", proc.stdout.strip()[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--list", action="store_true", help="print the test ids and stop")
    args = parser.parse_args(argv)
    ids = collect(args.keyword)
    if args.list:
        print("\n".join(ids))
        return 0
    print(f"{len(ids)} MPSGraph device tests on {platform.platform()}", flush=True)
    results: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": [], "crashed": []}
    for test_id in ids:
        kind, detail = outcome(test_id)
        results[kind].append(test_id)
        print(f"{kind:8} {test_id}", flush=True)
        if kind in ("failed", "crashed"):
            print("    " + detail.replace("\n", "\n    "), flush=True)
    print(", ".join(f"{len(v)} {k}" for k, v in results.items()))
    return 1 if results["failed"] or results["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
