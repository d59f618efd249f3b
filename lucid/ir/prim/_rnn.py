"""LSTM recurrence composites: one layer and direction over a whole sequence (``lstm``) and its
backpropagation through time (``lstm_grad``).

Both decompose into the unrolled cell (slices, matmuls, sigmoid/tanh, products, concats), so the
prim interpreter and a backend without a kernel (MPSGraph) run the unrolled maths; the CPU runtime
runs them as one kernel each (``lstm.cpp``): the recurrent GEMM of every step with the weight
read in place, the gate nonlinearities fused. Gate order is PyTorch's: input, forget, cell (g),
output; ``gates`` holds them after their nonlinearity.

``lstm(x[L, N, 4H], h0[N, H], c0[N, H], w_hh[4H, H], b_hh[4H] or 0-d){reverse, save}`` gives
``y[L, N, H], h_n, c_n`` and, with ``save``, ``cells[L, N, H], gates[L, N, 4H]`` for the gradient.
``lstm_grad(dy, dh_n, dc_n, d_cells, d_gates, h0, c0, w_hh, y, cells, gates){reverse}`` gives
``dx[L, N, 4H], dh0, dc0, dw_hh``; ``d_cells`` and ``d_gates`` are full or 0-d (broadcast: a
zero gradient is a 0-d zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lucid.ir.prim._core import Attr, Aval, _fail
from lucid.ir.prim.composite import Const, Emit, _register_composite

_REAL = frozenset({"f32", "f64"})


def _dims(v: Any) -> tuple[int, ...]:
    """The static shape of a numpy array, a lowering value or an IR value."""
    shape = getattr(v, "shape", None)
    return tuple(shape) if shape is not None else tuple(v.type.get_shape())


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def _rows(emit: Emit, v: Any, t: int) -> Any:
    """Time step ``t`` of a [L, N, W] value, as [N, W]."""
    _, batch, width = _dims(v)
    part = emit("slice", v, starts=(t, 0, 0), ends=(t + 1, batch, width), strides=(1, 1, 1))
    return emit("reshape", part, shape=(batch, width))


def _cols(emit: Emit, v: Any, k: int, hidden: int) -> Any:
    """Gate ``k`` (columns k*H .. (k+1)*H) of an [N, 4H] value."""
    batch = _dims(v)[0]
    return emit("slice", v, starts=(0, k * hidden), ends=(batch, (k + 1) * hidden), strides=(1, 1))


def _stack(emit: Emit, steps: Sequence[Any]) -> Any:
    rows = [emit("reshape", s, shape=(1, *_dims(s))) for s in steps]
    return rows[0] if len(rows) == 1 else emit("concat", *rows, axis=0)


def _lstm(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    x, h, c, w_hh, b_hh = operands
    length, _, four_h = _dims(x)
    hidden = four_h // 4
    outs: list[Any] = [None] * length
    cells: list[Any] = [None] * length
    gates: list[Any] = [None] * length
    for t in _steps(length, attrs["reverse"]):
        # As the linear op lowers: h W_hhᵀ, then its bias; then the input projection.
        recurrent = emit("add", emit("matmul", h, w_hh, transpose_b=True), b_hh)
        pre = emit("add", _rows(emit, x, t), recurrent)
        i, f, g, o = (
            emit("tanh" if k == 2 else "sigmoid", _cols(emit, pre, k, hidden)) for k in range(4)
        )
        c = emit("add", emit("mul", i, g), emit("mul", f, c))
        h = emit("mul", o, emit("tanh", c))
        outs[t], cells[t] = h, c
        if attrs["save"]:
            gates[t] = emit("concat", i, f, g, o, axis=1)
    results = [_stack(emit, outs), h, c]
    if attrs["save"]:
        results += [_stack(emit, cells), _stack(emit, gates)]
    return results


def _lstm_grad(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    dy, dh, dc, d_cells, d_gates, h0, c0, w_hh, y, cells, gates = operands
    length, _, four_h = _dims(gates)
    hidden = four_h // 4
    one = const(1.0, gates)
    steps = list(_steps(length, attrs["reverse"]))
    d_pre: list[Any] = [None] * length
    d_w = None
    for k in range(length - 1, -1, -1):  # the forward's steps, last first
        t = steps[k]
        h_prev = h0 if k == 0 else _rows(emit, y, steps[k - 1])
        c_prev = c0 if k == 0 else _rows(emit, cells, steps[k - 1])
        act = _rows(emit, gates, t)
        i, f, g, o = (_cols(emit, act, j, hidden) for j in range(4))
        extra = d_gates if not _dims(d_gates) else _rows(emit, d_gates, t)
        di, df, dg, do = (
            (extra, extra, extra, extra)
            if not _dims(extra)
            else tuple(_cols(emit, extra, j, hidden) for j in range(4))
        )
        tanh_c = emit("tanh", _rows(emit, cells, t))
        dh = emit("add", _rows(emit, dy, t), dh)
        d_cell = d_cells if not _dims(d_cells) else _rows(emit, d_cells, t)
        slope = emit("sub", one, emit("mul", tanh_c, tanh_c))
        dc = emit("add", emit("add", dc, d_cell), emit("mul", emit("mul", dh, o), slope))

        def sigmoid_grad(d: Any, s: Any) -> Any:
            return emit("mul", emit("mul", d, s), emit("sub", one, s))

        parts = (
            sigmoid_grad(emit("add", emit("mul", dc, g), di), i),
            sigmoid_grad(emit("add", emit("mul", dc, c_prev), df), f),
            emit("mul", emit("add", emit("mul", dc, i), dg), emit("sub", one, emit("mul", g, g))),
            sigmoid_grad(emit("add", emit("mul", dh, tanh_c), do), o),
        )
        pre = emit("concat", *parts, axis=1)
        d_pre[t] = pre
        step_w = emit("matmul", pre, h_prev, transpose_a=True)
        d_w = step_w if d_w is None else emit("add", d_w, step_w)
        dh = emit("matmul", pre, w_hh)
        dc = emit("mul", dc, f)
    return [_stack(emit, d_pre), dh, dc, d_w]


def _recurrence_avals(op: str, x: Aval, h0: Aval, c0: Aval, w_hh: Aval) -> tuple[int, int, int]:
    if x.dtype not in _REAL:
        raise _fail(op, f"needs f32 or f64 operands, got {x}")
    if len(x.shape) != 3 or len(w_hh.shape) != 2 or w_hh.shape[0] != 4 * w_hh.shape[1]:
        raise _fail(op, f"needs x [L, N, 4H] and w_hh [4H, H], got {x} and {w_hh}")
    length, batch, width = x.shape
    hidden = w_hh.shape[1]
    state = Aval((batch, hidden), x.dtype)
    if width != 4 * hidden or h0 != state or c0 != state or w_hh.dtype != x.dtype or length < 1:
        raise _fail(op, f"x {x}, h0 {h0}, c0 {c0}, w_hh {w_hh} are not [L >= 1, N, 4H], [N, H], "
                    "[N, H], [4H, H] of one dtype")  # fmt: skip
    return length, batch, hidden


def _lstm_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    x, h0, c0, w_hh, b_hh = avals
    length, batch, hidden = _recurrence_avals("lstm", x, h0, c0, w_hh)
    if b_hh.dtype != x.dtype or b_hh.shape not in ((), (4 * hidden,)):
        raise _fail("lstm", f"b_hh must be [{4 * hidden}] or 0-d of dtype {x.dtype}, got {b_hh}")
    sequence = Aval((length, batch, hidden), x.dtype)
    state = Aval((batch, hidden), x.dtype)
    saved = [sequence, x] if attrs["save"] else []
    return [sequence, state, state, *saved]


def _lstm_grad_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    dy, dh_n, dc_n, d_cells, d_gates, h0, c0, w_hh, y, cells, gates = avals
    length, batch, hidden = _recurrence_avals("lstm_grad", gates, h0, c0, w_hh)
    sequence = Aval((length, batch, hidden), gates.dtype)
    state = Aval((batch, hidden), gates.dtype)
    wanted = (("dy", dy, sequence), ("dh_n", dh_n, state), ("dc_n", dc_n, state),
              ("y", y, sequence), ("cells", cells, sequence))  # fmt: skip
    for name, got, want in wanted:
        if got != want:
            raise _fail("lstm_grad", f"{name} must be {want}, got {got}")
    for name, got, want in (("d_cells", d_cells, sequence), ("d_gates", d_gates, gates)):
        if got.dtype != gates.dtype or got.shape not in ((), want.shape):
            raise _fail("lstm_grad", f"{name} must be {want} or 0-d, got {got}")
    return [gates, state, state, w_hh]


_register_composite(
    "lstm",
    ("x", "h0", "c0", "w_hh", "b_hh"),
    _lstm_rule,
    _lstm,
    "lstm.cpp",
    {"reverse": Attr("bool", False), "save": Attr("bool", False)},
)
_register_composite(
    "lstm_grad",
    ("dy", "dh_n", "dc_n", "d_cells", "d_gates", "h0", "c0", "w_hh", "y", "cells", "gates"),
    _lstm_grad_rule,
    _lstm_grad,
    "lstm.cpp",
    {"reverse": Attr("bool", False)},
)

__all__: list[str] = []
