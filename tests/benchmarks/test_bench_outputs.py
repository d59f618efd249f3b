"""The benchmarks write committed results only when asked (and then only a full run), and never
print a ratio against a peer that is not installed. (Timing itself is never asserted.)"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
sys.path.insert(0, BENCH)

import bench_per_process as BP  # noqa: E402
import bench_workloads as BW  # noqa: E402


@pytest.mark.parametrize(
    "narrowing",
    [
        ["--workloads", "E"],
        ["--mode", "infer"],
        ["--cases", "lucid compiled"],
        ["--no-torch-compile"],
    ],
)
def test_write_refuses_a_narrowed_run(narrowing, capsys):
    with pytest.raises(SystemExit):
        BP.parse_args([*narrowing, "--write"])
    assert "needs a full run" in capsys.readouterr().err
    assert not BP.parse_args(narrowing).write  # the same run without --write is fine


@pytest.fixture
def lucid_only_run(monkeypatch, tmp_path):
    """bench_per_process with no peer installed, children (the cases' and the sgemm
    measurement's) faked, and the reference paths in tmp_path: returns those paths."""

    def fake_spawn(spec, args):
        return {"ms": 1.0, "first_call_s": 0.1, "blas": {}, "threads": {}, "versions": {}}

    def fake_sgemm(args):
        rates = [50.0, 52.0]
        shape = list(BP.SGEMM_SHAPE)
        return {"shape": shape, "threads": args.threads, "round_gflops": rates, "gflops": 51.0}

    monkeypatch.setattr(BP, "spawn", fake_spawn)
    monkeypatch.setattr(BP, "measure_sgemm", fake_sgemm)
    monkeypatch.setattr(BP, "installed", lambda framework, *_: framework == "lucid")
    reference = tmp_path / "workloads.json", tmp_path / "performance.png"
    monkeypatch.setattr(BP, "REFERENCE_JSON", str(reference[0]))
    monkeypatch.setattr(BP, "REFERENCE_CHART", str(reference[1]))
    return reference


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_per_process_run_writes_nothing_unless_asked_and_no_ratio_without_peers(
    lucid_only_run, capsys
):
    BP.main(["--passes", "1"])
    out = capsys.readouterr().out
    assert not any(p.exists() for p in lucid_only_run)
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "|---" not in ln]
    body = [ln for ln in rows if not ln.startswith("| wl ")]
    assert len(body) == 5 + 6  # inference A–E; training A (SGD, Adam) and B–E
    for line in body:
        assert "not installed" in line and "no peer measured" in line, line


def test_per_process_write_stores_the_full_run_without_ratios(lucid_only_run, capsys):
    BP.main(["--passes", "1", "--write"])
    saved = json.loads(lucid_only_run[0].read_text())
    assert len(saved["rows"]) == 11
    assert not any("ratio" in row or "vs" in row for row in saved["rows"])
    assert all(row["peer_source"] == "no peer installed" for row in saved["rows"])


@pytest.mark.slow
def test_the_sgemm_rate_is_measured_in_a_fresh_process():
    result = BP.measure_sgemm(BP.parse_args(["--threads", "1"]))
    assert "error" not in result, result
    assert result["shape"] == list(BP.SGEMM_SHAPE) and result["threads"] == 1
    assert result["gflops"] > 0 and all(r > 0 for r in result["round_gflops"])


def test_in_process_benchmark_has_no_ratio_without_peers(monkeypatch, capsys):
    for peer in ("torch", "jax"):
        monkeypatch.setitem(sys.modules, peer, None)  # as if not installed
    args = SimpleNamespace(rounds=1, min_round_s=0.0, threads=1, no_torch_compile=False)
    row = BW.run_row("infer", "E", args)
    assert set(row["ms"]) == {"lucid eager", "lucid compiled"}
    assert "ratio" not in row and row["peer_source"] == "no peer installed"
    BW.print_table([row])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| infer | E"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:7] == ["missing", "missing", "missing"]  # torch, torch.compile, jax
    assert cells[7] == "-"  # no ratio
