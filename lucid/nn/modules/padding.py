"""Padding layers: ``ConstantPad1d/2d/3d``, ``ZeroPad1d/2d/3d``, ``ReflectionPad1d/2d/3d``,
``ReplicationPad1d/2d/3d``, ``CircularPad1d/2d/3d``, all through ``F.pad``."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules._utils import ntuple
from lucid.nn.modules.module import Module

__all__ = [
    f"{kind}Pad{n}d"
    for kind in ("Constant", "Zero", "Reflection", "Replication", "Circular")
    for n in (1, 2, 3)
]


class _PadNd(Module):
    """Pads the last ``_dims`` dims: ``padding`` is an int (every side) or ``2 * _dims`` ints
    (left, right, top, bottom, front, back), as torch."""

    _dims = 1
    _mode = "constant"

    def __init__(self, padding: Any, value: float = 0.0) -> None:
        super().__init__()
        self.padding = tuple(ntuple(padding, 2 * self._dims, "padding"))
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in self.padding):
            raise TypeError(f"{type(self).__name__}: padding must be ints, got {padding!r}")
        self.value = value

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.ndim not in (self._dims + 1, self._dims + 2):
            raise ValueError(
                f"{type(self).__name__}: expected {self._dims + 1}D or {self._dims + 2}D input, "
                f"got {input.ndim}D input"
            )
        if self._mode == "constant":
            return F.pad(input, self.padding, "constant", self.value)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        if type(self).__name__.startswith("Constant"):
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


def _pad_class(kind: str, mode: str, dims: int) -> type:
    name = f"{kind}Pad{dims}d"
    doc = f"Pads the last {dims} dim(s) in ``{mode}`` mode (as ``torch.nn.{name}``)."
    attrs: dict[str, Any] = {"_dims": dims, "_mode": mode, "__doc__": doc}
    if kind == "Constant":

        def __init__(self: _PadNd, padding: Any, value: float) -> None:  # noqa: N807
            _PadNd.__init__(self, padding, value)

        attrs["__init__"] = __init__
    elif kind == "Zero":

        def __init__(self: _PadNd, padding: Any) -> None:  # noqa: N807
            _PadNd.__init__(self, padding, 0.0)

        attrs["__init__"] = __init__
    else:

        def __init__(self: _PadNd, padding: Any) -> None:  # noqa: N807
            _PadNd.__init__(self, padding)

        attrs["__init__"] = __init__
    cls = type(name, (_PadNd,), attrs)
    cls.__module__ = __name__
    return cls


_MODES = {
    "Constant": "constant",
    "Zero": "constant",
    "Reflection": "reflect",
    "Replication": "replicate",
    "Circular": "circular",
}
for _kind, _mode in _MODES.items():
    for _dims in (1, 2, 3):
        _cls = _pad_class(_kind, _mode, _dims)
        globals()[_cls.__name__] = _cls
