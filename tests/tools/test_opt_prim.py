"""lucid-opt reads lowered (prim) modules back."""

import subprocess
import sys

import pytest

import lucid


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_lucid_opt_parses_a_prim_module(tmp_path):
    cm = lucid.compile(lambda x: (x * 2.0).exp())
    with lucid.no_grad():
        cm(lucid.randn(3))
    path = tmp_path / "prim.mlir"
    path.write_text(cm.ir(stage="prim"))
    r = subprocess.run(
        [sys.executable, "-m", "lucid.tools.opt", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "prim.exp" in r.stdout and "prim.mul" in r.stdout
