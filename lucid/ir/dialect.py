"""The ``lucid`` dialect: one IRDL op per registry op, generated from the registry.

Adding an op to ``lucid.ops`` adds ``lucid.<name>`` here with no IR code to write: its operands
are builtin tensors (one variadic list, split by the registry's operand spec), its attributes are
typed properties (see ``lucid.ir.types``), and its verifier reruns the registry's shape/dtype
inference on the operand types. Python scalar operands are ``lucid.constant`` ops holding a scalar
attribute (PyTorch's weakly typed scalars); folded tensor constants hold a ``dense<...>``.

Custom form: ``%2 = lucid.sum %1 {dim = 1 : i64, keepdim = false} : (tensor<4x8xf32>) ->
tensor<4xf32>``.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import numpy as np

from lucid import _dtype
from lucid.ir import _xdsl as x
from lucid.ir.types import (
    attr_from_ir,
    attr_to_ir,
    aval_of_type,
    dtype_of_type,
    shape_of_type,
    tensor_type,
)
from lucid.ops._registry import RANDOM, REGISTRY, AVal, OpDef

__all__ = [
    "ConstantOp",
    "LucidOp",
    "constant_value",
    "get_op_class",
    "lucid_dialect",
    "make_constant",
]


class LucidOp(x.IRDLOperation):
    """Base of every generated ``lucid.<name>`` op; ``OPDEF`` is its registry entry."""

    OPDEF: ClassVar[OpDef]
    VARIADIC: ClassVar[bool]  # from OPDEF, precomputed: verification reads them for every op
    N_FIXED: ClassVar[int]  # operands before the variadic one (all of them if none)

    def lucid_attrs(self) -> dict[str, Any]:
        """The op's attributes as Python values, every registry attribute present."""
        props = self.properties
        return {k: (attr_from_ir(props[k]) if k in props else None) for k in self.OPDEF.attrs}

    def operand_groups(self, values: list) -> list:
        """``values`` (one per IR operand) grouped as the registry's operands: the variadic
        operand's values as one list."""
        if not self.VARIADIC:
            return values
        n_fixed = self.N_FIXED
        return [*values[:n_fixed], list(values[n_fixed:])]

    def print(self, printer: x.Printer) -> None:
        x.print_operands_attrs_type(self, printer)

    @classmethod
    def parse(cls, parser: x.Parser) -> LucidOp:
        return x.parse_operands_attrs_type(cls, parser, cls.OPDEF.attrs)

    def _verify_lucid(self) -> None:
        """The whole verifier of a generated op (it replaces IRDL's generic one, whose checks
        for these ops are: operands and results are tensors, properties are known)."""
        opdef = self.OPDEF
        n_fixed, variadic = self.N_FIXED, self.VARIADIC
        n = len(self.operands)
        if (variadic and n < n_fixed) or (not variadic and n != n_fixed):
            want = f"at least {n_fixed}" if variadic else str(n_fixed)
            raise x.VerifyException(
                f"{self.name} takes {want} operands ({', '.join(opdef.operands)}), got {n}"
            )
        for k in self.properties:
            if k not in opdef.attrs:
                raise x.VerifyException(
                    f"{self.name} has no attribute {k!r}; it takes {sorted(opdef.attrs) or 'none'}"
                )
        if self.attributes:  # Lucid ops carry no discardable attributes: a typo must not pass
            _refuse_attributes(self, opdef.attrs)
        try:
            attrs = self.lucid_attrs()
            args = self.operand_groups([operand_aval(v) for v in self.operands])
            avals = opdef.infer(*args, **attrs)
        except Exception as e:  # inference errors are the user's message: pass them on
            raise x.VerifyException(f"{self.name}: {e}") from e
        if opdef.n_outputs == 1:
            avals = (avals,)
        try:
            declared = [aval_of_type(r.type) for r in self.results]
        except ValueError as e:
            raise x.VerifyException(f"{self.name}: results must be tensors ({e})") from e
        if len(avals) != len(self.results):
            raise x.VerifyException(
                f"{self.name} has {len(self.results)} results; the op gives {len(avals)}"
            )
        for i, (r, d, av) in enumerate(zip(self.results, declared, avals, strict=True)):
            if not _type_matches(d, av):
                want = tensor_type(tuple(av.shape), av.dtype)
                operands = ", ".join(str(v.type) for v in self.operands)
                raise x.VerifyException(
                    f"{self.name}: result {i} is declared {r.type} but the op gives {want} for "
                    f"operands ({operands}) and attributes {attrs}"
                )


def _refuse_attributes(op: x.Operation, known) -> None:
    k = next(iter(op.attributes))
    if k in known:
        raise x.VerifyException(
            f"{op.name}: attribute {k!r} is given as a discardable attribute; in the generic "
            f"form it belongs in the properties, <{{{k} = ...}}>"
        )
    raise x.VerifyException(f"{op.name} has no attribute {k!r}; it takes {sorted(known) or 'none'}")


def _type_matches(declared: AVal, av: AVal) -> bool:
    if declared.dtype is not av.dtype:
        return False
    shape = declared.shape
    if len(shape) != len(av.shape):
        return False
    return all(a is None or b is None or a == b for a, b in zip(shape, av.shape, strict=True))


def operand_aval(v: x.SSAValue) -> Any:
    """What inference sees of an IR value: a Python scalar for a weak scalar constant, else an
    AVal of its type."""
    owner = v.owner
    if isinstance(owner, ConstantOp):
        scalar = owner.scalar()
        if scalar is not None:
            return scalar
    return aval_of_type(v.type)


@x.irdl_op_definition
class ConstantOp(x.IRDLOperation):
    """A constant: a Python scalar operand (``value`` is an i1/i64/f64 scalar attribute, result
    ``tensor<i1|i64|f32>``, weakly typed in promotion) or a folded tensor (a ``dense<...>``)."""

    name = "lucid.constant"
    value = x.opt_prop_def(x.Attribute)
    res = x.var_result_def(x.TensorType)
    traits = x.traits_def(x.Pure(), x.ConstantLike())

    # The text of the assembly format "$value attr-dict `->` type($res)", written by hand: an
    # assembly format imports xDSL's format parser, its parser and its printer when the class is
    # defined, on every process's first compile.
    def print(self, printer: x.Printer) -> None:
        value = self.properties.get("value")
        if value is not None:
            printer.print_string(" ")
            printer.print_attribute(value)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" -> ")
        printer.print_list(self.result_types, printer.print_attribute)

    @classmethod
    def parse(cls, parser: x.Parser) -> ConstantOp:
        value = parser.parse_attribute()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation("->")
        types = parser.parse_optional_undelimited_comma_separated_list(
            parser.parse_optional_type, parser.parse_type
        )
        return cls.create(result_types=types or [], properties={"value": value}, attributes=attrs)

    def scalar(self) -> bool | int | float | None:
        v = self.properties.get("value")
        if isinstance(v, (x.IntegerAttr, x.FloatAttr)):
            return attr_from_ir(v)
        return None

    def verify_(self) -> None:
        v = self.properties.get("value")
        if self.attributes:
            _refuse_attributes(self, ("value",))
        if len(self.results) != 1:
            raise x.VerifyException("lucid.constant has exactly one result")
        t = self.results[0].type
        if isinstance(v, (x.IntegerAttr, x.FloatAttr)):
            want = _scalar_type(attr_from_ir(v))
            if t != want:
                raise x.VerifyException(f"lucid.constant: a scalar {v} has type {want}, not {t}")
        elif isinstance(v, x.DenseIntOrFPElementsAttr):
            if v.type != t:
                raise x.VerifyException(
                    f"lucid.constant: the value has type {v.type} but the result is {t}"
                )
        else:
            raise x.VerifyException(f"lucid.constant needs a scalar or dense<...> value, got {v}")


_SCALAR_TYPES = {
    bool: tensor_type((), _dtype.bool_),
    int: tensor_type((), _dtype.int64),
    float: tensor_type((), _dtype.float32),
}


def _scalar_type(v: bool | int | float) -> x.TensorType:
    return _SCALAR_TYPES[type(v)]


def make_constant(value: Any) -> ConstantOp:
    """A ``lucid.constant`` for a Python scalar (weakly typed) or a numpy array."""
    if isinstance(value, (bool, int, float)):
        return ConstantOp.create(
            result_types=[_scalar_type(value)],
            properties={"value": attr_to_ir(value)},
            location=x.UNKNOWN_LOC,
        )
    arr = np.asarray(value)
    t = tensor_type(arr.shape, _dtype.from_numpy(arr.dtype))
    flat = arr.reshape(-1)
    if arr.dtype == np.bool_:
        flat = flat.astype(np.int64)
    dense = x.DenseIntOrFPElementsAttr.from_list(t, flat.tolist())
    return ConstantOp.create(result_types=[t], properties={"value": dense})


def constant_value(op: ConstantOp) -> Any:
    """The Python scalar or numpy array a ``lucid.constant`` holds."""
    v = op.properties["value"]
    if isinstance(v, (x.IntegerAttr, x.FloatAttr)):
        return attr_from_ir(v)
    t = v.type
    dt = dtype_of_type(t)
    return np.asarray(v.get_values(), dtype=dt.numpy).reshape(shape_of_type(t))


# --- generation from the registry

_OP_CLASSES: dict[str, type[LucidOp]] = {}
_GENERATION_LOCK = threading.Lock()


def _class_name(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_")) + "Op"


def _make_op_class(opdef: OpDef) -> type[LucidOp]:
    ns: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"``lucid.{opdef.name}``: {opdef.doc or 'see the registry entry'}",
        "name": f"lucid.{opdef.name}",
        "args": x.var_operand_def(x.TensorType),
        "res": x.var_result_def(x.TensorType),
        # A random op is pure given its RNG operand, but it stays out of CSE/DCE on purpose.
        "traits": x.traits_def() if RANDOM in opdef.props else x.traits_def(x.Pure()),
    }
    for attr in opdef.attrs:
        # Field names are prefixed: an attribute may be called e.g. "name" or "results".
        ns[f"prop_{attr}"] = x.opt_prop_def(x.Attribute, prop_name=attr)
    cls = x.irdl_op_definition(type(_class_name(opdef.name), (LucidOp,), ns))
    cls.OPDEF = opdef  # set after definition: IRDL accepts only its own fields in the body
    cls.VARIADIC = opdef.variadic
    cls.N_FIXED = len(opdef.operands) - (1 if opdef.variadic else 0)
    cls.verify_ = LucidOp._verify_lucid  # one pass over the op instead of IRDL's generic checks
    return cls


def get_op_class(name: str) -> type[LucidOp]:
    """The op class of registry op ``name`` (generated on first use)."""
    cls = _OP_CLASSES.get(name)
    if cls is None:
        with _GENERATION_LOCK:  # two threads compiling at once must get the same class
            cls = _OP_CLASSES.get(name)
            if cls is None:
                opdef = REGISTRY.get(name)
                if opdef is None:
                    raise KeyError(f"no op named {name!r} in the registry")
                cls = _OP_CLASSES[name] = _make_op_class(opdef)
    return cls


def lucid_dialect() -> x.Dialect:
    """The ``lucid`` dialect with one op per op registered now (ops registered later are added
    the next time this is called)."""
    return x.Dialect("lucid", [ConstantOp, *(get_op_class(n) for n in REGISTRY)])
