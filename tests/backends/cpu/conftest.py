"""Fixtures shared by the CPU backend's tests."""

import numpy as np
import pytest

import lucid


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
