"""``LSTM``, ``GRU`` and ``RNN`` (multi-layer, optionally bidirectional) and their one-step
cells, with torch's parameter names and layout.

The LSTM maths is the functional ``lucid.nn.functional.lstm`` (one ``lstm_recurrence`` op per
layer and direction); only LSTMs with projections (``proj_size > 0``), which it does not cover,
are unrolled here. The GRU is unrolled here from torch's equations.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import check_positive_int, empty_parameter, factory_dtype
from lucid.nn.modules.module import Module

__all__ = ["GRU", "LSTM", "RNN", "RNNCell", "LSTMCell", "GRUCell"]


def _lstm_direction(
    steps: list[Tensor],
    h: Tensor | None,
    c: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    w_hr: Tensor | None,
    reverse: bool,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """Run one direction of one layer over precomputed input projections ``steps[t]`` (N, 4H).

    ``h``/``c`` None means a zero initial state: the first step then skips the recurrent matmul,
    which keeps the unrolled graph free of shape-dependent constants.
    """
    outs: list[Tensor | None] = [None] * len(steps)
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    for t in order:
        gates = steps[t]
        if h is not None:
            gates = gates + F.linear(h, w_hh, b_hh)
        elif b_hh is not None:
            gates = gates + b_hh
        i, f, g, o = gates.chunk(4, -1)  # torch's gate order
        i, f, g, o = lucid.sigmoid(i), lucid.sigmoid(f), lucid.tanh(g), lucid.sigmoid(o)
        c = i * g if c is None else f * c + i * g
        h = o * lucid.tanh(c)
        if w_hr is not None:
            h = F.linear(h, w_hr)
        outs[t] = h
    if h is None or c is None:
        raise ValueError("LSTM: the input sequence has no time steps")
    return [o for o in outs if o is not None], h, c


class _RNNBase(Module):
    """What LSTM, GRU and RNN share: torch's parameter names per layer and direction, their init."""

    #: Parameter name stems, in the order ``_weights`` returns them (absent ones as None).
    _weight_stems: tuple[str, ...] = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if getattr(self, "proj_size", 0):  # LSTM's
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":  # RNN's
            s += f", nonlinearity={self.nonlinearity!r}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _make_weights(self, gates: int, dt: Any, proj_size: int = 0) -> None:
        """torch's parameters per layer and direction: ``gates`` stacked gate blocks, and with
        ``proj_size`` the LSTM projection ``weight_hr``."""
        out_size = proj_size if proj_size > 0 else self.hidden_size
        dirs = 2 if self.bidirectional else 1
        gate = gates * self.hidden_size
        for layer in range(self.num_layers):
            layer_in = self.input_size if layer == 0 else out_size * dirs
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                setattr(self, "weight_ih" + sfx, empty_parameter((gate, layer_in), dt))
                setattr(self, "weight_hh" + sfx, empty_parameter((gate, out_size), dt))
                if self.bias:
                    setattr(self, "bias_ih" + sfx, empty_parameter((gate,), dt))
                    setattr(self, "bias_hh" + sfx, empty_parameter((gate,), dt))
                if proj_size > 0:
                    shape = (proj_size, self.hidden_size)
                    setattr(self, "weight_hr" + sfx, empty_parameter(shape, dt))

    def _configure(
        self,
        name: str,
        gates: int,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        bias: bool,
        batch_first: bool,
        dropout: float,
        bidirectional: bool,
        device: Any,
        dtype: Any,
    ) -> None:
        """Check the constructor arguments of the one-state nets (GRU, RNN), keep them, make and
        initialise ``gates`` stacked weight blocks per layer and direction."""
        for name, v in (
            ("input_size", input_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            check_positive_int(v, name, name)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0.0 <= dropout <= 1.0
        ):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of an "
                f"element being zeroed, got {dropout!r}"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                f"num_layers={num_layers}",
                UserWarning,
                stacklevel=3,
            )
        dt = factory_dtype(device, dtype)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        self._make_weights(gates, dt)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """No-op (cuDNN weight packing has no meaning here); kept for torch compatibility."""

    def _run_single_state(
        self,
        input: Tensor,
        hx: Tensor | None,
        name: str,
        direction: Any,  # noqa: A002
    ) -> tuple[Tensor, Tensor]:
        """The multi-layer loop of the recurrent nets with one state (GRU, RNN): ``direction``
        runs one layer and direction over precomputed input projections."""
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a Tensor, got {type(input).__name__}")
        if input.ndim not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise ValueError(
                f"{name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {input.shape[-1]}"
            )
        batched = input.ndim == 3
        x = input.transpose(0, 1) if batched and self.batch_first else input
        if not batched:
            x = x.unsqueeze(1)
        dirs = 2 if self.bidirectional else 1
        h0s: list[Tensor | None] = [None] * (self.num_layers * dirs)
        if hx is not None:
            if not isinstance(hx, Tensor):
                raise TypeError(f"{name}: hx must be a Tensor, got {type(hx).__name__}")
            want_ndim = 3 if batched else 2
            if hx.ndim != want_ndim:
                raise RuntimeError(
                    f"{name}: for {'batched 3-D' if batched else 'unbatched 2-D'} input, hx should "
                    f"also be {want_ndim}-D but got {hx.ndim}-D tensor"
                )
            h0 = hx if batched else hx.unsqueeze(1)
            want = (self.num_layers * dirs, x.shape[1], self.hidden_size)
            if tuple(h0.shape) != want:
                got = tuple(h0.shape) if batched else tuple(hx.shape)
                want_shown = want if batched else (want[0], want[2])
                raise RuntimeError(f"{name}: Expected hidden size {want_shown}, got {got}")
            h0s = list(h0.unbind(0))
        h_n: list[Tensor] = []
        layer_input = x
        for layer in range(self.num_layers):
            dir_outputs = []
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                steps = list(F.linear(layer_input, w_ih, b_ih).unbind(0))
                outs, h = direction(steps, h0s[layer * dirs + d], w_hh, b_hh, reverse=d == 1)
                dir_outputs.append(lucid.stack(outs, 0))
                h_n.append(h)
            layer_input = dir_outputs[0] if dirs == 1 else lucid.cat(dir_outputs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        output, h_n_t = layer_input, lucid.stack(h_n, 0)
        if not batched:
            return output.squeeze(1), h_n_t.squeeze(1)
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, h_n_t

    def _weights(self, layer: int, direction: int) -> tuple:
        sfx = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        return tuple(self._parameters.get(stem + sfx) for stem in self._weight_stems)


class LSTM(_RNNBase):
    """Long short-term memory over (T, N, input_size) inputs ((N, T, ...) with ``batch_first``).

    ``forward(input, (h_0, c_0)=None)`` returns ``output, (h_n, c_n)`` as torch. Gates are ordered
    i, f, g, o in ``weight_ih_l{k}`` (4*hidden_size, input) and ``weight_hh_l{k}``; every
    parameter starts as U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)).
    """

    _weight_stems = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        for name, v in (
            ("input_size", input_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            check_positive_int(v, name, "LSTM")
        if isinstance(dropout, bool) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout should be a number in range [0, 1], got {dropout}")
        if isinstance(proj_size, bool) or not isinstance(proj_size, int):
            raise TypeError(f"LSTM: proj_size must be an int, got {proj_size!r}")
        if not 0 <= proj_size < hidden_size:
            raise ValueError(
                f"LSTM: proj_size ({proj_size}) must be in [0, hidden_size={hidden_size})"
            )
        dt = factory_dtype(device, dtype)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        self._make_weights(4, dt, proj_size)
        self.reset_parameters()

    def _flat_weights(self) -> list[Tensor]:
        """Parameters in the functional form's order: per layer and direction, w_ih, w_hh[, b_ih,
        b_hh]."""
        dirs = 2 if self.bidirectional else 1
        flat = []
        for layer in range(self.num_layers):
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh, _ = self._weights(layer, d)
                flat += [w_ih, w_hh] + ([b_ih, b_hh] if self.bias else [])
        return flat

    def forward(
        self,
        input: Tensor,
        hx: tuple[Tensor, Tensor] | None = None,  # noqa: A002
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if input.ndim not in (2, 3):
            raise ValueError(f"LSTM: expected input to be 2-D or 3-D, got {input.ndim}-D")
        if input.shape[-1] != self.input_size:
            raise ValueError(
                f"LSTM: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {input.shape[-1]}"
            )
        batched = input.ndim == 3
        x = input if not batched or not self.batch_first else input.transpose(0, 1)
        if not batched:
            x = x.unsqueeze(1)
        dirs = 2 if self.bidirectional else 1
        out_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        h0s: list[Any] = [None] * (self.num_layers * dirs)
        c0s: list[Any] = [None] * (self.num_layers * dirs)
        if hx is not None:
            h0, c0 = hx
            if not batched:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
            n = x.shape[1]
            for name, t, size in (("h_0", h0, out_size), ("c_0", c0, self.hidden_size)):
                want = (self.num_layers * dirs, n, size)
                if tuple(t.shape) != want:
                    raise ValueError(f"LSTM: expected {name} of shape {want}, got {tuple(t.shape)}")
            h0s, c0s = list(h0.unbind(0)), list(c0.unbind(0))
        if self.proj_size == 0:
            if hx is None:
                # Zeros built from the input (not from its shape) stay valid under a symbolic batch.
                zero = lucid.zeros_like(x[0, :, :1]).expand(self.num_layers * dirs, -1, out_size)
                hx = (zero, zero) if batched else (zero.squeeze(1), zero.squeeze(1))
            return F.lstm(
                input,
                hx,
                self._flat_weights(),
                self.num_layers,
                self.batch_first,
                self.bias,
                self.dropout,
                self.training,
                self.bidirectional,
            )
        # Projections (proj_size > 0) are not in the functional form: unroll here.
        h_n, c_n = [], []
        layer_input = x
        for layer in range(self.num_layers):
            dir_outputs = []
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, d)
                steps = list(F.linear(layer_input, w_ih, b_ih).unbind(0))
                idx = layer * dirs + d
                outs, h, c = _lstm_direction(
                    steps, h0s[idx], c0s[idx], w_hh, b_hh, w_hr, reverse=d == 1
                )
                dir_outputs.append(lucid.stack(outs, 0))
                h_n.append(h)
                c_n.append(c)
            layer_input = dir_outputs[0] if dirs == 1 else lucid.cat(dir_outputs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        output, h_n_t, c_n_t = layer_input, lucid.stack(h_n, 0), lucid.stack(c_n, 0)
        if not batched:
            return output.squeeze(1), (h_n_t.squeeze(1), c_n_t.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n_t, c_n_t)


def _gru_direction(
    steps: list[Tensor],
    h: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    reverse: bool,
) -> tuple[list[Tensor], Tensor]:
    """Run one direction of one GRU layer over precomputed input projections ``steps[t]``
    (N, 3H), torch's equations with gates ordered r, z, n:

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    ``h`` None means a zero initial state (the first step skips the recurrent matmul).
    """
    outs: list[Tensor | None] = [None] * len(steps)
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    for t in order:
        i_r, i_z, i_n = steps[t].chunk(3, -1)
        if h is not None:
            h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)
            r, z = lucid.sigmoid(i_r + h_r), lucid.sigmoid(i_z + h_z)
            n = lucid.tanh(i_n + r * h_n)
            h = n + z * (h - n)  # (1 - z) * n + z * h
        elif b_hh is not None:
            h_r, h_z, h_n = b_hh.chunk(3, -1)
            r, z = lucid.sigmoid(i_r + h_r), lucid.sigmoid(i_z + h_z)
            n = lucid.tanh(i_n + r * h_n)
            h = n - z * n
        else:
            z = lucid.sigmoid(i_z)
            n = lucid.tanh(i_n)
            h = n - z * n
        outs[t] = h
    if h is None:
        raise ValueError("GRU: the input sequence has no time steps")
    return [o for o in outs if o is not None], h


class GRU(_RNNBase):
    """Gated recurrent unit over (L, N, input_size) inputs ((N, L, ...) with ``batch_first``,
    (L, input_size) unbatched), as ``torch.nn.GRU``.

    ``forward(input, h_0=None)`` returns ``output, h_n``: ``output`` holds the last layer's hidden
    state at every step (both directions concatenated when ``bidirectional``), ``h_n`` the final
    hidden state of every layer and direction, (num_layers * D, N, hidden_size). Gates are
    ordered r, z, n in ``weight_ih_l{k}`` (3*hidden_size, input) and ``weight_hh_l{k}``
    (3*hidden_size, hidden_size); every parameter starts as U(-1/sqrt(hidden_size),
    1/sqrt(hidden_size)). ``dropout`` applies to the outputs of every layer but the last, in
    training mode.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self._configure(
            "GRU", 3, input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, device, dtype,
        )  # fmt: skip

    def forward(
        self,
        input: Tensor,  # noqa: A002
        hx: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        return self._run_single_state(input, hx, "GRU", _gru_direction)


def _rnn_direction(
    steps: list[Tensor],
    h: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    reverse: bool,
    activation: Any = lucid.tanh,
) -> tuple[list[Tensor], Tensor]:
    """One direction of one Elman-RNN layer: h' = act(W_ih x + b_ih + W_hh h + b_hh), over
    precomputed input projections ``steps[t]`` (N, H); ``h`` None is a zero initial state."""
    outs: list[Tensor | None] = [None] * len(steps)
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    for t in order:
        pre = steps[t]
        if h is not None:
            pre = pre + F.linear(h, w_hh, b_hh)
        elif b_hh is not None:
            pre = pre + b_hh
        h = activation(pre)
        outs[t] = h
    if h is None:
        raise ValueError("RNN: the input sequence has no time steps")
    return [o for o in outs if o is not None], h


_NONLINEARITIES = {"tanh": lucid.tanh, "relu": F.relu}


def _nonlinearity(name: str, who: str) -> Any:
    if name not in _NONLINEARITIES:
        raise ValueError(f"{who}: unknown nonlinearity {name!r}; expected 'tanh' or 'relu'")
    return _NONLINEARITIES[name]


class RNN(_RNNBase):
    """Elman RNN, h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) (or ReLU with
    ``nonlinearity="relu"``), over (L, N, input_size) inputs ((N, L, ...) with ``batch_first``,
    (L, input_size) unbatched), as ``torch.nn.RNN``: ``forward(input, h_0=None)`` returns
    ``output, h_n``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self._activation = _nonlinearity(nonlinearity, "RNN")
        self.nonlinearity = nonlinearity
        self._configure(
            "RNN", 1, input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, device, dtype,
        )  # fmt: skip

    def forward(
        self,
        input: Tensor,  # noqa: A002
        hx: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        def direction(steps, h, w_hh, b_hh, reverse):
            return _rnn_direction(steps, h, w_hh, b_hh, reverse, self._activation)

        return self._run_single_state(input, hx, "RNN", direction)


class _RNNCellBase(Module):
    """What the cells share: ``weight_ih`` (gates*H, I), ``weight_hh`` (gates*H, H), optional
    ``bias_ih``/``bias_hh``, all U(-1/sqrt(H), 1/sqrt(H)); inputs (N, I) or unbatched (I,)."""

    _gates = 1

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool, device: Any, dtype: Any
    ) -> None:
        super().__init__()
        who = type(self).__name__
        check_positive_int(input_size, "input_size", who)
        check_positive_int(hidden_size, "hidden_size", who)
        dt = factory_dtype(device, dtype)
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        gate = self._gates * hidden_size
        self.weight_ih = empty_parameter((gate, input_size), dt)
        self.weight_hh = empty_parameter((gate, hidden_size), dt)
        if bias:
            self.bias_ih = empty_parameter((gate,), dt)
            self.bias_hh = empty_parameter((gate,), dt)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def _batched_input(self, input: Tensor) -> tuple[Tensor, bool]:  # noqa: A002
        who = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{who}: input must be a Tensor, got {type(input).__name__}")
        if input.ndim not in (1, 2):
            raise ValueError(f"{who}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise ValueError(
                f"{who}: input has {input.shape[-1]} features, expected input_size="
                f"{self.input_size}"
            )
        return (input, True) if input.ndim == 2 else (input.unsqueeze(0), False)

    def _batched_state(self, h: Tensor | None, x: Tensor, batched: bool) -> Tensor | None:
        if h is None:
            return None
        h = h if batched else h.unsqueeze(0)
        if tuple(h.shape) != (x.shape[0], self.hidden_size):
            raise ValueError(
                f"{type(self).__name__}: hidden state has shape {tuple(h.shape)}, expected "
                f"{(x.shape[0], self.hidden_size) if batched else (self.hidden_size,)}"
            )
        return h

    def _projected(self, x: Tensor) -> list[Tensor]:
        return [F.linear(x, self.weight_ih, self.bias_ih)]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        return s if self.bias else s + ", bias=False"


class RNNCell(_RNNCellBase):
    """One Elman-RNN step: h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (or ReLU); ``h`` defaults to
    zeros."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        self._activation = _nonlinearity(nonlinearity, "RNNCell")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        x, batched = self._batched_input(input)
        h = self._batched_state(hx, x, batched)
        _, h = _rnn_direction(
            self._projected(x), h, self.weight_hh, self.bias_hh, False, self._activation
        )
        return h if batched else h.squeeze(0)


class GRUCell(_RNNCellBase):
    """One GRU step with torch's equations and gate order (r, z, n); ``h`` defaults to zeros."""

    _gates = 3

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        x, batched = self._batched_input(input)
        h = self._batched_state(hx, x, batched)
        _, h = _gru_direction(self._projected(x), h, self.weight_hh, self.bias_hh, False)
        return h if batched else h.squeeze(0)


class LSTMCell(_RNNCellBase):
    """One LSTM step with torch's gate order (i, f, g, o): ``forward(input, (h, c)=None)``
    returns ``(h', c')``; the state defaults to zeros."""

    _gates = 4

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def forward(
        self,
        input: Tensor,  # noqa: A002
        hx: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        x, batched = self._batched_input(input)
        h = c = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError("LSTMCell: hx must be a tuple (h_0, c_0)")
            h = self._batched_state(hx[0], x, batched)
            c = self._batched_state(hx[1], x, batched)
        _, h, c = _lstm_direction(
            self._projected(x), h, c, self.weight_hh, self.bias_hh, None, False
        )
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))
