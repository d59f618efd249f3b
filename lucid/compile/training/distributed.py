"""``fused_step(..., process_group=...)``: a data-parallel training step.

No backend runtime has an instruction that runs a collective, so the step is the ``grad-allreduce``
program cut at its collectives into what a backend can run:

1. one executable: forward, loss and backward, with the ``grad-allreduce`` pass's buckets
   (each bucket's gradients flattened and concatenated) as its results (``bucket:<i>``);
2. on the host, one non-blocking MPI all-reduce per bucket through the process group's
   communicator, all started as soon as the executable returns, then one wait (with the group's
   deadline) and the division by the world size;
3. the optimizer's update as ``compile_optimizer``'s executable, reading the averaged gradients
   (``p.grad`` becomes a view of its bucket), so clipping sees averaged gradients, as in PyTorch.

Before 1, the model's buffers (BatchNorm statistics) are broadcast from rank 0, as eager DDP's
forward does (``broadcast_buffers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lucid._tensor import Tensor
from lucid.compile._binding import STRUCTURE_VERSION
from lucid.compile.errors import CompileError
from lucid.compile.training.base import _one_call_at_a_time
from lucid.compile.training.entries import _run_checked
from lucid.compile.training.make_step import TrainStep
from lucid.compile.training.optimizer import CompiledOptimizerStep
from lucid.distributed._group import ReduceOp
from lucid.nn.parallel.distributed import _broadcast_coalesced
from lucid.passes.grad_allreduce import BUCKET, GRAD

__all__ = ["DistributedFusedStep"]


class _BucketGradients(TrainStep):
    """Forward + loss + backward compiled with ``grad-allreduce`` and cut at its collectives:
    each run returns the loss and the flat gradient buffer of every bucket."""

    _what = "fused_step"

    def __init__(
        self,
        model: Any,
        loss_fn: Callable[..., Tensor],
        world_size: int,
        bucket_cap_mb: float,
        **kw: Any,
    ):
        super().__init__(model, loss_fn, **kw)
        self._world_size = world_size
        self._build_options = {"grad_allreduce_mb": bucket_cap_mb}

    def _key(self, inputs: tuple) -> tuple:
        # The world size changes what the program means (what it is averaged over).
        return (*super()._key(inputs), self._world_size)

    def buckets(self, inputs: tuple) -> tuple[np.ndarray, list[tuple[np.ndarray, list]]]:
        """Run the executable: the loss and, per bucket, its buffer and ``(param, start,
        end)`` of each gradient in it."""
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        key = self._key(inputs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(key, inputs)
        res = _run_checked(entry, [a for a in inputs if isinstance(a, Tensor)], "fused_step")
        entry.after_success(res)
        tm = entry.tm
        out = []
        for i, roles in enumerate(tm.buckets):
            buffer = np.require(res[entry.result_roles.index(f"{BUCKET}{i}")], None, ["C", "W"])
            layout, start = [], 0
            for role in roles:
                param = tm.params[role[len(GRAD) :]]
                layout.append((param, start, start + param._data.size))
                start += param._data.size
            out.append((buffer, layout))
        return res[entry.loss_index], out


class DistributedFusedStep:
    """``step(x, *extra) -> loss`` averaged over ``process_group``'s ranks: forward + backward
    executable, one all-reduce per gradient bucket, update executable. See ``fused_step``."""

    def __init__(
        self,
        model: Any,
        loss_fn: Callable[..., Tensor],
        optimizer: Any,
        process_group: Any,
        *,
        bucket_cap_mb: float = 25.0,
        broadcast_buffers: bool = True,
        backend: str = "auto",
        options: dict[str, Any] | None = None,
        max_grad_norm: float | None = None,
        norm_type: float | str = 2.0,
        clip_grad_value: float | None = None,
    ):
        if not bucket_cap_mb > 0:
            raise ValueError(f"fused_step: bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self.process_group = process_group
        self.model = model
        self.broadcast_buffers = broadcast_buffers
        self.optimizer = optimizer
        self._gradients = _BucketGradients(
            model,
            loss_fn,
            process_group.size,
            bucket_cap_mb,
            backend=backend,
            options=options,
        )
        switches = {k: v for k, v in (options or {}).items() if k != "pipeline"}
        self._update = CompiledOptimizerStep(
            optimizer,
            backend=backend,
            options=switches,
            max_grad_norm=max_grad_norm,
            norm_type=norm_type,
            clip_grad_value=clip_grad_value,
        )
        self._lock = self._gradients._lock
        # The total gradient norm before clipping of the last step (with max_grad_norm).
        self.grad_norm: Tensor | None = None

    def cache_info(self) -> dict[str, Any]:
        """The gradient executable's cache (one entry per input signature)."""
        return self._gradients.cache_info()

    def _part(self, part: str) -> Any:
        if part == "gradients":
            return self._gradients
        if part == "update":
            return self._update
        raise ValueError(f"unknown part {part!r}; expected 'gradients' or 'update'")

    def timing(self) -> list[dict[str, Any]]:
        """``fused_step``'s ``timing()`` rows for the step's two executables, each with ``part``:
        ``"gradients"`` (forward and backward up to the gradient buckets, one row per input
        signature) then ``"update"`` (the optimizer step on the all-reduced gradients)."""
        return [
            {**row, "part": part}
            for part in ("gradients", "update")
            for row in self._part(part).timing()
        ]

    def module(self, key: Any = -1, *, part: str = "gradients") -> Any:
        """The compiled ``prim`` module of ``part`` (``"gradients"`` or ``"update"``; ``key`` as
        for ``fused_step``'s ``module``); print it with ``lucid.ir.print_ir``. Raises
        ``KeyError`` before the first call. (No ``ir(stage=...)``: rebuilt from the trace, the
        gradient program would keep the collectives its compiled form is cut at.)"""
        return self._part(part).module(key)

    def profile(self, *inputs: Any, repeats: int = 100) -> list[dict[str, Any]]:
        """Where the gradient executable's time goes for ``inputs`` (as ``fused_step``'s
        ``profile``: parameters and state untouched, no all-reduce, no update)."""
        return self._gradients.profile(*inputs, repeats=repeats)

    @_one_call_at_a_time
    def __call__(self, x: Any, *extra: Any) -> Tensor:
        group = self.process_group
        if self.broadcast_buffers and group.size > 1:
            # As eager DDP's forward: every rank starts from rank 0's BatchNorm statistics.
            buffers = list(self.model.buffers())
            if buffers:
                _broadcast_coalesced(group, buffers)
        try:
            loss, buckets = self._gradients.buckets((x, *extra))
        except CompileError as e:
            raise CompileError(group.error(str(e))) from e
        if group.size > 1:
            requests = [group.start_all_reduce(buffer, ReduceOp.SUM) for buffer, _ in buckets]
            group.wait(requests, f"gradient all-reduce of {len(buckets)} buckets")
        # A parameter without a gradient in this step keeps none (as fused_step ignores it),
        # not a stale one the update would apply.
        for param_group in self.optimizer.param_groups:
            for param in param_group["params"]:
                param._grad = None
        for buffer, layout in buckets:
            if group.size > 1:
                np.divide(buffer, group.size, out=buffer, casting="unsafe")
            for param, start, end in layout:
                param._grad = Tensor._wrap(buffer[start:end].reshape(param._data.shape))
        try:
            self._update()
        except CompileError as e:
            raise CompileError(group.error(str(e))) from e
        self.grad_norm = self._update.grad_norm
        return Tensor._wrap(loss)
