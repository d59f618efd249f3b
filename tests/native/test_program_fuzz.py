"""The differential native-program mutation fuzzer (issues 15 and 22): programs compiled from
real models, mutated, then validated, compiled and run in child processes, each run compared
instruction by instruction with the numpy reference interpreter. Zero crashes, hangs and
disagreements allowed; a failure prints the offending case. See tests/native/program_fuzz.py."""

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

# The fuzzer's children run it as `python -m tests.native.program_fuzz` from the repository root.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from lucid import _native  # noqa: E402
from tests.native.program_fuzz import (  # noqa: E402
    check_against_reference,
    collect_seed_programs,
    compare_with_reference,
    run_batch_in_subprocess,
)


@pytest.fixture(scope="module")
def seeds_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "seeds.pkl"
    with open(path, "wb") as f:
        pickle.dump(collect_seed_programs(), f)
    return str(path)


def fuzz(seeds_file, seed, cases, per_batch):
    totals: dict[str, int] = {}
    for start in range(0, cases, per_batch):
        report = run_batch_in_subprocess(seeds_file, seed, start, per_batch, timeout=300)
        assert report.failure is None, report.failure
        for outcome, n in report.outcomes.items():
            totals[outcome] = totals.get(outcome, 0) + n
    assert sum(totals.values()) == cases
    return totals


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_mutated_programs_never_crash_hang_or_disagree_with_the_reference(seeds_file):
    totals = fuzz(seeds_file, seed=0, cases=300, per_batch=300)
    # The mutations reach every stage: refused programs, runs, and run-time index errors.
    assert totals.get("invalid:ValueError", 0) > 100
    assert totals.get("ran", 0) > 50


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 11))
def test_many_more_mutated_programs_never_crash_hang_or_disagree(seeds_file, seed):
    totals = fuzz(seeds_file, seed=seed, cases=5000, per_batch=2500)
    assert totals.get("ran", 0) > 1000


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_the_fuzzer_reports_a_hang(seeds_file):
    # A child that cannot finish in time is reported as a hang (with its case once one started).
    report = run_batch_in_subprocess(seeds_file, 0, 0, 10**9, timeout=1.5)
    assert report.failure is not None and report.failure.startswith("hang (timeout)")


# -- the comparison itself ---------------------------------------------------------------------


def test_compare_with_reference_is_nan_aware_and_loose_only_in_magnitude():
    ref = np.array([1.0, np.nan, np.inf, -np.inf, 10.0], np.float32)
    assert compare_with_reference([ref.copy()], [ref]) is None
    assert compare_with_reference([ref * (1 + 1e-4)], [ref]) is None  # within the tolerance
    for i, wrong in [(0, 1.1), (1, 0.0), (2, -np.inf), (3, np.nan), (4, np.inf)]:
        got = ref.copy()
        got[i] = wrong
        assert f"first at ({i},)" in compare_with_reference([got], [ref])
    # Only where the caller allows it (an infinite input) may NaN stand for an infinity.
    nan_for_inf = ref.copy()
    nan_for_inf[2] = np.nan
    assert compare_with_reference([nan_for_inf], [ref]) is not None
    assert compare_with_reference([nan_for_inf], [ref], nan_for_infinity=True) is None
    nan_for_inf[0] = np.nan
    assert compare_with_reference([nan_for_inf], [ref], nan_for_infinity=True) is not None
    ints = np.array([1, 2], np.int64)
    assert compare_with_reference([ints + [0, 1]], [ints]) is not None
    assert "reference int32" in compare_with_reference([ints], [ints.astype(np.int32)])


def test_a_wrong_native_result_is_reported_at_its_instruction():
    desc = {
        "slots": [((3,), "f32"), ((3,), "f32"), ((3,), "f32")],
        "instrs": [("exp", [0], [1], {}), ("neg", [1], [2], {})],
        "feeds": [0],
        "results": [2],
        "inplace": {},
    }
    x = np.array([0.0, 1.0, -1.0], np.float32)
    results = _native.compile(desc, cache=False).run([x.copy()])
    assert check_against_reference(desc, [x], results, _native) is None
    results[0][1] += 1  # not what the run computed
    assert "changes when every value is a result" in check_against_reference(
        desc, [x], results, _native
    )
