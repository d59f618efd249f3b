"""The ``grad-allreduce`` pass against the IR interpreter, with an in-process N-rank group.

N threads each interpret the same step module on their shard of the batch; the ``all_reduce``
op reduces through ``ThreadGroup``. Every rank must get the gradient eager autograd computes on
the whole batch (float64, up to summation order), and the optimizer update must read it.
"""

from __future__ import annotations

import importlib.util
import io
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.distributed as dist
from lucid import nn
from lucid.compile.training import build_training_module
from lucid.ir import forward_func, import_trace, interpret, result_roles
from lucid.passes import Instrumentation, PassFailure, PassManager
from lucid.passes.grad_allreduce import GradAllReduceError, insert_grad_allreduce
from lucid.testing import assert_close
from lucid.trace import _tracing


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), path)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ThreadGroup = _load("thread_group", "_thread_group.py").ThreadGroup
# forward + loss + a hand-written SGD update on ghost gradient feeds, x of 4 rows
_sgd_step_module = _load("ghost_grads_tests", "../passes/test_ghost_grads.py")._sgd_step_module


@pytest.fixture
def group_of():
    """``group_of(n)`` installs an n-rank ThreadGroup as the default group (restored after)."""
    previous = []

    def install(n: int):
        group = ThreadGroup(n)
        previous.append(dist.set_default_group(group))
        return group

    yield install
    if previous:
        dist.set_default_group(previous[0])


def _model():
    lucid.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _loss(out, target):
    return ((out - target) ** 2).mean()


def _all_reduce_ops(module) -> list:
    return [
        op for op in forward_func(module).body.blocks.first.ops if op.name == "lucid.all_reduce"
    ]


@pytest.mark.parametrize("n", [2, 4])
def test_every_rank_gets_the_whole_batch_gradient(group_of, n):
    per_rank = 3
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal((n * per_rank, 4)), rng.standard_normal((n * per_rank, 2))
    model = _model()
    tm = build_training_module(
        model,
        _loss,
        (lucid.tensor(x[:per_rank]), lucid.tensor(y[:per_rank])),
        pipeline="grad-allreduce{bucket-cap-mb=0.0003},canonicalize,cse,dce",
    )
    n_buckets = len(_all_reduce_ops(tm.module))
    assert n_buckets > 1  # 300 bytes: the 4x8 weight alone is 256 bytes
    params = {role: t.numpy() for role, t in tm.feeds.items() if role.startswith("param:")}
    group = group_of(n)

    def step(rank: int) -> dict:
        part = slice(rank * per_rank, (rank + 1) * per_rank)
        feeds = {**params, "input:0": x[part], "input:1": y[part]}
        return dict(zip(tm.result_roles, interpret(tm.module, feeds), strict=True))

    results = group.run(step)
    assert group.reductions == n_buckets  # one collective per bucket, none more
    _loss(model(lucid.tensor(x)), lucid.tensor(y)).backward()
    for rank_results in results:
        for name, p in model.named_parameters():
            assert_close(rank_results[f"grad:param:{name}"], p.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_the_optimizer_update_reads_the_averaged_gradients(group_of):
    """``grad-allreduce`` runs before ``ghost-grads``: the update binds to the averages."""
    n, rows = 2, 4
    module, w0, b0 = _sgd_step_module()
    xa = np.random.default_rng(0).standard_normal((n * rows, 3))
    PassManager("vjp{wrt=params},grad-allreduce,ghost-grads,canonicalize,cse,dce").run(module)
    assert result_roles(forward_func(module)) == ["output:0", "output:1", "output:2"]
    assert len(_all_reduce_ops(module)) == 1  # both gradients share one 25 MB bucket
    group = group_of(n)
    updates = group.run(
        lambda r: interpret(
            module, {"input:0": xa[r * rows : (r + 1) * rows], "param:w": w0, "param:b": b0}
        )
    )
    w, b = lucid.tensor(w0, requires_grad=True), lucid.tensor(b0, requires_grad=True)
    gw, gb = lucid.autograd.grad(((lucid.tensor(xa) @ w + b).tanh() ** 2).mean(), [w, b])
    for _, new_w, new_b in updates:
        assert_close(new_w, w0 - 0.5 * gw.numpy(), rtol=1e-12)
        assert_close(new_b, b0 - 0.5 * gb.numpy(), rtol=1e-12)


def _grad_module():
    model = _model()
    return build_training_module(
        model, _loss, (lucid.randn(3, 4).double(), lucid.randn(3, 2).double())
    ).module


@settings(max_examples=15, deadline=None)
@given(cap_bytes=st.integers(min_value=1, max_value=2000))
def test_buckets_partition_the_gradients_within_the_cap(cap_bytes):
    module = _grad_module()
    fn = forward_func(module)
    sizes = {
        r: v.type.get_shape()
        for r, v in zip(result_roles(fn), fn.body.blocks.first.last_op.operands, strict=True)
    }
    before = list(fn.body.blocks.first.ops)
    grad_defs = [
        v.owner
        for r, v in zip(result_roles(fn), fn.body.blocks.first.last_op.operands, strict=True)
        if r.startswith("grad:")
    ]
    last_grad_def = max(grad_defs, key=before.index)
    buckets = insert_grad_allreduce(fn, bucket_cap_mb=cap_bytes / 2**20)
    flat = [role for bucket in buckets for role in bucket]
    assert sorted(flat) == sorted(r for r in sizes if r.startswith("grad:"))
    for bucket in buckets:
        nbytes = sum(int(np.prod(sizes[r])) * 8 for r in bucket)
        assert len(bucket) == 1 or nbytes <= cap_bytes
    ops = list(fn.body.blocks.first.ops)
    reduces = [op for op in ops if op.name == "lucid.all_reduce"]
    assert len(reduces) == len(buckets)
    # Each collective sits where its bucket is complete, not after the whole backward: with
    # several buckets, the first one is reduced before the last gradient is computed.
    if len(buckets) > 1:
        assert ops.index(reduces[0]) < ops.index(last_grad_def)


def test_visible_in_print_ir_after_all():
    module = _grad_module()
    stream = io.StringIO()
    PassManager("grad-allreduce", Instrumentation(print_ir_after_all=True, stream=stream)).run(
        module
    )
    text = stream.getvalue()
    assert "grad-allreduce" in text and "lucid.all_reduce" in text and 'reduce_op = "avg"' in text


def test_a_function_without_gradients_is_refused():
    with _tracing() as tr:
        a = tr.input((2,), lucid.float32, role="param:a")
        trace = tr.finish([a * 2])
    with pytest.raises(PassFailure, match="no grad:<role> results; run vjp first"):
        PassManager("grad-allreduce").run(import_trace(trace))
    with pytest.raises(GradAllReduceError, match="reduce-op must be avg or sum"):
        insert_grad_allreduce(forward_func(_grad_module()), reduce_op="max")
    with pytest.raises(GradAllReduceError, match="bucket-cap-mb must be > 0"):
        insert_grad_allreduce(forward_func(_grad_module()), bucket_cap_mb=0)


def test_the_op_without_a_process_group_names_the_fix():
    previous = dist.set_default_group(None)
    try:
        with pytest.raises(RuntimeError, match="init_process_group"):
            lucid._dispatch.apply("all_reduce", lucid.ones(2))
    finally:
        dist.set_default_group(previous)
