"""Smaller surprising behaviours (issue 14, item 7): graph_dump() and lucid-inspect-trace,
LUCID_MANUAL_VJP_REQUIRE's error type, an unhashable argument's traceback, ``t.to("cuda")``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid._dispatch import apply
from lucid.ops._registry import REGISTRY, AVal, OpDef, register
from lucid.trace._trace import traces_from_json


def _inspect(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("lucid-inspect-trace", path=str(Path(sys.executable).parent))
    cmd = [tool] if tool else [sys.executable, "-m", "lucid.tools.inspect_trace"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # six tool processes; test_compiled_module checks graph_dump in the default run
def test_graph_dump_without_key_is_accepted_by_lucid_inspect_trace(tmp_path):
    cm = lucid.compile(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
        cm(lucid.randn(5, 4))
    dump = cm.graph_dump()
    assert [sig for sig, _ in traces_from_json(json.loads(dump))] == [
        repr(k) for k in cm.cache_info()["keys"]
    ]
    path = tmp_path / "dump.json"
    path.write_text(dump)
    res = _inspect(str(path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("2 signature(s)")
    assert "--sig 1: CacheKey((tensor<5x4xfloat32>)" in res.stdout
    assert res.stdout.count("linear") == 2 and res.stdout.count("relu") == 2
    res = _inspect(str(path), "--sig", "1", "--mlir")
    assert res.returncode == 0, res.stderr
    assert "lucid.linear" in res.stdout and "5x4" in res.stdout
    res = _inspect(str(path), str(path), "--sig", "0")
    assert res.returncode == 0 and "identical" in res.stdout
    # Several signatures where one trace is needed: the tool says how to pick one.
    res = _inspect(str(path), "--mlir")
    assert res.returncode == 2 and "2 signatures" in res.stderr and "--sig" in res.stderr
    res = _inspect(str(path), "--sig", "7")
    assert res.returncode == 2 and "holds 2 signature(s)" in res.stderr
    # One signature's dump is a plain trace, as before.
    one = tmp_path / "one.json"
    one.write_text(cm.graph_dump(cm.cache_info()["keys"][0]))
    res = _inspect(str(one))
    assert res.returncode == 0 and res.stdout.startswith("3 feeds, 2 ops")


def test_a_bad_graph_dump_entry_is_named():
    with pytest.raises(ValueError, match="entry 0 of the list is not a graph_dump"):
        traces_from_json([{"graph": {}}])
    with pytest.raises(ValueError, match=r"entry 0 \(k\): not a Lucid trace"):
        traces_from_json([{"sig": "k", "graph": {"format": "x"}}])


@pytest.fixture
def no_rule_op():
    op = register(
        OpDef(
            name="test_surprise_norule",
            operands=("x",),
            infer=lambda x: AVal(tuple(x.shape), x.dtype),
            kernel=lambda x: x * 2,
            vjp=None,
        )
    )
    yield op
    del REGISTRY[op.name]


class _Gap(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.op = op

    def forward(self, x):
        return apply(self.op, self.fc(x))


def test_manual_vjp_require_raises_compile_error(no_rule_op, monkeypatch):
    monkeypatch.setenv("LUCID_MANUAL_VJP_REQUIRE", "1")
    model = _Gap(no_rule_op)
    x = lucid.randn(2, 4)
    # A compiled call in grad mode: raised, not a silent eager fallback.
    with pytest.raises(lucid.compile.CompileError, match="test_surprise_norule"):
        lucid.compile(model)(x)
    # A training step.
    step = lucid.compile.make_step(model, lambda out: out.sum())
    with pytest.raises(lucid.compile.CompileError, match="test_surprise_norule"):
        step(x)
    # Without the variable the compiled call falls back to eager (the vjp pass refuses).
    monkeypatch.delenv("LUCID_MANUAL_VJP_REQUIRE")
    cm = lucid.compile(model)
    out = cm(x)
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    assert cm.cache_info()["eager_only"]


def test_an_unhashable_argument_does_not_chain_an_internal_error():
    def f(x, sizes):
        raise ValueError(f"bad sizes {sizes}")

    cm = lucid.compile(f)
    with pytest.raises(ValueError, match="bad sizes") as info:
        cm(lucid.randn(2), [1, 2])
    err = info.value
    assert err.__context__ is None and err.__cause__ is None
    text = "".join(traceback.format_exception(err))
    assert "_Unhashable" not in text and "During handling" not in text
    # And an unhashable argument the model accepts still runs eagerly.
    g = lucid.compile(lambda x, sizes: x * len(sizes))
    np.testing.assert_allclose(g(lucid.ones(2), [1, 2, 3]).numpy(), [3.0, 3.0])


def test_to_an_unknown_device_names_lucids_devices():
    t = lucid.randn(2)
    for name in ("cuda", "cuda:0", "mps"):
        with pytest.raises(ValueError, match=rf"unknown device '{name}'.*'cpu'.*'metal'"):
            t.to(name)
    with pytest.raises(ValueError, match="unknown device 'cuda'"):
        nn.Linear(2, 2).to("cuda")
    assert t.to("float64").dtype == lucid.float64
    assert t.to("cpu", lucid.float64).dtype == lucid.float64
    assert t.to("cpu") is t
