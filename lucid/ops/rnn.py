"""LSTM maths: one cell as a composition of Lucid ops, and a sequence as one op per layer and
direction.

Gate order is PyTorch's: input, forget, cell (g), output. The input projections of all time steps
run as one ``linear`` before the recurrence; the recurrence itself (each step adds the recurrent
projection and applies the gates) is the registered op ``lstm_recurrence``, with its
backpropagation through time as the op ``lstm_recurrence_backward``. One op per sequence keeps
traced graphs small (a 128-step, 2-layer LSTM is two ops, not 256 cells) and lets a backend run
the whole recurrence in one kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lucid._dispatch import apply
from lucid._dtype import result_type
from lucid._tensor import Tensor
from lucid.ops._registry import AVal, OpDef, register
from lucid.ops.elementwise import _sigmoid_kernel

__all__: list[str] = []


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return apply("linear", x, w, 0.0 if b is None else b)


def _gates_to_state(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    i, f, g, o = gates.chunk(4, -1)
    c_next = i.sigmoid() * g.tanh() + f.sigmoid() * c
    h_next = o.sigmoid() * c_next.tanh()
    return h_next, c_next


def lstm_cell(
    x: Tensor,
    h: Tensor,
    c: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None = None,
    b_hh: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step: (h', c') from input x (N, I) or (I,) and state h, c (N, H) or (H,).

    gates = x W_ih^T + b_ih + h W_hh^T + b_hh, split as (i, f, g, o);
    c' = sigmoid(f) c + sigmoid(i) tanh(g); h' = sigmoid(o) tanh(c').
    """
    hidden = w_hh.shape[1]
    if w_ih.shape[0] != 4 * hidden or w_hh.shape[0] != 4 * hidden:
        raise ValueError(
            f"lstm_cell: w_ih {tuple(w_ih.shape)} and w_hh {tuple(w_hh.shape)} must have "
            f"4 * hidden_size = {4 * hidden} rows"
        )
    if tuple(h.shape) != tuple(c.shape) or h.shape[-1] != hidden:
        raise ValueError(
            f"lstm_cell: h {tuple(h.shape)} and c {tuple(c.shape)} must both end in hidden_size "
            f"{hidden}"
        )
    gates = _linear(x, w_ih, b_ih) + _linear(h, w_hh, b_hh)
    return _gates_to_state(gates, c)


# --- the recurrence of one layer and direction as one op

_OP = "lstm_recurrence"


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check_recurrence(op: str, projected, h0, c0, w_hh, b_hh) -> tuple:
    """(L, N, H) of a recurrence's operands; TypeError/ValueError naming the bad one."""
    for name, t in (("projected", projected), ("h0", h0), ("c0", c0), ("w_hh", w_hh)):
        if not t.dtype.is_floating_point or t.dtype is not projected.dtype:
            raise TypeError(
                f"{op}: projected, h0, c0 and w_hh must share one floating dtype, got "
                f"{projected.dtype}, {h0.dtype}, {c0.dtype}, {w_hh.dtype} ({name})"
            )
    if w_hh.ndim != 2 or projected.ndim != 3:
        raise ValueError(
            f"{op}: expected projected (L, N, 4H) and w_hh (4H, H), got {tuple(projected.shape)} "
            f"and {tuple(w_hh.shape)}"
        )
    four_h, hidden = w_hh.shape
    length, batch, width = projected.shape
    if None not in (four_h, hidden) and four_h != 4 * hidden:
        raise ValueError(f"{op}: w_hh {tuple(w_hh.shape)} must have 4 * hidden_size rows")
    if width != four_h:
        raise ValueError(
            f"{op}: projected {tuple(projected.shape)} must end in w_hh's {four_h} rows"
        )
    for name, t in (("h0", h0), ("c0", c0)):
        if tuple(t.shape) != (batch, hidden):
            raise ValueError(
                f"{op}: expected {name} of shape {(batch, hidden)}, got {tuple(t.shape)}"
            )
    if _is_tensor(b_hh):
        if b_hh.dtype is not projected.dtype or tuple(b_hh.shape) != (four_h,):
            raise ValueError(
                f"{op}: b_hh must be a ({four_h},) tensor of dtype {projected.dtype}, got "
                f"{tuple(b_hh.shape)} {b_hh.dtype}"
            )
    elif b_hh != 0:
        raise ValueError(f"{op}: b_hh must be a tensor or the scalar 0.0 (no bias), got {b_hh}")
    if length == 0:
        raise ValueError(f"{op}: the sequence has no time steps")
    return length, batch, hidden


def _recurrence_infer(projected, h0, c0, w_hh, b_hh, reverse):
    length, batch, hidden = _check_recurrence(_OP, projected, h0, c0, w_hh, b_hh)
    dt = projected.dtype
    state = AVal((batch, hidden), dt)
    sequence = AVal((length, batch, hidden), dt)
    return sequence, state, state, sequence, AVal(tuple(projected.shape), dt)


def _time_steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def _recurrence_kernel(projected, h0, c0, w_hh, b_hh, reverse):
    length, batch, four_h = projected.shape
    hidden = four_h // 4
    dt = projected.dtype
    outputs = np.empty((length, batch, hidden), dt)
    cells = np.empty((length, batch, hidden), dt)
    gates = np.empty(projected.shape, dt)
    h, c = h0, c0
    for t in _time_steps(length, reverse):
        recurrent = np.matmul(h, w_hh.T)  # the linear op's kernel, then its bias
        if b_hh.ndim:
            recurrent += b_hh
        pre = projected[t] + recurrent
        act = gates[t]
        act[:, : 2 * hidden] = _sigmoid_kernel(pre[:, : 2 * hidden])
        act[:, 2 * hidden : 3 * hidden] = np.tanh(pre[:, 2 * hidden : 3 * hidden])
        act[:, 3 * hidden :] = _sigmoid_kernel(pre[:, 3 * hidden :])
        i, f, g, o = np.split(act, 4, axis=-1)
        c = cells[t] = i * g + f * c
        h = outputs[t] = o * np.tanh(c)
    return outputs, h.copy(), c.copy(), cells, gates


def _recurrence_vjp(c, d_out, d_h_n, d_c_n, d_cells, d_gates):
    projected, h0, c0, w_hh, b_hh = c.inputs
    outputs, _, _, cells, gates = c.outputs
    d_projected, d_h0, d_c0, d_w_hh = apply(
        f"{_OP}_backward",
        d_out, d_h_n, d_c_n, d_cells, d_gates, h0, c0, w_hh, outputs, cells, gates,
        **c.attrs,
    )  # fmt: skip
    d_b_hh = d_projected.sum((0, 1)) if c.needs_input_grad[4] else None
    return d_projected, d_h0, d_c0, d_w_hh, d_b_hh


register(
    OpDef(
        _OP,
        ("projected", "h0", "c0", "w_hh", "b_hh"),
        _recurrence_infer,
        _recurrence_kernel,
        _recurrence_vjp,
        attrs={"reverse": False},
        n_outputs=5,
        doc="One LSTM layer and direction over a sequence of input projections (L, N, 4H): "
        "(outputs, h_n, c_n, cells, gates); cells and the activated gates are saved for the "
        "backward. b_hh is a tensor or 0.0.",
    )
)


def _backward_infer(
    d_out, d_h_n, d_c_n, d_cells, d_gates, h0, c0, w_hh, outputs, cells, gates, reverse
):
    op = f"{_OP}_backward"
    length, batch, hidden = _check_recurrence(op, gates, h0, c0, w_hh, 0.0)
    sequence = (length, batch, hidden)
    wanted = (
        ("d_out", d_out, sequence), ("d_h_n", d_h_n, (batch, hidden)),
        ("d_c_n", d_c_n, (batch, hidden)), ("d_cells", d_cells, sequence),
        ("d_gates", d_gates, tuple(gates.shape)), ("outputs", outputs, sequence),
        ("cells", cells, sequence),
    )  # fmt: skip
    for name, t, shape in wanted:
        if not _is_tensor(t):
            if name in ("d_cells", "d_gates") and t == 0:
                continue  # a zero gradient
            raise ValueError(f"{op}: {name} must be a tensor, got {t!r}")
        if t.dtype is not gates.dtype or tuple(t.shape) != shape:
            raise ValueError(
                f"{op}: expected {name} of shape {shape} and dtype {gates.dtype}, got "
                f"{tuple(t.shape)} {t.dtype}"
            )
    dt = gates.dtype
    state = AVal((batch, hidden), dt)
    return AVal(tuple(gates.shape), dt), state, state, AVal(tuple(w_hh.shape), dt)


def _backward_kernel(
    d_out, d_h_n, d_c_n, d_cells, d_gates, h0, c0, w_hh, outputs, cells, gates, reverse
):
    length, batch, four_h = gates.shape
    hidden = four_h // 4
    d_cells = np.broadcast_to(d_cells, cells.shape)
    d_gates = np.broadcast_to(d_gates, gates.shape)
    d_pre = np.empty(gates.shape, gates.dtype)
    d_w_hh = np.zeros(w_hh.shape, gates.dtype)
    d_h, d_c = d_h_n, d_c_n
    steps = list(_time_steps(length, reverse))
    for k in range(length - 1, -1, -1):  # the forward's steps, last first
        t = steps[k]
        h_prev = h0 if k == 0 else outputs[steps[k - 1]]
        c_prev = c0 if k == 0 else cells[steps[k - 1]]
        i, f, g, o = np.split(gates[t], 4, axis=-1)
        di, df, dg, do = np.split(d_gates[t], 4, axis=-1)
        tanh_c = np.tanh(cells[t])
        d_h = d_out[t] + d_h
        d_c = d_c + d_cells[t] + d_h * o * (1 - tanh_c * tanh_c)
        pre = d_pre[t]
        pre[:, :hidden] = (d_c * g + di) * i * (1 - i)
        pre[:, hidden : 2 * hidden] = (d_c * c_prev + df) * f * (1 - f)
        pre[:, 2 * hidden : 3 * hidden] = (d_c * i + dg) * (1 - g * g)
        pre[:, 3 * hidden :] = (d_h * tanh_c + do) * o * (1 - o)
        d_w_hh += np.matmul(pre.T, h_prev)
        d_h = np.matmul(pre, w_hh)
        d_c = d_c * f
    return d_pre, d_h, np.array(d_c, copy=True), d_w_hh


register(
    OpDef(
        f"{_OP}_backward",
        (
            "d_out",
            "d_h_n",
            "d_c_n",
            "d_cells",
            "d_gates",
            "h0",
            "c0",
            "w_hh",
            "outputs",
            "cells",
            "gates",
        ),  # fmt: skip
        _backward_infer,
        _backward_kernel,
        None,
        attrs={"reverse": False},
        n_outputs=4,
        unsupported={"vjp": "double backward through lstm_recurrence is not implemented"},
        doc="Backpropagation through time of lstm_recurrence: gradients of the projections, "
        "h0, c0 and w_hh (d_cells and d_gates may be 0.0: no gradient).",
    )
)


def lstm_recurrence(
    projected: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_hh: Tensor,
    b_hh: Tensor | None = None,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer and direction over input projections ``projected`` (L, N, 4H) from state
    ``h0``, ``c0`` (N, H): ``(outputs (L, N, H), h_n, c_n)``; ``reverse`` runs from the last step.
    """
    operands = [projected, h0, c0, w_hh] + ([] if b_hh is None else [b_hh])
    # One dtype for all (the unrolled cell's type promotion): under autocast the projections
    # may be half while the state and the weights are float32.
    common = result_type(*operands)
    operands = [t if t.dtype is common else t.to(common) for t in operands]
    if b_hh is None:
        operands.append(0.0)
    outputs, h_n, c_n, _, _ = apply(_OP, *operands, reverse=reverse)
    return outputs, h_n, c_n


def lstm(
    input: Tensor,  # noqa: A002  (PyTorch's argument name)
    hx: tuple[Tensor, Tensor] | None,
    params: Sequence[Tensor],
    num_layers: int = 1,
    batch_first: bool = False,
    has_biases: bool = True,
    dropout: float = 0.0,
    training: bool = False,
    bidirectional: bool = False,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """A multi-layer LSTM over a sequence, as ``torch.nn.LSTM``'s forward.

    ``input``: (L, N, I), or (N, L, I) with ``batch_first``, or unbatched (L, I).
    ``hx``: (h0, c0), each (num_layers * num_directions, N, H) (or without N when unbatched);
    None means zeros. ``params``: per layer and direction, ``w_ih, w_hh[, b_ih, b_hh]`` in
    torch's order (layer 0 forward, layer 0 reverse, layer 1 forward, ...). ``dropout`` applies
    to the outputs of every layer but the last, when ``training``.
    Returns ``output`` (L, N, num_directions * H) (batch-first if asked) and ``(h_n, c_n)``.
    """
    import lucid

    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * directions * per:
        raise ValueError(
            f"lstm: expected {num_layers * directions * per} parameter tensors for "
            f"{num_layers} layer(s), {directions} direction(s), has_biases={has_biases}; got "
            f"{len(params)}"
        )
    if input.ndim not in (2, 3):
        raise ValueError(f"lstm: expected a 2-d or 3-d input, got shape {tuple(input.shape)}")
    unbatched = input.ndim == 2
    x = input.reshape(input.shape[0], 1, input.shape[1]) if unbatched else input
    if batch_first and not unbatched:
        x = x.transpose(0, 1)
    seq_len, batch = x.shape[:2]
    hidden = params[1].shape[1]
    state_shape = (num_layers * directions, batch, hidden)
    if hx is None:
        h0 = lucid.zeros(*state_shape, dtype=x.dtype)
        c0 = lucid.zeros(*state_shape, dtype=x.dtype)
    else:
        h0, c0 = hx
        if unbatched:
            h0 = h0.reshape(h0.shape[0], 1, h0.shape[-1])
            c0 = c0.reshape(c0.shape[0], 1, c0.shape[-1])
        for name, t in (("h0", h0), ("c0", c0)):
            if tuple(t.shape) != state_shape:
                raise ValueError(
                    f"lstm: expected {name} of shape {state_shape}, got {tuple(t.shape)}"
                )
    h0s, c0s = h0.unbind(0), c0.unbind(0)
    h_n: list[Tensor] = []
    c_n: list[Tensor] = []
    layer_input = x
    for layer in range(num_layers):
        dir_outputs = []
        for d in range(directions):
            idx = layer * directions + d
            w_ih, w_hh, *biases = params[idx * per : (idx + 1) * per]
            b_ih, b_hh = biases if has_biases else (None, None)
            projected = _linear(layer_input, w_ih, b_ih)
            outs, h, c = lstm_recurrence(projected, h0s[idx], c0s[idx], w_hh, b_hh, d == 1)
            dir_outputs.append(outs)
            h_n.append(h)
            c_n.append(c)
        layer_input = dir_outputs[0] if directions == 1 else lucid.cat(dir_outputs, -1)
        if dropout > 0 and training and layer < num_layers - 1:
            layer_input = lucid.dropout(layer_input, dropout, True)
    output = layer_input
    h_stack, c_stack = lucid.stack(h_n, 0), lucid.stack(c_n, 0)
    if unbatched:
        output = output.reshape(seq_len, output.shape[-1])
        h_stack = h_stack.reshape(h_stack.shape[0], hidden)
        c_stack = c_stack.reshape(c_stack.shape[0], hidden)
    elif batch_first:
        output = output.transpose(0, 1)
    return output, (h_stack, c_stack)
