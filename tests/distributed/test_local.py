"""In-process parts of data-parallel training: the post-accumulate-grad hook DDP relies on,
DDP's bucketing with a one-rank group, ``DistributedSampler``'s rules (PyTorch's), and the
errors a user sees without a process group."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.distributed as dist
from lucid import nn
from lucid.nn.parallel import DistributedDataParallel as DDP
from lucid.testing import assert_close
from lucid.utils.data import DistributedSampler


class OneRank:
    """A one-rank group: the collectives are identities; counts them."""

    rank, size = 0, 1

    def __init__(self):
        self.calls = 0

    def error(self, message: str) -> str:
        return f"rank 0 of 1: {message}"

    def all_reduce_array(self, arr, op):
        self.calls += 1

    def broadcast_array(self, arr, src):
        self.calls += 1

    def test(self, requests):
        return True

    def wait(self, requests, what):
        assert not requests


# --- the hook --------------------------------------------------------------------------------


def test_post_accumulate_grad_hook_fires_once_after_the_last_gradient():
    w = lucid.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    handle = w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    x = lucid.tensor([3.0, 4.0])
    ((w * x).sum() + (w * w).sum()).backward()  # two gradients reach w
    assert len(seen) == 1
    assert_close(seen[0], np.array([3.0 + 2.0, 4.0 + 4.0]))
    handle.remove()
    (w * x).sum().backward()
    assert len(seen) == 1


def test_queued_callback_runs_after_every_hook():
    a = lucid.tensor([1.0], requires_grad=True)
    b = lucid.tensor([2.0], requires_grad=True)
    events = []

    def hook(t):
        events.append("hook")
        if len(events) == 1:
            lucid._autograd.queue_callback(lambda: events.append("done"))

    a.register_post_accumulate_grad_hook(hook)
    b.register_post_accumulate_grad_hook(hook)
    (a * b).sum().backward()
    assert events == ["hook", "hook", "done"]


def test_hooks_refuse_non_leaves():
    a = lucid.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="non-leaf"):
        (a * 2).register_post_accumulate_grad_hook(lambda t: None)


# --- DDP with one rank ------------------------------------------------------------------------


def _mlp():
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).double()


@settings(max_examples=10, deadline=None)
@given(cap_bytes=st.integers(min_value=1, max_value=1200))
def test_buckets_cover_the_parameters_in_backward_order(cap_bytes):
    model = _mlp()
    ddp = DDP(model, process_group=OneRank(), bucket_cap_mb=cap_bytes / 2**20)
    params = list(model.parameters())
    launched = [p for bucket in ddp._buckets for p in bucket.params]
    assert [id(p) for p in launched] == [id(p) for p in reversed(params)]
    for bucket in ddp._buckets:
        assert len(bucket.params) == 1 or sum(p._data.nbytes for p in bucket.params) <= cap_bytes


def test_one_rank_ddp_gives_plain_gradients_and_keeps_state_dict_keys():
    model, plain = _mlp(), _mlp()
    ddp = DDP(model, process_group=OneRank(), bucket_cap_mb=0.0001)
    x = lucid.randn(5, 4).double()
    ddp(x).sum().backward()
    plain(x).sum().backward()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        assert_close(p.grad.numpy(), q.grad.numpy(), rtol=0, atol=0)
    assert list(ddp.state_dict()) == [f"module.{k}" for k in plain.state_dict()]


class TwoRanksOfOne(OneRank):
    """Claims two ranks but reduces only its own buffer (the other rank contributes zeros):
    records when each bucket's non-blocking all-reduce starts."""

    size = 2

    def __init__(self):
        super().__init__()
        self.started = []

    def start_all_reduce(self, arr, op):
        self.started.append(arr.size)
        return len(self.started)

    def wait(self, requests, what):
        assert requests == list(range(1, len(self.started) + 1))


def test_buckets_start_during_backward_and_in_order():
    model, plain = _mlp(), _mlp()
    group = TwoRanksOfOne()
    ddp = DDP(model, process_group=group, bucket_cap_mb=1e-9)  # one parameter per bucket
    started_when_first_layer_ready = []
    first_weight = model[0].weight  # backward reaches it last
    first_weight.register_post_accumulate_grad_hook(
        lambda t: started_when_first_layer_ready.append(len(group.started))
    )
    x = lucid.randn(5, 4).double()
    ddp(x).sum().backward()
    plain(x).sum().backward()
    # The last layers' buckets were already in flight while backward reached the first layer.
    assert started_when_first_layer_ready[0] >= 2
    assert group.started == [p._data.size for p in reversed(list(model.parameters()))]
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        assert_close(p.grad.numpy(), q.grad.numpy() / 2, rtol=1e-15, atol=0)  # sum / world size


def test_compiling_ddp_falls_back_to_eager_or_refuses_never_skips_the_all_reduce():
    model = _mlp()
    ddp = DDP(model, process_group=OneRank())
    x = lucid.randn(5, 4).double()
    cm = lucid.compile(ddp)
    assert_close(cm(x).detach().numpy(), model(x).detach().numpy(), rtol=0, atol=0)
    (reason,) = cm.cache_info()["reasons"].values()
    assert "DistributedDataParallel" in reason
    with pytest.raises(lucid.compile.CompileError, match="DistributedDataParallel"):
        lucid.compile.make_step(ddp, lambda out: (out**2).mean())(x)
    # fused_step averages through the DDP model's group itself (test_compiled_step.py).
    opt = lucid.optim.SGD(ddp.parameters(), lr=0.1)
    step = lucid.compile.fused_step(ddp, lambda out: (out**2).mean(), opt)
    assert step.model is model and step.process_group is ddp.process_group


def test_ddp_without_a_process_group_names_init_process_group():
    previous = dist.set_default_group(None)
    try:
        with pytest.raises(RuntimeError, match="init_process_group"):
            DDP(_mlp())
        with pytest.raises(RuntimeError, match="init_process_group"):
            DistributedSampler(range(4))
        with pytest.raises(ValueError, match="backend 'nccl' is not available"):
            dist.init_process_group("nccl")
    finally:
        dist.set_default_group(previous)


def test_collectives_refuse_bad_input():
    group = OneRank()
    with pytest.raises(TypeError, match="rank 0 of 1: all_reduce expects a lucid Tensor"):
        dist.all_reduce(np.ones(3), group=group)
    with pytest.raises(ValueError, match="unknown reduce op 'product'"):
        dist.all_reduce(lucid.ones(3), op="product", group=group)
    with pytest.raises(ValueError, match="all_gather: the list has 2 tensors for 1 ranks"):
        dist.all_gather([lucid.ones(2), lucid.ones(2)], lucid.ones(2), group=group)
    with pytest.raises(ValueError, match=r"must hold world_size=1 blocks of \(2,\) float32"):
        dist.all_gather_into_tensor(lucid.zeros(3), lucid.zeros(2), group=group)


# --- DistributedSampler: PyTorch's rules ----------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(min_value=0, max_value=40),
    replicas=st.integers(min_value=1, max_value=6),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    epoch=st.integers(min_value=0, max_value=3),
)
def test_sampler_shards_follow_pytorchs_rules(length, replicas, shuffle, drop_last, epoch):
    samplers = [
        DistributedSampler(range(length), replicas, r, shuffle=shuffle, drop_last=drop_last)
        for r in range(replicas)
    ]
    for s in samplers:
        s.set_epoch(epoch)
    shards = [list(s) for s in samplers]
    if drop_last and length % replicas:
        per_rank = math.ceil((length - replicas) / replicas)
    else:
        per_rank = math.ceil(length / replicas)
    assert all(len(shard) == len(s) == per_rank for shard, s in zip(shards, samplers, strict=True))
    # Rank r takes positions r, r + replicas, ... of one shared (padded or cut) index list.
    merged = [shards[k % replicas][k // replicas] for k in range(per_rank * replicas)]
    if drop_last:
        assert len(set(merged)) == len(merged)  # nothing repeated
    elif length:
        assert set(merged) == set(range(length))
        padding = merged[length:]
        assert padding == (merged[:length] * replicas)[: len(padding)]  # wraps to the start
    if not shuffle:
        assert merged[: min(length, len(merged))] == list(range(min(length, len(merged))))


def test_sampler_order_depends_on_seed_and_epoch_only():
    a, b = DistributedSampler(range(50), 2, 0, seed=1), DistributedSampler(range(50), 2, 0, seed=1)
    assert list(a) == list(b) == list(a)
    a.set_epoch(1)
    assert list(a) != list(b)
    assert list(DistributedSampler(range(50), 2, 0, seed=2)) != list(b)


def test_sampler_refuses_a_rank_outside_the_group():
    with pytest.raises(
        ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"
    ):
        DistributedSampler(range(4), 2, 2)
