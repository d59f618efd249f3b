"""The Tensor: a numpy array (or, under a tracer, a shape-only trace value) plus autograd state.

Op methods (``x.exp()``, ``x + y``, ``x.sum(1)``) are attached by the op modules in ``lucid.ops``
next to each op's registry entry; this file holds only what is not an op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid import _dtype
from lucid._state import state


class device:  # noqa: N801  (torch.device)
    """Where a tensor lives: ``"cpu"`` everywhere, ``"metal"`` where the MPSGraph backend runs."""

    __slots__ = ("type",)

    def __init__(self, type: str | device = "cpu"):  # noqa: A002
        if isinstance(type, device):
            type = type.type
        if type not in ("cpu", "metal"):
            raise ValueError(
                f"unknown device {type!r}: Lucid's devices are 'cpu' (every machine) and "
                "'metal' (Apple Silicon GPU through the MPSGraph backend)"
            )
        if type == "metal":
            raise RuntimeError(
                "device 'metal' needs the MPSGraph backend (Apple Silicon, macOS 14+); "
                "it is not available on this machine"
            )
        self.type = type

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.type == other
        return isinstance(other, device) and other.type == self.type

    def __hash__(self) -> int:
        return hash(self.type)

    def __repr__(self) -> str:
        return f"device(type='{self.type}')"

    def __str__(self) -> str:
        return self.type


CPU = device("cpu")


def _graph_break(t: Tensor, what: str):
    # Under a tracer even a concrete tensor's value must not be read: it would be baked into the
    # graph as a constant and go stale when the tensor changes.
    tracer = state.tracer
    if tracer is not None:
        return tracer.graph_break(what, t)
    raise RuntimeError(f"{what}: this is a trace tensor from a finished trace; it has no value")


class Tensor:
    """An n-dimensional array with reverse-mode autograd, the PyTorch way.

    >>> x = lucid.tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward(); x.grad
    tensor([2., 4.])
    """

    __slots__ = (
        "_data",
        "_trace",
        "_requires_grad",
        "_grad",
        "_node",
        "_out_idx",
        "_version",
        "_retains_grad",
        "__weakref__",
        "__dict__",
    )
    __array_priority__ = 1000  # numpy defers to Tensor's reflected operators

    def __init__(self, *args: Any, dtype: Any = None, requires_grad: bool = False):
        """``Tensor(*sizes)``, ``Tensor(data)`` or ``Tensor(tensor)`` with PyTorch's legacy
        semantics (float32; sizes give a zero-filled tensor, a tensor is aliased). With an
        explicit ``dtype``, ``Tensor(data, dtype=...)`` is a copy of ``data`` in that dtype."""
        version = [0]
        if dtype is not None:
            if len(args) > 1:
                raise TypeError("Tensor(data, dtype=...) takes one data argument")
            arr = _as_array(args[0] if args and args[0] is not None else [], dtype)
        else:
            arr = _legacy_array(args, _dtype.default_float, "Tensor")
            if len(args) == 1 and isinstance(args[0], Tensor):
                version = args[0]._version
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

    @classmethod
    def _wrap(cls, arr: np.ndarray) -> Tensor:
        t = object.__new__(cls)
        t._data = arr
        t._trace = None
        t._requires_grad = False
        t._grad = None
        t._node = None
        t._out_idx = 0
        t._version = [0]
        t._retains_grad = False
        return t

    @classmethod
    def _traced(cls, trace_value: Any) -> Tensor:
        """A shape-only tensor standing for ``trace_value`` (which has ``shape`` and ``dtype``)."""
        t = cls._wrap(None)  # type: ignore[arg-type]
        t._trace = trace_value
        return t

    # --- metadata -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        d = self._data
        return d.shape if d is not None else self._trace.shape

    @property
    def dtype(self) -> _dtype.dtype:
        d = self._data
        return _dtype._BY_NUMPY[d.dtype] if d is not None else self._trace.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> device:
        return CPU

    # Lucid runs on the CPU (or Metal through a compiled backend): never a CUDA, XPU or MPS tensor.
    is_cuda = False
    is_xpu = False
    is_mps = False
    is_meta = False
    is_cpu = True

    @property
    def is_traced(self) -> bool:
        return self._data is None

    def size(self, dim: int | None = None):
        s = self.shape
        if dim is None:
            return s
        from lucid.ops._registry import normalize_dim

        return s[normalize_dim(dim, len(s), "size")]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self) -> int:
        return self.dtype.itemsize

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    # --- autograd state -------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and not self.dtype.is_floating_point:
            raise RuntimeError(
                f"only floating point tensors can require gradients, not {self.dtype}"
            )
        if not value and self._node is not None:
            raise RuntimeError(
                "requires_grad can only be turned off on leaf tensors; use detach() instead"
            )
        self._requires_grad = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    @property
    def grad(self) -> Tensor | None:
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad must be a Tensor or None, not {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(
                    f"assigned grad has shape {tuple(value.shape)}, tensor has {tuple(self.shape)}"
                )
        self._grad = value

    @property
    def grad_fn(self):
        return self._node

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def retain_grad(self) -> None:
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on a tensor that does not require grad")
        self._retains_grad = True

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """``hook(self)`` runs after each backward has accumulated this leaf's gradient."""
        from lucid._autograd import register_post_accumulate_grad_hook

        return register_post_accumulate_grad_hook(self, hook)

    @property
    def _version_count(self) -> int:
        return self._version[0]

    def backward(
        self,
        gradient: Tensor | None = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        from lucid._autograd import backward

        backward(
            [self],
            None if gradient is None else [gradient],
            retain_graph,
            create_graph,
            inputs=inputs,
        )

    def detach(self) -> Tensor:
        if self._data is None:
            from lucid._dispatch import apply

            return apply("detach", self)
        t = Tensor._wrap(self._data)
        t._version = self._version
        return t

    def detach_(self) -> Tensor:
        self._node = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise TypeError("data must be a Tensor")
        self._data = value._data

    # --- values ---------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        if self._data is None or state.tracer is not None:
            return _graph_break(self, "Tensor.numpy()")
        if self._requires_grad and state.grad_enabled and self._node is not None:
            raise RuntimeError("can't call numpy() on a tensor that requires grad; use detach()")
        return self._data

    def item(self) -> Any:
        if self._data is None or state.tracer is not None:
            return _graph_break(self, "Tensor.item()")
        if self._data.size != 1:
            raise RuntimeError(
                f"item(): a tensor with {self._data.size} elements cannot be converted to a scalar"
            )
        value = self._data.reshape(()).item()
        # ml_dtypes' bfloat16 scalar is no Python float; PyTorch's item() gives one.
        return float(value) if self._data.dtype in _dtype.HALF_NUMPY else value

    def tolist(self) -> Any:
        if self._data is None or state.tracer is not None:
            return _graph_break(self, "Tensor.tolist()")
        if self._data.dtype in _dtype.HALF_NUMPY:
            return self._data.astype(np.float32).tolist()  # exact; bfloat16 gives Python floats
        return self._data.tolist()

    def __bool__(self) -> bool:
        if self._data is None or state.tracer is not None:
            return _graph_break(self, "Python control flow on a tensor (bool())")
        if self._data.size != 1:
            raise RuntimeError(
                f"the truth value of a tensor with {self._data.size} elements is ambiguous"
            )
        return bool(self._data.reshape(()))

    def __float__(self) -> float:
        return float(self.item())

    def __format__(self, spec: str) -> str:
        """A 0-d tensor formats as its number (``f"{loss:.4f}"``), as in PyTorch."""
        if self.ndim == 0:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.ndim != 0:
            raise TypeError("only integer 0-d tensors can be used as an index")
        return int(self.item())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._data is None or state.tracer is not None:
            return _graph_break(self, "np.asarray(tensor)")
        return self._data if dtype is None else self._data.astype(dtype)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        if self._data is None:
            return f"tensor(<traced>, shape={tuple(self.shape)}, dtype={self.dtype})"
        body = np.array2string(
            self._data, separator=", ", precision=4, threshold=200, prefix="tensor("
        )
        extras = []
        if self._data.dtype not in (np.float32, np.int64, np.bool_):
            extras.append(f"dtype={self.dtype}")
        if self._node is not None:
            extras.append(f"grad_fn=<{self._node.name}>")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    # --- in place -------------------------------------------------------------------------------
    def _apply_inplace(self, fn, *args: Any, **kwargs: Any) -> Tensor:
        """Run ``fn(self_alias, *args)`` out of place and write the result into ``self``.

        Autograd history is rebased onto the new node; earlier nodes that saved ``self`` see its
        version counter move and refuse to backward through the stale value.
        """
        tracer = state.tracer
        if tracer is not None:
            out = fn(self, *args, **kwargs)
            tracer.record_inplace(self, out)
            return self
        if self._node is None and self._requires_grad and state.grad_enabled:
            raise RuntimeError(
                "a leaf tensor that requires grad is being used in an in-place operation"
            )
        alias = Tensor._wrap(self._data)
        alias._version = self._version
        alias._node, alias._out_idx = self._node, self._out_idx
        alias._requires_grad = self._requires_grad
        out = fn(alias, *args, **kwargs)
        if tuple(out.shape) != tuple(self.shape):
            raise RuntimeError(
                f"in-place result has shape {tuple(out.shape)}, which does not match the "
                f"tensor's shape {tuple(self.shape)}"
            )
        if out.dtype.category > self.dtype.category:
            raise RuntimeError(
                f"result type {out.dtype} can't be cast to the in-place output type {self.dtype}"
            )
        node = out._node
        if node is not None and node.saves(alias):
            # The new node needs the old value: give it a copy before the write below.
            alias._data = self._data.copy()
            alias._version = [0]
            node.resave(alias)
        np.copyto(self._data, out._data, casting="unsafe")
        self._version[0] += 1
        if node is not None:
            self._node, self._out_idx = node, out._out_idx
            self._requires_grad = True
            node.set_output(out._out_idx, self)
        return self

    # Conversions that are not ops of their own live here; casts go through the registry.
    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        target_dtype = kwargs.pop("dtype", None)
        dev = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("copy", None)
        if kwargs:
            raise TypeError(f"to() got unexpected arguments {sorted(kwargs)}")
        for a in args:
            # A string that is no dtype name is a device ("cuda" gets the list of devices).
            if isinstance(a, device) or (isinstance(a, str) and a not in _dtype._BY_NAME):
                dev = a
            elif isinstance(a, Tensor):
                target_dtype = a.dtype
            else:
                target_dtype = a
        if dev is not None:
            device(dev)  # validates, raises for an unavailable device
        if target_dtype is None:
            return self
        return self.type(target_dtype)

    def cpu(self) -> Tensor:
        return self

    def contiguous(self) -> Tensor:
        """``self`` when its storage is row-major (always, for a trace tensor), else a
        row-major copy (differentiable), as PyTorch."""
        if self._data is None or self._data.flags.c_contiguous:
            return self
        from lucid.ops.elementwise import clone

        return clone(self)

    def is_contiguous(self) -> bool:
        """Whether the storage is row-major (C-contiguous)."""
        return self._data is None or bool(self._data.flags.c_contiguous)

    def float(self) -> Tensor:
        return self.type(_dtype.float32)

    def double(self) -> Tensor:
        return self.type(_dtype.float64)

    def half(self) -> Tensor:
        return self.type(_dtype.float16)

    def bfloat16(self) -> Tensor:
        return self.type(_dtype.bfloat16)

    def long(self) -> Tensor:
        return self.type(_dtype.int64)

    def int(self) -> Tensor:
        return self.type(_dtype.int32)

    def bool(self) -> Tensor:
        return self.type(_dtype.bool_)

    def type(self, dtype: Any = None) -> Tensor | str:
        """A copy cast to ``dtype`` (a dtype, a name or a legacy class such as
        ``lucid.LongTensor``); without an argument, the legacy type name
        (``"lucid.FloatTensor"``)."""
        if dtype is None:
            return f"lucid.{_LEGACY_NAMES.get(self.dtype, 'Tensor')}"
        if isinstance(dtype, _LegacyTensorType):
            dtype = dtype.dtype
        elif isinstance(dtype, str) and dtype.rsplit(".", 1)[-1] in _LEGACY_BY_NAME:
            dtype = _LEGACY_BY_NAME[dtype.rsplit(".", 1)[-1]]
        dt = _dtype.canonical(dtype)
        if dt is self.dtype:
            return self
        from lucid._dispatch import apply

        return apply("cast", self, dtype=dt)


def _tensor_from(data: Any, dtype: Any = None) -> Tensor:
    """A new tensor holding a copy of ``data``, its dtype inferred as ``lucid.tensor`` does."""
    return Tensor._wrap(_as_array(data, dtype))


def _is_size(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _legacy_array(args: tuple, dt: _dtype.dtype, who: str) -> np.ndarray:
    """PyTorch's legacy constructor: ``()`` is empty, ints are sizes (zero-filled: PyTorch leaves
    them uninitialised), one tensor is aliased (its dtype must be ``dt`` for a typed class), one
    other object is data converted to ``dt``."""
    if not args:
        return np.zeros((0,), dt.numpy)
    if all(_is_size(a) for a in args):
        sizes = tuple(int(a) for a in args)
        if any(n < 0 for n in sizes):
            raise ValueError(f"{who}: trying to create a tensor with negative dimension {sizes}")
        return np.zeros(sizes, dt.numpy)
    if len(args) > 1:
        kinds = ", ".join(type(a).__name__ for a in args)
        raise TypeError(f"{who}() takes sizes (ints) or one data argument, got ({kinds})")
    (data,) = args
    if isinstance(data, Tensor):
        if data._data is None:
            raise TypeError(f"{who}() cannot wrap a trace tensor")
        if who != "Tensor" and data.dtype is not dt:
            raise TypeError(f"{who}() expects a {dt} tensor, got {data.dtype}")
        return data._data
    return _as_array(data, dt)


class _LegacyTensorType(type):
    """The metaclass of ``lucid.FloatTensor`` and friends: calling one builds a tensor of its
    dtype; ``isinstance(t, lucid.FloatTensor)`` checks the dtype, as in PyTorch."""

    dtype: _dtype.dtype

    def __call__(cls, *args: Any) -> Tensor:
        arr = _legacy_array(args, cls.dtype, cls.__name__)
        out = Tensor._wrap(arr)
        if len(args) == 1 and isinstance(args[0], Tensor):
            out._version = args[0]._version
        return out

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj._data is not None and obj.dtype is cls.dtype

    def __repr__(cls) -> str:
        return f"<class 'lucid.{cls.__name__}'>"


_LEGACY_BY_NAME = {
    "FloatTensor": _dtype.float32,
    "DoubleTensor": _dtype.float64,
    "HalfTensor": _dtype.float16,
    "BFloat16Tensor": _dtype.bfloat16,
    "LongTensor": _dtype.int64,
    "IntTensor": _dtype.int32,
    "ShortTensor": _dtype.int16,
    "CharTensor": _dtype.int8,
    "ByteTensor": _dtype.uint8,
    "BoolTensor": _dtype.bool_,
}
_LEGACY_NAMES = {dt: name for name, dt in _LEGACY_BY_NAME.items()}
LEGACY_TENSOR_TYPES = {
    name: _LegacyTensorType(name, (), {"dtype": dt, "__doc__": f"Legacy {dt} tensor type."})
    for name, dt in _LEGACY_BY_NAME.items()
}


def _as_array(data: Any, dtype: Any = None) -> np.ndarray:
    if isinstance(data, Tensor):
        if data._data is None:
            raise RuntimeError("cannot build a concrete tensor from a trace tensor")
        data = data._data
    dt = _dtype.canonical(dtype) if dtype is not None else None
    if isinstance(data, np.ndarray):
        arr = data
        if dt is None and arr.dtype not in _dtype._BY_NUMPY:
            raise TypeError(f"numpy dtype {arr.dtype} has no Lucid equivalent")
    elif isinstance(data, (np.generic,)):
        arr = np.asarray(data)
    else:
        arr = np.asarray(_unwrap_nested(data))
        if dt is None:
            if arr.dtype.kind == "f":
                arr = arr.astype(_dtype.default_float.numpy)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(np.int64)
            elif arr.dtype.kind == "b":
                pass
            elif arr.size == 0:
                arr = arr.astype(_dtype.default_float.numpy)
            else:
                raise TypeError(f"cannot make a tensor from {type(data).__name__} data")
    if dt is not None and arr.dtype != dt.numpy:
        arr = arr.astype(dt.numpy)
    return np.array(arr, copy=True) if arr is data else arr


def _unwrap_nested(data: Any) -> Any:
    if isinstance(data, Tensor):
        return data.item() if data.ndim == 0 else data._data
    if isinstance(data, (list, tuple)):
        return [_unwrap_nested(x) for x in data]
    return data
