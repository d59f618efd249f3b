"""``lucid.compile.diagnose``: coverage buckets with counts and shapes, backend support, graph
breaks with source lines, the printed report, JSON form and LUCID_MANUAL_VJP_REQUIRE."""

from __future__ import annotations

import json

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid.compile import DiagnosisReport, OpInfo, diagnose
from lucid.compile.diagnose import VJPCoverageError
from lucid.compile.training.builder import build_training_module
from lucid.ops._registry import GRAD_SINK, REGISTRY, SYMBOLIC_BATCH_SAFE, AVal, OpDef, register


@pytest.fixture
def no_rule_op():
    """A throwaway op with no VJP rule (and no reason), unregistered afterwards."""
    op = register(
        OpDef(
            name="test_diag_norule",
            operands=("x",),
            infer=lambda x: AVal(tuple(x.shape), x.dtype),
            kernel=lambda x: x * 2,
            vjp=None,
        )
    )
    yield op
    del REGISTRY[op.name]


class WithGap(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.op = op

    def forward(self, x):
        h = apply(self.op, F.relu(self.fc(x)))
        h = apply(self.op, h) + (h > 0).float()
        return h.sum()


def test_op_without_rule_is_listed_under_uncovered_with_count_and_shape(no_rule_op):
    report = diagnose(WithGap(no_rule_op), lucid.randn(3, 4))
    assert isinstance(report, DiagnosisReport)
    uncovered = {i.name: i for i in report.uncovered}
    assert uncovered == {"test_diag_norule": OpInfo("test_diag_norule", 2, (3, 6), "float32")}
    registered = {i.name: i for i in report.registered}
    assert registered["linear"].count == 1 and registered["linear"].sample_shape == (3, 6)
    assert {"relu", "add", "sum", "cast"} <= set(registered)
    assert {i.name for i in report.grad_sinks} == {"gt"}
    buckets = [*report.registered, *report.grad_sinks, *report.uncovered]
    assert report.total_ops == sum(i.count for i in buckets)
    assert not report.covered and "test_diag_norule" in report.recommendation


def test_printed_report_shows_buckets_counts_and_shapes(no_rule_op):
    report = diagnose(WithGap(no_rule_op), lucid.randn(3, 4))
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == f"Lucid diagnosis: {report.total_ops} ops traced"
    uncovered_at = next(i for i, l in enumerate(lines) if l.startswith("UNCOVERED"))
    assert lines[uncovered_at].endswith(": 1 ops, 2 uses")
    row = lines[uncovered_at + 1].split()
    assert row == ["test_diag_norule", "x2", "3x6", "float32"]
    sinks_at = next(i for i, l in enumerate(lines) if l.startswith("Gradient sinks"))
    assert lines[sinks_at + 1].split() == ["gt", "x1", "3x6", "bool"]
    assert "Backend support:" in text and "symbolic batch" in text
    assert lines[-1].startswith("Recommendation: ") and "test_diag_norule" in lines[-1]
    assert all(line == line.rstrip() for line in lines)


def test_support_reports_lowering_and_symbolic_batch_safety_per_op():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU())
    report = diagnose(model, lucid.randn(2, 4))
    support = {s.name: s for s in report.support}
    assert set(support) == {"linear", "relu"}
    for name, s in support.items():
        assert s.symbolic_batch_safe == (SYMBOLIC_BATCH_SAFE in REGISTRY[name].props)
        assert s.stages, "at least the lowering stage is reported"
        assert all(v == "yes" or v.startswith("no") for v in s.stages.values())
    assert report.covered and report.uncovered == [] and report.graph_breaks == []
    assert "ready" in report.recommendation
    assert all(s.stages["lowers to prim"] == "yes" for s in support.values())


def test_op_that_cannot_lower_is_reported_for_every_backend(no_rule_op):
    report = diagnose(WithGap(no_rule_op), lucid.randn(3, 4))
    stages = {s.name: s.stages for s in report.support}["test_diag_norule"]
    assert stages["lowers to prim"].startswith("no: ")
    assert all(v.startswith("no") for v in stages.values())
    assert "test_diag_norule" in report.recommendation
    assert "Not supported:" in str(report)


def test_mpsgraph_column_shows_its_refusal_even_where_it_cannot_run():
    from lucid.backends import _status

    def fn(x):
        return F.relu(x) * x

    report = diagnose(fn, lucid.randn(2, 4, dtype=lucid.float64))
    available, _ = _status("mpsgraph")
    column = "mpsgraph" if available else "mpsgraph (not available here)"
    stages = {s.name: s.stages for s in report.support}
    for name in ("mul", "relu"):
        assert stages[name]["mpsgraph-reference"].startswith("no: ")
        assert stages[name][column].startswith("no: ") and "float64" in stages[name][column]
        assert stages[name]["cpu"] == "yes"
    assert f"relu: {column}: " in str(report) and "64-bit float" in str(report)
    # The same function in float32 passes MPSGraph legalization.
    ok = diagnose(fn, lucid.randn(2, 4))
    assert all(s.stages[column] == "yes" for s in ok.support)


def test_graph_break_is_reported_with_its_source_line():
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # the break
            return y
        return -y

    report = diagnose(f, lucid.randn(3))
    (brk,) = report.graph_breaks
    assert "item()" in brk.what and brk.filename == __file__
    assert brk.source == "if y.sum().item() > 0:  # the break"
    assert {i.name for i in report.registered} == {"mul", "sum"}  # the ops before the break
    assert f"{__file__}:{brk.lineno}" in str(report)
    assert "graph break" in report.recommendation


def test_diagnose_runs_nothing():
    calls = []
    model = nn.Linear(3, 2)
    weight_before = model.weight.detach().numpy().copy()
    report = diagnose(lambda x: calls.append(x.is_traced) or model(x).sum(), lucid.randn(2, 3))
    assert calls == [True]  # called once, on trace tensors
    np.testing.assert_array_equal(model.weight.detach().numpy(), weight_before)
    assert report.total_ops == 2


def test_to_dict_is_json_ready_and_complete(no_rule_op):
    report = diagnose(WithGap(no_rule_op), lucid.randn(3, 4))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["total_ops"] == report.total_ops
    assert data["uncovered"] == [
        {
            "name": "test_diag_norule",
            "count": 2,
            "sample_shape": [3, 6],
            "sample_dtype": "float32",
            "reason": "",
        }
    ]
    assert {s["name"] for s in data["support"]} == {
        i.name for i in [*report.registered, *report.grad_sinks, *report.uncovered]
    }
    assert data["recommendation"] == report.recommendation


def test_grad_sink_ops_come_from_the_registry_mark():
    def f(x):
        return (x.argmax(1).float() + lucid.zeros_like(x).sum(1) + (x == 1).float().sum(1)).sum()

    report = diagnose(f, lucid.randn(2, 3))
    for info in report.grad_sinks:
        assert GRAD_SINK in REGISTRY[info.name].props
    assert {"argmax", "zeros_like", "eq"} <= {i.name for i in report.grad_sinks}


def test_require_env_turns_a_coverage_gap_into_an_error(no_rule_op, monkeypatch):
    model = WithGap(no_rule_op)
    x = lucid.randn(3, 4)
    monkeypatch.setenv("LUCID_MANUAL_VJP_REQUIRE", "1")
    with pytest.raises(VJPCoverageError, match=r"test_diag_norule \(x2, shape \(3, 6\)\)"):
        build_training_module(model, lambda out: out, (x,))
    monkeypatch.setenv("LUCID_MANUAL_VJP_REQUIRE", "0")
    from lucid.passes.vjp import VJPError

    with pytest.raises(VJPError, match="test_diag_norule"):  # still caught, by the vjp pass
        build_training_module(model, lambda out: out, (x,))


def test_docs_sample_report_is_what_diagnose_prints(capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "diagnose.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    sample = re.search(r"```text\n(.*?)```", doc, re.S).group(1)
    try:
        exec(code, {})
    finally:
        REGISTRY.pop("my_scale", None)
    printed = capsys.readouterr().out

    def section(text: str, start: str, stop: str) -> str:
        return text[text.index(start) : text.index(stop)]

    # The uncovered op and the report's layout are the sample's; the registered list may move
    # with the layers' implementation and the support table with the backends installed.
    assert printed.splitlines()[0] == sample.splitlines()[0]
    assert section(printed, "UNCOVERED", "Backend support:") == section(
        sample, "UNCOVERED", "Backend support:"
    )
    titles = [line.split(":")[0] for line in printed.splitlines() if line and line[0] != " "]
    assert titles == [line.split(":")[0] for line in sample.splitlines() if line and line[0] != " "]
    assert printed.splitlines()[-1].startswith("Recommendation: add a VJP rule for my_scale")
