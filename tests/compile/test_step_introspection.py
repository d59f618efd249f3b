"""Training steps get the switches and the introspection of ``lucid.compile``:
``LUCID_COMPILE_VERBOSE``/``DEBUG``/``PRINT_IR_*`` and ``options=`` print for ``make_step``,
``fused_step`` and ``compile_optimizer``; ``timing()`` (with ``passes_ms``), ``ir(stage=...)``,
``module()``, ``profile()`` and ``cache_info()``; ``module()`` before the first call is a
``KeyError`` that says nothing is compiled yet; each pipeline gets its own IR-tree folder."""

from __future__ import annotations

import copy
import json
import logging
import os

import numpy as np
import pytest

import lucid
import lucid.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.bn(x)).relu()


def mse(y, t):
    return ((y - t) ** 2).mean()


def _data(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return (
        lucid.tensor(rng.standard_normal((n, 4)).astype(np.float32)),
        lucid.tensor(rng.standard_normal((n, 3)).astype(np.float32)),
    )


def _fused(**kw):
    model = Net()
    opt = lucid.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, lucid.compile.fused_step(model, mse, opt, **kw)


def _snapshot(model, opt):
    params = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    state = {
        (id(p), k): (v.numpy().copy() if hasattr(v, "numpy") else v)
        for p, st in opt.state.items()
        for k, v in st.items()
    }
    return params, state


def _assert_same(a, b):
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys()
    for k in a[0]:
        np.testing.assert_array_equal(a[0][k], b[0][k], err_msg=k)
    for k in a[1]:
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=str(k))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("LUCID_COMPILE_") and name != "LUCID_COMPILE_BACKEND":
            monkeypatch.delenv(name)
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path / "debug"))


@pytest.mark.parametrize("make", ["make_step", "fused_step"])
def test_module_and_ir_before_the_first_call_say_nothing_is_compiled(make):
    model = Net()
    if make == "make_step":
        step = lucid.compile.make_step(model, mse)
    else:
        step = lucid.compile.fused_step(model, mse, lucid.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(KeyError, match=f"{make}: nothing is compiled yet.*first call"):
        step.module()
    with pytest.raises(KeyError, match="nothing is compiled yet"):
        step.ir()
    assert step.timing() == [] and step.cache_info()["entries"] == 0
    step(*_data())
    assert "func.func" in lucid.ir.print_ir(step.module())
    assert step.module(0) is step.module(step.cache_info()["keys"][0])
    with pytest.raises(KeyError, match="no compiled signature"):
        step.module(("not", "a", "key"))
    with pytest.raises(KeyError, match="no entry 3"):
        step.module(3)


def test_fused_step_timing_names_every_stage():
    _, _, step = _fused()
    for seed in range(2):
        step(*_data(seed=seed))
    (row,) = step.timing()
    assert row["key"] == step.cache_info()["keys"][0]
    assert row["n_runs"] == 2 and row["compile_ms"] > 0 and row["last_run_ms"] > 0
    stages = list(row["passes_ms"])
    for name in ("trace", "vjp", "optimizer-fusion", "ghost-grads", "canonicalize", "cse"):
        assert name in stages, stages
    assert {"lower-to-prim", "backend-compile"} <= set(stages)
    assert stages.index("vjp") < stages.index("ghost-grads") < stages.index("lower-to-prim")
    assert all(ms >= 0 for ms in row["passes_ms"].values())
    assert sum(row["passes_ms"].values()) <= row["compile_ms"] * 1.01 + 1


def test_make_step_timing_and_ir_stages():
    step = lucid.compile.make_step(Net(), mse)
    step(*_data())
    (row,) = step.timing()
    assert {"trace", "vjp", "lower-to-prim", "backend-compile"} <= set(row["passes_ms"])
    imported = step.ir(stage="imported")
    optimized = step.ir(stage="optimized")
    prim = step.ir(stage="prim")
    final = step.ir(stage="final")
    assert "lucid.relu" in imported and "threshold_backward" not in imported
    assert "lucid.threshold_backward" in optimized and "grad:param:fc.weight" in optimized
    assert "prim." in prim and "lucid.relu" not in prim
    assert final.strip() and final != prim
    with pytest.raises(ValueError, match="unknown stage"):
        step.ir(stage="lowered")


def test_fused_step_ir_shows_the_update_and_ghost_gradients():
    _, _, step = _fused()
    step(*_data())
    imported = step.ir(stage="imported")
    optimized = step.ir(stage="optimized")
    assert "ghost:param:fc.weight" in imported and "ghost:" not in optimized
    assert "update:param:fc.weight" in optimized and "update:state:fc.weight" in optimized


def test_profile_compiles_without_stepping_and_leaves_state():
    model, opt, step = _fused()
    ref = copy.deepcopy(model)
    ref_opt = lucid.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    xb, tb = _data()
    before = _snapshot(model, opt)
    rows = step.profile(xb, tb, repeats=3)
    assert rows and {"index", "op", "ms", "instr"} <= set(rows[0])
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    params_after, _ = _snapshot(model, opt)
    for k in before[0]:
        np.testing.assert_array_equal(params_after[k], before[0][k], err_msg=k)
    assert step.cache_info()["entries"] == 1 and step.timing()[0]["n_runs"] == 0
    # The first real step after profile() is still a first step (SGD's momentum buffer).
    for seed in range(2):
        xb, tb = _data(seed=seed)
        loss = step(xb, tb)
        ref_opt.zero_grad()
        want = mse(ref(xb), tb)
        want.backward()
        ref_opt.step()
        assert abs(loss.item() - want.item()) < 1e-5
        for (name, a), (_, b) in zip(
            model.state_dict().items(), ref.state_dict().items(), strict=True
        ):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    # Profiling a compiled entry leaves parameters, optimizer state and buffers as they were.
    before = _snapshot(model, opt)
    step.profile(xb, tb, repeats=2)
    _assert_same(_snapshot(model, opt), before)
    with pytest.raises(ValueError, match="repeats"):
        step.profile(xb, tb, repeats=0)


def test_make_step_profile():
    model = Net()
    step = lucid.compile.make_step(model, mse)
    xb, tb = _data()
    buffers = [b.numpy().copy() for b in model.buffers()]
    rows = step.profile(xb, tb, repeats=2)
    assert any(r["op"] for r in rows)
    for b, saved in zip(model.buffers(), buffers, strict=True):
        np.testing.assert_array_equal(b.numpy(), saved)


@pytest.mark.parametrize("make", ["make_step", "fused_step"])
def test_print_ir_after_all_option_and_env(make, capsys, monkeypatch):
    def build(**kw):
        model = Net()
        if make == "make_step":
            return lucid.compile.make_step(model, mse, **kw)
        return lucid.compile.fused_step(
            model, mse, lucid.optim.Adam(model.parameters(), lr=1e-3), **kw
        )

    build(options={"print_ir_after_all": True})(*_data())
    err = capsys.readouterr().err
    expected = ["vjp", "canonicalize", "cse", "dce", "lower-to-prim"]
    if make == "fused_step":
        expected += ["optimizer-fusion", "ghost-grads"]
    for name in expected:
        assert f"IR Dump After {name} " in err, name
    build()(*_data())
    assert "IR Dump" not in capsys.readouterr().err
    monkeypatch.setenv("LUCID_COMPILE_PRINT_IR_AFTER_ALL", "1")
    build()(*_data())
    assert "IR Dump After vjp " in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"{make}: unknown option.*'print_ir'"):
        build(options={"print_ir": True})


def test_verbose_and_debug_for_fused_step(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_VERBOSE", "1")
    monkeypatch.setenv("LUCID_COMPILE_DEBUG", "1")
    _, _, step = _fused()
    with caplog.at_level(logging.INFO, logger="lucid.compile"):
        step(*_data())
        step(*_data(seed=1))
    lines = [r.getMessage() for r in caplog.records if "compiled fused_step" in r.getMessage()]
    assert len(lines) == 1  # one per compile
    assert "ops" in lines[0] and "vjp" in lines[0] and "lower-to-prim" in lines[0]
    (path,) = (tmp_path / "debug").glob("lucid-trace-*.json")
    ops = [op["name"] for op in json.loads(path.read_text())["ops"]]
    assert "batch_norm" in " ".join(ops) or "linear" in ops


def test_tree_dir_gives_each_pipeline_its_own_folder(tmp_path):
    tree = tmp_path / "tree"
    _, _, step = _fused(options={"print_ir_tree_dir": tree})
    step(*_data())
    step(*_data(n=5))  # a second signature: two more folders, nothing overwritten
    folders = sorted(os.listdir(tree))
    assert [f.split("_", 1)[1] for f in folders] == [
        "fused_step-graph",
        "fused_step-lowering",
        "fused_step-graph",
        "fused_step-lowering",
    ]
    graph = sorted(os.listdir(tree / folders[0]))
    assert graph[0] == "00_input.mlir" and any(f.endswith("_vjp.mlir") for f in graph)
    assert any(f.endswith("_ghost-grads.mlir") for f in graph)
    lowering = sorted(os.listdir(tree / folders[1]))
    assert lowering[0] == "00_input.mlir" and lowering[1] == "01_lower-to-prim.mlir"
    first = (tree / folders[0] / "00_input.mlir").read_text()
    second = (tree / folders[2] / "00_input.mlir").read_text()
    assert "6x4" in first and "5x4" in second


def test_compile_optimizer_switches_and_introspection(capsys):
    model = Net()
    opt = lucid.compile.compile_optimizer(
        lucid.optim.Adam(model.parameters(), lr=1e-3), options={"print_ir_after_all": True}
    )
    with pytest.raises(KeyError, match="compile_optimizer: nothing is compiled yet"):
        opt.step.module()
    loss = mse(model(_data()[0]), _data()[1])
    loss.backward()
    opt.step()
    assert "IR Dump After optimizer-fusion " in capsys.readouterr().err
    (row,) = opt.step.timing()
    assert {"trace", "optimizer-fusion", "lower-to-prim"} <= set(row["passes_ms"])
    assert "lucid.sqrt" in opt.step.ir(stage="optimized")
    before = [p.numpy().copy() for p in model.parameters()]
    assert opt.step.profile(repeats=2)
    for p, b in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), b)
    with pytest.raises(ValueError, match="'pipeline' is not taken"):
        lucid.compile.compile_optimizer(
            lucid.optim.SGD(model.parameters(), lr=0.1), options={"pipeline": "cse"}
        )
