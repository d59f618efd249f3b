"""Comparing compiled results with eager ones: the ``check=`` mode and tolerance arguments,
``compare`` (the first difference, as a sentence) and ``Culprit`` (what a bisection found).

Used by the parity check of compiled calls (``parity.call``) and of training steps
(``parity.step``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid._tensor import Tensor

__all__ = [
    "DEFAULT_TOLERANCE",
    "MODES",
    "Culprit",
    "backend_culprit",
    "check_mode",
    "compare",
    "tolerance",
]

MODES = ("first", "always")
DEFAULT_TOLERANCE = (1e-4, 1e-5)  # (rtol, atol) for float32; scaled by the output's magnitude


def check_mode(value: str | None) -> str | None:
    """The ``check=`` argument, or ``LUCID_COMPILE_CHECK`` when it is None; None: no checking."""
    if value is None:
        value = os.environ.get("LUCID_COMPILE_CHECK", "").strip().lower() or None
        if value in ("0", "off", "false", "no"):
            value = None
    if value is not None and value not in MODES:
        raise ValueError(f"lucid.compile: check must be one of {MODES} or None, got {value!r}")
    return value


def tolerance(value: Any) -> tuple[float, float]:
    """``check_tolerance=(rtol, atol)``; default ``DEFAULT_TOLERANCE``."""
    if value is None:
        return DEFAULT_TOLERANCE
    try:
        rtol, atol = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"lucid.compile: check_tolerance must be (rtol, atol), got {value!r}"
        ) from None
    if rtol < 0 or atol < 0:
        raise ValueError(f"lucid.compile: check_tolerance must be non-negative, got {value!r}")
    return rtol, atol


def _array(a: Any) -> np.ndarray:
    return np.asarray(a._data if isinstance(a, Tensor) else a)


def compare(got: list, want: list, tol: tuple[float, float], what: str = "output") -> str | None:
    """None when every pair is close (NaNs equal); else what differs, naming the element."""
    rtol, atol = tol
    if len(got) != len(want):
        return f"{len(got)} {what}s compiled, {len(want)} eager"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = _array(g), _array(w)
        if g.shape != w.shape:
            return f"{what} {i}: shape {g.shape} compiled, {w.shape} eager"
        if not np.issubdtype(w.dtype, np.inexact):
            if not np.array_equal(g, w):
                return f"{what} {i}: integer/bool values differ"
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        # The magnitude of the finite reference values: an inf (a skipped loss-scaled step's
        # gradient) would make every tolerance infinite.
        finite = np.abs(w64[np.isfinite(w64)])
        scale = float(finite.max(initial=0.0))
        bad = ~np.isclose(g64, w64, rtol=rtol, atol=atol + rtol * scale, equal_nan=True)
        if bad.any():
            j = tuple(int(k) for k in np.argwhere(bad)[0])
            return (
                f"{what} {i}: {int(bad.sum())} of {bad.size} elements differ beyond "
                f"rtol={rtol}, atol={atol} (at {j}: compiled {g64[j]!r}, eager {w64[j]!r})"
            )
    return None


@dataclass
class Culprit:
    """What the bisection found: the ``stage`` (``pass``, ``lowering``, ``backend``), the pass
    and op names, a sentence, and the repro folder."""

    stage: str
    pass_name: str | None = None
    op: str | None = None
    detail: str = ""
    folder: str | None = None
    files: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        where = f"pass {self.pass_name!r}" if self.pass_name else self.stage
        op = f", op {self.op}" if self.op else ""
        folder = f"; repro written to {self.folder}" if self.folder else ""
        return f"{where}{op}: {self.detail}{folder}"


def backend_culprit(backend: Any) -> Culprit:
    """The culprit when the ``prim`` interpreter agrees with eager: the backend's own passes or
    code generation."""
    return Culprit(
        "backend",
        None,
        None,
        f"the prim interpreter agrees with eager: the {getattr(backend, 'name', backend)!r} "
        "backend's passes or code generation differ",
    )
