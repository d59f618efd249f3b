"""The pass registry reads the installed packages' entry points only for a pass name it does not
know: a pipeline of built-in passes (every compile's) never scans the installed distributions."""

import importlib.metadata

import pytest

from lucid.passes import registry
from lucid.passes.manager import PipelineError, parse_pipeline_spec


@pytest.fixture
def scans(monkeypatch):
    calls = []

    def fake_entry_points(group):
        calls.append(group)
        return []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    return calls


def test_built_in_pipeline_reads_no_entry_points(scans):
    passes = parse_pipeline_spec("canonicalize,cse,dce,lower-to-prim,prim-simplify")
    assert [p.name for p in passes] == [
        "canonicalize",
        "cse",
        "dce",
        "lower-to-prim",
        "prim-simplify",
    ]
    assert scans == []


def test_unknown_pass_reads_entry_points_once_then_is_refused(scans):
    with pytest.raises(PipelineError, match="unknown pass 'no-such-pass'"):
        parse_pipeline_spec("cse,no-such-pass")
    with pytest.raises(PipelineError, match="available passes: .*canonicalize"):
        parse_pipeline_spec("no-such-pass")
    assert scans == [registry.ENTRY_POINT_GROUP]
