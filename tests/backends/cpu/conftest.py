"""Fixtures shared by the CPU backend's tests."""

import numpy as np
import pytest

import lucid
from lucid.backends.cpu import get_num_threads, set_adaptive_threads, set_num_threads, thread_stats


@pytest.fixture
def fixed_threads():
    """Thread counts set by a test hold (and split paths run) while other processes keep the
    machine busy: the adaptive policy is off for the test; it and the count come back after."""
    adaptive, threads = thread_stats()["adaptive"], get_num_threads()
    set_adaptive_threads(False)
    yield
    set_adaptive_threads(adaptive)
    set_num_threads(threads)


@pytest.fixture
def sgd_training_matches_eager():
    """``check(compiled, eager, loss_of, x)``: three ``fused_step`` SGD steps on ``compiled`` leave
    the same parameters as three eager SGD steps on ``eager`` (a same-seeded twin)."""

    def check(compiled, eager, loss_of, x, steps=3, lr=0.5):
        step = lucid.compile.fused_step(
            compiled, loss_of, lucid.optim.SGD(compiled.parameters(), lr=lr)
        )
        opt = lucid.optim.SGD(eager.parameters(), lr=lr)
        for _ in range(steps):
            step(x)
            opt.zero_grad()
            loss_of(eager(x)).backward()
            opt.step()
        for (name, a), (_, b) in zip(
            compiled.named_parameters(), eager.named_parameters(), strict=True
        ):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6, err_msg=name)

    return check
