"""The on-device calibration command (issue 24, item 14), run here against the reference: its
cases reach every selector the emitter uses, a case that aborts its child process is reported,
not inherited, and the command says why it cannot run where there is no device."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucid.backends.mpsgraph import selfcheck
from lucid.backends.mpsgraph.emit import Val, emit_op, mps_dims
from lucid.backends.mpsgraph.program import RecordingBuilder
from lucid.backends.mpsgraph.selectors import INPUT_SELECTORS, SELECTORS
from lucid.ir import prim as P


def test_the_cases_cover_every_prim_op_and_every_selector():
    assert {c.op for c in selfcheck.CASES.values()} == set(P.PRIM_OPS)
    used = set(INPUT_SELECTORS)
    for case in selfcheck.CASES.values():
        b = RecordingBuilder()
        arrays = [np.asarray(a) for a in case.inputs()]
        ins = [Val(b.placeholder(mps_dims(a.shape), P.dtype_of(a), "x"), a.shape, P.dtype_of(a))
               for a in arrays]  # fmt: skip
        emit_op(b, case.op, ins, case.attrs)
        used |= {c["selector"] for c in b.calls}
    assert used == set(SELECTORS), set(SELECTORS) - used


@pytest.mark.parametrize("name", ["argmax", "argsort_nan_ties", "cast_i64_to_i32_overflow"])
def test_a_case_compares_with_the_reference_and_prim(name):
    row = selfcheck.check_case(name, device=False)
    assert row["reference"].startswith("agrees") and row["prim"].startswith("agrees"), row


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_an_aborting_case_is_reported_and_the_run_goes_on(monkeypatch, capsys):
    monkeypatch.setenv("LUCID_SELFCHECK_ABORT", "one_hot")
    status = selfcheck.main(["--backend", "mpsgraph-reference", "--json", "--case", "one_hot"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1
    (row,) = report["rows"]
    assert row["case"] == "one_hot" and row["reference"].startswith("ABORTED (signal 6)"), row
    assert report["machine"] and report["device"]


def test_without_a_device_the_command_says_why():
    status = selfcheck.main([])
    assert status == 2 or selfcheck.sys.platform == "darwin"
