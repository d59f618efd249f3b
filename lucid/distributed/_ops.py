"""The ``all_reduce`` registry op: the collective as a value in the IR.

``all_reduce(x, reduce_op="avg")`` returns ``x`` reduced over the ranks of the default process
group. The ``grad-allreduce`` pass inserts it between the backward graph and the optimizer
update; the IR interpreter and eager dispatch run it through this kernel, which calls the
default group's communicator (any object with ``all_reduce_array``, so a test can install an
in-process stub). It returns a new array and never writes its operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid.ops._registry import AVal, OpDef, register, shape_of

__all__ = ["ALL_REDUCE"]


def _all_reduce_kernel(x: np.ndarray, reduce_op: str = "avg") -> np.ndarray:
    from lucid import distributed
    from lucid.distributed._group import as_reduce_op

    out = np.array(x, copy=True, order="C")
    distributed.default_group().all_reduce_array(out, as_reduce_op(reduce_op))
    return out


def _all_reduce_infer(x: Any, reduce_op: str = "avg") -> Any:
    from lucid.distributed._group import as_reduce_op

    as_reduce_op(reduce_op)  # an unknown op fails when traced, not when run
    return AVal(shape_of(x), x.dtype)


ALL_REDUCE = register(
    OpDef(
        "all_reduce",
        ("x",),
        _all_reduce_infer,
        _all_reduce_kernel,
        attrs={"reduce_op": "avg"},
        saves_inputs=False,
        saves_outputs=False,
        unsupported={
            "vjp": "it reduces gradients after the backward graph; differentiating through "
            "communication between processes is not supported"
        },
        doc="the operand reduced over the ranks of the default process group (sum, avg, max, "
        "min); inserted by the grad-allreduce pass",
    )
)
