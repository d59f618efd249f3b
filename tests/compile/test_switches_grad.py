"""The debugging switches in grad mode (the forward/backward split of ``_grad_call``) and the
shared ``CompileSession`` that every entry point runs its pipelines through."""

import json
import logging

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.compile import options
from lucid.compile.session import CompileSession
from lucid.ir import import_trace
from lucid.trace._tracing import _tracing


def _model():
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))


def _grad_call(cm):
    x = lucid.randn(3, 4)
    out = cm(x)
    out.sum().backward()
    return out


def test_print_ir_after_all_prints_every_pipeline_in_grad_mode(monkeypatch, capsys):
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL", "1")
    _grad_call(lucid.compile(_model()))
    err = capsys.readouterr().err
    for name in ("vjp", "canonicalize", "cse", "dce", "partition"):
        assert f"IR Dump After {name}" in err
    # Two lowering pipelines: the forward and the backward executables.
    assert err.count("IR Dump After lower-to-prim") == 2
    monkeypatch.delenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL")
    _grad_call(lucid.compile(_model(), options={"print_ir_after_all": True}))
    err = capsys.readouterr().err
    assert "IR Dump After vjp" in err and err.count("IR Dump After lower-to-prim") == 2


def test_verbose_and_debug_in_grad_mode(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_VERBOSE", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    cm = lucid.compile(_model())
    with caplog.at_level(logging.INFO, logger="lucid.compile"):
        _grad_call(cm)
        _grad_call(cm)  # a hit: no second line
    lines = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "grad" in lines[0] and "vjp" in lines[0] and "backward:lower-to-prim" in lines[0]
    (path,) = tmp_path.glob("lucid-trace-*.json")
    data = json.loads(path.read_text())
    assert "linear" in [op["name"] for op in data["ops"]]
    assert any(f["role"].startswith("cot:") for f in data["feeds"])


def test_timing_has_the_stages_in_grad_mode():
    cm = lucid.compile(_model())
    _grad_call(cm)
    (row,) = cm.timing()
    passes = row["passes_ms"]
    expected = {
        "import",
        "vjp",
        "canonicalize",
        "cse",
        "dce",
        "partition",
        "forward:lower-to-prim",
        "forward:backend-compile",
        "backward:lower-to-prim",
        "backward:backend-compile",
    }
    assert expected <= set(passes), passes
    assert all(v >= 0 for v in passes.values())
    assert row["compile_ms"] >= sum(passes.values()) * 0.5


def _tree(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_tree_dir_gives_each_pipeline_its_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_TREE_DIR", str(tmp_path))
    cm = lucid.compile(_model())
    _grad_call(cm)
    assert _tree(tmp_path) == [
        "00_graph",
        "01_partition",
        "02_forward-lowering",
        "03_backward-lowering",
    ]
    inputs = [(tmp_path / d / "00_input.mlir").read_text() for d in _tree(tmp_path)]
    assert len(set(inputs)) == 4  # nothing overwritten: four different modules
    assert "cot" in inputs[0] and "cot" not in inputs[2] and "residual" in inputs[3]
    assert (tmp_path / "00_graph" / "01_vjp.mlir").exists()
    split = (tmp_path / "01_partition" / "01_partition.mlir").read_text()
    assert "func.func @forward" in split and "func.func @backward" in split
    assert (tmp_path / "03_backward-lowering" / "01_lower-to-prim.mlir").exists()
    # A no_grad call of the same wrapper: two more folders, numbered after the others.
    with lucid.no_grad():
        cm(lucid.randn(3, 4))
    assert _tree(tmp_path)[4:] == ["04_graph", "05_lowering"]
    graph_out = (tmp_path / "04_graph" / "03_dce.mlir").read_text()
    assert graph_out == (tmp_path / "05_lowering" / "00_input.mlir").read_text()


def test_tree_dir_option_in_a_fresh_folder_per_process_run(tmp_path):
    tree = tmp_path / "tree"
    (tree).mkdir()
    (tree / "07_graph").mkdir()  # left by an earlier run: the numbering continues after it
    with lucid.no_grad():
        lucid.compile(_model(), options={"print_ir_tree_dir": tree})(lucid.randn(2, 4))
    assert _tree(tree) == ["07_graph", "08_graph", "09_lowering"]
    assert not any((tree / "07_graph").iterdir())


def test_compile_session_is_usable_by_other_entry_points(monkeypatch, capsys, caplog, tmp_path):
    """What a training step does with it: its own pipelines, switches and timings."""
    monkeypatch.setenv("LUCID_COMPILE_VERBOSE", "1")
    model = _model()
    with _tracing(model) as tracer:
        out = model(tracer.input((2, 4), lucid.float32))
        trace = tracer.finish([out])
    session = CompileSession({"print_ir_after_all": True, "print_ir_tree_dir": str(tmp_path)})
    with session.timed("import"):
        module = import_trace(trace)
    session.run_passes("canonicalize,cse,dce", module, pipeline="step-graph")
    backend = options.backend_of("cpu")
    exe = session.compile_module(module, backend, pipeline="step-lowering", prefix="step:")
    with caplog.at_level(logging.INFO, logger="lucid.compile"):
        ms = session.finish("my step", trace=trace, backend="cpu")
    assert ms > 0
    assert {"import", "cse", "step:lower-to-prim", "step:backend-compile"} <= set(session.passes_ms)
    assert "IR Dump After dce" in capsys.readouterr().err
    assert _tree(tmp_path) == ["00_step-graph", "01_step-lowering"]
    assert any("compiled my step" in r.getMessage() for r in caplog.records)
    x = lucid.randn(2, 4)
    feeds = [x._data] + [p._data for p in model.parameters()]
    roles = [f.role for f in trace.feeds]
    assert roles[0] == "input:0" and len(roles) == len(feeds)
    with lucid.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(exe.run(feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_parse_options_is_shared_and_names_the_caller():
    pipeline, switches = options.parse_options(
        {"pipeline": "cse", "print_ir_after_all": 1, "pass_timing": True}, "fused_step"
    )
    assert pipeline == "cse" and switches == {"print_ir_after_all": True, "timing": True}
    with pytest.raises(ValueError, match="fused_step: unknown option"):
        options.parse_options({"bogus": 1}, "fused_step")
