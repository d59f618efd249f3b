"""``Parameter``: a Tensor that a Module registers as one of its learnable weights."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor, _as_array


class Parameter(Tensor):
    """A leaf Tensor that requires grad by default and that ``Module.__setattr__`` registers.

    ``Parameter(t)`` shares ``t``'s memory, as ``torch.nn.Parameter`` does.

    >>> w = lucid.nn.Parameter(lucid.zeros(2, 3))
    >>> w.requires_grad
    True
    """

    def __init__(self, data: Any = None, requires_grad: bool = True):
        if isinstance(data, Tensor):
            if data._data is None:
                raise TypeError("Parameter() cannot wrap a trace tensor")
            arr = data._data
            version = data._version
        else:
            arr = _as_array(data if data is not None else [])
            version = [0]
        self._data = arr
        self._trace = None
        self._grad = None
        self._node = None
        self._out_idx = 0
        self._version = version
        self._retains_grad = False
        self._requires_grad = False
        if requires_grad:
            self.requires_grad = True

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_rebuild_parameter, (self._data, self._requires_grad))

    def __deepcopy__(self, memo: dict) -> Parameter:
        if id(self) in memo:
            return memo[id(self)]
        out = Parameter(Tensor._wrap(self._data.copy()), self._requires_grad)
        if self._grad is not None:
            out._grad = Tensor._wrap(self._grad._data.copy())
        memo[id(self)] = out
        return out


def _rebuild_parameter(data: Any, requires_grad: bool) -> Parameter:
    return Parameter(Tensor._wrap(data), requires_grad)
