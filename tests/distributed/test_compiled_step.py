"""``fused_step(..., process_group=...)`` in one process: the program cut at the collectives
(against the IR interpreter), world size 1 against the plain ``fused_step``, a DDP-wrapped
model, and refused arguments. The N-process runs are in ``test_mpi.py``."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import lucid
from lucid import nn, optim
from lucid.compile.training import build_training_module
from lucid.ir import interpret, print_ir
from lucid.nn.parallel import DistributedDataParallel as DDP
from lucid.testing import assert_close

# The in-process group of test_grad_allreduce.py (tests are imported without packages here).
ThreadGroup = runpy.run_path(str(Path(__file__).with_name("_thread_group.py")))["ThreadGroup"]


def _mlp(seed: int, dtype=lucid.float64) -> nn.Module:
    lucid.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def _mse(out, target):
    return ((out - target) ** 2).mean()


def _data(seed: int, rows: int = 6):
    rng = np.random.default_rng(seed)
    return lucid.tensor(rng.standard_normal((rows, 5))), lucid.tensor(
        rng.standard_normal((rows, 3))
    )


def test_cut_program_returns_each_bucket_as_the_flat_local_gradients():
    model = _mlp(1)
    x, y = _data(2)
    tm = build_training_module(model, _mse, (x, y), grad_allreduce_mb=0.0005)
    assert len(tm.buckets) > 1
    assert not any(r.startswith("grad:") for r in tm.result_roles)
    feeds = {role: t.numpy() for role, t in tm.feeds.items()}
    feeds["input:0"], feeds["input:1"] = x.numpy(), y.numpy()
    results = dict(zip(tm.result_roles, interpret(tm.module, feeds), strict=True))
    _mse(model(x), y).backward()
    grads = {f"grad:param:{n}": p.grad.numpy() for n, p in model.named_parameters()}
    seen = []
    for i, roles in enumerate(tm.buckets):
        want = np.concatenate([grads[r].reshape(-1) for r in roles])
        assert_close(results[f"bucket:{i}"], want, rtol=1e-12, atol=1e-14)
        seen += roles
    assert sorted(seen) == sorted(grads)


@pytest.mark.parametrize(
    ("opt_cls", "kwargs", "clip"),
    [(optim.SGD, dict(lr=0.1, momentum=0.9), None), (optim.AdamW, dict(lr=0.01), 0.1)],
)
def test_world_size_one_equals_the_plain_fused_step(opt_cls, kwargs, clip):
    group = ThreadGroup(1)
    model, plain_model = _mlp(3), _mlp(3)
    opt = opt_cls(model.parameters(), **kwargs)
    plain_opt = opt_cls(plain_model.parameters(), **kwargs)
    step = lucid.compile.fused_step(
        model, _mse, opt, process_group=group, bucket_cap_mb=0.0005, max_grad_norm=clip
    )
    plain = lucid.compile.fused_step(plain_model, _mse, plain_opt, max_grad_norm=clip)

    def train(_rank: int) -> list:
        losses = []
        for seed in range(3):
            x, y = _data(10 + seed)
            losses.append((step(x, y).item(), plain(x, y).item()))
        return losses

    for got, want in group.run(train)[0]:
        assert got == pytest.approx(want, rel=1e-12)
    for p, q in zip(model.parameters(), plain_model.parameters(), strict=True):
        assert_close(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-14)
    if clip is not None:
        assert step.grad_norm.item() == pytest.approx(plain.grad_norm.item(), rel=1e-12)
    assert step.cache_info()["entries"] == 1


def test_a_ddp_model_brings_its_group_and_module():
    group = ThreadGroup(1)
    model, plain_model = _mlp(4), _mlp(4)
    ddp = DDP(model, process_group=group)
    opt, plain_opt = (
        optim.SGD(ddp.parameters(), lr=0.1),
        optim.SGD(plain_model.parameters(), lr=0.1),
    )
    step = lucid.compile.fused_step(ddp, _mse, opt)
    assert step.process_group is group and step.model is model
    x, y = _data(5)
    group.run(lambda _rank: step(x, y))
    _mse(plain_model(x), y).backward()
    plain_opt.step()
    for p, q in zip(model.parameters(), plain_model.parameters(), strict=True):
        assert_close(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-14)


def test_refused_arguments_name_the_problem():
    model = _mlp(6)
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="bucket_cap_mb needs a process_group"):
        lucid.compile.fused_step(model, _mse, opt, bucket_cap_mb=1.0)
    group = ThreadGroup(1)

    def finite(_rank: int) -> None:
        lucid.compile.fused_step(model, _mse, opt, process_group=group, check_finite=True)

    with pytest.raises(ValueError, match="rank 0 of 1: fused_step: check_finite="):
        group.run(finite)

    def scaled(_rank: int) -> None:
        lucid.compile.fused_step(
            model, _mse, opt, process_group=group, scaler=lucid.amp.GradScaler()
        )

    with pytest.raises(ValueError, match="rank 0 of 1: fused_step: scaler="):
        group.run(scaled)
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        lucid.compile.fused_step(model, _mse, opt, process_group=group, bucket_cap_mb=0)


def test_a_step_that_cannot_compile_names_the_rank():
    group = ThreadGroup(1)
    model = _mlp(7)
    opt = optim.SGD(model.parameters(), lr=0.1)

    def reads_a_value(out, target):  # a Python float of a traced value: a graph break
        return _mse(out, target) * float(out.sum().item() > 0)

    step = lucid.compile.fused_step(model, reads_a_value, opt, process_group=group)
    x, y = _data(8)
    with pytest.raises(lucid.compile.CompileError, match=r"^rank 0 of 1: fused_step: cannot"):
        group.run(lambda _rank: step(x, y))
    assert all(p.grad is None for p in model.parameters())  # nothing was updated


class _WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(5, 3).double()
        self.unused = nn.Linear(5, 3).double()

    def forward(self, x):
        return self.used(x)


def test_a_parameter_the_loss_does_not_reach_is_not_updated_from_a_stale_grad():
    group = ThreadGroup(1)
    lucid.manual_seed(9)
    model = _WithUnused()
    before = model.unused.weight.numpy().copy()
    model.unused.weight.grad = lucid.ones_like(model.unused.weight)  # left from elsewhere
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = lucid.compile.fused_step(model, _mse, opt, process_group=group)
    x, y = _data(12)
    group.run(lambda _rank: step(x, y))
    assert_close(model.unused.weight.numpy(), before, rtol=0, atol=0)
    assert model.unused.weight.grad is None and model.used.weight.grad is not None


def test_the_step_shows_its_two_executables_timing_modules_and_profile():
    group = ThreadGroup(1)
    model = _mlp(4)
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = lucid.compile.fused_step(model, _mse, opt, process_group=group, bucket_cap_mb=0.0005)
    with pytest.raises(KeyError, match="call it once"):
        step.module()
    x, y = _data(5)
    group.run(lambda _rank: step(x, y))
    rows = step.timing()
    assert [r["part"] for r in rows] == ["gradients", "update"]
    assert all(r["compile_ms"] > 0 and r["n_runs"] == 1 for r in rows)
    gradients, update = step.module(), step.module(part="update")
    assert "bucket:0" in print_ir(gradients) and "bucket:0" not in print_ir(update)
    before = [p.numpy().copy() for p in model.parameters()]
    profile = step.profile(x, y, repeats=2)
    assert profile and {"index", "op", "ms", "instr"} <= set(profile[0])
    assert all((p.numpy() == b).all() for p, b in zip(model.parameters(), before, strict=True))
    with pytest.raises(ValueError, match="unknown part 'loss'"):
        step.module(part="loss")
