"""The recorded MPSGraph program (format ``lucid.mpsgraph/v1``) and the recording builder.

The emitter drives a builder with one call per MPSGraph method; the recording builder writes those
calls down as plain data, which is what the native side (``lucid._native.mpsgraph_compile``)
replays into a real ``MPSGraph`` and what the golden tests read. A program is a JSON object::

    {"format": "lucid.mpsgraph/v1",
     "placeholders": [{"id": 0, "shape": [4, 3], "dtype": "MPSDataTypeFloat32",
                       "role": "input:0"}, ...],
     "calls": [{"selector": "additionWithPrimaryTensor:secondaryTensor:name:",
                "args": [{"tensor": 0}, {"tensor": 1}, {"nil": true}],
                "results": [2]}, ...],
     "targets": [5, 7],
     "inplace": [[0, 3]],
     "checks": [9]}

- ``placeholders``: the feeds, in feed order; each one is
  ``placeholderWithShape:dataType:name:`` (name nil). ``-1`` in a shape is a symbolic dimension.
  ``role`` is informational (which function argument it is).
- ``calls``: in order; every selector is a key of ``selectors.SELECTORS``, with exactly its
  arguments, in selector order. ``results`` are the tensor ids the call defines: one for a method
  returning ``MPSGraphTensor *``, one per element for a method returning
  ``NSArray<MPSGraphTensor *> *``. Ids are unique across placeholders and calls and every id is
  defined before it is used.
- ``targets``: the result tensors, in result order (the executable's ``targetTensors``), each
  tensor once. The backend's boundary maps the function's results onto them (a tensor returned
  twice, or a checked value that is also a result, is one target; a returned feed is no target),
  and keeps only the placeholders some call reads (an unused feed may be pruned by MPSGraph's
  compile, and the executable's feeds would not match).
- ``inplace``: ``[result index, feed index]`` pairs: after a successful run, result ``i`` is
  written back into feed ``j``'s buffer (same shape and dtype).
- ``checks`` (optional, may be absent or empty): indices into ``targets`` of Bool tensors that must
  be all true for the run to count as successful (an index out of range in a gather); the Python
  side reads them after the run and raises ``IndexError``. When a program has checks, its
  ``inplace`` list is empty and Python writes results back itself after the checks passed, so a
  failed check never changes a feed.

Argument encodings (one JSON object per argument, the key is the kind):

==========================  ======================================================================
``{"tensor": id}``          an ``MPSGraphTensor *`` defined earlier
``{"tensors": [ids]}``      ``NSArray<MPSGraphTensor *> *``
``{"int": n}``              ``NSInteger`` / ``NSUInteger`` (the selector table says which)
``{"double": x}``           ``double`` or ``float`` (the table says which); ``"inf"``, ``"-inf"``
                            and ``"nan"`` are written as those strings (JSON has no infinity)
``{"bool": b}``             ``BOOL``
``{"shape": [dims]}``       ``MPSShape *`` (``NSArray<NSNumber *>``, ``-1`` = symbolic)
``{"ints": [..]}``          ``NSArray<NSNumber *> *`` (axes, permutations, starts, ...)
``{"dtype": name}``         ``MPSDataType`` by name (``selectors.MPS_DTYPES``)
``{"enum": name,            an enum constant; ``value`` is its integer value
  "value": n}``
``{"descriptor": class,     a descriptor object: built with the class's constructor from the
  "fields": {..}}``         constructor fields, then the other fields set (see
                            ``selectors.DESCRIPTORS``); enum fields hold the constant's name,
                            bool fields true/false
``{"constant": {"data_b64": the ``NSData *`` of ``constantWithData:shape:dataType:``: the raw
  s, "shape": [..],         little-endian bytes, row-major, base64; its shape and dtype repeat the
  "dtype": name}}``         call's next two arguments
``{"nil": true}``           ``nil`` (every ``name:`` argument)
==========================  ======================================================================
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from lucid.backends.mpsgraph.selectors import (
    DESCRIPTORS,
    ENUMS,
    MPS_DTYPE_VALUES,
    MPS_DTYPES,
    PRIM_OF_MPS_DTYPE,
    SELECTORS,
)

FORMAT = "lucid.mpsgraph/v1"
ARG_KINDS = (
    "tensor", "tensors", "int", "double", "bool", "shape", "ints", "dtype", "enum", "descriptor",
    "constant", "nil",
)  # fmt: skip
NUMPY_OF_MPS = {
    "MPSDataTypeFloat32": np.dtype(np.float32),
    "MPSDataTypeFloat16": np.dtype(np.float16),
    "MPSDataTypeBFloat16": np.dtype(ml_dtypes.bfloat16),
    "MPSDataTypeInt32": np.dtype(np.int32),
    "MPSDataTypeInt64": np.dtype(np.int64),
    "MPSDataTypeBool": np.dtype(np.bool_),
}


class ProgramError(ValueError):
    """A recorded program does not follow the format or the selector table."""


# --- argument constructors (the emitter spells its calls with these) ---------------------------
def tensor(tid: int) -> dict:
    return {"tensor": int(tid)}


def tensors(tids: list[int]) -> dict:
    return {"tensors": [int(t) for t in tids]}


def integer(n: int) -> dict:
    return {"int": int(n)}


def double(v: float) -> dict:
    v = float(v)
    if math.isnan(v):
        return {"double": "nan"}
    if math.isinf(v):
        return {"double": "inf" if v > 0 else "-inf"}
    return {"double": v}


def boolean(b: bool) -> dict:
    return {"bool": bool(b)}


def shape(dims: tuple[int, ...] | list[int]) -> dict:
    return {"shape": [int(d) for d in dims]}


def ints(values: tuple[int, ...] | list[int]) -> dict:
    return {"ints": [int(v) for v in values]}


def dtype(prim_dtype: str) -> dict:
    return {"dtype": MPS_DTYPES[prim_dtype][0]}


def enum(name: str) -> dict:
    return {"enum": name, "value": ENUMS[name][1]}


def descriptor(cls: str, fields: dict[str, Any]) -> dict:
    return {"descriptor": cls, "fields": dict(fields)}


def constant(array: np.ndarray, prim_dtype: str) -> dict:
    name = MPS_DTYPES[prim_dtype][0]
    data = np.ascontiguousarray(array, dtype=NUMPY_OF_MPS[name].newbyteorder("<"))
    return {
        "constant": {
            "data_b64": base64.b64encode(data.tobytes()).decode("ascii"),
            "shape": [int(d) for d in array.shape],
            "dtype": name,
        }
    }


NIL = {"nil": True}


def decode_double(arg: dict) -> float:
    v = arg["double"]
    return float(v) if isinstance(v, str) else v


def decode_constant(arg: dict) -> np.ndarray:
    c = arg["constant"]
    dt = NUMPY_OF_MPS[c["dtype"]].newbyteorder("<")
    data = np.frombuffer(base64.b64decode(c["data_b64"]), dtype=dt)
    return data.astype(NUMPY_OF_MPS[c["dtype"]]).reshape(c["shape"])


# --- the recording builder ----------------------------------------------------------------------
@dataclass
class RecordingBuilder:
    """Writes every builder call down as data: the program the native side replays."""

    placeholders: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    _next_id: int = 0

    def _fresh(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def placeholder(self, dims: tuple[int, ...], prim_dtype: str, role: str) -> int:
        """A feed (``placeholderWithShape:dataType:name:``); returns its tensor id."""
        tid = self._fresh()
        self.placeholders.append(
            {
                "id": tid,
                "shape": [int(d) for d in dims],
                "dtype": MPS_DTYPES[prim_dtype][0],
                "role": role,
            }
        )
        return tid

    def call(self, selector: str, args: list[dict], n_results: int = 1) -> list[int]:
        """One MPSGraph method call; returns the ids of the tensors it defines."""
        spec = SELECTORS.get(selector)
        if spec is None:
            raise ProgramError(f"selector {selector!r} is not in the selector table")
        if len(args) != spec.arity:
            raise ProgramError(f"{selector} takes {spec.arity} arguments, got {len(args)}")
        for i, (arg, want) in enumerate(zip(args, spec.args, strict=True)):
            (kind,) = (k for k in arg if k in ARG_KINDS)
            if kind != want.kind:
                raise ProgramError(f"{selector} argument {i}: expected {want.kind}, got {kind}")
        if spec.returns == "tensor" and n_results != 1:
            raise ProgramError(f"{selector} returns one tensor")
        results = [self._fresh() for _ in range(n_results)]
        self.calls.append({"selector": selector, "args": args, "results": results})
        return results

    def program(
        self,
        targets: list[int],
        inplace: list[tuple[int, int]],
        checks: list[int] = (),
        feeds: list[int] | None = None,
    ) -> dict:
        """The finished program as JSON-ready data (checked with :func:`validate`); ``feeds``
        keeps only those placeholders (by position), all of them when None."""
        placeholders = self.placeholders if feeds is None else [self.placeholders[i] for i in feeds]
        prog = {
            "format": FORMAT,
            "placeholders": list(placeholders),
            "calls": list(self.calls),
            "targets": [int(t) for t in targets],
            "inplace": [] if checks else [[int(r), int(f)] for r, f in inplace],
            "checks": [int(c) for c in checks],
        }
        validate(prog)
        return prog


def validate(prog: dict) -> None:
    """Raise ProgramError unless ``prog`` follows the format and the selector table."""
    if prog.get("format") != FORMAT:
        raise ProgramError(f"not a {FORMAT} program (format {prog.get('format')!r})")
    defined: set[int] = set()

    def define(tid: int) -> None:
        if not isinstance(tid, int) or tid in defined:
            raise ProgramError(f"tensor id {tid!r} defined twice or not an integer")
        defined.add(tid)

    def use(tid: Any) -> None:
        if tid not in defined:
            raise ProgramError(f"tensor {tid!r} used before it is defined")

    for p in prog["placeholders"]:
        define(p["id"])
        if p["dtype"] not in MPS_DTYPE_VALUES:
            raise ProgramError(f"placeholder {p['id']}: unknown dtype {p['dtype']!r}")
        if any(not isinstance(d, int) or d < -1 or d == 0 for d in p["shape"]):
            raise ProgramError(f"placeholder {p['id']}: bad shape {p['shape']}")
        if not p["shape"]:  # an empty MPSShape is undocumented: rank 0 is spelled [1]
            raise ProgramError(f"placeholder {p['id']}: rank 0 (an empty shape); use [1]")
    for c in prog["calls"]:
        spec = SELECTORS.get(c["selector"])
        if spec is None:
            raise ProgramError(f"selector {c['selector']!r} is not in the selector table")
        if len(c["args"]) != spec.arity:
            raise ProgramError(f"{c['selector']}: {len(c['args'])} arguments, want {spec.arity}")
        for arg, want in zip(c["args"], spec.args, strict=True):
            if want.kind not in arg:
                raise ProgramError(f"{c['selector']}: expected a {want.kind} argument, got {arg}")
            if want.kind == "tensor":
                use(arg["tensor"])
            elif want.kind == "tensors":
                for t in arg["tensors"]:
                    use(t)
            elif want.kind == "dtype" and arg["dtype"] not in MPS_DTYPE_VALUES:
                raise ProgramError(f"{c['selector']}: unknown dtype {arg['dtype']!r}")
            elif want.kind == "enum" and ENUMS.get(arg["enum"], (None, None))[1] != arg["value"]:
                raise ProgramError(f"{c['selector']}: unknown enum {arg['enum']!r}")
            elif want.kind == "descriptor":
                _validate_descriptor(c["selector"], arg)
        if spec.returns == "tensor" and len(c["results"]) != 1:
            raise ProgramError(f"{c['selector']} defines exactly one tensor")
        for r in c["results"]:
            define(r)
    for t in prog["targets"]:
        use(t)
    if len(set(prog["targets"])) != len(prog["targets"]):
        # MPSGraph would either merge them (and the counts differ) or leave a result slot unset.
        raise ProgramError(f"targets {prog['targets']} name a tensor twice")
    n_feeds, n_targets = len(prog["placeholders"]), len(prog["targets"])
    for r, f in prog["inplace"]:
        if not (0 <= r < n_targets and 0 <= f < n_feeds):
            raise ProgramError(f"in-place pair {[r, f]} out of range")
    for i in prog.get("checks", []):
        if not 0 <= i < n_targets:
            raise ProgramError(f"check {i} is not a target index")


def _validate_descriptor(selector: str, arg: dict) -> None:
    spec = DESCRIPTORS.get(arg["descriptor"])
    if spec is None:
        raise ProgramError(f"{selector}: unknown descriptor class {arg['descriptor']!r}")
    missing = set(spec.constructor_fields) - set(arg["fields"])
    unknown = set(arg["fields"]) - set(spec.fields)
    if missing or unknown:
        raise ProgramError(
            f"{selector}: descriptor {spec.name} missing {sorted(missing)}, "
            f"unknown {sorted(unknown)}"
        )


def structural_hash(prog: dict) -> str:
    """A hash of everything that defines the program (for caches and golden files)."""
    text = json.dumps(prog, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def numpy_dtype(mps_dtype: str) -> np.dtype:
    """The numpy dtype of an MPSDataType name."""
    return NUMPY_OF_MPS[mps_dtype]


def prim_dtype(mps_dtype: str) -> str:
    return PRIM_OF_MPS_DTYPE[mps_dtype]


__all__ = [
    "FORMAT",
    "NIL",
    "ProgramError",
    "RecordingBuilder",
    "boolean",
    "constant",
    "decode_constant",
    "decode_double",
    "descriptor",
    "double",
    "dtype",
    "enum",
    "integer",
    "ints",
    "numpy_dtype",
    "prim_dtype",
    "shape",
    "structural_hash",
    "tensor",
    "tensors",
    "validate",
]
