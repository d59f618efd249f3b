"""``diagnose(fn, *example_inputs)``: what the compiler will make of a function, before compiling.

It traces ``fn`` once (computing nothing) and reports, for the ops recorded:

- gradient coverage: ops with a VJP rule (``registered``), ops whose gradient deliberately stops
  (``grad_sinks``: comparisons, argmax, integer casts, factories) and ops with no rule
  (``uncovered``), each with its count and the shape/dtype of its first result at first use;
- per op, whether it lowers to ``prim`` (its first use is lowered, with its real operand types)
  and whether each available backend compiles the ``prim`` ops it lowers to (plus a backend
  whose refusal holds where it cannot run, marked "not available here", and any backend
  publishing a per-op table for ``docs/ops.md``), and whether it is safe under a symbolic batch
  axis;
- a graph break (a value read such as ``.item()``), with the user's source line; coverage then
  describes the ops recorded before the break.

``LUCID_MANUAL_VJP_REQUIRE=1`` turns a coverage gap into an error when a training graph is
built: ``check_vjp_coverage`` raises ``VJPCoverageError`` naming every uncovered op.
"""

from __future__ import annotations

import linecache
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from lucid._tensor import Tensor
from lucid.compile.errors import CompileError
from lucid.compile.options import resolve_backend
from lucid.ops._registry import GRAD_SINK, REGISTRY, SYMBOLIC_BATCH_SAFE
from lucid.trace._tracing import GraphBreak, _tracing

__all__ = [
    "DiagnosisReport",
    "GraphBreakInfo",
    "OpInfo",
    "OpSupport",
    "VJPCoverageError",
    "check_vjp_coverage",
    "diagnose",
]

REQUIRE_ENV = "LUCID_MANUAL_VJP_REQUIRE"


@dataclass(frozen=True)
class OpInfo:
    """One op of the traced graph: how often it occurs and its first result's shape/dtype.
    ``reason`` says why an uncovered op has no VJP rule, when the registry says."""

    name: str
    count: int
    sample_shape: tuple
    sample_dtype: str
    reason: str = ""


@dataclass(frozen=True)
class OpSupport:
    """Per op: each later stage's status (``"yes"`` or ``"no: <reason>"``; keys such as
    ``lowers to prim`` and one per backend, by its registry name, ``"<name> (not available
    here)"`` for a backend reported where it cannot run) and symbolic-batch safety."""

    name: str
    stages: dict[str, str]
    symbolic_batch_safe: bool


@dataclass(frozen=True)
class GraphBreakInfo:
    """A value read that stops tracing: what it was and the user's source line."""

    what: str
    filename: str | None
    lineno: int | None
    source: str


@dataclass(frozen=True)
class DiagnosisReport:
    """What ``diagnose`` found; ``str()`` is a readable report, ``to_dict()`` JSON-ready."""

    total_ops: int
    registered: list[OpInfo]
    grad_sinks: list[OpInfo]
    uncovered: list[OpInfo]
    recommendation: str
    support: list[OpSupport] = field(default_factory=list)
    graph_breaks: list[GraphBreakInfo] = field(default_factory=list)

    @property
    def covered(self) -> bool:
        """True when every op has a VJP rule or is a gradient sink."""
        return not self.uncovered

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("registered", "grad_sinks", "uncovered"):
            for info in data[key]:
                info["sample_shape"] = list(info["sample_shape"])
        return data

    def __str__(self) -> str:
        lines = [f"Lucid diagnosis: {self.total_ops} ops traced"]
        if self.graph_breaks:
            lines.append("")
            lines.append("Graph breaks (tracing stopped; the ops below are those before it):")
            for b in self.graph_breaks:
                where = f"{b.filename}:{b.lineno}" if b.filename else "unknown location"
                lines.append(f"  {b.what} at {where}")
                if b.source:
                    lines.append(f"      {b.source}")
        sections = (
            ("Gradient coverage: registered VJP rules", self.registered),
            ("Gradient sinks (the gradient deliberately stops)", self.grad_sinks),
            ("UNCOVERED (no VJP rule: backward through them fails)", self.uncovered),
        )
        for title, infos in sections:
            lines.append("")
            lines.append(f"{title}: {len(infos)} ops, {sum(i.count for i in infos)} uses")
            for i in infos:
                shape = "x".join(str("?" if d is None else d) for d in i.sample_shape) or "scalar"
                extra = f"  ({i.reason})" if i.reason else ""
                lines.append(f"  {i.name:<32} x{i.count:<4} {shape} {i.sample_dtype}{extra}")
        if self.support:
            stages = list(self.support[0].stages)
            lines.append("")
            lines.append("Backend support:")
            header = ["op", *stages, "symbolic batch"]
            rows = [
                [
                    s.name,
                    *(_short(s.stages[k]) for k in stages),
                    "yes" if s.symbolic_batch_safe else "no",
                ]
                for s in self.support
            ]
            widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
            for r in [header, *rows]:
                cells = "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))
                lines.append(("  " + cells).rstrip())
            notes = [
                f"  {s.name}: {k}: {v[4:]}"
                for s in self.support
                for k, v in s.stages.items()
                if v.startswith("no: ")
            ]
            if notes:
                lines.append("Not supported:")
                lines.extend(notes)
        lines.append("")
        lines.append(f"Recommendation: {self.recommendation}")
        return "\n".join(lines)


def _short(status: str) -> str:
    return "no" if status.startswith("no") else status


class VJPCoverageError(CompileError):
    """``LUCID_MANUAL_VJP_REQUIRE=1`` and the graph has ops with no VJP rule (a
    ``lucid.compile.CompileError``, as every refusal to compile)."""

    def __init__(self, uncovered: list[OpInfo]):
        self.uncovered = uncovered
        listed = ", ".join(f"{i.name} (x{i.count}, shape {i.sample_shape})" for i in uncovered)
        super().__init__(
            f"{REQUIRE_ENV}=1 and these ops have no VJP rule: {listed}; add a rule to the op's "
            "registry entry or unset the variable"
        )


def require_vjp() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _coverage(ops: Iterable[tuple[str, tuple, Any]]) -> tuple[list, list, list, int]:
    counts: Counter[str] = Counter()
    first: dict[str, tuple[tuple, str]] = {}
    total = 0
    for name, shape, dtype in ops:
        total += 1
        counts[name] += 1
        first.setdefault(name, (tuple(shape), getattr(dtype, "name", str(dtype))))
    registered, sinks, uncovered = [], [], []
    for name in sorted(counts):
        op = REGISTRY.get(name)
        shape, dt = first[name]
        if op is not None and GRAD_SINK in op.props:
            sinks.append(OpInfo(name, counts[name], shape, dt))
        elif op is not None and op.vjp is not None:
            registered.append(OpInfo(name, counts[name], shape, dt))
        else:
            reason = op.unsupported.get("vjp", "") if op is not None else "not in the registry"
            uncovered.append(OpInfo(name, counts[name], shape, dt, reason))
    return registered, sinks, uncovered, total


def _trace_ops(trace: Any) -> list[tuple[str, tuple, Any]]:
    out = []
    for top in trace.ops:
        v = top.outputs[0] if top.outputs else None
        out.append((top.name, v.shape if v is not None else (), v.dtype if v is not None else ""))
    return out


def check_vjp_coverage(trace: Any) -> None:
    """Raise ``VJPCoverageError`` when ``LUCID_MANUAL_VJP_REQUIRE`` is set and ``trace`` (a
    Trace) records an op with no VJP rule; do nothing otherwise."""
    if not require_vjp():
        return
    _, _, uncovered, _ = _coverage(_trace_ops(trace))
    if uncovered:
        raise VJPCoverageError(uncovered)


def _backends(backend: str | None) -> dict[str, Any]:
    """The backends to report on, by column name: ``backend`` alone (resolved through the
    registry), or every backend available on this machine plus those whose refusal holds
    without running them (their column says "(not available here)")."""
    from lucid.backends import get_backend, reporting_backends

    if backend is not None:
        name = resolve_backend(backend)
        return {name: get_backend(name)}
    return {
        name if not why else f"{name} (not available here)": target
        for name, (target, why) in reporting_backends().items()
    }


def _lower_one(top: Any) -> tuple[str, set[str], Any]:
    """Lower one traced op (its first use, with its real operand types) to ``prim``: ``("yes",
    prim op names, the prim module)`` or ``("no: <reason>", set(), None)``."""
    from lucid.ir import import_trace
    from lucid.passes.lower_to_prim import lower_module
    from lucid.trace._trace import Feed, Trace, TraceOp

    mini = Trace()
    seen: set[int] = set()
    for inp in top.inputs:
        for v in inp if isinstance(inp, list) else (inp,):
            if hasattr(v, "id") and v.id not in seen:
                seen.add(v.id)
                mini.feeds.append(Feed(v, f"input:{len(mini.feeds)}"))
    mini.ops.append(TraceOp(top.name, top.inputs, top.outputs, top.attrs))
    mini.outputs.extend((f"output:{i}", v) for i, v in enumerate(top.outputs))
    try:
        module = lower_module(import_trace(mini))
    except Exception as e:  # noqa: BLE001 (any lowering failure is what the report shows)
        reason = getattr(e, "reason", None) or str(e)
        return f"no: {reason}", set(), None
    prims = {
        op.name.split(".", 1)[1]
        for fn in module.ops
        for op in fn.body.blocks.first.ops
        if op.name.startswith("prim.")
    }
    return "yes", prims, module


def _support(first_use: dict[str, Any], backend: str | None) -> list[OpSupport]:
    backends = _backends(backend)
    out = []
    for name, top in sorted(first_use.items()):
        op = REGISTRY.get(name)
        if op is not None:
            lowered, _, module = _lower_one(top)
        else:
            lowered, module = "no: not in the registry", None
        stages = {"lowers to prim": lowered}
        for bname, target in backends.items():
            if module is None:
                stages[bname] = "no: does not lower to prim"
                continue
            refusal = target.refusal(module)
            stages[bname] = f"no: {refusal}" if refusal else "yes"
        safe = op is not None and SYMBOLIC_BATCH_SAFE in op.props
        out.append(OpSupport(name, stages, safe))
    return out


def _recommendation(uncovered, breaks, support) -> str:
    parts = []
    if breaks:
        b = breaks[0]
        where = f" at {b.filename}:{b.lineno}" if b.filename else ""
        parts.append(
            f"remove the graph break ({b.what}{where}): compute it outside the compiled function "
            "or keep the value as a tensor"
        )
    if uncovered:
        names = ", ".join(i.name for i in uncovered)
        parts.append(
            f"add a VJP rule for {names} (or mark it a gradient sink) before training through "
            f"it; set {REQUIRE_ENV}=1 to make this an error at compile time"
        )
    missing = sorted({s.name for s in support for v in s.stages.values() if v.startswith("no")})
    if missing:
        parts.append(
            f"{', '.join(missing)} cannot run on every backend: such graphs fall back to eager"
        )
    if not parts:
        return "every op is covered and compiles: ready for lucid.compile and compiled training"
    return "; ".join(parts)


def diagnose(fn: Callable, *example_inputs: Any, backend: str | None = None) -> DiagnosisReport:
    """Trace ``fn(*example_inputs)`` once (nothing runs) and report gradient coverage, backend
    support, symbolic-batch safety and graph breaks. ``backend``: report on that backend only
    (``"auto"`` and ``LUCID_COMPILE_BACKEND`` as for ``lucid.compile``); by default on the
    backend ``LUCID_COMPILE_BACKEND`` names, else on every backend available on this machine."""
    model = fn if hasattr(fn, "named_parameters") else None
    breaks: list[GraphBreakInfo] = []
    with _tracing(model) as tracer:
        args = [tracer.input_like(x) if isinstance(x, Tensor) else x for x in example_inputs]
        try:
            fn(*args)
        except GraphBreak as e:
            source = linecache.getline(e.filename, e.lineno or 0).strip() if e.filename else ""
            breaks.append(GraphBreakInfo(e.what, e.filename, e.lineno, source))
    registered, sinks, uncovered, total = _coverage(_trace_ops(tracer.trace))
    first_use: dict[str, Any] = {}
    for top in tracer.trace.ops:
        first_use.setdefault(top.name, top)
    if backend is None and os.environ.get("LUCID_COMPILE_BACKEND", "").strip():
        backend = "auto"  # the variable picks the backend, as for every entry point
    support = _support(first_use, backend)
    return DiagnosisReport(
        total_ops=total,
        registered=registered,
        grad_sinks=sinks,
        uncovered=uncovered,
        recommendation=_recommendation(uncovered, breaks, support),
        support=support,
        graph_breaks=breaks,
    )
