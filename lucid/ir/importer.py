"""Stage 2: a Trace becomes a ``builtin.module`` holding ``func.func @forward`` in the ``lucid``
dialect. Arguments carry their feed roles and results their output roles (``lucid.role``).

Built with ``Op.create`` and no verification: this runs on every new input shape, so it must stay
cheap (verify with ``module.verify()`` when asked).
"""

from __future__ import annotations

from typing import Any

from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import ConstantOp, get_op_class, make_constant
from lucid.ir.types import attr_to_ir, tensor_type
from lucid.trace import Const, Trace

__all__ = [
    "ROLE",
    "feed_roles",
    "forward_func",
    "import_checked_trace",
    "import_trace",
    "result_roles",
]

ROLE = "lucid.role"

_PROPS_CACHE: dict[tuple, dict] = {}


def _typed_key(v: Any) -> Any:
    # 1, 1.0 and True are equal as dict keys but are different attributes
    if isinstance(v, (tuple, list)):
        return (tuple, tuple(_typed_key(e) for e in v))
    return (type(v), v)


def _props(attrs: dict[str, Any]) -> dict[str, x.Attribute]:
    try:
        key = tuple((k, _typed_key(v)) for k, v in attrs.items())
        hit = _PROPS_CACHE.get(key)
    except TypeError:  # an unhashable attribute value: convert without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    props = {k: a for k, v in attrs.items() if (a := attr_to_ir(v)) is not None}
    if key is not None and len(_PROPS_CACHE) < 4096:
        _PROPS_CACHE[key] = props
    return props


def _location(filename: str, line: int) -> x.Attribute:
    return x.FileLineColLoc(x.StringAttr(filename), x.IntAttr(line), x.IntAttr(0))


def _roles(roles: list[str]) -> x.ArrayAttr:
    return x.ArrayAttr([x.DictionaryAttr({ROLE: x.StringAttr(r)}) for r in roles])


def import_trace(trace: Trace, name: str = "forward") -> x.ModuleOp:
    """The module of ``trace``: one ``lucid.<op>`` per traced op, scalars as ``lucid.constant``."""
    arg_types = [tensor_type(f.value.shape, f.value.dtype) for f in trace.feeds]
    block = x.Block(arg_types=arg_types)
    env: dict[int, x.SSAValue] = {
        f.value.id: a for f, a in zip(trace.feeds, block.args, strict=True)
    }
    consts: dict[tuple, x.SSAValue] = {}
    ops: list[x.Operation] = []

    def operand(c: Any) -> x.SSAValue:
        if isinstance(c, Const):
            # repr keeps 0.0 and -0.0 (equal as floats) and nan apart.
            key = (type(c.value), repr(c.value))
            v = consts.get(key)
            if v is None:
                op = make_constant(c.value)
                ops.append(op)
                v = consts[key] = op.results[0]
            return v
        return env[c.id]

    visits.count("import", len(trace.ops))
    for top in trace.ops:
        operands = []
        for inp in top.inputs:
            if isinstance(inp, list):
                operands.extend(operand(e) for e in inp)
            else:
                operands.append(operand(inp))
        op = get_op_class(top.name).create(
            operands=operands,
            result_types=[tensor_type(v.shape, v.dtype) for v in top.outputs],
            properties=_props(top.attrs),
            # passing the shared unknown location skips a lookup xDSL does per op otherwise
            location=x.UNKNOWN_LOC if top.loc is None else _location(*top.loc),
        )
        ops.append(op)
        for v, r in zip(top.outputs, op.results, strict=True):
            env[v.id] = r
    results = [operand(v) for _, v in trace.outputs]
    ops.append(x.func.ReturnOp(*results))
    block.add_ops(ops)
    fn = x.func.FuncOp(
        name,
        (arg_types, [r.type for r in results]),
        x.Region(block),
        arg_attrs=_roles([f.role for f in trace.feeds]),
        res_attrs=_roles([role for role, _ in trace.outputs]),
    )
    return x.ModuleOp([fn])


def import_checked_trace(trace: Trace, name: str = "forward") -> x.ModuleOp:
    """``import_trace`` for a trace from outside (a file), verified: an unknown op, an attribute
    with no IR form or an op that does not verify is a ValueError naming the op by its place in
    the trace JSON (``$.ops[N]``)."""
    from lucid.ops._registry import REGISTRY
    from lucid.trace._trace import Const

    for i, top in enumerate(trace.ops):
        if top.name not in REGISTRY:
            raise ValueError(f"$.ops[{i}]: unknown op {top.name!r} (not in the op registry)")
        for k, v in top.attrs.items():
            try:
                attr_to_ir(v)
            except Exception as e:  # TypeError, or xDSL refusing e.g. an int beyond i64
                raise ValueError(f"$.ops[{i}].attrs.{k}: {v!r} has no IR form: {e}") from None
        for j, c in enumerate(top.inputs):
            for e in c if isinstance(c, list) else [c]:
                if isinstance(e, Const):
                    try:
                        make_constant(e.value)
                    except Exception as err:
                        raise ValueError(
                            f"$.ops[{i}].inputs[{j}]: constant {e.value!r} has no IR form: {err}"
                        ) from None
    try:
        module = import_trace(trace, name)
    except Exception as e:
        raise ValueError(f"the trace does not import: {type(e).__name__}: {e}") from None
    body = forward_func(module, name).body.blocks.first
    traced = [op for op in body.ops if not isinstance(op, (ConstantOp, x.func.ReturnOp))]
    for i, op in enumerate(traced):
        try:
            op.verify(verify_nested_ops=False)
        except Exception as e:  # VerifyException, or a verifier tripping on odd attributes
            raise ValueError(f"$.ops[{i}] ({op.name}) does not verify: {e}") from None
    try:
        module.verify()
    except Exception as e:
        raise ValueError(f"the imported module does not verify: {e}") from None
    return module


def forward_func(module: x.ModuleOp, name: str = "forward") -> x.func.FuncOp:
    """The ``func.func`` named ``name`` in ``module``."""
    for op in module.ops:
        if isinstance(op, x.func.FuncOp) and op.sym_name.data == name:
            return op
    raise ValueError(f"the module has no func.func @{name}")


def _read_roles(attrs: x.ArrayAttr | None, n: int, what: str) -> list[str]:
    if attrs is None:
        return [f"{what}:{i}" for i in range(n)]
    out = []
    for i, d in enumerate(attrs.data):
        r = d.data.get(ROLE)
        out.append(r.data if isinstance(r, x.StringAttr) else f"{what}:{i}")
    return out


def feed_roles(fn: x.func.FuncOp) -> list[str]:
    """The role of each argument (``input:N`` where none is given)."""
    return _read_roles(fn.arg_attrs, len(fn.body.blocks.first.args), "input")


def result_roles(fn: x.func.FuncOp) -> list[str]:
    """The role of each result (``output:N`` where none is given)."""
    return _read_roles(fn.res_attrs, len(fn.function_type.outputs.data), "output")
