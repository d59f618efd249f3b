"""Process groups: who takes part in a collective, and the transport that runs it.

``MPIProcessGroup`` wraps an ``mpi4py`` communicator. Every collective is issued as a
non-blocking MPI request and polled against a deadline, so a peer that never joins (it died, or
it is stuck elsewhere) makes this rank raise ``DistributedTimeoutError`` naming the rank, the
collective and the timeout instead of waiting forever. Buffers travel through the buffer
protocol on the tensors' own numpy storage: a contiguous tensor is reduced in place, without a
copy.

Every group implements the array-level methods (``all_reduce_array`` and friends); the public
functions in ``lucid.distributed`` turn tensors into arrays and back. A test can install any
object with these methods as the default group (see ``set_default_group``).
"""

from __future__ import annotations

import atexit
import enum
import os
import sys
import time
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DistributedError",
    "DistributedTimeoutError",
    "MPIProcessGroup",
    "ReduceOp",
]

# PyTorch waits 30 minutes; a dead peer should surface sooner than that on one machine.
DEFAULT_TIMEOUT_S = float(os.environ.get("LUCID_DISTRIBUTED_TIMEOUT", "300"))


class ReduceOp(enum.Enum):
    """How ``all_reduce`` and ``reduce_scatter`` combine the ranks' values (PyTorch's names)."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


class DistributedError(RuntimeError):
    """A collective failed; the message names the rank."""


class DistributedTimeoutError(DistributedError):
    """A collective did not complete before the group's timeout (a peer died or never joined)."""


def as_reduce_op(op: Any) -> ReduceOp:
    """``ReduceOp.SUM`` or ``"sum"`` (any case) -> ``ReduceOp``; anything else is a ValueError."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    raise ValueError(f"unknown reduce op {op!r}; use one of {[o.name for o in ReduceOp]}")


# MPI has no datatype for these; they travel as float32 copies (exact for both).
_WIDENED = {"float16", "bfloat16"}


def _wire_array(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """The array MPI sends for ``arr`` and whether it is a copy that must be written back."""
    if arr.dtype.name in _WIDENED:
        return np.ascontiguousarray(arr, dtype=np.float32), True
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8), True
    if not arr.flags.c_contiguous:
        return np.ascontiguousarray(arr), True
    return arr, False


class MPIProcessGroup:
    """The ranks of one MPI communicator; collectives time out after ``timeout`` seconds."""

    def __init__(self, comm: Any, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.timeout = float(timeout)
        self._ops = {
            ReduceOp.SUM: MPI.SUM,
            ReduceOp.AVG: MPI.SUM,
            ReduceOp.MAX: MPI.MAX,
            ReduceOp.MIN: MPI.MIN,
        }

    def __repr__(self) -> str:
        return f"<MPIProcessGroup rank {self.rank} of {self.size}>"

    def error(self, message: str) -> str:
        return f"rank {self.rank} of {self.size}: {message}"

    # --- waiting with a deadline --------------------------------------------------------------

    def wait(self, requests: list, what: str) -> None:
        """Complete ``requests`` or raise ``DistributedTimeoutError`` after the timeout."""
        if not requests:
            return
        start = time.monotonic()
        deadline = start + self.timeout
        pause = 0.0
        while not self._mpi.Request.Testall(requests):
            now = time.monotonic()
            if now > deadline:
                _abort_at_exit(self)
                raise DistributedTimeoutError(
                    self.error(
                        f"{what} did not complete within {self.timeout:g} s: another rank died "
                        "or did not reach the same collective (every rank must call the same "
                        "collectives in the same order)"
                    )
                )
            # MPI moves a large message in fragments, each needing a Testall on both sides:
            # poll (yielding the core, which ranks may share) for the first half second, and
            # only then back off to a slower poll while waiting for a late or dead peer.
            time.sleep(pause)
            if now - start > 0.5:
                pause = min(pause * 2 or 1e-4, 2e-3)

    def test(self, requests: list) -> bool:
        """Whether ``requests`` have completed (and drive MPI's progress on them)."""
        return bool(self._mpi.Request.Testall(requests)) if requests else True

    # --- non-blocking collectives on arrays ----------------------------------------------------

    def start_all_reduce(self, arr: np.ndarray, op: ReduceOp) -> Any:
        """Start a SUM/MAX/MIN all-reduce of contiguous ``arr`` in place; returns the request."""
        return self.comm.Iallreduce(self._mpi.IN_PLACE, arr, op=self._ops[op])

    # --- blocking collectives on arrays (each waits with the deadline) -------------------------

    def all_reduce_array(self, arr: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``arr`` over the ranks, in place; AVG divides the sum by the world size."""
        if op is ReduceOp.AVG and not (
            np.issubdtype(arr.dtype, np.floating) or arr.dtype.name in _WIDENED
        ):
            raise TypeError(self.error(f"all_reduce AVG needs a floating tensor, got {arr.dtype}"))
        wire, copied = _wire_array(arr)
        if self.size > 1:
            self.wait([self.start_all_reduce(wire, op)], f"all_reduce({op.name})")
        if op is ReduceOp.AVG:
            np.divide(wire, self.size, out=wire, casting="unsafe")
        if copied:
            np.copyto(arr, wire, casting="unsafe")

    def broadcast_array(self, arr: np.ndarray, src: int) -> None:
        """Overwrite ``arr`` on every rank with rank ``src``'s ``arr``."""
        self.check_rank(src, "broadcast src")
        wire, copied = _wire_array(arr)
        if self.size > 1:
            self.wait([self.comm.Ibcast(wire, root=src)], f"broadcast(src={src})")
        if copied:
            np.copyto(arr, wire, casting="unsafe")

    def all_gather_array(self, out: np.ndarray, arr: np.ndarray) -> None:
        """``out[r]`` = rank ``r``'s ``arr``; ``out`` has shape ``(size, *arr.shape)``."""
        wire, _ = _wire_array(arr)
        recv, copied = _wire_array(out)
        if self.size > 1:
            self.wait([self.comm.Iallgather(wire, recv)], "all_gather")
        else:
            recv.reshape(wire.shape)[...] = wire
        if copied:
            np.copyto(out, recv, casting="unsafe")

    def reduce_scatter_array(self, out: np.ndarray, arr: np.ndarray, op: ReduceOp) -> None:
        """``out`` = the reduction over ranks of block ``rank`` of ``arr`` (``size`` blocks)."""
        wire, _ = _wire_array(arr)
        recv, copied = _wire_array(out)
        if self.size > 1:
            request = self.comm.Ireduce_scatter_block(wire, recv, op=self._ops[op])
            self.wait([request], f"reduce_scatter({op.name})")
        else:
            recv.reshape(-1)[...] = wire.reshape(-1)
        if op is ReduceOp.AVG:
            np.divide(recv, self.size, out=recv, casting="unsafe")
        if copied:
            np.copyto(out, recv, casting="unsafe")

    def barrier(self) -> None:
        if self.size > 1:
            self.wait([self.comm.Ibarrier()], "barrier")

    def check_rank(self, rank: int, what: str) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(self.error(f"{what} must be a rank in [0, {self.size}), got {rank!r}"))


_abort_registered = False


def _abort_at_exit(group: MPIProcessGroup) -> None:
    """After a timed-out collective, MPI cannot finalize (the request is still pending and
    ``MPI_Finalize`` would wait for it forever): end the job with ``MPI_Abort`` at exit instead,
    once the error has been reported."""
    global _abort_registered
    if _abort_registered:
        return
    _abort_registered = True

    def abort() -> None:
        sys.stderr.flush()
        group.comm.Abort(1)

    atexit.register(abort)
