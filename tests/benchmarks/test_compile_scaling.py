"""The compile-scaling benchmark's arithmetic: the growth-exponent fit, the targets, the run order
and series ending; and a smoke run on tiny sizes without peers. (Timing is never asserted.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
sys.path.insert(0, BENCH)

import bench_compile_scaling as CS  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(
    exponent=st.floats(0.5, 2.5),
    scale=st.floats(1e-3, 1e3),
    sizes=st.lists(st.integers(1, 100_000), min_size=2, max_size=8, unique=True),
)
def test_fit_recovers_the_exponent_of_a_power_law(exponent, scale, sizes):
    values = [scale * s**exponent for s in sizes]
    assert CS.fit_exponent(sizes, values) == pytest.approx(exponent, rel=1e-6, abs=1e-6)


def test_fit_is_least_squares_over_noisy_points():
    # log2 sizes 0, 1, 2; log2 values 0, 2, 3: slope by least squares = 1.5 (log base cancels).
    assert CS.fit_exponent([1, 2, 4], [1, 4, 8]) == pytest.approx(1.5)


def test_fit_leaves_out_non_positive_points_and_needs_two_sizes():
    assert CS.fit_exponent([1, 2, 4], [0.0, 2.0, 8.0]) == pytest.approx(2.0)
    assert CS.fit_exponent([1, 2], [0.0, 5.0]) is None
    assert CS.fit_exponent([3, 3, 3], [1.0, 2.0, 3.0]) is None


def point(n_ops, stages, first_s=1.0, peak=100.0, **extra):
    return {"n_ops": n_ops, "stages_ms": stages, "first_call_s": first_s, "peak_mb": peak, **extra}


def test_series_exponents_judge_only_stages_large_enough_to_time():
    pts = [
        point(100, {"big": 100.0, "tiny": 1.0}, 0.2, 10.0),
        point(400, {"big": 1600.0, "tiny": 4.0}, 0.8, 40.0),
    ]
    e = CS.series_exponents(pts)
    assert e["big"]["exponent"] == pytest.approx(2.0) and e["big"]["judged"]
    assert e["tiny"]["exponent"] == pytest.approx(1.0) and not e["tiny"]["judged"]
    assert e["first call"]["exponent"] == pytest.approx(1.0)
    assert e["peak memory"]["exponent"] == pytest.approx(1.0) and e["peak memory"]["judged"]


def test_a_stage_missing_at_one_size_counts_as_zero_there_and_is_left_out_of_the_fit():
    pts = [point(10, {"a": 50.0}), point(20, {"a": 100.0, "b": 30.0}), point(40, {"a": 200.0})]
    e = CS.series_exponents(pts)
    assert e["a"]["exponent"] == pytest.approx(1.0)
    assert e["b"]["exponent"] is None and not e["b"]["judged"]  # one point only


def test_a_training_series_fits_only_the_sizes_compiled_like_its_largest():
    # Below fused_step's update-fusion limit the step is another program (one concatenated
    # update chain): fitted with the larger sizes it would bend the slope.
    fused = dict(model="transformer", mode="train", framework="lucid", fused_updates=True)
    unfused = dict(fused, fused_updates=False)
    results = [
        dict(point(24, {"a": 0.2}), size=1, **fused),
        dict(point(48, {"a": 50.0}), size=2, **unfused),
        dict(point(96, {"a": 100.0}), size=4, **unfused),
    ]
    kept, left_out = CS.comparable_points(results)
    assert [p["size"] for p in kept] == [2, 4] and [p["size"] for p in left_out] == [1]
    assert CS.all_exponents(results)["transformer train"]["a"]["exponent"] == pytest.approx(1.0)
    old = [{k: v for k, v in p.items() if k != "fused_updates"} for p in results]
    assert CS.comparable_points(old) == (old, [])  # cases measured before the flag: all fitted


def case(model, mode, size, fw, first_s=None, **extra):
    out = {"model": model, "mode": mode, "size": size, "framework": fw, **extra}
    if first_s is not None:
        out["first_call_s"] = first_s
    return out


def by_target(targets):
    return {t["target"]: t for t in targets}


def test_targets_compare_with_jax_at_depth_16_and_find_the_worst_exponent():
    results = [
        case("transformer", "train", 16, "lucid", 20.0),
        case("transformer", "train", 16, "jax", 40.0),
        case("transformer", "infer", 16, "lucid", 4.0),
        case("transformer", "infer", 16, "jax", 2.0),
        case("chain", "infer", 4000, "lucid", 3.0, n_ops=8001),
        case("chain", "infer", 5000, "lucid", 12.0, n_ops=10001),
        case("chain", "infer", 8000, "lucid", 20.0, n_ops=16001),
    ]
    exps = {
        "chain infer": {
            "fuse": {"exponent": 2.0, "judged": True},
            "noise": {"exponent": 5.0, "judged": False},
            "peak memory": {"exponent": 1.1, "judged": True},
        },
        "lstm train": {"cse": {"exponent": 1.2, "judged": True}},
    }
    t = by_target(CS.check_targets(results, exps))
    stage = t["every stage's growth exponent"]
    assert stage["value"] == 2.0 and stage["where"] == "chain infer: fuse" and not stage["holds"]
    train = t["fused_step first call, transformer depth 16, vs JAX"]
    assert train["value"] == pytest.approx(0.5) and train["holds"] is False
    infer = t["inference first call, transformer depth 16, vs JAX"]
    assert infer["value"] == pytest.approx(2.0) and infer["holds"] is False
    big = t["a 10,000-op graph compiles (first call, s)"]
    assert big["value"] == 12.0 and big["holds"] is False  # the smallest chain of >= 10,000 ops
    peak = t["compile peak memory's growth exponent"]
    assert peak["value"] == pytest.approx(1.1) and peak["holds"] is True


def test_a_big_chain_over_the_budget_misses_the_big_graph_target():
    results = [
        case("chain", "infer", 2000, "lucid", 5.0, n_ops=4001),
        case("chain", "infer", 5000, "lucid", over_budget=True, budget_s=120.0, error="over"),
        case("chain", "infer", 8000, "lucid", skipped="after pairs 5000"),
    ]
    big = CS.big_graph_target(results)
    assert big["value"] == 120.0 and big["holds"] is False and "over the budget" in big["where"]
    assert CS.big_graph_target(results[:1])["holds"] is None  # no chain that large was run


def test_targets_not_measured_are_neither_held_nor_missed():
    results = [case("transformer", "train", 16, "lucid", 20.0)]  # no JAX, no chain
    for t in CS.check_targets(results, {}):
        assert t["value"] is None and t["holds"] is None, t
    CS.print_targets(CS.check_targets(results, {}))  # prints "not measured", does not fail


def test_schedule_runs_a_rows_frameworks_back_to_back_rotated():
    rows = [("m", "infer", 1), ("m", "infer", 2), ("m", "infer", 4), ("m", "infer", 8)]
    order = CS.schedule(rows, ["lucid", "jax", "torch.compile"])
    assert len(order) == 12 and len(set(order)) == 12
    for i, row in enumerate(rows):
        chunk = order[3 * i : 3 * i + 3]
        assert {c[:3] for c in chunk} == {row}  # back to back
    firsts = [order[3 * i][3] for i in range(4)]
    assert firsts == ["lucid", "jax", "torch.compile", "lucid"]  # rotated
    assert CS.schedule(rows, []) == []


def test_a_failed_case_ends_its_series_only(monkeypatch):
    monkeypatch.setattr(CS, "installed", lambda fw, args: fw != "torch.compile")

    def fake_spawn(c, args):
        model, mode, size, fw = c
        if fw == "lucid" and size == 2:
            return {"error": "over the 1 s budget", "over_budget": True}
        return {"first_call_s": 0.1 * size, "peak_mb": 1.0}

    args = SimpleNamespace(
        models=["transformer"],
        modes=["infer"],
        frameworks=["lucid", "jax", "torch.compile"],
        size_plan={("transformer", "infer"): (4, 1, 2)},
    )
    results = CS.run_plan(args, spawn_case=fake_spawn)
    got = {(r["size"], r["framework"]): r for r in results}
    assert len(got) == 9
    assert got[(1, "lucid")]["first_call_s"] == pytest.approx(0.1)
    assert got[(2, "lucid")]["over_budget"] and "after depth 2" in got[(4, "lucid")]["skipped"]
    assert got[(4, "jax")]["first_call_s"] == pytest.approx(0.4)  # JAX's series goes on
    assert all(got[(n, "torch.compile")]["missing"] for n in (1, 2, 4))
    args.peer_plan = {("transformer", "infer"): (1,)}  # peers at depth 1 only
    again = {(r["size"], r["framework"]) for r in CS.run_plan(args, spawn_case=fake_spawn)}
    assert (1, "jax") in again and (2, "jax") not in again and (4, "lucid") in again
    assert [CS.cell(got[(n, "lucid")]) for n in (1, 2, 4)] == [
        "0.10 s, 1 MB",
        "over budget",
        "skipped",
    ]


@pytest.mark.parametrize(
    "bad",
    [
        ["--sizes", "transformer"],
        ["--sizes", "nope=1"],
        ["--sizes", "chain=0"],
        ["--sizes", "chain:fit=1"],
        ["--modes", "x"],
    ],
)
def test_bad_options_are_refused_by_name(bad, capsys):
    with pytest.raises(SystemExit):
        CS.parse_args(bad)
    assert "--" in capsys.readouterr().err


def test_sizes_override_only_the_models_and_modes_named():
    args = CS.parse_args(
        ["--quick", "--models", "chain,lstm", "--sizes", "chain=3,5", "--sizes", "chain:train=2"]
    )
    assert args.size_plan == {
        ("chain", "infer"): (3, 5),
        ("chain", "train"): (2,),
        ("lstm", "infer"): CS.QUICK_SIZES["lstm"],
        ("lstm", "train"): CS.QUICK_SIZES["lstm"],
    }
    assert CS.planned_rows(["chain"], ["infer", "train"], args.size_plan) == [
        ("chain", "infer", 3),
        ("chain", "infer", 5),
        ("chain", "train", 2),
    ]


def test_backend_split_times_each_wrapped_function_once():
    timer = CS._SelfTimer()

    def inner():
        return 1

    wrapped_inner = timer.wrap("inner", inner)
    outer = timer.wrap("outer", lambda: wrapped_inner() + 1)
    assert outer() == 2
    assert set(timer.ms) == {"inner", "outer"}
    assert all(v >= 0 for v in timer.ms.values())


@pytest.mark.slow
def test_smoke_run_on_tiny_sizes_without_peers(tmp_path):
    """The whole script, Lucid only, two tiny sizes of two models: the JSON has a per-stage
    split, the exponents and the targets (peers' targets not measured)."""
    out = tmp_path / "scaling.json"
    cmd = [
        sys.executable,
        os.path.join(BENCH, "bench_compile_scaling.py"),
        "--frameworks",
        "lucid",
        "--models",
        "chain,transformer",
        "--sizes",
        "chain=4,8",
        "--sizes",
        "transformer=1",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(out.read_text())
    ok = [r for r in saved["results"] if "first_call_s" in r]
    assert len(ok) == 2 * 2 + 2, saved["results"]  # chain 2 sizes x 2 modes, transformer 1 x 2
    for r in ok:
        assert r["n_ops"] > 0 and r["peak_mb"] >= 0
        assert "rest" in r["stages_ms"] and r["passes_ms"]
    chain8 = next(r for r in ok if (r["model"], r["mode"], r["size"]) == ("chain", "infer", 8))
    chain4 = next(r for r in ok if (r["model"], r["mode"], r["size"]) == ("chain", "infer", 4))
    assert chain8["n_ops"] > chain4["n_ops"]
    assert set(saved["exponents"]) == {
        "chain infer",
        "chain train",
        "transformer infer",
        "transformer train",
    }
    assert "first call" in saved["exponents"]["chain infer"]
    peers = [t for t in saved["targets"] if "JAX" in t["target"]]
    assert peers and all(t["holds"] is None for t in peers)
    assert "| chain | infer | pairs 4 |" in done.stdout


def test_lucid_cases_compile_for_the_backend_named(tmp_path):
    """``--lucid-backend mpsgraph-reference``: the MPSGraph emission's stages are timed (and a
    case that fell back to eager would be an error, not a row)."""
    out = tmp_path / "scaling.json"
    cmd = [sys.executable, os.path.join(BENCH, "bench_compile_scaling.py"), "--frameworks"]
    cmd += ["lucid", "--models", "chain", "--modes", "infer", "--sizes", "chain=4,8"]
    cmd += ["--lucid-backend", "mpsgraph-reference", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert saved["lucid_backend"] == "mpsgraph-reference"
    assert len(saved["results"]) == 2
    for r in saved["results"]:
        assert "error" not in r, r
        assert {"mpsgraph-legalize", "backend-compile"} <= set(r["stages_ms"])
        assert not any(s.startswith("backend:") for s in r["stages_ms"])  # the CPU split


def test_report_reads_back_the_cases_a_stopped_run_appended(tmp_path, capsys):
    partial = tmp_path / "run.json.partial.jsonl"
    cases = [
        case(
            "chain",
            "infer",
            n,
            "lucid",
            0.001 * n,
            n_ops=2 * n + 1,
            peak_mb=0.01 * n,
            stages_ms={"cse": 0.5 * n, "rest": 1.0},
        )  # fmt: skip
        for n in (100, 200, 400)
    ]
    partial.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "report.json"
    assert CS.main(["--report", str(partial), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["reported_from"] == str(partial) and saved["results"] == cases
    assert saved["sizes"] == {"chain infer": [100, 200, 400]}
    cse = saved["exponents"]["chain infer"]["cse"]
    assert cse["judged"] and cse["exponent"] == pytest.approx(1.0, abs=0.01)
    assert "| chain | infer | pairs 400 | 801 |" in capsys.readouterr().out


def test_report_of_a_saved_run_keeps_when_and_how_it_was_measured(tmp_path, capsys):
    partial = tmp_path / "run.json.partial.jsonl"
    cases = [
        case("chain", "infer", n, "lucid", 0.001 * n, n_ops=2 * n + 1, peak_mb=0.01 * n)
        for n in (100, 200)
    ]
    partial.write_text("".join(json.dumps(c) + "\n" for c in cases))
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert CS.main(["--report", str(partial), "--json", str(first)]) == 0
    run = json.loads(first.read_text())
    run.update(started_utc="2026-01-02 03:04:05", minutes=7.5, load_average=[0.25, 1.5])
    run["command"] = "python benchmarks/bench_compile_scaling.py --repeats 3"
    first.write_text(json.dumps(run))
    capsys.readouterr()
    assert CS.main(["--report", str(first), "--json", str(second)]) == 0
    saved = json.loads(second.read_text())
    for key in ("started_utc", "minutes", "load_average", "command"):
        assert saved[key] == run[key], key
    assert saved["reported_from"] == str(first) and saved["results"] == cases
    assert "7.5 min; load average 0.25 -> 1.5" in capsys.readouterr().out


def test_each_resnet_series_stays_on_one_side_of_the_update_fusion_limit():
    # fused_step fuses the optimizer updates only up to a parameter count: a series crossing
    # it would fit one growth exponent over two different training programs.
    import scaling_models

    from lucid.compile.training.entries import _fuse_updates

    for sizes in (CS.DEFAULT_SIZES["resnet"], CS.QUICK_SIZES["resnet"]):
        sides = {
            _fuse_updates(list(scaling_models.lucid_model("resnet", n).parameters())) for n in sizes
        }
        assert len(sides) == 1, sizes


def test_repeats_take_each_stages_median_and_stop_at_a_failure(monkeypatch):
    monkeypatch.setattr(CS, "installed", lambda fw, args: fw == "lucid")
    calls: dict[int, int] = {}

    def fake_spawn(c, args):
        size = c[2]
        k = calls[size] = calls.get(size, 0) + 1
        if size == 2 and k == 2:
            return {"error": "exit 1: boom"}
        first = {1: 0.3, 2: 0.1, 3: 0.2}[k]
        return {"first_call_s": first * size, "n_ops": 10, "stages_ms": {"cse": 10.0 * k}}

    args = SimpleNamespace(
        models=["chain"],
        modes=["infer"],
        frameworks=["lucid"],
        size_plan={("chain", "infer"): (1, 2)},
        repeats=3,
    )
    got = {r["size"]: r for r in CS.run_plan(args, spawn_case=fake_spawn)}
    assert calls == {1: 3, 2: 2}  # the failed repeat ends that case's runs
    one = got[1]
    assert one["first_call_s"] == pytest.approx(0.2) and one["stages_ms"] == {"cse": 20.0}
    assert one["repeats"] == 3 and one["first_call_range_s"] == pytest.approx([0.1, 0.3])
    assert got[2]["error"] == "exit 1: boom"
    with pytest.raises(SystemExit):
        CS.parse_args(["--repeats", "0"])


def test_repeats_are_passes_over_the_plan_in_alternating_order(monkeypatch, tmp_path):
    # A machine whose speed drifts over minutes must not bend the fits: with back-to-back
    # repeats in increasing sizes, every series' largest sizes would all run last.
    monkeypatch.setattr(CS, "installed", lambda fw, args: fw == "lucid")
    seen: list[int] = []

    def fake_spawn(c, args):
        seen.append(c[2])
        return {"first_call_s": 0.1 * c[2], "n_ops": c[2], "stages_ms": {"cse": float(len(seen))}}

    args = SimpleNamespace(
        models=["chain"],
        modes=["infer"],
        frameworks=["lucid"],
        size_plan={("chain", "infer"): (1, 2, 4)},
        repeats=3,
    )
    partial = tmp_path / "runs.partial.jsonl"

    def keep(run):
        with open(partial, "a") as f:
            f.write(json.dumps(run) + "\n")

    got = CS.run_plan(args, spawn_case=fake_spawn, on_case=keep)
    assert seen == [1, 2, 4, 4, 2, 1, 1, 2, 4]
    assert [r["stages_ms"]["cse"] for r in got] == [6.0, 5.0, 4.0]  # medians of each case's runs
    assert CS.load_cases(str(partial)) == got  # a partial file's runs give the same cases
