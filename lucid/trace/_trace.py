"""The Trace: what a traced call did, as plain data (stage 1's output, stage 2's input).

A trace is a straight-line list of registry ops over numbered values. Values enter as feeds (each
with a role: ``input:0``, ``param:fc1.weight``, ``buffer:bn.running_mean``, ``capture:0``,
``rng``) or as op outputs, and leave as outputs (``output:0``, ``update:buffer:bn.running_mean``).
Python scalars passed to an op stay inline as ``Const`` operands. It serialises to JSON
(``lucid.compile.trace/v1``) and loads back losslessly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid import _dtype

FORMAT = "lucid.compile.trace/v1"


@dataclass(frozen=True, slots=True)
class Const:
    """A Python scalar operand (bool, int or float), kept weakly typed as PyTorch does."""

    value: bool | int | float


@dataclass(slots=True)
class Value:
    """A value of the trace: ``shape`` has None for a symbolic dim."""

    id: int
    shape: tuple
    dtype: _dtype.dtype
    device: str = "cpu"

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(slots=True)
class Feed:
    value: Value
    role: str


@dataclass(slots=True)
class TraceOp:
    """One recorded op. ``inputs`` holds Values and Consts (a list for a variadic operand)."""

    name: str
    inputs: list
    outputs: list[Value]
    attrs: dict[str, Any]
    loc: tuple[str, int] | None = None  # the user's file and line, when locations are recorded


@dataclass
class Trace:
    feeds: list[Feed] = field(default_factory=list)
    ops: list[TraceOp] = field(default_factory=list)
    outputs: list[tuple[str, Value]] = field(default_factory=list)

    def feed(self, role: str) -> Feed:
        for f in self.feeds:
            if f.role == role:
                return f
        raise KeyError(f"the trace has no feed with role {role!r}")

    def __repr__(self) -> str:
        return f"<Trace: {len(self.feeds)} feeds, {len(self.ops)} ops, {len(self.outputs)} outputs>"

    def feeds_reaching(self, values: list[Value]) -> set[str]:
        """Roles of the feeds ``values`` depend on through differentiable ops: exactly the
        tensors eager backward gives a gradient (the others keep ``grad=None``)."""
        from lucid.ops._registry import GRAD_SINK, REGISTRY

        needed = {v.id for v in values}
        for op in reversed(self.ops):
            if GRAD_SINK in REGISTRY[op.name].props or not any(v.id in needed for v in op.outputs):
                continue
            for inp in op.inputs:
                for v in inp if isinstance(inp, list) else (inp,):
                    if hasattr(v, "id"):
                        needed.add(v.id)
        return {f.role for f in self.feeds if f.value.id in needed}

    # --- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "feeds": [{"role": f.role, **_value_json(f.value)} for f in self.feeds],
            "ops": [_op_json(op) for op in self.ops],
            "outputs": [{"role": role, "id": v.id} for role, v in self.outputs],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a Lucid trace: expected format {FORMAT!r}, got {got!r}")
        check_trace_json(data)
        values: dict[int, Value] = {}

        def new_value(d: dict) -> Value:
            v = Value(
                int(d["id"]),
                tuple(None if s is None else int(s) for s in d["shape"]),
                _dtype.from_name(d["dtype"]),
                d.get("device", "cpu"),
            )
            if v.id in values:
                raise ValueError(f"trace JSON defines value %{v.id} twice")
            values[v.id] = v
            return v

        def operand(x: Any) -> Any:
            if isinstance(x, list):
                return [operand(e) for e in x]
            if "const" in x:
                return Const(x["const"])
            try:
                return values[int(x["id"])]
            except KeyError:
                raise ValueError(f"trace JSON uses value %{x['id']} before defining it") from None

        trace = cls()
        try:
            for f in data["feeds"]:
                trace.feeds.append(Feed(new_value(f), f["role"]))
            for op in data["ops"]:
                inputs = [operand(x) for x in op["inputs"]]
                outputs = [new_value(v) for v in op["outputs"]]
                attrs = {k: attr_from_json(v) for k, v in op.get("attrs", {}).items()}
                loc = tuple(op["loc"]) if op.get("loc") else None
                trace.ops.append(TraceOp(op["name"], inputs, outputs, attrs, loc))
            for o in data["outputs"]:
                trace.outputs.append((o["role"], operand(o)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed trace JSON: missing or bad field {e}") from None
        return trace

    @classmethod
    def from_json(cls, text: str) -> Trace:
        return cls.from_dict(json.loads(text))


def traces_from_json(data: Any) -> list[tuple[str | None, Trace]]:
    """The traces in a JSON document: one trace (``lucid.compile.trace/v1``) as ``[(None,
    trace)]``, or ``CompiledModule.graph_dump()``'s list of ``{"sig", "graph"}`` as one
    ``(sig, trace)`` per cached signature. Anything else: ValueError naming the problem."""
    if not isinstance(data, list):
        return [(None, Trace.from_dict(data))]
    out: list[tuple[str | None, Trace]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"sig", "graph"}:
            raise ValueError(
                f"entry {i} of the list is not a graph_dump() entry "
                '({"sig": ..., "graph": <trace>})'
            )
        try:
            out.append((str(item["sig"]), Trace.from_dict(item["graph"])))
        except ValueError as e:
            raise ValueError(f"entry {i} ({item['sig']}): {e}") from None
    return out


_MAX_DIM = 2**63 - 1  # shapes are int64 in the IR


def check_trace_json(data: dict) -> None:
    """Refuse a malformed trace dict with a ValueError naming the JSON path of the problem:
    dims must be None or non-negative ints (not bools or floats), ids ints defined once before
    use, constants bool/int/float, outputs values, and every field of the expected kind."""

    def bad(path: str, what: str) -> ValueError:
        return ValueError(f"malformed trace JSON at {path}: {what}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def field_of(d: Any, key: str, path: str, kinds: tuple, what: str) -> Any:
        if not isinstance(d, dict):
            raise bad(path, f"expected an object, got {type(d).__name__}")
        if key not in d:
            raise bad(path, f"missing field {key!r}")
        v = d[key]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise bad(f"{path}.{key}", f"expected {what}, got {v!r}")
        return v

    def items(d: dict, key: str, path: str) -> list:
        return field_of(d, key, path, (list,), "a list")

    defined: set[int] = set()

    def value(d: Any, path: str) -> None:
        vid = field_of(d, "id", path, (int,), "an integer id")
        if vid in defined:
            raise bad(f"{path}.id", f"the trace defines value %{vid} twice")
        for i, dim in enumerate(items(d, "shape", path)):
            if dim is not None and not (is_int(dim) and 0 <= dim <= _MAX_DIM):
                raise bad(f"{path}.shape[{i}]", f"a dim is null or an integer >= 0, got {dim!r}")
        name = field_of(d, "dtype", path, (str,), "a dtype name")
        try:
            _dtype.from_name(name)
        except TypeError as e:
            raise bad(f"{path}.dtype", str(e)) from None
        if "device" in d and not isinstance(d["device"], str):
            raise bad(f"{path}.device", f"expected a string, got {d['device']!r}")
        defined.add(vid)

    def operand(x: Any, path: str, *, allow_list: bool) -> None:
        if isinstance(x, list) and allow_list:
            for i, e in enumerate(x):
                operand(e, f"{path}[{i}]", allow_list=False)
            return
        if isinstance(x, dict) and "const" in x:
            if not isinstance(x["const"], (bool, int, float)):
                raise bad(f"{path}.const", f"a constant is a bool or a number, got {x['const']!r}")
            return
        vid = field_of(x, "id", path, (int,), "an integer id")
        if vid not in defined:
            raise bad(f"{path}.id", f"the trace uses value %{vid} before defining it")

    def attr(v: Any, path: str) -> None:
        if v is None or isinstance(v, (bool, int, float, str)):
            return
        if isinstance(v, list):
            for i, e in enumerate(v):
                attr(e, f"{path}[{i}]")
        elif isinstance(v, dict) and set(v) == {"dtype"}:
            try:
                _dtype.from_name(v["dtype"])
            except TypeError as e:
                raise bad(path, str(e)) from None
        elif isinstance(v, dict) and set(v) == {"tuple"}:
            attr(field_of(v, "tuple", path, (list,), "a list"), f"{path}.tuple")
        else:
            raise bad(path, f"unknown attribute encoding {v!r}")

    for i, f in enumerate(items(data, "feeds", "$")):
        field_of(f, "role", f"$.feeds[{i}]", (str,), "a role string")
        value(f, f"$.feeds[{i}]")
    for i, op in enumerate(items(data, "ops", "$")):
        path = f"$.ops[{i}]"
        field_of(op, "name", path, (str,), "an op name")
        for j, x in enumerate(items(op, "inputs", path)):
            operand(x, f"{path}.inputs[{j}]", allow_list=True)
        for j, v in enumerate(items(op, "outputs", path)):
            value(v, f"{path}.outputs[{j}]")
        if "attrs" in op:
            for k, v in field_of(op, "attrs", path, (dict,), "an object").items():
                attr(v, f"{path}.attrs.{k}")
        loc = op.get("loc")
        if loc is not None and not (
            isinstance(loc, list) and len(loc) == 2 and isinstance(loc[0], str) and is_int(loc[1])
        ):
            raise bad(f"{path}.loc", f"expected [file, line], got {loc!r}")
    for i, o in enumerate(items(data, "outputs", "$")):
        path = f"$.outputs[{i}]"
        field_of(o, "role", path, (str,), "a role string")
        if isinstance(o, dict) and "const" in o:
            raise bad(path, "an output must be a value ({'id': N}), not a constant")
        operand(o, path, allow_list=False)


def _op_json(op: TraceOp) -> dict:
    d = {
        "name": op.name,
        "inputs": [_operand_json(x) for x in op.inputs],
        "outputs": [_value_json(v) for v in op.outputs],
        "attrs": {k: attr_to_json(v) for k, v in op.attrs.items()},
    }
    if op.loc is not None:
        d["loc"] = list(op.loc)
    return d


def _value_json(v: Value) -> dict:
    return {"id": v.id, "shape": list(v.shape), "dtype": v.dtype.name, "device": v.device}


def _operand_json(x: Any) -> Any:
    if isinstance(x, list):
        return [_operand_json(e) for e in x]
    if isinstance(x, Const):
        return {"const": x.value}
    return {"id": x.id}


def attr_to_json(v: Any) -> Any:
    """Attributes as JSON: tuples and dtypes are tagged so they load back as themselves."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, _dtype.dtype):
        return {"dtype": v.name}
    if isinstance(v, (tuple, list)):
        return {"tuple": [attr_to_json(e) for e in v]}
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return v.item()
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} cannot go into a trace")


def attr_from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if "dtype" in v:
            return _dtype.from_name(v["dtype"])
        if "tuple" in v:
            return tuple(attr_from_json(e) for e in v["tuple"])
        raise ValueError(f"unknown attribute encoding {v!r}")
    if isinstance(v, list):
        return tuple(attr_from_json(e) for e in v)
    return v
