"""The op registry: one entry per op, holding everything every stage needs to know about it.

An entry (``OpDef``) carries the op's operands and attributes, its shape/dtype inference, its numpy
kernel, its VJP rule (written with Lucid ops, so the same rule runs eagerly in autograd and
symbolically under a tracer) and the properties passes read. Fronts (``lucid.exp``, ``Tensor.exp``,
``F.relu``) call ``lucid._dispatch.apply(name, ...)``; nothing else computes an op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lucid._dtype import HALF_DTYPES, dtype, finfo, result_type

# --- properties, as set memberships (tinygrad's GroupOp style)
ELEMENTWISE = "elementwise"  # output[i] depends on input[i] only (after broadcasting)
PROMOTE = "promote"  # inputs are cast to their PyTorch result type before the kernel runs
RANDOM = "random"  # consumes randomness (an RNG-state feed once compiled)
DATA_DEPENDENT = "data_dependent"  # output shape depends on input values: a graph break
GRAD_SINK = "grad_sink"  # gradient deliberately stops here (comparisons, argmax, int casts)
SYMBOLIC_BATCH_SAFE = "symbolic_batch_safe"  # correct under a symbolic leading (batch) axis
REQUIRED = object()  # an attribute with no default


@dataclass(frozen=True, slots=True)
class AVal:
    """An abstract value: what shape/dtype inference and the tracer see of a tensor.

    A dimension is an int, or None when symbolic.
    """

    shape: tuple
    dtype: dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


class VJPContext:
    """What a VJP rule sees: the op's inputs, outputs and attributes, and which grads are wanted.

    In eager autograd the inputs/outputs are Tensors; under a tracer they are trace tensors. A rule
    uses Lucid ops only, so it does not know which.
    """

    __slots__ = ("inputs", "outputs", "attrs", "needs_input_grad")

    def __init__(self, inputs, outputs, attrs, needs_input_grad):
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs
        self.needs_input_grad = needs_input_grad


@dataclass(eq=False)
class OpDef:
    """One op. ``kernel(*arrays, **attrs)`` and ``infer(*avals, **attrs)`` take the operands in
    order; a variadic operand (its name ends in ``*``) is passed as one list.

    ``vjp(ctx, *output_grads)`` returns one gradient (or None) per operand (for a variadic operand,
    a list). Gradients of broadcast operands may keep the broadcast shape: autograd and the ``vjp``
    pass reduce them to the operand's shape. ``vjp=None`` without ``GRAD_SINK`` means "no rule":
    backward through it raises an error naming the op.
    """

    name: str
    operands: tuple[str, ...]
    infer: Callable[..., AVal | tuple[AVal, ...]]
    kernel: Callable[..., Any]
    vjp: Callable[..., Sequence[Any]] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    props: frozenset[str] = frozenset()
    n_outputs: int = 1
    # Which of the op's operands/outputs the VJP rule reads: only those are version-checked.
    saves_inputs: bool = True
    saves_outputs: bool = True
    # Parts this op deliberately lacks, with the reason users see: {"vjp": "...", "cpu": "..."}.
    unsupported: dict[str, str] = field(default_factory=dict)
    doc: str = ""
    # Operands whose VJP is None by design even when they require grad, with why (a zero
    # gradient: e.g. read only for its shape). Any other None for such an operand makes
    # backward() raise, naming the op and the operand.
    no_grad_operands: dict[str, str] = field(default_factory=dict)
    # ``resolve_attrs(operands, attrs) -> attrs``: fills attributes whose default depends on the
    # operands' dtypes (a half format's limits or epsilon) before the op runs or is traced. Half
    # kernels compute in float32, so a default resolved inside the kernel would be float32's,
    # while the compiled program (and PyTorch) use the half format's.
    resolve_attrs: Callable[[tuple, dict[str, Any]], dict[str, Any]] | None = None

    def operand_name(self, i: int) -> str:
        """The name of the ``i``-th flattened operand (a variadic operand's elements share it)."""
        if self.variadic and i >= len(self.operands) - 1:
            return self.operands[-1].rstrip("*")
        return self.operands[i]

    @property
    def variadic(self) -> bool:
        return bool(self.operands) and self.operands[-1].endswith("*")

    @property
    def differentiable(self) -> bool:
        return GRAD_SINK not in self.props

    def bind_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Attributes with defaults filled in; an unknown or missing one is a TypeError."""
        full = dict(self.attrs)
        for k, v in attrs.items():
            if k not in full:
                raise TypeError(f"{self.name}() got an unexpected attribute {k!r}")
            full[k] = v
        for k, v in full.items():
            if v is REQUIRED:
                raise TypeError(f"{self.name}() missing required attribute {k!r}")
        return full


def half_format_defaults(**fields: str) -> Callable[[tuple, dict[str, Any]], dict[str, Any]]:
    """A ``resolve_attrs`` that fills each attribute left None with the ``finfo`` field it names
    of the first operand's dtype, when that is a half format: ``half_format_defaults(eps="eps")``.
    """

    def resolve(operands: tuple, attrs: dict[str, Any]) -> dict[str, Any]:
        dt = getattr(operands[0], "dtype", None)
        if dt not in HALF_DTYPES or all(attrs[k] is not None for k in fields):
            return attrs
        info = finfo(dt)
        return {**attrs, **{k: getattr(info, f) for k, f in fields.items() if attrs[k] is None}}

    return resolve


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} is registered twice")
    REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} in the registry") from None


# --- shared inference helpers (JAX's standard_primitive role)


def shape_of(x: Any) -> tuple:
    return tuple(getattr(x, "shape", ()))


def broadcast_shapes(*shapes: Sequence, op: str = "broadcast") -> tuple:
    """NumPy/PyTorch broadcasting; None (symbolic) matches anything that is not a conflict."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        dim: Any = 1
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim == 1 or dim is None:
                dim = d if dim == 1 or d is not None else None
            elif d is not None and d != dim:
                shown = ", ".join(str(tuple(s)) for s in shapes)
                raise ValueError(f"{op}: shapes {shown} cannot be broadcast together (dim {i})")
        out.append(dim)
    return tuple(out)


def normalize_dim(dim: int, ndim: int, op: str = "op") -> int:
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not isinstance(dim, int) or not lo <= dim <= hi:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {ndim} dims")
    return dim % max(ndim, 1)


def normalize_dims(dims: Any, ndim: int, op: str = "op") -> tuple[int, ...]:
    """``None`` means every dim; an int or a sequence of ints otherwise (negative allowed)."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: dim {tuple(dims)} repeats a dimension")
    return out


def elementwise_infer(out: str | dtype | None = None) -> Callable[..., AVal]:
    """Inference for broadcasting elementwise ops. ``out``: None keeps the promoted dtype, "bool"
    gives bool, "float" gives the promoted dtype or float32 for integer/bool inputs."""
    from lucid import _dtype

    def infer(*xs: Any, **_attrs: Any) -> AVal:
        shape = broadcast_shapes(*(shape_of(x) for x in xs))
        dt = result_type(*xs)
        if out == "bool":
            dt = _dtype.bool_
        elif out == "float" and not dt.is_floating_point:
            dt = _dtype.default_float
        elif isinstance(out, dtype):
            dt = out
        return AVal(shape, dt)

    return infer
