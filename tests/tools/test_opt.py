"""lucid-opt and lucid-inspect-trace, run as a user would (subprocesses), plus the plugin paths:
a third-party pass through the ``lucid.passes`` entry point, and Lucid inside stock xdsl-opt."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lucid
from lucid.ir import import_trace, interpret, parse_ir, print_ir
from lucid.trace import trace

ROOT = Path(__file__).resolve().parents[2]


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys, monkeypatch):
    """Run a tool's ``main`` in this process (a subprocess per case costs seconds)."""

    def call(args, *, stdin=None, tool="lucid.tools.opt"):
        import importlib

        main = importlib.import_module(tool).main
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return _Result(code, out, err)

    return call


def _run(args, *, stdin=None, env=None, tool="lucid.tools.opt"):
    """Run a tool as a user would: a new Python process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", tool, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def model_mlir(tmp_path_factory):
    def forward(a):
        return ((a * 1).exp() + (a * 1).exp()) * 2

    path = tmp_path_factory.mktemp("opt") / "model.mlir"
    module = import_trace(trace(forward, lucid.tensor(np.ones((2, 3), np.float32))))
    path.write_text(print_ir(module))
    return path


def test_pipeline_with_print_ir_after_all_shows_each_pass(run, model_mlir):
    r = run([str(model_mlir), "--pass-pipeline=canonicalize,cse,dce", "--print-ir-after-all"])
    assert r.returncode == 0, r.stderr
    headers = [line for line in r.stderr.splitlines() if "IR Dump" in line]
    assert headers == [
        "// -----// IR Dump After canonicalize //----- //",
        "// -----// IR Dump After cse //----- //",
        "// -----// IR Dump After dce //----- //",
    ]
    out = parse_ir(r.stdout)
    out.verify()
    assert r.stdout.count("lucid.exp") == 1
    a = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    before = interpret(parse_ir(model_mlir.read_text()), [a])[0]
    np.testing.assert_allclose(interpret(out, [a])[0], before, rtol=1e-6)


def test_stdin_output_file_generic_and_timing(run, model_mlir, tmp_path):
    out_file = tmp_path / "out.mlir"
    r = run(
        ["-", "-p", "cse", "--print-op-generic", "--pass-timing", "-o", str(out_file)],
        stdin=model_mlir.read_text(),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert '"lucid.exp"' in out_file.read_text()
    assert "Pass execution timing report" in r.stderr and "cse" in r.stderr


def test_tree_dir_and_verify_each(run, model_mlir, tmp_path):
    tree = tmp_path / "tree"
    r = run(
        [str(model_mlir), "-p", "canonicalize,dce", "--verify-each", f"--print-ir-tree-dir={tree}"]
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tree.iterdir()) == [
        "00_input.mlir",
        "01_canonicalize.mlir",
        "02_dce.mlir",
    ]


def test_parse_error_reports_file_line_and_column(run, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f() {\n  %0 = lucid.exp\n}\n")
    r = run([str(bad)])
    assert r.returncode == 1
    assert r.stderr.startswith(f"lucid-opt: error: {bad}:3:1: ")
    assert r.stderr.count("\n") == 1  # one line: the caret display is for Python users


def test_unknown_pass_and_bad_option_are_errors(run, model_mlir):
    r = run([str(model_mlir), "-p", "canonicalise"])
    assert r.returncode == 1 and "unknown pass 'canonicalise'" in r.stderr
    assert "available passes: " in r.stderr and "canonicalize" in r.stderr
    r = run([str(model_mlir), "-p", "canonicalize{limit=3}"])
    assert r.returncode == 1 and "bad options for pass 'canonicalize'" in r.stderr


def test_invalid_module_is_reported(run, tmp_path):
    bad = tmp_path / "invalid.mlir"
    bad.write_text(
        textwrap.dedent(
            """\
            func.func @f(%a: tensor<3xf32>) -> tensor<4xf32> {
              %e = lucid.exp %a : (tensor<3xf32>) -> tensor<4xf32>
              func.return %e : tensor<4xf32>
            }
            """
        )
    )
    r = run([str(bad)])
    assert r.returncode == 1 and "does not verify" in r.stderr and "lucid.exp" in r.stderr
    assert f"{bad}:2 does not verify" in r.stderr  # the line of the failing op


def test_list_passes(run):
    r = run(["--list-passes"])
    assert r.returncode == 0
    assert "canonicalize" in r.stdout and "fold-limit" in r.stdout and "dce" in r.stdout


THIRD_PARTY = '''
from dataclasses import dataclass

from lucid.ir import _xdsl as x


@dataclass(frozen=True)
class DropExp(x.ModulePass):
    """Test pass from outside Lucid: replace exp(x) by x."""

    name = "thirdparty-drop-exp"

    def apply(self, ctx, op):
        for o in list(op.walk()):
            if o.name == "lucid.exp":
                o.results[0].replace_all_uses_with(o.operands[0])
                o.detach()
                o.erase()
'''


def _fake_distribution(root: Path, name: str, entry_points: str, module: str | None = None):
    """An installed-looking package: a dist-info folder on PYTHONPATH is all importlib.metadata
    needs to find its entry points."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    if module is not None:
        (root / f"{name}.py").write_text(module)


@pytest.mark.slow  # a fresh lucid-opt process with a package on its path (2.5 s)
def test_third_party_pass_from_an_entry_point_runs_in_lucid_opt(model_mlir, tmp_path):
    _fake_distribution(
        tmp_path,
        "thirdparty_pkg",
        "[lucid.passes]\nthirdparty-drop-exp = thirdparty_pkg:DropExp\n",
        THIRD_PARTY,
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    listed = _run(["--list-passes"], env=env)
    assert "thirdparty-drop-exp" in listed.stdout
    r = _run(
        [str(model_mlir), "-p", "canonicalize,thirdparty-drop-exp,dce", "--verify-each"], env=env
    )
    assert r.returncode == 0, r.stderr
    assert "lucid.exp" not in r.stdout and "lucid.add" in r.stdout


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_lucid_dialect_and_passes_in_stock_xdsl_opt(model_mlir, tmp_path):
    xdsl_opt = Path(sys.executable).with_name("xdsl-opt")
    if not xdsl_opt.exists():
        pytest.skip("xdsl-opt is not installed next to this Python")
    # The xdsl.universe entry point as pyproject.toml declares it, visible without a reinstall.
    _fake_distribution(
        tmp_path,
        "lucid_universe",
        "[xdsl.universe]\nlucid = lucid.passes.universe:LUCID_UNIVERSE\n",
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    r = subprocess.run(
        [str(xdsl_opt), str(model_mlir), "-p", "lucid-canonicalize,lucid-cse,lucid-dce"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("lucid.exp") == 1


def test_inspect_trace_summary_diff_and_mlir(run, tmp_path):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    x = lucid.tensor(np.ones((2, 3), np.float32))
    a.write_text(trace(lambda t: (t * 2).exp(), x).to_json())
    b.write_text(trace(lambda t: (t * 3).exp(), x).to_json())
    r = run([str(a)], tool="lucid.tools.inspect_trace")
    assert r.returncode == 0 and "1 feeds, 2 ops, 1 outputs" in r.stdout and "input:0" in r.stdout
    r = run([str(a), str(b)], tool="lucid.tools.inspect_trace")
    assert r.returncode == 1
    assert "-mul(float32[2x3], 2)" in r.stdout and "+mul(float32[2x3], 3)" in r.stdout
    r = run([str(a), str(a)], tool="lucid.tools.inspect_trace")
    assert r.returncode == 0 and "identical" in r.stdout
    r = run([str(a), "--mlir"], tool="lucid.tools.inspect_trace")
    assert r.returncode == 0 and "lucid.exp" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    r = run([str(bad)], tool="lucid.tools.inspect_trace")
    assert r.returncode == 2 and "not a Lucid trace" in r.stderr
