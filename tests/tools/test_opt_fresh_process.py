"""``lucid-opt`` in a fresh process loads every registered pass (issue 12, item 4: ghost-grads used
to fail with a circular import because ``lucid/passes`` imported the tracer from
``lucid/compile``). Each pass runs first thing in its own new interpreter, as a user would.
The default run lists (so loads) every pass in one new interpreter; the rest are marked slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """builtin.module {
  func.func @forward(%0: tensor<4x3xf32> {lucid.role = "input:0"}, %1: tensor<2x3xf32> {lucid.role = "param:weight"}, %2: tensor<2xf32> {lucid.role = "param:bias"}, %3: tensor<4x2xf32> {lucid.role = "input:1"}) -> (tensor<f32> {lucid.role = "output:0"}) {
    %4 = lucid.linear %0, %1, %2 : (tensor<4x3xf32>, tensor<2x3xf32>, tensor<2xf32>) -> tensor<4x2xf32>
    %5 = lucid.mse_loss %4, %3 {reduction = "mean"} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<f32>
    func.return %5 : tensor<f32>
  }
}
"""  # noqa: E501


def _opt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lucid.tools.opt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def _registered() -> list[str]:
    code = "from lucid.passes.registry import available_passes; print(*available_passes())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_list_passes_loads_every_pass():
    out = _opt("--list-passes")
    assert out.returncode == 0, out.stderr
    assert "cannot load" not in out.stdout + out.stderr
    for name in _registered():
        assert f"  {name}  " in out.stdout or f"  {name}\n" in out.stdout, name


@pytest.mark.slow
def test_vjp_then_ghost_grads_on_a_sample_file(tmp_path):
    sample = tmp_path / "loss.mlir"
    sample.write_text(SAMPLE)
    out = _opt(str(sample), "--pass-pipeline=vjp,ghost-grads")
    assert out.returncode == 0, out.stderr
    assert '"grad:param:weight"' in out.stdout and '"grad:param:bias"' in out.stdout


@pytest.mark.slow
def test_each_registered_pass_loads_first_thing_in_a_fresh_process(tmp_path):
    sample = tmp_path / "loss.mlir"
    sample.write_text(SAMPLE)
    names = _registered()
    assert {"vjp", "ghost-grads", "optimizer-fusion", "lower-to-prim"} <= set(names)
    # Concurrent processes: one per pass, each importing its pass before anything else.
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "lucid.tools.opt", str(sample), f"--pass-pipeline={name}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for name in names
    }
    failures = {}
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"lucid-opt --pass-pipeline={name} hung")
        # A pass may reject this input, with a one-line message; it must never fail to load.
        if "Traceback" in err or "ImportError" in err or "cannot import" in err:
            failures[name] = err[-2000:]
    assert not failures, failures
