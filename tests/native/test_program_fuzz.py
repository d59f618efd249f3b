"""The native-program mutation fuzzer (issue 15): programs compiled from real models, mutated,
then validated, compiled and run in child processes. Zero crashes and zero hangs allowed; a
failure prints the offending case. See tests/native/program_fuzz.py."""

import pickle
import sys
from pathlib import Path

import pytest

# The fuzzer's children run it as `python -m tests.native.program_fuzz` from the repository root.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.native.program_fuzz import (  # noqa: E402
    collect_seed_programs,
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
        report = run_batch_in_subprocess(seeds_file, seed, start, per_batch, timeout=180)
        assert report.failure is None, report.failure
        for outcome, n in report.outcomes.items():
            totals[outcome] = totals.get(outcome, 0) + n
    assert sum(totals.values()) == cases
    return totals


def test_mutated_programs_never_crash_or_hang(seeds_file):
    totals = fuzz(seeds_file, seed=0, cases=2000, per_batch=1000)
    # The mutations reach every stage: refused programs, runs, and run-time index errors.
    assert totals.get("invalid:ValueError", 0) > 500
    assert totals.get("ran", 0) > 100


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 11))
def test_many_more_mutated_programs_never_crash_or_hang(seeds_file, seed):
    totals = fuzz(seeds_file, seed=seed, cases=5000, per_batch=1000)
    assert totals.get("ran", 0) > 200


def test_the_fuzzer_reports_a_hang(seeds_file):
    # A child that cannot finish in time is reported as a hang (with its case once one started).
    report = run_batch_in_subprocess(seeds_file, 0, 0, 10**9, timeout=4)
    assert report.failure is not None and report.failure.startswith("hang (timeout)")
