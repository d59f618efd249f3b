"""``DistributedDataParallel``: one model replica per process, gradients averaged over MPI.

At wrap time rank 0's parameters and buffers are broadcast to every rank. During ``backward()``
each parameter's post-accumulate-grad hook marks it ready; the parameters are grouped in
buckets (in reverse registration order, roughly the order backward produces their gradients,
at most ``bucket_cap_mb`` each), and a bucket whose gradients are all ready is flattened into
one buffer and its all-reduce is started at once (non-blocking), while backward goes on with the
layers before it. Buckets start in the same order on every rank, as MPI requires of
collectives. When backward ends, the remaining buckets are reduced, every request is completed
(with the group's timeout) and each gradient becomes its slice of the averaged bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from lucid._autograd import queue_callback
from lucid._state import state
from lucid._tensor import Tensor
from lucid.distributed import default_group
from lucid.distributed._group import ReduceOp
from lucid.nn.modules.module import Module

__all__ = ["DistributedDataParallel"]


class _Bucket:
    """Parameters whose gradients travel in one all-reduce, and this step's flat buffer."""

    __slots__ = ("params", "offsets", "dtype", "size", "waiting", "buffer", "request")

    def __init__(self, params: list, dtype: np.dtype):
        self.params = params
        self.dtype = dtype
        self.offsets = np.cumsum([0] + [p._data.size for p in params]).tolist()
        self.size = self.offsets[-1]
        self.waiting = len(params)
        self.buffer: np.ndarray | None = None
        self.request: Any = None


def _broadcast_coalesced(group: Any, tensors: list[Tensor], src: int = 0) -> None:
    """Broadcast ``tensors`` from ``src``: one collective per dtype, not one per tensor."""
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t._data.dtype, []).append(t)
    for dtype, same in by_dtype.items():
        flat = np.concatenate([t._data.reshape(-1) for t in same]).astype(dtype, copy=False)
        group.broadcast_array(flat, src)
        start = 0
        for t in same:
            n = t._data.size
            np.copyto(t._data, flat[start : start + n].reshape(t._data.shape))
            t._version[0] += 1
            start += n


class DistributedDataParallel(Module):
    """Data-parallel training of ``module`` over the ranks of ``process_group`` (the default).

    Every rank runs ``module`` on its share of the batch; after ``loss.backward()`` each
    parameter's ``grad`` is the average over the ranks, so an optimizer step keeps the replicas
    identical. ``no_sync()`` skips the averaging (gradients accumulate locally until the first
    backward outside it). ``broadcast_buffers`` copies rank 0's buffers (BatchNorm running
    statistics) to every rank before each forward, as PyTorch does by default.
    """

    def __init__(
        self,
        module: Module,
        device_ids: Any = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float = 25.0,
        find_unused_parameters: bool = False,
        **_ignored: Any,
    ) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an nn.Module, got {module!r}")
        if not bucket_cap_mb > 0:
            raise ValueError(
                f"DistributedDataParallel: bucket_cap_mb must be > 0, got {bucket_cap_mb}"
            )
        group = default_group() if process_group is None else process_group
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        # Plain attributes (not submodules, parameters or buffers) set past Module.__setattr__.
        object.__setattr__(self, "process_group", group)
        params = [p for p in module.parameters() if p.requires_grad]
        object.__setattr__(self, "_params", params)
        object.__setattr__(self, "_buckets", self._make_buckets(params, bucket_cap_mb))
        object.__setattr__(self, "_bucket_of", {})
        object.__setattr__(self, "_next_launch", 0)
        object.__setattr__(self, "_step_active", False)
        object.__setattr__(self, "_ready", set())
        for b, bucket in enumerate(self._buckets):
            for p in bucket.params:
                self._bucket_of[id(p)] = b
        if group.size > 1:
            _broadcast_coalesced(group, [*module.parameters(), *module.buffers()])
        object.__setattr__(
            self,
            "_hook_handles",
            [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params],
        )

    @staticmethod
    def _make_buckets(params: list, cap_mb: float) -> list[_Bucket]:
        cap = cap_mb * 1024 * 1024
        buckets: list[_Bucket] = []
        open_by_dtype: dict[np.dtype, tuple[list, int]] = {}
        for p in reversed(params):
            dtype = p._data.dtype
            members, nbytes = open_by_dtype.get(dtype, ([], 0))
            if members and nbytes + p._data.nbytes > cap:
                buckets.append(_Bucket(members, dtype))
                members, nbytes = [], 0
            members.append(p)
            open_by_dtype[dtype] = (members, nbytes + p._data.nbytes)
        buckets.extend(_Bucket(members, dtype) for dtype, (members, _) in open_by_dtype.items())
        # Launch order: the bucket whose first parameter backward reaches first goes first.
        order = {id(p): i for i, p in enumerate(reversed(params))}
        buckets.sort(key=lambda b: order[id(b.params[0])])
        return buckets

    @property
    def bucket_sizes(self) -> list[int]:
        """Number of parameters in each gradient bucket, in launch order."""
        return [len(b.params) for b in self._buckets]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if state.tracer is not None:
            # A compiled training step writes p.grad without the autograd engine, so the hooks
            # would never average it: the replicas would drift apart silently. Refuse instead
            # (lucid.compile falls back to eager; fused_step/compiled_step raise the reason).
            return state.tracer.graph_break(
                "DistributedDataParallel: its gradient all-reduce runs in eager backward hooks; "
                "run the DDP model eagerly (compile_optimizer works: it reads the averaged p.grad)"
            )
        group = self.process_group
        if self.broadcast_buffers and group.size > 1:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_coalesced(group, buffers)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside the block accumulates gradients locally, without communication."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # --- the reducer ------------------------------------------------------------------------

    def _grad_ready(self, param: Tensor) -> None:
        if not self.require_backward_grad_sync:
            return
        if not self._step_active:
            self._start_step()
        if id(param) in self._ready:
            return
        self._ready.add(id(param))
        bucket = self._buckets[self._bucket_of[id(param)]]
        bucket.waiting -= 1
        self._launch_ready_buckets()
        # MPI progresses a non-blocking collective only inside MPI calls: poke the ones in flight.
        self.process_group.test([b.request for b in self._buckets if b.request is not None])

    def _start_step(self) -> None:
        object.__setattr__(self, "_step_active", True)
        object.__setattr__(self, "_next_launch", 0)
        self._ready.clear()
        for bucket in self._buckets:
            bucket.waiting = len(bucket.params)
            bucket.buffer = bucket.request = None
        queue_callback(self._finish_step)

    def _launch_ready_buckets(self) -> None:
        while self._next_launch < len(self._buckets):
            bucket = self._buckets[self._next_launch]
            if bucket.waiting > 0:
                return
            self._launch(bucket)
            object.__setattr__(self, "_next_launch", self._next_launch + 1)

    def _launch(self, bucket: _Bucket) -> None:
        buffer = np.empty(bucket.size, dtype=bucket.dtype)
        for p, start, end in zip(bucket.params, bucket.offsets, bucket.offsets[1:], strict=False):
            if p._grad is None:
                buffer[start:end] = 0
            else:
                buffer[start:end] = p._grad._data.reshape(-1)
        bucket.buffer = buffer
        if self.process_group.size > 1:
            bucket.request = self.process_group.start_all_reduce(buffer, ReduceOp.SUM)

    def _finish_step(self) -> None:
        """After backward: reduce what is left, wait for every bucket, write the averages."""
        group = self.process_group
        unused = [p for p in self._params if id(p) not in self._ready]
        for bucket in self._buckets[self._next_launch :]:
            self._launch(bucket)
        object.__setattr__(self, "_next_launch", len(self._buckets))
        object.__setattr__(self, "_step_active", False)
        used_anywhere = self._used_anywhere(unused) if self.find_unused_parameters else None
        group.wait(
            [b.request for b in self._buckets if b.request is not None],
            f"gradient all-reduce of {len(self._buckets)} buckets",
        )
        for bucket in self._buckets:
            buffer = bucket.buffer
            np.divide(buffer, group.size, out=buffer)
            for p, start, end in zip(
                bucket.params, bucket.offsets, bucket.offsets[1:], strict=False
            ):
                if used_anywhere is not None and not used_anywhere.get(id(p), True):
                    continue
                p._grad = Tensor._wrap(buffer[start:end].reshape(p._data.shape))
        if unused and not self.find_unused_parameters:
            names = {id(p): n for n, p in self.module.named_parameters()}
            raise RuntimeError(
                group.error(
                    "DistributedDataParallel: these parameters got no gradient in this backward: "
                    f"{[names.get(id(p), '?') for p in unused]}; pass "
                    "find_unused_parameters=True when the forward does not use every parameter"
                )
            )

    def _used_anywhere(self, unused: list) -> dict[int, bool]:
        """Whether each locally unused parameter got a gradient on some rank (one MAX
        all-reduce of a flag per parameter)."""
        flags = np.array([id(p) not in self._ready for p in self._params], dtype=np.int32)
        flags = 1 - flags  # 1 where used here
        self.process_group.all_reduce_array(flags, ReduceOp.MAX)
        return {id(p): bool(f) for p, f in zip(self._params, flags, strict=True)}
