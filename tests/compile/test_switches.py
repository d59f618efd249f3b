"""The debugging switches of lucid.compile (environment variables and options)."""

import json
import logging

import numpy as np
import pytest

import lucid


def f(x):
    return (x * 2.0).exp()


@pytest.fixture(autouse=True)
def _no_grad():
    with lucid.no_grad():
        yield


def test_verbose_logs_one_line_per_compile(monkeypatch, caplog):
    monkeypatch.setenv("LUCID_COMPILE_VERBOSE", "1")
    cm = lucid.compile(f)
    with caplog.at_level(logging.INFO, logger="lucid.compile"):
        cm(lucid.randn(3))
        cm(lucid.randn(3))
    lines = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]
    assert len(lines) == 1
    assert "ops" in lines[0] and "canonicalize" in lines[0] and "backend cpu" in lines[0]


def test_debug_writes_the_trace_json(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.compile(f)(lucid.randn(3))
    (path,) = tmp_path.glob("lucid-trace-*.json")
    data = json.loads(path.read_text())
    assert data["format"] == "lucid.compile.trace/v1"
    assert [op["name"] for op in data["ops"]] == ["mul", "exp"]


def test_print_ir_after_all_env_and_option(monkeypatch, capsys):
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL", "1")
    lucid.compile(f)(lucid.randn(3))
    err = capsys.readouterr().err
    for name in ("canonicalize", "cse", "dce", "lower-to-prim"):
        assert f"IR Dump After {name}" in err
    monkeypatch.delenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL")
    lucid.compile(f, options={"print_ir_after_all": True})(lucid.randn(4))
    assert "IR Dump After dce" in capsys.readouterr().err


def test_every_instrumentation_switch_works_as_an_option(tmp_path, capsys):
    x = lucid.randn(3)
    lucid.compile(f, options={"print_ir_before_all": True})(x)
    assert "IR Dump Before canonicalize" in capsys.readouterr().err
    lucid.compile(f, options={"print_ir_after_change": True, "pass_timing": True})(x)
    err = capsys.readouterr().err
    assert "IR Dump After lower-to-prim" in err and "IR Dump After cse" not in err
    assert "Pass execution timing report" in err and "prim-simplify" in err
    lucid.compile(f, options={"print_ir_tree_dir": tmp_path / "tree"})(x)
    assert any((tmp_path / "tree").rglob("*"))


def test_unknown_or_mistyped_options_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown option.*'print_ir_after'.*accepted: pipeline"):
        lucid.compile(f, options={"print_ir_after": True})
    with pytest.raises(TypeError, match="'pipeline' must be a string"):
        lucid.compile(f, options={"pipeline": ["cse"]})


def test_backend_env_and_unknown_backend(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_BACKEND", "cpu")
    x = lucid.randn(3)
    np.testing.assert_allclose(lucid.compile(f)(x).numpy(), f(x).numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="'mpsgraph' is not available here: .*macOS"):
        lucid.compile(f, backend="mpsgraph")
    with pytest.raises(ValueError, match="unknown backend"):
        lucid.compile(f, backend="tpu")


def test_strict_env(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_STRICT", "1")

    def g(x):
        return x * float(x.sum())

    with pytest.raises(lucid.compile.CompileError, match="graph break"):
        lucid.compile(g)(lucid.randn(3))


def test_custom_pipeline_option_is_used():
    cm = lucid.compile(f, options={"pipeline": "cse"})
    cm(lucid.randn(3))
    assert set(cm.timing()[0]["passes_ms"]) >= {"import", "cse", "lower-to-prim"}
    assert "canonicalize" not in cm.timing()[0]["passes_ms"]
