"""LSTM maths as compositions of Lucid ops (linear, sigmoid, tanh), unrolled over time.

Gate order is PyTorch's: input, forget, cell (g), output. The input projections of all time steps
run as one ``linear`` before the loop; each step then adds the recurrent projection.
"""

from __future__ import annotations

from collections.abc import Sequence

from lucid._dispatch import apply
from lucid._tensor import Tensor

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


def _run_direction(
    projected: list[Tensor],
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    b_hh: Tensor | None,
    reverse: bool,
) -> tuple[list[Tensor], Tensor, Tensor]:
    steps = range(len(projected) - 1, -1, -1) if reverse else range(len(projected))
    outs: list[Tensor | None] = [None] * len(projected)
    for t in steps:
        h, c = _gates_to_state(projected[t] + _linear(h, w_hh, b_hh), c)
        outs[t] = h
    return outs, h, c  # type: ignore[return-value]


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
            projected = list(_linear(layer_input, w_ih, b_ih).unbind(0))
            outs, h, c = _run_direction(projected, h0s[idx], c0s[idx], w_hh, b_hh, d == 1)
            dir_outputs.append(lucid.stack(outs, 0))
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
