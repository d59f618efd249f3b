"""Why a wrapper compiles a new signature while others are cached: the difference against the
nearest cached key, part by part, old -> new, with a hint where one applies.

A key is ``(argument signatures, keyword signatures, training, grad, parameter dtypes)`` (see
``signature.CacheKey``); a tensor's signature is ``(shape, dtype, requires_grad)``, any other
argument's ``(type, value)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid.compile._binding import mode_repr

__all__ = ["Difference", "explain", "nearest", "recompile_limit"]

BATCH_HINT = "the batch dim changes: compile with dynamic=True to share one executable"
SCALAR_HINT = "a Python scalar argument changes value: pass it as a tensor to reuse the executable"


@dataclass(frozen=True)
class Difference:
    """One part of a key that differs: ``where`` (argument), ``part``, ``old`` -> ``new``."""

    where: str
    part: str
    old: Any
    new: Any
    hint: str = ""

    @property
    def varying(self) -> str:
        """What varies, without the values (to group the differences of many recompiles)."""
        return f"{self.where}: {self.part}"

    def __str__(self) -> str:
        return f"{self.where}: {self.part} {self.old!r} -> {self.new!r}"


def _is_tensor_sig(sig: Any) -> bool:
    # (shape, dtype, requires_grad) for a call; (shape, dtype) for a training step's input.
    return isinstance(sig, tuple) and len(sig) in (2, 3) and not isinstance(sig[0], type)


def _dim(d: Any) -> Any:
    return "?" if d is None else d


def _sig_diffs(where: str, old: Any, new: Any) -> list[Difference]:
    try:
        if old is new or bool(old == new):
            return []
    except (TypeError, ValueError, RuntimeError):  # a value whose == is elementwise (a tensor)
        pass
    if _is_tensor_sig(old) and _is_tensor_sig(new):
        (oshape, odt, org), (nshape, ndt, nrg) = (
            (tuple(old) + (False,))[:3],
            (tuple(new) + (False,))[:3],
        )
        out: list[Difference] = []
        if len(oshape) != len(nshape):
            out.append(Difference(where, "rank", len(oshape), len(nshape)))
        else:
            for j, (a, b) in enumerate(zip(oshape, nshape, strict=True)):
                if a != b:
                    hint = BATCH_HINT if j == 0 else ""
                    out.append(Difference(where, f"shape dim {j}", _dim(a), _dim(b), hint))
        if odt != ndt:
            out.append(Difference(where, "dtype", np.dtype(odt).name, np.dtype(ndt).name))
        if org != nrg:
            out.append(Difference(where, "requires_grad", bool(org), bool(nrg)))
        return out
    if not _is_tensor_sig(old) and not _is_tensor_sig(new):
        (otype, oval), (ntype, nval) = old, new
        if otype is not ntype:
            return [Difference(where, "type", otype.__name__, ntype.__name__)]
        hint = SCALAR_HINT if isinstance(oval, (int, float, complex)) else ""
        return [Difference(where, "value", oval, nval, hint)]
    kind = ("tensor", "non-tensor")
    return [Difference(where, "kind", kind[not _is_tensor_sig(old)], kind[not _is_tensor_sig(new)])]


def diff(old: tuple, new: tuple) -> list[Difference]:
    """Every difference between two cache keys."""
    (oargs, okw, otrain, ograd, oparams, oregion), (nargs, nkw, ntrain, ngrad, nparams, nregion) = (
        old,
        new,
    )
    out: list[Difference] = []
    if len(oargs) != len(nargs):
        out.append(Difference("arguments", "count", len(oargs), len(nargs)))
    for i, (a, b) in enumerate(zip(oargs, nargs, strict=False)):
        out += _sig_diffs(f"argument {i}", a, b)
    okw_d, nkw_d = dict(okw), dict(nkw)
    for name in sorted(set(okw_d) | set(nkw_d)):
        if name not in okw_d:
            out.append(Difference(f"keyword {name!r}", "presence", "absent", "given"))
        elif name not in nkw_d:
            out.append(Difference(f"keyword {name!r}", "presence", "given", "absent"))
        else:
            out += _sig_diffs(f"keyword {name!r}", okw_d[name], nkw_d[name])
    if otrain != ntrain:
        out.append(Difference("model", "training flag", mode_repr(otrain), mode_repr(ntrain)))
    if ograd != ngrad:
        out.append(Difference("call", "grad mode", bool(ograd), bool(ngrad)))
    if oparams != nparams:
        names = [
            f"{i}: {np.dtype(a).name} -> {np.dtype(b).name}"
            for i, (a, b) in enumerate(zip(oparams, nparams, strict=False))
            if a != b
        ]
        out.append(Difference("parameters", "dtypes", len(oparams), ", ".join(names) or "count"))
    if oregion != nregion:
        out.append(Difference("call", "autocast region", oregion, nregion))
    return out


def diff_step(old: tuple, new: tuple) -> list[Difference]:
    """Every difference between two training-step keys: ``(input signatures, training, ...,
    autocast region)`` (``make_step``: parameters' ``(requires_grad, dtype)``; ``fused_step``:
    the optimizer's baked-in settings, parameters' ``requires_grad``, and after the region the
    loss scaling's)."""
    out: list[Difference] = []
    oin, nin = old[0], new[0]
    if len(oin) != len(nin):
        out.append(Difference("inputs", "count", len(oin), len(nin)))
    for i, (a, b) in enumerate(zip(oin, nin, strict=False)):
        out += _sig_diffs(f"input {i}", a, b)
    if old[1] != new[1]:
        out.append(Difference("model", "training flag", mode_repr(old[1]), mode_repr(new[1])))
    fused = len(new) == 6
    if fused and old[5] != new[5]:
        out.append(Difference("scaler", "options", old[5], new[5]))
    region = 4 if fused else 3
    if old[region] != new[region]:
        out.append(Difference("call", "autocast region", old[region], new[region]))
    rest = ("optimizer settings", "parameters") if fused else ("parameters",)
    for name, a, b in zip(rest, old[2:region], new[2:region], strict=False):
        if a != b:
            changed = [i for i, (u, v) in enumerate(zip(a, b, strict=False)) if u != v]
            what = "requires_grad/dtype" if name == "parameters" else "values"
            out.append(Difference(name, f"{what} at {changed or 'count'}", "cached", "new"))
    return out


def nearest(
    new: tuple, cached: list[tuple], differ: Any = None
) -> tuple[tuple, list[Difference]] | None:
    """The cached key with the fewest differences from ``new``, and those differences."""
    best = None
    best_score = 0
    for key in cached:
        d = (differ or diff)(key, new)
        # A different argument count hides every per-argument difference: rank it far.
        score = sum(3 if x.part == "count" else 1 for x in d)
        if best is None or score < best_score:
            best, best_score = (key, d), score
    return best


def explain(new: tuple, cached: list[tuple], differ: Any = None) -> dict[str, Any] | None:
    """Why ``new`` compiles while ``cached`` keys exist: ``{"key", "nearest", "differences",
    "hints", "message"}``; None when nothing is cached."""
    found = nearest(new, cached, differ)
    if found is None:
        return None
    near, diffs = found
    hints = sorted({d.hint for d in diffs if d.hint})
    parts = "; ".join(str(d) for d in diffs) or "no visible difference"
    message = f"recompiling for {new!r}: {parts} (against cached {near!r})"
    if hints:
        message += ". Hint: " + "; ".join(hints)
    return {
        "key": new,
        "nearest": near,
        "differences": [str(d) for d in diffs],
        "varying": sorted({d.varying for d in diffs}),
        "hints": hints,
        "message": message,
    }


def recompile_limit() -> int:
    """``LUCID_COMPILE_RECOMPILE_LIMIT`` (default 8): signatures on one wrapper before one
    warning naming the varying part."""
    raw = os.environ.get("LUCID_COMPILE_RECOMPILE_LIMIT", "").strip()
    if not raw:
        return 8
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"LUCID_COMPILE_RECOMPILE_LIMIT must be a positive integer, got {raw!r}"
        ) from None
    if value < 1:
        raise ValueError(f"LUCID_COMPILE_RECOMPILE_LIMIT must be a positive integer, got {raw!r}")
    return value
