"""``lucid.distributed``: collectives over MPI with PyTorch's shapes.

Launch one process per rank with ``mpirun -n N python train.py``; each calls
``init_process_group(backend="mpi")``. Collectives work on Lucid tensors in place
(``all_reduce(t)`` overwrites ``t``, as in PyTorch) and send the tensors' own numpy storage
through MPI when it is contiguous. A collective that a peer never joins raises
``DistributedTimeoutError`` naming this rank after the group's timeout; it never hangs.

MPI comes from ``mpi4py`` (``pip install lucid[distributed]``) and the system's Open MPI or
MPICH; importing this module does not import ``mpi4py``.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid._state import state
from lucid._tensor import Tensor
from lucid.distributed import _ops  # noqa: F401  (registers the all_reduce op)
from lucid.distributed._group import (
    DEFAULT_TIMEOUT_S,
    DistributedError,
    DistributedTimeoutError,
    MPIProcessGroup,
    ReduceOp,
    as_reduce_op,
)

__all__ = [
    "DistributedError",
    "DistributedTimeoutError",
    "ProcessGroup",
    "ReduceOp",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "reduce_scatter",
    "reduce_scatter_tensor",
]

ProcessGroup = MPIProcessGroup

_default_group: Any = None


def is_available() -> bool:
    """Whether ``mpi4py`` (and so an MPI library) can be imported."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def init_process_group(
    backend: str = "mpi",
    *,
    timeout: datetime.timedelta | float | None = None,
    world_size: int = -1,
    rank: int = -1,
) -> None:
    """Join the job started by ``mpirun``: every process becomes one rank of the default group.

    ``timeout`` (seconds or a ``timedelta``; default 300 s, or ``LUCID_DISTRIBUTED_TIMEOUT``)
    bounds every collective. ``world_size`` and ``rank``, when given, must match what MPI says.
    """
    global _default_group
    if backend != "mpi":
        raise ValueError(f"init_process_group: backend {backend!r} is not available; use 'mpi'")
    if _default_group is not None:
        raise RuntimeError("init_process_group: the default process group is already initialized")
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeError(
            "init_process_group(backend='mpi') needs mpi4py and an MPI library: "
            "pip install lucid[distributed] (and Open MPI: apt-get install openmpi-bin "
            "libopenmpi-dev, or brew install open-mpi)"
        ) from e
    seconds = _seconds(timeout)
    group = MPIProcessGroup(MPI.COMM_WORLD.Dup(), seconds)
    if world_size not in (-1, group.size):
        raise ValueError(group.error(f"world_size={world_size} but mpirun started {group.size}"))
    if rank not in (-1, group.rank):
        raise ValueError(group.error(f"rank={rank} but MPI gave this process rank {group.rank}"))
    _default_group = group


def _seconds(timeout: datetime.timedelta | float | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"init_process_group: timeout must be positive, got {timeout!r}")
    return float(seconds)


def is_initialized() -> bool:
    """Whether ``init_process_group`` has run (and ``destroy_process_group`` has not)."""
    return _default_group is not None


def set_default_group(group: Any) -> Any:
    """Install ``group`` (any object with the array-level collectives of ``MPIProcessGroup``)
    as the default group and return the previous one; for tests and embedders."""
    global _default_group
    previous, _default_group = _default_group, group
    return previous


def default_group() -> Any:
    """The default group; a RuntimeError when ``init_process_group`` has not run."""
    if _default_group is None:
        raise RuntimeError(
            "the default process group is not initialized: call "
            "lucid.distributed.init_process_group(backend='mpi') first"
        )
    return _default_group


def _group(group: Any) -> Any:
    return default_group() if group is None else group


def destroy_process_group(group: Any = None) -> None:
    """Leave the default group (its communicator is freed)."""
    global _default_group
    g = _group(group)
    comm = getattr(g, "comm", None)
    if comm is not None:
        comm.Free()
    if g is _default_group:
        _default_group = None


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the default group)."""
    return _group(group).rank


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (the default group)."""
    return _group(group).size


def barrier(group: Any = None) -> None:
    """Wait until every rank has reached the barrier (or the timeout)."""
    _group(group).barrier()


def _storage(t: Any, g: Any, what: str) -> np.ndarray:
    if not isinstance(t, Tensor):
        raise TypeError(g.error(f"{what} expects a lucid Tensor, got {type(t).__name__}"))
    if t._data is None or state.tracer is not None:
        raise RuntimeError(
            g.error(f"{what} cannot run inside a traced function (use the grad-allreduce pass)")
        )
    return t._data


def _check_blocks(g: Any, what: str, whole: np.ndarray, block: np.ndarray) -> None:
    """``whole`` must hold ``world_size`` blocks the size of ``block``, of the same dtype."""
    if whole.size != block.size * g.size or whole.dtype != block.dtype:
        raise ValueError(
            g.error(
                f"{what}: {whole.shape} {whole.dtype} must hold world_size={g.size} blocks of "
                f"{block.shape} {block.dtype}"
            )
        )


def _check_list(g: Any, what: str, arrays: list, like: np.ndarray) -> None:
    """One array per rank, each with ``like``'s shape and dtype."""
    if len(arrays) != g.size:
        raise ValueError(g.error(f"{what}: the list has {len(arrays)} tensors for {g.size} ranks"))
    for r, a in enumerate(arrays):
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ValueError(
                g.error(
                    f"{what}: list[{r}] is {a.shape} {a.dtype}, expected {like.shape} {like.dtype}"
                )
            )


def _written(t: Tensor) -> None:
    t._version[0] += 1  # an in-place write: autograd's saved-tensor checks must see it


def all_reduce(tensor: Tensor, op: ReduceOp | str = ReduceOp.SUM, group: Any = None) -> None:
    """Reduce ``tensor`` over the ranks (SUM, AVG, MAX or MIN), in place on every rank."""
    g = _group(group)
    g.all_reduce_array(_storage(tensor, g, "all_reduce"), as_reduce_op(op))
    _written(tensor)


def broadcast(tensor: Tensor, src: int = 0, group: Any = None) -> None:
    """Overwrite ``tensor`` on every rank with rank ``src``'s value."""
    g = _group(group)
    g.broadcast_array(_storage(tensor, g, "broadcast"), src)
    _written(tensor)


def all_gather_into_tensor(output: Tensor, input: Tensor, group: Any = None) -> None:  # noqa: A002
    """``output`` (``world_size * input.shape[0]`` rows) receives every rank's ``input``."""
    g = _group(group)
    src = _storage(input, g, "all_gather_into_tensor")
    out = _storage(output, g, "all_gather_into_tensor")
    _check_blocks(g, "all_gather_into_tensor output", out, src)
    g.all_gather_array(out.reshape((g.size, *src.shape)) if out.flags.c_contiguous else out, src)
    _written(output)


def all_gather(tensor_list: list, tensor: Tensor, group: Any = None) -> None:
    """``tensor_list[r]`` receives rank ``r``'s ``tensor`` (one tensor per rank, same shape)."""
    g = _group(group)
    src = _storage(tensor, g, "all_gather")
    outs = [_storage(t, g, "all_gather") for t in tensor_list]
    _check_list(g, "all_gather", outs, src)
    gathered = np.empty((g.size, *src.shape), dtype=src.dtype)
    g.all_gather_array(gathered, src)
    for t, o, part in zip(tensor_list, outs, gathered, strict=True):
        o[...] = part
        _written(t)


def reduce_scatter_tensor(
    output: Tensor,
    input: Tensor,  # noqa: A002
    op: ReduceOp | str = ReduceOp.SUM,
    group: Any = None,
) -> None:
    """``output`` = block ``rank`` (of ``world_size`` along dim 0) of ``input`` reduced over
    the ranks."""
    g = _group(group)
    src = _storage(input, g, "reduce_scatter_tensor")
    out = _storage(output, g, "reduce_scatter_tensor")
    _check_blocks(g, "reduce_scatter_tensor input", src, out)
    g.reduce_scatter_array(out, src, as_reduce_op(op))
    _written(output)


def reduce_scatter(
    output: Tensor,
    input_list: Sequence[Tensor],
    op: ReduceOp | str = ReduceOp.SUM,
    group: Any = None,
) -> None:
    """``output`` = ``input_list[rank]`` reduced over the ranks (one input per rank)."""
    g = _group(group)
    out = _storage(output, g, "reduce_scatter")
    parts = [_storage(t, g, "reduce_scatter") for t in input_list]
    _check_list(g, "reduce_scatter", parts, out)
    g.reduce_scatter_array(out, np.stack(parts), as_reduce_op(op))
    _written(output)
