"""The per-process benchmark's bookkeeping: ratios only against measured peers, aligned passes,
nothing written unless asked. (Timing itself is never asserted: the machine is shared.)"""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH))

import bench_per_process as BP  # noqa: E402


def ok(ms: float) -> dict:
    return {
        "ms": ms,
        "first_call_s": 0.5,
        "blas": {"source": "test"},
        "threads": {},
        "versions": {},
    }


def test_ratio_is_against_the_best_measured_peer_with_per_pass_range():
    runs = {
        "lucid compiled": [ok(2.0), ok(3.0), ok(2.5)],
        "torch": [ok(4.0), ok(3.0), ok(5.0)],
        "jax": [ok(2.5), ok(6.0), ok(2.6)],
    }
    row = BP.summarize_row("infer", "D", "", runs, missing=["torch.compile"])
    assert row["ms"]["lucid compiled"] == 2.5
    assert row["range_ms"]["torch"] == [3.0, 5.0]
    assert row["vs"] == "jax" and row["ratio"] == pytest.approx(2.5 / 2.6)
    assert row["ratio_range"] == pytest.approx([3.0 / 6.0, 2.5 / 2.6])
    assert row["holds"] is False  # 0.96 > 0.9
    assert BP.fmt_cell(row, "torch.compile") == "not installed"


def test_no_ratio_without_a_measured_peer():
    runs = {"lucid compiled": [ok(1.0)], "lucid eager": [ok(5.0)]}
    row = BP.summarize_row("train", "A", "sgd", runs, missing=["torch", "torch.compile", "jax"])
    assert "ratio" not in row and "vs" not in row
    assert row["peer_source"] == "no peer installed"
    assert row["speedup_vs_eager"] == pytest.approx(5.0)


def test_e_is_only_compared_with_jax():
    runs = {"lucid compiled": [ok(0.01)], "torch": [ok(0.005)]}
    row = BP.summarize_row("infer", "E", "", runs, missing=["jax"])
    assert "ratio" not in row


def test_a_failed_pass_is_left_out_of_medians_and_ratio_pairs():
    runs = {
        "lucid compiled": [ok(1.0), {"error": "boom"}, ok(3.0)],
        "jax": [ok(2.0), ok(100.0), ok(2.0)],
    }
    row = BP.summarize_row("infer", "A", "", runs, missing=[])
    assert row["ms"]["lucid compiled"] == 2.0
    assert row["errors"]["lucid compiled"] == "boom"
    assert row["ratio_range"] == pytest.approx([0.5, 1.5])


def test_rows_and_cases_follow_the_arguments():
    args = BP.parse_args(["--mode", "train", "--workloads", "AD", "--cases", "lucid compiled,jax"])
    assert BP.planned_rows(args) == [
        ("train", "A", "sgd"),
        ("train", "A", "adam"),
        ("train", "D", "sgd"),
    ]
    cases, missing = BP.row_cases("train", args)
    assert sorted(cases + missing) == ["jax", "lucid compiled"]
    assert args.json is None and not args.write  # nothing is written unless asked


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        BP.parse_args(["--workloads", "AZ"])
    with pytest.raises(SystemExit):
        BP.parse_args(["--cases", "numpy"])


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_a_child_process_times_its_case_and_records_blas_and_threads():
    args = BP.parse_args(["--rounds", "2", "--min-round-s", "0.001", "--threads", "1"])
    result = BP.spawn("infer:E:lucid compiled:sgd", args)
    assert "error" not in result, result.get("error")
    assert len(result["round_ms"]) == 2 and result["ms"] > 0
    assert 0 < result["process_cpu_s"]  # the child's own CPU time, counted from its rusage
    assert result["threads"]["LUCID_NUM_THREADS"] == "1"
    assert result["threads"]["lucid native pool"] == 1
    assert result["blas"]["source"] in ("threadpoolctl", "numpy/scipy-openblas32 config")


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_a_child_reports_a_case_it_cannot_build():
    args = BP.parse_args(["--rounds", "1", "--min-round-s", "0.001"])
    result = BP.spawn("infer:E:no such case:sgd", args)
    assert "error" in result


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_lucid_cases_run_under_the_lucid_interpreter_and_peers_under_this_one(tmp_path):
    marker = tmp_path / "ran"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    args = BP.parse_args(
        [
            "--rounds",
            "1",
            "--min-round-s",
            "0.001",
            "--threads",
            "1",
            "--lucid-python",
            str(wrapper),
        ]
    )
    assert BP.interpreter("lucid", args) == str(wrapper)
    assert BP.interpreter("torch", args) == BP.interpreter("jax", args) == sys.executable
    result = BP.spawn("infer:E:lucid compiled:sgd", args)
    assert "error" not in result, result.get("error")
    assert marker.exists()


def test_a_lucid_interpreter_that_is_not_executable_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        BP.parse_args(["--lucid-python", str(tmp_path / "missing")])


def test_rows_carry_their_flop_floor():
    import workloads as W

    # The figures: D's forward about 0.44 GFLOP, 2.9 ms at 150 GFLOP/s; training ~3x.
    assert W.flops("D", False) == pytest.approx(0.44e9, rel=0.01)
    assert W.floor_ms("D", False) == pytest.approx(2.9, rel=0.01)
    assert 2.5 < W.flops("D", True) / W.flops("D", False) < 3.0
    # A's inference is one 64x784 @ 784x256 GEMM plus a small one.
    assert W.flops("A", False) == pytest.approx(2 * 64 * 784 * 256, rel=0.02)
    assert W.flops("E", False) is None
    row = BP.summarize_row("infer", "D", "", {"lucid compiled": [ok(3.2)]}, missing=[])
    assert row["floor_ms"] == pytest.approx(W.floor_ms("D", False))
    assert row["vs_floor"] == pytest.approx(3.2 / row["floor_ms"])
    assert "floor_ms" not in BP.summarize_row("infer", "E", "", {}, missing=[])


def test_floors_scale_with_the_sgemm_rate():
    import workloads as W

    for wl, train in (("A", False), ("B", True), ("C", True), ("D", False)):
        at_150 = W.floor_ms(wl, train)
        assert at_150 == pytest.approx(W.flops(wl, train) / 150e9 * 1e3)
        assert W.floor_ms(wl, train, 50.0) == pytest.approx(3 * at_150)
    assert W.floor_ms("E", True, 50.0) is None
    with pytest.raises(ValueError, match="positive"):
        W.floor_ms("D", False, 0.0)


def test_rows_take_the_floor_at_the_rate_given():
    import workloads as W

    runs = {"lucid compiled": [ok(20.0)], "jax": [ok(18.0)]}
    row = BP.summarize_row("train", "B", "sgd", runs, missing=[], floor_gflops=60.0)
    assert row["floor_gflops"] == 60.0
    assert row["floor_ms"] == pytest.approx(W.flops("B", True) / 60e9 * 1e3)
    assert row["vs_floor"] == pytest.approx(20.0 / row["floor_ms"])


def test_the_floor_rate_is_the_higher_measurement_or_the_default():
    import workloads as W

    start, end = {"gflops": 54.0}, {"gflops": 61.5}
    assert BP.floor_rate(start, end) == (61.5, "measured: the higher of the run's start and end")
    assert BP.floor_rate({"error": "boom"}, end)[0] == 61.5
    rate, source = BP.floor_rate({"error": "boom"}, None)
    assert rate == W.FLOOR_GFLOPS and source.startswith("assumed")


def test_the_table_header_names_the_rate(capsys):
    runs = {"lucid compiled": [ok(3.0)], "jax": [ok(3.5)]}
    row = BP.summarize_row("infer", "D", "", runs, missing=[], floor_gflops=75.0)
    BP.print_tables([row], 75.0)
    lines = capsys.readouterr().out.splitlines()
    header = next(ln for ln in lines if ln.startswith("| wl |"))
    assert "| FLOP floor at 75 GFLOP/s (compiled/floor) |" in header
    assert header.endswith("| first call s, compiled / jax | peak RSS MB, compiled / best peer |")
    body = next(ln for ln in lines if ln.startswith("| D |"))
    # As many cells as the header (the docs' tables are pasted from these lines).
    assert body.count("|") == header.count("|")
    assert f"({3.0 / row['floor_ms']:.2f}x)" in body


def test_floor_gflops_is_checked_and_kept_out_of_a_reference_run():
    assert BP.parse_args(["--floor-gflops", "80"]).floor_gflops == 80.0
    with pytest.raises(SystemExit):
        BP.parse_args(["--floor-gflops", "0"])
    with pytest.raises(SystemExit):
        BP.parse_args(["--floor-gflops", "80", "--write"])


def test_the_sgemm_child_reports_a_rate_per_round(monkeypatch):
    monkeypatch.setattr(BP, "SGEMM_ROUNDS", 2)
    monkeypatch.setattr(BP, "SGEMM_MIN_ROUND_S", 0.001)
    result = BP.run_sgemm_child(BP.parse_args(["--threads", "1"]))
    assert result["shape"] == list(BP.SGEMM_SHAPE) and result["threads"] == 1
    assert len(result["round_gflops"]) == 2 and result["gflops"] > 0
    assert BP.describe_sgemm(result).endswith(")")
    assert BP.describe_sgemm(None) == "not measured"


def ok_with(ms: float, first_s: float, peak_mb: float, import_s: float | None = None) -> dict:
    return dict(ok(ms), first_call_s=first_s, peak_mb=peak_mb, import_s=import_s)


def test_large_rows_judge_first_call_against_jax_and_peak_memory_against_the_best_peer():
    runs = {
        "lucid compiled": [ok_with(10.0, 10.0, 100.0), ok_with(12.0, 14.0, 110.0)],
        "torch": [ok_with(11.0, 1.0, 80.0), ok_with(13.0, 1.0, 90.0)],
        "jax": [ok_with(20.0, 30.0, 120.0), ok_with(20.0, 30.0, 140.0)],
    }
    row = BP.summarize_row("train", "F", "adamw", runs, missing=["torch.compile"])
    assert row["peak_mb"] == {"lucid compiled": 105.0, "torch": 85.0, "jax": 130.0}
    assert row["first_call_vs_jax"] == pytest.approx(12.0 / 30.0) and row["first_call_holds"]
    assert row["peak_vs"] == "torch" and row["peak_vs_best"] == pytest.approx(105.0 / 85.0)
    assert row["peak_holds"] is False
    assert BP.first_call_cell(row) == "12.00 / 30.00 (0.40x, holds)"
    assert BP.peak_cell(row) == "105 / 85 torch (1.24x, NO)"


def test_small_rows_show_first_call_and_peak_without_judging_them():
    runs = {"lucid compiled": [ok_with(1.0, 2.0, 10.0)], "jax": [ok_with(1.0, 1.0, 20.0)]}
    row = BP.summarize_row("infer", "A", "", runs, missing=[])
    assert row["first_call_vs_jax"] == pytest.approx(2.0) and "first_call_holds" not in row
    assert BP.first_call_cell(row) == "2.00 / 1.00 (2.00x)"
    assert "peak_holds" not in row and row["peak_vs_best"] == pytest.approx(0.5)


def test_the_first_call_cell_adds_the_comparison_with_each_frameworks_import():
    runs = {
        "lucid compiled": [ok_with(1.0, 0.2, 10.0, import_s=0.1)],
        "jax": [ok_with(1.0, 0.3, 20.0, import_s=0.9)],
    }
    row = BP.summarize_row("infer", "H", "", runs, missing=[])
    assert row["first_call_holds"] is False  # judged on the first call alone
    assert row["ready_s"] == pytest.approx({"lucid compiled": 0.3, "jax": 1.2})
    assert BP.first_call_cell(row) == "0.20 / 0.30 (0.67x, NO); with import 0.30 / 1.20 (0.25x)"


def test_the_child_times_its_frameworks_import(monkeypatch):
    import bench_workloads as BW

    for module in BP.FRAMEWORK_MODULES.values():  # the child blocks the other frameworks
        monkeypatch.setitem(sys.modules, module, sys.modules.get(module))
    imported = []
    monkeypatch.setattr(BP.importlib, "import_module", imported.append)
    calls = []
    monkeypatch.setattr(BW, "infer_cases", lambda *a, **k: {"jax": lambda: lambda: calls.append(1)})
    args = BP.parse_args(["--rounds", "1", "--min-round-s", "0"])
    result = BP.run_child("infer:A:jax:", args)
    assert imported == ["jax", "jax.numpy"] and result["import_s"] >= 0
    assert result["first_call_s"] >= 0 and calls


def test_a_child_without_peak_memory_leaves_the_columns_empty():
    row = BP.summarize_row("infer", "G", "", {"lucid compiled": [ok(1.0)]}, missing=["jax"])
    assert "peak_mb" not in row and BP.peak_cell(row) == "-"
    assert BP.first_call_cell(row) == "0.50 / -"


def test_large_workloads_train_with_their_own_optimizers():
    args = BP.parse_args(["--workloads", "FGH", "--mode", "train"])
    assert BP.planned_rows(args) == [
        ("train", "F", "adamw"),
        ("train", "G", "sgd_momentum"),
        ("train", "H", "adam"),
    ]
    assert BP.parse_args(["--workloads", "ABCDEFGH", "--write"]).write  # A-E plus more is full


def test_unknown_workload_is_refused(capsys):
    with pytest.raises(SystemExit):
        BP.parse_args(["--workloads", "AZ"])
    assert "unknown workloads 'Z'" in capsys.readouterr().err
