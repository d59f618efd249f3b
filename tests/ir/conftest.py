"""Shared by the IR tests: upstream mlir-opt, when installed, checks the generic form."""

from __future__ import annotations

import glob
import shutil
import subprocess

import pytest


def _find_mlir_opt() -> str | None:
    """Upstream mlir-opt, under its plain or versioned name (Debian: apt mlir-19-tools)."""
    for name in ("mlir-opt", *(f"mlir-opt-{v}" for v in range(30, 16, -1))):
        path = shutil.which(name)
        if path:
            return path
    found = sorted(glob.glob("/usr/lib/llvm-*/bin/mlir-opt"))
    return found[-1] if found else None


@pytest.fixture
def mlir_opt():
    """A function running ``mlir-opt --allow-unregistered-dialect`` on a text; skips the test
    when mlir-opt is not installed."""
    path = _find_mlir_opt()
    if path is None:
        pytest.skip("upstream mlir-opt is not installed (e.g. apt install mlir-19-tools)")

    def run(text: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [path, "--allow-unregistered-dialect"], input=text, capture_output=True, text=True
        )

    return run
