"""The ``prim`` dialect: one IRDL op per entry of the prim op table (``lucid.ir.prim``).

The table is the single definition of every primitive (operands, attributes, shape/dtype rule,
numpy semantics); this module only gives each entry an xDSL face. Operands and results are builtin
tensors of exact dtypes (``f32 f64 f16 bf16 i32 i64 i1``), attributes are typed properties, and
the verifier reruns the table's rule on the operand types.

Custom form: ``%2 = prim.reduce_sum %1 {axes = array<i64: 1>} : (tensor<4x8xf32>) ->
tensor<4xf32>``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.types import BoundedCache, int_attr, ints_attr

__all__ = [
    "PrimIROp",
    "attr_from_prim",
    "attr_to_prim",
    "aval_of_type",
    "create_prim",
    "get_prim_class",
    "make_prim_context",
    "prim_attrs",
    "prim_dialect",
    "prim_type",
]

_DTYPE_TO_ELEM = {
    "f32": x.f32,
    "f64": x.f64,
    "f16": x.f16,
    "bf16": x.bf16,
    "i32": x.i32,
    "i64": x.i64,
    "bool": x.i1,
}
_ELEM_TO_DTYPE = {v: k for k, v in _DTYPE_TO_ELEM.items()}
_TYPE_CACHE_LIMIT = 128  # least recently used evicted (see lucid.ir.types.BoundedCache)
_TYPE_CACHE: BoundedCache[x.TensorType] = BoundedCache(_TYPE_CACHE_LIMIT)


def prim_type(shape: Sequence[int], dtype: str) -> x.TensorType:
    """``tensor<...>`` of a static shape and a prim dtype name."""
    shape = tuple(shape)
    return _TYPE_CACHE.get((shape, dtype), lambda: x.TensorType(_DTYPE_TO_ELEM[dtype], list(shape)))


_AVAL_CACHE: BoundedCache[tuple[x.Attribute, P.Aval]] = BoundedCache(2 * _TYPE_CACHE_LIMIT)


def aval_of_type(t: x.Attribute) -> P.Aval:
    """The prim ``Aval`` of a tensor type; symbolic dims and non-prim element types raise.
    Cached by object identity, as ``lucid.ir.types.aval_of_type`` (lowering asks for the
    operands' avals of every op it creates, and ``prim_type`` shares the type objects)."""
    held, av = _AVAL_CACHE.get(id(t), lambda: (t, _aval_of_type(t)))
    return av if held is t else _aval_of_type(t)


def _aval_of_type(t: x.Attribute) -> P.Aval:
    if not isinstance(t, x.TensorType):
        raise P.PrimError(f"expected a tensor type, got {t}")
    dtype = _ELEM_TO_DTYPE.get(t.element_type)
    if dtype is None:
        raise P.PrimError(f"element type {t.element_type} has no prim dtype; expected {P.DTYPES}")
    shape = tuple(t.get_shape())
    if any(d == x.DYNAMIC_INDEX for d in shape):
        raise P.PrimError(f"prim needs static shapes, got {t}")
    return P.Aval(shape, dtype)


# --- attributes: kind-directed, so every kind has exactly one IR form


def attr_to_prim(kind: str, value: Any) -> x.Attribute:
    if kind == "int":
        return int_attr(int(value))
    if kind == "bool":
        return _TRUE if value else _FALSE
    if kind == "float":
        return _float_attr(float(value))
    if kind == "ints":
        return ints_attr(tuple(int(v) for v in value))
    if kind == "floats":
        # An ArrayAttr of f64 attributes: xDSL 0.75 prints some array<f64> values (and dense<>
        # f64 values) in a hex form its own parser misreads.
        return x.ArrayAttr([_float_attr(float(v)) for v in value])
    if kind == "dtype":
        return _DTYPE_TO_ELEM[value]
    if kind == "str":
        return x.StringAttr(str(value))
    raise AssertionError(kind)


_FLOAT_ATTRS: dict[bytes, x.FloatAttr] = {}
_TRUE, _FALSE = x.BoolAttr.from_bool(True), x.BoolAttr.from_bool(False)  # shared, as the others


def _float_attr(v: float) -> x.FloatAttr:
    """A shared f64 attribute per value (keyed by bits, so -0.0 and NaNs stay exact): building
    one costs ~20 us, and masks and tables repeat a few values many times."""
    key = struct.pack("<d", v)
    a = _FLOAT_ATTRS.get(key)
    if a is None:
        a = x.FloatAttr(v, x.f64)
        if len(_FLOAT_ATTRS) < 65536:
            _FLOAT_ATTRS[key] = a
    return a


def attr_from_prim(kind: str, a: x.Attribute) -> Any:
    if kind == "int" and isinstance(a, x.IntegerAttr) and a.type != x.i1:
        return int(a.value.data)
    if kind == "bool" and isinstance(a, x.IntegerAttr) and a.type == x.i1:
        return bool(a.value.data)
    if kind == "float" and isinstance(a, x.FloatAttr):
        return float(a.value.data)
    if kind == "ints" and isinstance(a, x.DenseArrayBase):
        return tuple(int(v) for v in a.get_values())
    if kind == "floats" and isinstance(a, x.ArrayAttr):
        if all(isinstance(e, x.FloatAttr) for e in a.data):
            return tuple(float(e.value.data) for e in a.data)
    if kind == "dtype" and a in _ELEM_TO_DTYPE:
        return _ELEM_TO_DTYPE[a]
    if kind == "str" and isinstance(a, x.StringAttr):
        return a.data
    raise P.PrimError(f"attribute {a} is not of kind {kind}")


class PrimIROp(x.IRDLOperation):
    """Base of every generated ``prim.<name>`` op; ``PRIM`` is its table entry."""

    PRIM: ClassVar[P.PrimOp]

    def given_attrs(self) -> dict[str, Any]:
        """The attributes present on the op, as Python values."""
        spec = self.PRIM.attrs
        return {k: attr_from_prim(spec[k].kind, a) for k, a in self.properties.items() if k in spec}

    def prim_attrs(self) -> dict[str, Any]:
        """Every attribute of the op (defaults filled in), checked by the table."""
        return P.check_attrs(self.PRIM, self.given_attrs())

    def print(self, printer: x.Printer) -> None:
        x.print_operands_attrs_type(self, printer)

    @classmethod
    def parse(cls, parser: x.Parser) -> PrimIROp:
        return x.parse_operands_attrs_type(cls, parser, cls.PRIM.attrs)

    def verify_(self) -> None:
        op = self.PRIM
        try:
            unknown = (set(self.properties) | set(self.attributes)) - set(op.attrs)
            if unknown:
                raise P.PrimError(f"unknown attribute(s) {sorted(unknown)}")
            avals = [aval_of_type(v.type) for v in self.operands]
            outs = P.infer(op.name, avals, self.given_attrs())
        except (P.PrimError, ValueError) as e:
            raise x.VerifyException(f"{self.name}: {e}") from e
        if len(outs) != len(self.results):
            raise x.VerifyException(
                f"{self.name} has {len(self.results)} results; the op gives {len(outs)}"
            )
        for i, (r, av) in enumerate(zip(self.results, outs, strict=True)):
            want = prim_type(av.shape, av.dtype)
            if r.type != want:
                raise x.VerifyException(f"{self.name}: result {i} is declared {r.type}, not {want}")


def prim_attrs(op: PrimIROp) -> dict[str, Any]:
    return op.prim_attrs()


_CLASSES: dict[str, type[PrimIROp]] = {}


def _class_name(name: str) -> str:
    return "Prim" + "".join(p.capitalize() for p in name.split("_")) + "Op"


def _make_class(op: P.PrimOp) -> type[PrimIROp]:
    random = "RANDOM" in op.props
    ns: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"``prim.{op.name}`` (CPU: {op.cpu_kernel})",
        "name": f"prim.{op.name}",
        "args": x.var_operand_def(x.TensorType),
        "res": x.var_result_def(x.TensorType),
        # Random ops stay out of CSE/DCE: two draws from one state are deliberate.
        "traits": x.traits_def() if random else x.traits_def(x.Pure()),
    }
    for attr in op.attrs:
        ns[f"prop_{attr}"] = x.opt_prop_def(x.Attribute, prop_name=attr)
    cls = x.irdl_op_definition(type(_class_name(op.name), (PrimIROp,), ns))
    cls.PRIM = op
    return cls


def get_prim_class(name: str) -> type[PrimIROp]:
    """The op class of prim op ``name``."""
    cls = _CLASSES.get(name)
    if cls is None:
        cls = _CLASSES[name] = _make_class(P.lookup(name))
    return cls


def made_prim_classes(names: Iterable[str]) -> set[type[PrimIROp]]:
    """The op classes of those of ``names`` made so far: no op of a class not yet made exists,
    so a walk looking for these ops can test ``type(op) in`` the set (an ABC ``isinstance``
    per op costs more), or be skipped when it is empty."""
    return {cls for name in names if (cls := _CLASSES.get(name)) is not None}


def create_prim(name: str, operands: Sequence[x.SSAValue], attrs: dict[str, Any]) -> PrimIROp:
    """A ``prim.<name>`` op on ``operands`` with result types from the table's rule (which raises
    ``PrimError`` when the operands or attributes do not fit). Attributes equal to their default
    are left out of the op."""
    op = P.lookup(name)
    avals = [aval_of_type(v.type) for v in operands]
    full = P.check_attrs(op, attrs)
    outs = P.infer_checked(op, avals, full)
    props = {}
    for k, v in full.items():
        spec = op.attrs[k]
        if spec.default is P.REQUIRED or v != spec.default:
            props[k] = attr_to_prim(spec.kind, v)
    return get_prim_class(name).create(
        operands=list(operands),
        result_types=[prim_type(a.shape, a.dtype) for a in outs],
        properties=props,
    )


def prim_dialect() -> x.Dialect:
    """The ``prim`` dialect: one op per table entry, composite ops included (so printed IR
    holding ``prim.gelu`` parses back)."""
    return x.Dialect("prim", [get_prim_class(n) for n in (*P.PRIM_OPS, *P.COMPOSITE_OPS)])


def make_prim_context() -> x.Context:
    """A context with ``builtin``, ``func``, ``lucid`` and ``prim`` loaded."""
    from lucid.ir.text import make_context

    ctx = make_context()
    ctx.load_dialect(prim_dialect())
    return ctx
