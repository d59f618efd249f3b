"""Checks run on every rank of an ``mpirun`` job: ``python _mpi_checks.py NAME [NAME ...]``.

Each check asserts on this rank and prints ``PASS <name> <rank>``; ``test_mpi.py`` launches the
jobs and counts the lines. References are computed in this process, without communication:
one process training on the whole global batch (or, with BatchNorm, on each rank's shard in
turn), which is what N processes on N shards must reproduce.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import lucid
import lucid.distributed as dist
from lucid import nn, optim
from lucid.nn.parallel import DistributedDataParallel as DDP
from lucid.testing import assert_close
from lucid.utils.data import DistributedSampler

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def rank_size() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


# --- collectives -------------------------------------------------------------------------------


@check
def collectives() -> None:
    r, n = rank_size()
    for dtype in (lucid.float32, lucid.float64, lucid.int64, lucid.float16):
        base = np.arange(6).reshape(2, 3)
        expected = {
            "sum": sum(base + k for k in range(n)),
            "max": base + n - 1,
            "min": base,
        }
        if dtype.is_floating_point:
            expected["avg"] = sum(base + k for k in range(n)) / n
        for op, want in expected.items():
            t = lucid.tensor(base + r, dtype=dtype)
            storage, pointer = t._data, t._data.ctypes.data
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()))
            assert_close(t.numpy().astype(np.float64), want.astype(np.float64))
            if dtype is not lucid.float16:  # zero-copy: reduced in the tensor's own storage
                assert t._data is storage and t._data.ctypes.data == pointer
    # A non-contiguous tensor (a transpose) is reduced through a copy and written back.
    t = lucid.tensor(np.arange(6.0).reshape(2, 3) * (r + 1)).t()
    dist.all_reduce(t)
    assert_close(t.numpy(), np.arange(6.0).reshape(2, 3).T * sum(range(1, n + 1)))
    # AVG of integers is refused, naming the rank.
    try:
        dist.all_reduce(lucid.tensor([1, 2]), op="avg")
        raise AssertionError("AVG of an integer tensor must fail")
    except TypeError as e:
        assert f"rank {r} of {n}" in str(e), e

    src = n - 1
    b = lucid.tensor(np.full(5, float(r)))
    dist.broadcast(b, src=src)
    assert_close(b.numpy(), np.full(5, float(src)))
    try:
        dist.broadcast(b, src=n)
        raise AssertionError("a broadcast from a rank that does not exist must fail")
    except ValueError as e:
        assert f"rank {r} of {n}" in str(e) and "src" in str(e), e

    outs = [lucid.zeros(3, dtype=lucid.float64) for _ in range(n)]
    dist.all_gather(outs, lucid.tensor(np.full(3, r * 10.0)))
    for k, o in enumerate(outs):
        assert_close(o.numpy(), np.full(3, k * 10.0))
    gathered = lucid.zeros(n * 2, 3)
    dist.all_gather_into_tensor(gathered, lucid.ones(2, 3) * r)
    assert_close(gathered.numpy(), np.repeat(np.arange(n, dtype=np.float32), 6).reshape(n * 2, 3))

    inputs = [lucid.tensor(np.full(4, float(r + k))) for k in range(n)]
    out = lucid.zeros(4, dtype=lucid.float64)
    dist.reduce_scatter(out, inputs)
    assert_close(out.numpy(), np.full(4, float(sum(q + r for q in range(n)))))
    out = lucid.zeros(2, dtype=lucid.float64)
    dist.reduce_scatter_tensor(out, lucid.tensor(np.arange(2.0 * n)), op="max")
    assert_close(out.numpy(), np.arange(2.0 * n)[2 * r : 2 * r + 2])
    dist.barrier()


# --- DistributedDataParallel ------------------------------------------------------------------


def _mlp(dtype, seed: int) -> nn.Module:
    lucid.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    return model.to(dtype)


def _copy_params(dst: nn.Module, src: nn.Module) -> None:
    for p, q in zip(dst.parameters(), src.parameters(), strict=True):
        p._data[...] = q._data


def _batches(n: int, steps: int, per_rank: int, dtype, seed: int = 3):
    rng = np.random.default_rng(seed)
    np_dtype = np.float64 if dtype is lucid.float64 else np.float32
    for _ in range(steps):
        x = rng.standard_normal((per_rank * n, 5)).astype(np_dtype)
        y = rng.standard_normal((per_rank * n, 3)).astype(np_dtype)
        yield x, y


def _ddp_matches_one_process(opt_cls, opt_kwargs, dtype, rtol: float) -> None:
    r, n = rank_size()
    steps, per_rank = 3, 4
    # Each rank builds its replica from a different seed: the wrap-time broadcast must fix it.
    local = _mlp(dtype, seed=100 + r)
    ref = _mlp(dtype, seed=100)  # rank 0's initial parameters, trained on the whole batch
    ddp = DDP(local, bucket_cap_mb=0.0005)  # ~500 bytes: several buckets
    assert len(ddp.bucket_sizes) > 1, ddp.bucket_sizes
    opt, ref_opt = opt_cls(ddp.parameters(), **opt_kwargs), opt_cls(ref.parameters(), **opt_kwargs)
    for x, y in _batches(n, steps, per_rank, dtype):
        opt.zero_grad()
        shard = slice(r * per_rank, (r + 1) * per_rank)
        loss = ((ddp(lucid.tensor(x[shard])) - lucid.tensor(y[shard])) ** 2).mean()
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ((ref(lucid.tensor(x)) - lucid.tensor(y)) ** 2).mean().backward()
        ref_opt.step()
    for (name, p), q in zip(local.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(
            p.numpy(), q.numpy(), rtol=rtol, atol=rtol, err_msg=f"rank {r}: {name}"
        )


@check
def ddp_sgd_float64() -> None:
    _ddp_matches_one_process(optim.SGD, dict(lr=0.1, momentum=0.9), lucid.float64, 1e-12)


@check
def ddp_adamw_float64() -> None:
    # Adam divides by sqrt(v): summation-order round-off in a small gradient grows a little.
    _ddp_matches_one_process(optim.AdamW, dict(lr=0.01, weight_decay=0.1), lucid.float64, 1e-10)


@check
def ddp_sgd_adamw_float32() -> None:
    _ddp_matches_one_process(optim.SGD, dict(lr=0.1), lucid.float32, 2e-5)
    _ddp_matches_one_process(optim.AdamW, dict(lr=0.01), lucid.float32, 2e-5)


@check
def ddp_compiled_optimizer() -> None:
    """Eager DDP backward, then ``compile_optimizer``'s executable updates from the averaged
    gradients: the same parameters as one process on the whole batch with the eager AdamW."""
    r, n = rank_size()
    per_rank = 4
    local, ref = _mlp(lucid.float64, seed=30 + r), _mlp(lucid.float64, seed=30)
    ddp = DDP(local)
    opt = optim.AdamW(ddp.parameters(), lr=0.01, weight_decay=0.1)
    lucid.compile.compile_optimizer(opt)  # opt.step is now one cached executable
    ref_opt = optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    for x, y in _batches(n, 3, per_rank, lucid.float64, seed=5):
        opt.zero_grad()
        shard = slice(r * per_rank, (r + 1) * per_rank)
        ((ddp(lucid.tensor(x[shard])) - lucid.tensor(y[shard])) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((ref(lucid.tensor(x)) - lucid.tensor(y)) ** 2).mean().backward()
        ref_opt.step()
    for (name, p), q in zip(local.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)


@check
def ddp_batchnorm() -> None:
    """What PyTorch's DDP guarantees with BatchNorm (each rank normalizes with its own batch
    statistics; buffers are broadcast from rank 0 before every forward): the averaged gradient
    is the mean of the per-shard gradients, the replicas stay identical, and the running
    statistics every forward starts from are rank 0's."""
    r, n = rank_size()
    per_rank = 4

    def make(seed):
        lucid.manual_seed(seed)
        # No bias before BatchNorm: its exact gradient is zero, and AdamW would turn the
        # round-off left in it into full-size steps (noise, not a property of DDP).
        return nn.Sequential(
            nn.Linear(5, 6, bias=False), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)
        ).double()

    local, ref = make(7 + r), make(7)
    ddp = DDP(local)
    opt, ref_opt = optim.AdamW(ddp.parameters(), lr=0.01), optim.AdamW(ref.parameters(), lr=0.01)
    ref_buffers = [b for b in ref.buffers()]
    for x, y in _batches(n, 3, per_rank, lucid.float64):
        opt.zero_grad()
        shard = slice(r * per_rank, (r + 1) * per_rank)
        ((ddp(lucid.tensor(x[shard])) - lucid.tensor(y[shard])) ** 2).mean().backward()
        opt.step()
        # Reference: every shard starts from the same buffers (rank 0's), gradients are averaged
        # over the shards, and rank 0's updated running statistics carry on.
        ref_opt.zero_grad()
        start = [b._data.copy() for b in ref_buffers]
        after_shard0 = None
        for k in range(n):
            for b, s in zip(ref_buffers, start, strict=True):
                b._data[...] = s
            part = slice(k * per_rank, (k + 1) * per_rank)
            loss = ((ref(lucid.tensor(x[part])) - lucid.tensor(y[part])) ** 2).mean() / n
            loss.backward()
            if k == 0:
                after_shard0 = [b._data.copy() for b in ref_buffers]
        for b, s in zip(ref_buffers, after_shard0, strict=True):
            b._data[...] = s
        ref_opt.step()
    for (name, p), q in zip(local.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(
            p.numpy(), q.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"rank {r}: {name}"
        )
    if r == 0:  # rank 0's running statistics are the reference's (shard 0's updates)
        for (name, b), q in zip(local.named_buffers(), ref_buffers, strict=True):
            np.testing.assert_allclose(b.numpy(), q.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    # The next forward starts every rank from rank 0's statistics (same input: same update).
    ddp(lucid.tensor(np.ones((2, 5))))
    gathered = [lucid.zeros(6, dtype=lucid.float64) for _ in range(n)]
    dist.all_gather(gathered, local[1].running_mean)
    for g in gathered:
        assert_close(g.numpy(), gathered[0].numpy(), rtol=0, atol=0)


@check
def ddp_no_sync() -> None:
    r, n = rank_size()
    per_rank = 3
    local, ref = _mlp(lucid.float64, 5 + r), _mlp(lucid.float64, 5)
    ddp = DDP(local)
    micro = list(_batches(n, 2, per_rank, lucid.float64, seed=11))
    shard = slice(r * per_rank, (r + 1) * per_rank)
    with ddp.no_sync():
        x, y = micro[0]
        ((ddp(lucid.tensor(x[shard])) - lucid.tensor(y[shard])) ** 2).mean().backward()
    # Inside no_sync the gradients stay local: they differ between ranks.
    g = local[0].weight.grad.clone()
    everyone = [lucid.zeros(*g.shape, dtype=lucid.float64) for _ in range(n)]
    dist.all_gather(everyone, g)
    assert not np.allclose(everyone[0].numpy(), everyone[-1].numpy())
    x, y = micro[1]
    ((ddp(lucid.tensor(x[shard])) - lucid.tensor(y[shard])) ** 2).mean().backward()
    for x, y in micro:
        ((ref(lucid.tensor(x)) - lucid.tensor(y)) ** 2).mean().backward()
    for p, q in zip(local.parameters(), ref.parameters(), strict=True):
        assert_close(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-14)


@check
def ddp_unused_parameters() -> None:
    r, n = rank_size()

    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            lucid.manual_seed(0)
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)

    ddp = DDP(Partial())
    try:
        ddp(lucid.ones(2, 3)).sum().backward()
        raise AssertionError("an unused parameter must be reported")
    except RuntimeError as e:
        assert f"rank {r} of {n}" in str(e) and "unused.weight" in str(e), e
    model = Partial()
    ddp = DDP(model, find_unused_parameters=True)
    ddp(lucid.ones(2, 3) * (r + 1)).sum().backward()
    assert model.unused.weight.grad is None
    assert_close(
        model.used.weight.grad.numpy(), np.full((2, 3), float(n + 1))
    )  # mean of 2 * (r + 1)


@check
def sampler() -> None:
    r, n = rank_size()
    s = DistributedSampler(range(11), seed=4)
    s.set_epoch(2)
    mine = lucid.tensor(np.array(list(s), dtype=np.int64))
    everyone = [lucid.zeros(len(s), dtype=lucid.int64) for _ in range(n)]
    dist.all_gather(everyone, mine)
    seen = np.concatenate([e.numpy() for e in everyone])
    assert set(seen.tolist()) == set(range(11)) and len(seen) == s.total_size


# --- the grad-allreduce pass, run by the IR interpreter on real MPI --------------------------


@check
def grad_allreduce_pass() -> None:
    from lucid.compile.training import build_training_module
    from lucid.ir import interpret

    r, n = rank_size()
    per_rank = 4
    model = _mlp(lucid.float64, seed=21)
    x, y = next(_batches(n, 1, per_rank, lucid.float64, seed=8))
    shard = slice(r * per_rank, (r + 1) * per_rank)
    xs, ys = lucid.tensor(x[shard]), lucid.tensor(y[shard])

    def loss_fn(out, target):
        return ((out - target) ** 2).mean()

    tm = build_training_module(
        model,
        loss_fn,
        (xs, ys),
        pipeline="grad-allreduce{bucket-cap-mb=0.0005},canonicalize,cse,dce",
    )
    feeds = {role: t.numpy() for role, t in tm.feeds.items()}
    feeds["input:0"], feeds["input:1"] = x[shard], y[shard]
    results = dict(zip(tm.result_roles, interpret(tm.module, feeds), strict=True))
    loss_fn(model(lucid.tensor(x)), lucid.tensor(y)).backward()
    for name, p in model.named_parameters():
        assert_close(results[f"grad:param:{name}"], p.grad.numpy(), rtol=1e-12, atol=1e-14)


# --- fused_step(..., process_group=...): the compiled data-parallel step ----------------------


def _mse(out, target):
    return ((out - target) ** 2).mean()


def _compiled_ddp_matches(opt_cls, opt_kwargs, dtype, rtol: float, **step_kw) -> None:
    """Compiled on N shards == one eager process on the whole batch == eager DDP on N shards."""
    r, n = rank_size()
    steps, per_rank = 3, 4
    model = _mlp(dtype, seed=40)
    ref, eager = _mlp(dtype, seed=40), _mlp(dtype, seed=40)
    ddp = DDP(eager, bucket_cap_mb=0.0005)
    opt = opt_cls(model.parameters(), **opt_kwargs)
    ref_opt = opt_cls(ref.parameters(), **opt_kwargs)
    ddp_opt = opt_cls(ddp.parameters(), **opt_kwargs)
    step = lucid.compile.fused_step(
        model, _mse, opt, process_group=dist.default_group(), bucket_cap_mb=0.0005, **step_kw
    )
    for x, y in _batches(n, steps, per_rank, dtype, seed=11):
        shard = slice(r * per_rank, (r + 1) * per_rank)
        loss = step(lucid.tensor(x[shard]), lucid.tensor(y[shard]))
        ddp_opt.zero_grad()
        eager_loss = _mse(ddp(lucid.tensor(x[shard])), lucid.tensor(y[shard]))
        eager_loss.backward()
        if "max_grad_norm" in step_kw:
            lucid.nn.utils.clip_grad_norm_(list(ddp.parameters()), step_kw["max_grad_norm"])
        ddp_opt.step()
        assert_close(loss.numpy(), eager_loss.detach().numpy(), rtol=rtol, atol=rtol)
        ref_opt.zero_grad()
        _mse(ref(lucid.tensor(x)), lucid.tensor(y)).backward()
        if "max_grad_norm" in step_kw:
            lucid.nn.utils.clip_grad_norm_(list(ref.parameters()), step_kw["max_grad_norm"])
        ref_opt.step()
    # One forward+backward executable: more buckets than one, all in it.
    assert len(step._gradients._entries) == 1
    (entry,) = step._gradients._entries.values()
    assert len(entry.tm.buckets) > 1, entry.tm.buckets
    for (name, p), q, e in zip(
        model.named_parameters(), ref.parameters(), eager.parameters(), strict=True
    ):
        np.testing.assert_allclose(
            p.numpy(), q.numpy(), rtol=rtol, atol=rtol, err_msg=f"rank {r}: {name} vs one process"
        )
        np.testing.assert_allclose(
            p.numpy(), e.numpy(), rtol=rtol, atol=rtol, err_msg=f"rank {r}: {name} vs eager DDP"
        )


@check
def compiled_ddp_sgd_float64() -> None:
    _compiled_ddp_matches(optim.SGD, dict(lr=0.1, momentum=0.9), lucid.float64, 1e-10)


@check
def compiled_ddp_adamw_float64() -> None:
    _compiled_ddp_matches(optim.AdamW, dict(lr=0.01, weight_decay=0.1), lucid.float64, 1e-10)


@check
def compiled_ddp_float32_and_clipping() -> None:
    _compiled_ddp_matches(optim.SGD, dict(lr=0.1), lucid.float32, 2e-5)
    _compiled_ddp_matches(optim.AdamW, dict(lr=0.01), lucid.float32, 2e-5)
    # Clipping sees the averaged gradients: the whole-batch reference clips its own.
    _compiled_ddp_matches(optim.SGD, dict(lr=0.1), lucid.float64, 1e-10, max_grad_norm=0.05)


@check
def compiled_ddp_wrapped_model() -> None:
    """fused_step(ddp_model, ...) compiles the wrapped module with DDP's group and buckets."""
    r, n = rank_size()
    per_rank = 4
    local, ref = _mlp(lucid.float64, seed=50 + r), _mlp(lucid.float64, seed=50)
    ddp = DDP(local)  # the wrap-time broadcast gives every rank rank 0's parameters
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    step = lucid.compile.fused_step(ddp, _mse, opt)
    for x, y in _batches(n, 2, per_rank, lucid.float64, seed=13):
        shard = slice(r * per_rank, (r + 1) * per_rank)
        step(lucid.tensor(x[shard]), lucid.tensor(y[shard]))
        ref_opt.zero_grad()
        _mse(ref(lucid.tensor(x)), lucid.tensor(y)).backward()
        ref_opt.step()
    for (name, p), q in zip(local.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


@check
def compiled_ddp_batchnorm() -> None:
    """With BatchNorm (buffers broadcast from rank 0 before each step, per-shard statistics):
    the compiled step equals eager DDP, parameters and running statistics."""
    r, n = rank_size()
    per_rank = 4

    def make(seed):
        lucid.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(5, 6, bias=False), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)
        ).double()

    compiled, eager = DDP(make(70 + r)), DDP(make(80 + r))  # the wrap broadcasts rank 0's
    _copy_params(eager.module, compiled.module)
    opt = optim.AdamW(compiled.parameters(), lr=0.01)
    eager_opt = optim.AdamW(eager.parameters(), lr=0.01)
    step = lucid.compile.fused_step(compiled, _mse, opt)
    if r == 1:  # diverged statistics: the broadcast before the step must undo this
        compiled.module[1].running_mean._data[...] = 5.0
    for x, y in _batches(n, 3, per_rank, lucid.float64, seed=17):
        shard = slice(r * per_rank, (r + 1) * per_rank)
        step(lucid.tensor(x[shard]), lucid.tensor(y[shard]))
        eager_opt.zero_grad()
        _mse(eager(lucid.tensor(x[shard])), lucid.tensor(y[shard])).backward()
        eager_opt.step()
    want = eager.module.state_dict()
    for name, a in compiled.module.state_dict().items():
        b = want[name]
        if np.issubdtype(a.numpy().dtype, np.floating):
            np.testing.assert_allclose(
                a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"rank {r}: {name}"
            )


@check
def compiled_ddp_print_ir() -> None:
    """--print-ir-after-all shows the grad-allreduce pass's collectives (to stderr; the test
    reads the job's output)."""
    r, n = rank_size()
    model = _mlp(lucid.float64, seed=60)
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = lucid.compile.fused_step(
        model,
        _mse,
        opt,
        process_group=dist.default_group(),
        bucket_cap_mb=0.0005,
        options={"print_ir_after_all": True},
    )
    x, y = next(_batches(n, 1, 4, lucid.float64))
    step(lucid.tensor(x[:4]), lucid.tensor(y[:4]))
    (entry,) = step._gradients._entries.values()
    cut = str(entry.tm.module)
    assert "all_reduce" not in cut and '"bucket:0"' in cut, "the program is cut before them"


# --- failure: a rank that never joins, a rank that dies ----------------------------------------


@check
def peer_never_joins() -> None:
    """The last rank stays alive but never reaches the collective: the others raise
    DistributedTimeoutError (uncaught: the job must then end, not hang in MPI_Finalize)."""
    r, n = rank_size()
    if r == n - 1:
        time.sleep(120)
    dist.all_reduce(lucid.ones(3))
    raise AssertionError("unreachable: the collective must time out")


@check
def peer_dies() -> None:
    r, n = rank_size()
    if r == n - 1:
        os.kill(os.getpid(), 9)
    dist.all_reduce(lucid.ones(3))
    raise AssertionError("unreachable: the peer died")


def main(names: list[str]) -> None:
    timeout = float(os.environ.get("LUCID_TEST_COLLECTIVE_TIMEOUT", "60"))
    dist.init_process_group("mpi", timeout=timeout)
    r = dist.get_rank()
    for name in names:
        CHECKS[name]()
        print(f"PASS {name} {r}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
