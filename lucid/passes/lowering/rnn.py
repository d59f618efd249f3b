"""Lowering rules of the LSTM recurrence: each op becomes one composite prim op (``lstm``,
``lstm_grad``, ``lucid.ir.prim._rnn``), which the CPU runtime runs as one kernel and other
backends expand into the unrolled cell."""

from __future__ import annotations

from lucid.ir.prim.dialect import PrimIROp
from lucid.passes.lowering._core import PV, Builder, Operand, is_scalar, rule


def _is_zero(v: PV) -> bool:
    """Whether ``v`` is a constant zero (a gradient nobody sent: the ``vjp`` pass's zeros)."""
    owner = v.ssa.owner
    if isinstance(owner, PrimIROp) and owner.PRIM.name == "broadcast_to":
        owner = owner.operands[0].owner
    if not isinstance(owner, PrimIROp) or owner.PRIM.name != "constant":
        return False
    values = owner.prim_attrs()["value"]
    return len(values) == 1 and values[0] == 0.0


def _maybe_zero(b: Builder, v: Operand, like: PV) -> PV:
    """``v``, or a 0-d zero when it is zero: the kernel then reads nothing for it."""
    if is_scalar(v):
        return b.const(v, like.dtype, ())
    return b.const(0.0, like.dtype, ()) if _is_zero(v) else b.widen(v)


@rule("lstm_recurrence")
def _lstm_recurrence(b: Builder, projected, h0, c0, w_hh, b_hh, reverse):
    x = b.widen(projected)
    bias = b.const(0.0, x.dtype, ()) if is_scalar(b_hh) else b.widen(b_hh)
    # The training forward keeps the cells and gates for lstm_grad; inference does not.
    save = any(b.used[3:])
    operands = [x, b.widen(h0), b.widen(c0), b.widen(w_hh), bias]
    outs = b.emit("lstm", operands, reverse=bool(reverse), save=save)
    return (*outs, None, None) if not save else tuple(outs)


@rule("lstm_recurrence_backward")
def _lstm_recurrence_backward(
    b: Builder, d_out, d_h_n, d_c_n, d_cells, d_gates, h0, c0, w_hh, outputs, cells, gates,
    reverse,
):  # fmt: skip
    like = b.widen(gates)
    operands = [
        b.widen(d_out), b.widen(d_h_n), b.widen(d_c_n), _maybe_zero(b, d_cells, like),
        _maybe_zero(b, d_gates, like), b.widen(h0), b.widen(c0), b.widen(w_hh),
        b.widen(outputs), b.widen(cells), like,
    ]  # fmt: skip
    return tuple(b.emit("lstm_grad", operands, reverse=bool(reverse)))
