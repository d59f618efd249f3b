"""Real multi-process runs: ``mpirun -n 2`` and ``-n 4`` jobs of ``_mpi_checks.py``.

The default run starts one 2-process job running the default checks (each job pays for its
processes' start-up, so they share one); the rest, the 4-process jobs included, are marked
slow. Each job has a timeout, so a hang fails the test instead of blocking it.
Skipped (with the reason) where mpirun or mpi4py is missing; ``.ci/run`` installs both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHECKS = Path(__file__).with_name("_mpi_checks.py")
REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240


def _missing() -> str | None:
    if shutil.which("mpirun") is None:
        return "mpirun not found (install Open MPI: apt-get install openmpi-bin libopenmpi-dev)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install lucid[distributed])"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def _mpirun(n: int, checks: list[str], timeout: float = JOB_TIMEOUT_S, **env: str):
    command = [
        "mpirun",
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
        str(n),
        sys.executable,
        str(CHECKS),
        *checks,
    ]
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    environment.update(env)
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=environment, cwd=REPO
    )
    return done, time.monotonic() - start


def _assert_passed(n: int, checks: list[str]) -> None:
    done, _ = _mpirun(n, checks)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for name in checks:
        ranks = set(re.findall(rf"PASS {name} (\d+)", done.stdout))
        assert ranks == {str(r) for r in range(n)}, (name, ranks, output[-4000:])


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_every_check(n):
    _assert_passed(
        n,
        [
            "collectives",
            "ddp_sgd_float64",
            "ddp_adamw_float64",
            "ddp_sgd_adamw_float32",
            "ddp_batchnorm",
            "ddp_compiled_optimizer",
            "ddp_no_sync",
            "ddp_unused_parameters",
            "sampler",
            "grad_allreduce_pass",
        ],
    )


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_two_processes_eager_and_compiled_data_parallel():
    """One 2-process job: the collectives, eager DDP, the sampler; fused_step(...,
    process_group=...) on 2 shards == 1 process on the whole batch == eager DDP, and
    --print-ir-after-all shows the all_reduce ops of the grad-allreduce pass. (test_every_check
    runs these and more on 4 processes too.)"""
    checks = [
        "collectives",
        "ddp_sgd_float64",
        "ddp_adamw_float64",
        "ddp_batchnorm",
        "ddp_compiled_optimizer",
        "ddp_no_sync",
        "sampler",
        "compiled_ddp_sgd_float64",
        "compiled_ddp_adamw_float64",
        "compiled_ddp_batchnorm",
        "compiled_ddp_print_ir",
    ]
    done, _ = _mpirun(2, checks)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for name in checks:
        assert set(re.findall(rf"PASS {name} (\d+)", done.stdout)) == {"0", "1"}, output[-4000:]
    assert "IR Dump After grad-allreduce" in output, output[-4000:]
    after_pass = output.split("IR Dump After grad-allreduce", 1)[1]
    assert '"lucid.all_reduce"' in after_pass or "lucid.all_reduce" in after_pass, output[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_compiled_data_parallel_step_every_check(n):
    _assert_passed(
        n,
        [
            "compiled_ddp_sgd_float64",
            "compiled_ddp_adamw_float64",
            "compiled_ddp_float32_and_clipping",
            "compiled_ddp_wrapped_model",
            "compiled_ddp_batchnorm",
        ],
    )


@pytest.mark.slow
def test_a_rank_that_never_joins_makes_the_others_raise_not_hang():
    done, elapsed = _mpirun(2, ["peer_never_joins"], timeout=90, LUCID_TEST_COLLECTIVE_TIMEOUT="3")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "DistributedTimeoutError: rank 0 of 2: all_reduce(SUM) did not complete within 3 s" in (
        output
    ), output[-3000:]
    assert elapsed < 60  # the sleeping rank would hold the job for 120 s


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_job():
    done, _ = _mpirun(2, ["peer_dies"], timeout=90)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert re.search(r"rank 1 .*signal 9", output), output[-3000:]
