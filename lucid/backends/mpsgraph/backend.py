"""The two MPSGraph backends: ``mpsgraph`` (native, Apple Silicon with macOS 14+) and
``mpsgraph-reference`` (the same emission run by the numpy reference builder, on any machine).

Both take a prim module (after ``lower-to-prim``), run ``mpsgraph-legalize`` (and, for a symbolic
batch, ``symbolic-safety``), emit it through the emitter into their builder and return an
:class:`MPSGraphExecutable`: ``run(feeds) -> results``, with the gather range checks turned into
``IndexError`` and the ``update:<role>`` results written back into their feeds after a successful
run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid.backends.base import Backend
from lucid.backends.mpsgraph import program as A
from lucid.backends.mpsgraph.emit import HANDLED_OPS, EmitError, emit_module
from lucid.backends.mpsgraph.emit import STAGE as EMIT_STAGE
from lucid.backends.mpsgraph.legalize import MPSGraphUnsupported, legalize, legalize_refusal
from lucid.backends.mpsgraph.native import (
    MPSGraphUnavailable,
    NativeBuilder,
    macos_version,
    native_status,
)
from lucid.backends.mpsgraph.reference import ReferenceBuilder, run_program
from lucid.backends.mpsgraph.selectors import EMISSIONS
from lucid.backends.mpsgraph.symbolic import SymbolicUnsafe, symbolic_dims
from lucid.ir import visits
from lucid.ir.prim._shape import index_error_message

__all__ = [
    "Boundary",
    "MPSGraphBackend",
    "MPSGraphExecutable",
    "MPSGraphReferenceBackend",
    "dump_program",
]

# The prim-level passes both backends run after lower-to-prim.
PIPELINE = "prim-simplify,mpsgraph-legalize"


@dataclass(frozen=True)
class Boundary:
    """Between the function (its feeds and results) and the recorded program.

    ``feeds``: the function's feed index of each program placeholder (placeholders no call reads
    are left out). ``slots``: where each of the emitted results (results, check masks, checked
    values) comes from: ``("target", k)``, the program's k-th target (each tensor is one target,
    however often it is returned), or ``("feed", i)``, a copy of feed ``i`` returned as is.
    ``shapes``: ``()`` for a rank-0 result (``(1,)`` in the program), else None."""

    feeds: list[int]
    slots: list[tuple[str, int]]
    shapes: list[tuple[int, ...] | None]

    def run(self, runner: Any, feeds: list[np.ndarray]) -> list[np.ndarray]:
        bound = [feeds[i] for i in self.feeds]
        bound = [f.reshape(1) if isinstance(f, np.ndarray) and f.ndim == 0 else f for f in bound]
        targets = runner(bound) if any(kind == "target" for kind, _ in self.slots) else []
        outs = []
        for (kind, k), shape in zip(self.slots, self.shapes, strict=True):
            out = targets[k] if kind == "target" else np.array(feeds[k], copy=True)
            if shape is not None and out.shape != shape:
                out = out.reshape(shape)
            outs.append(out)
        return outs


def bind(builder: A.RecordingBuilder, emitted: Any) -> tuple[dict, Boundary]:
    """The program of an emission and its :class:`Boundary`: every target once, no returned
    placeholder among them, only the placeholders a call reads."""
    feed_of = {p["id"]: i for i, p in enumerate(builder.placeholders)}
    targets: list[int] = []
    position: dict[int, int] = {}
    slots: list[tuple[str, int]] = []
    for t in emitted.targets:
        if t in feed_of:
            slots.append(("feed", feed_of[t]))
            continue
        position.setdefault(t, len(targets))
        if position[t] == len(targets):
            targets.append(t)
        slots.append(("target", position[t]))
    visits.count(EMIT_STAGE, len(builder.calls))
    read = set()
    for c in builder.calls:
        for a in c["args"]:
            read.update([a["tensor"]] if "tensor" in a else a.get("tensors", []))
    feeds = [i for i, p in enumerate(builder.placeholders) if p["id"] in read]
    checks = sorted({slots[i][1] for i in emitted.checks})
    # Only rank-0 results change shape (the others may carry a symbolic batch).
    shapes: list[tuple[int, ...] | None] = [
        () if a.shape == () else None for a in emitted.result_avals
    ]
    shapes += [None] * (len(slots) - len(shapes))
    # Python writes in-place results back (after the checks), so the program lists none.
    return builder.program(targets, [], checks, feeds), Boundary(feeds, slots, shapes)


@dataclass
class MPSGraphExecutable:
    """A compiled MPSGraph program: run feeds (in placeholder order) to results."""

    program: dict
    feed_roles: list[str]
    result_roles: list[str]
    n_results: int
    checks: list[int]
    inplace: list[tuple[int, int]]  # written back here (the program's own list is empty)
    runner: Any  # feeds -> list of target arrays
    # check target -> (target of the checked values, the user op's message with "{}")
    check_messages: dict[int, tuple[int, str]] = field(default_factory=dict)
    # The boundary (None: the program's feeds and targets are the executable's own).
    boundary: Boundary | None = None

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = list(feeds)
        if self.boundary is None:
            outs = self.runner(feeds)
        else:
            outs = self.boundary.run(self.runner, feeds)
        for i in self.checks:
            ok = np.asarray(outs[i])
            if ok.all():
                continue
            if i in self.check_messages:  # eager's message, naming the first bad value
                values, message = self.check_messages[i]
                bad = np.asarray(outs[values]).reshape(-1)[int(np.argmin(ok.reshape(-1)))]
                raise IndexError(index_error_message(message, int(bad)))
            raise IndexError(
                "index out of range in a gather or scatter of the MPSGraph program "
                "(nothing was written back)"
            )
        results = list(outs[: self.n_results])
        for r, f in self.inplace:
            np.copyto(feeds[f], results[r])
            results[r] = feeds[f]
        return results

    def dump(self) -> str:
        return dump_program(self.program)


class MPSGraphReferenceBackend(Backend):
    """Emission + the numpy reference builder: "will my model compile for the Mac, and does it
    give the same numbers?", on any machine."""

    name = "mpsgraph-reference"
    pipeline = PIPELINE
    # What compile/compile_symbolic (and mpsgraph-legalize) raise for a graph MPSGraph cannot run:
    # the compiler shows the message as the fallback reason.
    refusals = (MPSGraphUnsupported, SymbolicUnsafe, EmitError)
    supports_symbolic_batch = True

    def available(self) -> tuple[bool, str]:
        return True, ""

    def _macos(self) -> tuple[int, ...] | None:
        """The macOS version whose bugs legalization works around (None: any)."""
        return None

    def supported_ops(self) -> frozenset[str]:
        return frozenset(EMISSIONS) & HANDLED_OPS

    def _builder(self) -> A.RecordingBuilder:
        return ReferenceBuilder()

    def record(
        self,
        module: Any,
        *,
        inplace_updates: bool = True,
        symbolic: Mapping[Any, frozenset[int]] | None = None,
        builder: A.RecordingBuilder | None = None,
    ) -> tuple[dict, Any]:
        """Legalize ``module`` in place and record its MPSGraph program: (program, Emitted)."""
        program, emitted, _ = self.record_bound(
            module, inplace_updates=inplace_updates, symbolic=symbolic, builder=builder
        )
        return program, emitted

    def record_bound(
        self,
        module: Any,
        *,
        inplace_updates: bool = True,
        symbolic: Mapping[Any, frozenset[int]] | None = None,
        builder: A.RecordingBuilder | None = None,
    ) -> tuple[dict, Any, Boundary]:
        """:meth:`record` and the :class:`Boundary` between the function and the program."""
        legalize(module, self._macos())
        b = builder if builder is not None else A.RecordingBuilder()
        emitted = emit_module(module, b, inplace_updates=inplace_updates, symbolic=symbolic)
        program, boundary = bind(b, emitted)
        return program, emitted, boundary

    def _runner(self, program: dict) -> Any:
        A.validate(program)
        return lambda feeds: run_program(program, feeds, validated=True)

    def compile(  # type: ignore[override]
        self,
        module: Any,
        *,
        inplace_updates: bool = True,
        symbolic: Mapping[Any, frozenset[int]] | None = None,
    ) -> MPSGraphExecutable:
        """An executable of a prim module (``mpsgraph-legalize`` runs first and may refuse with
        ``MPSGraphUnsupported``)."""
        program, emitted, boundary = self.record_bound(
            module, inplace_updates=inplace_updates, symbolic=symbolic
        )
        # A program of returned feeds only has nothing for MPSGraph to compile.
        runner = self._runner(program) if program["targets"] else None
        return MPSGraphExecutable(
            program,
            emitted.feed_roles,
            emitted.result_roles,
            len(emitted.result_roles),
            emitted.checks,
            emitted.inplace,  # written back in Python, after the checks passed
            runner,
            emitted.check_messages,
            boundary,
        )

    def compile_symbolic(
        self, module: Any, probe: Any, *, inplace_updates: bool = True
    ) -> MPSGraphExecutable:
        """One executable for every batch size: ``module`` and ``probe`` are the same trace
        lowered to prim at two batch sizes. Raises SymbolicUnsafe (with the op) when
        symbolic-safety cannot prove that MPSGraph will not abort; the caller then compiles
        per shape and reports the reason."""
        legalize(module)
        legalize(probe)
        dims = symbolic_dims(module, probe)
        return self.compile(module, inplace_updates=inplace_updates, symbolic=dims)

    def stage_ir(self, module: Any) -> str:
        """The final stage of a prim module as text (``CompiledModule.ir(stage="final")``): the
        legalized prim module, then its MPSGraph program, one method call a line."""
        from lucid.ir import print_ir

        program, _ = self.record(module)
        return (
            print_ir(module) + "\n// MPSGraph program (lucid.mpsgraph/v1)\n" + dump_program(program)
        )

    def refusal(self, module: Any) -> str | None:
        """Why MPSGraph would refuse the prim ``module`` (``diagnose``'s column), or None: what
        mpsgraph-legalize refuses, else what the emitter cannot emit (the module is unchanged;
        the emission goes to a throwaway recording)."""
        reason = legalize_refusal(module)
        if reason is not None:
            return reason
        try:
            emit_module(module, A.RecordingBuilder())
        except (EmitError, A.ProgramError) as e:
            return str(e)
        return None


class MPSGraphBackend(MPSGraphReferenceBackend):
    """The native MPSGraph backend (Apple Silicon, macOS 14+, native part built)."""

    name = "mpsgraph"
    # Its refusal is the reference's (legalization and emission, in Python): diagnose shows it
    # on any machine.
    reports_when_unavailable = True

    def available(self) -> tuple[bool, str]:
        return native_status()

    def _macos(self) -> tuple[int, ...] | None:
        return macos_version()

    def _runner(self, program: dict) -> Any:
        ok, reason = native_status()
        if not ok:
            raise MPSGraphUnavailable(reason)
        executable = NativeBuilder().compile(program, cache=True)
        return lambda feeds: NativeBuilder.run(executable, feeds)


def _render_arg(a: dict) -> str:
    kind = next(k for k in a if k in A.ARG_KINDS)
    if kind == "tensor":
        return f"%{a['tensor']}"
    if kind == "tensors":
        return "[" + ", ".join(f"%{t}" for t in a["tensors"]) + "]"
    if kind == "nil":
        return "nil"
    if kind == "enum":
        return a["enum"]
    if kind == "descriptor":
        fields = ", ".join(f"{k}={v}" for k, v in a["fields"].items())
        return f"{a['descriptor']}{{{fields}}}"
    if kind == "constant":
        c = a["constant"]
        return f"<{c['dtype']} {c['shape']} data>"
    return repr(a[kind])


def dump_program(program: dict) -> str:
    """A recorded program as text, one MPSGraph call a line."""
    lines = []
    for p in program["placeholders"]:
        lines.append(f"%{p['id']} = placeholder {p['shape']} {p['dtype']}  // {p['role']}")
    for c in program["calls"]:
        results = ", ".join(f"%{r}" for r in c["results"])
        args = ", ".join(_render_arg(a) for a in c["args"])
        lines.append(f"{results} = {c['selector']}({args})")
    lines.append("targets " + ", ".join(f"%{t}" for t in program["targets"]))
    if program["inplace"]:
        lines.append(f"inplace {program['inplace']}")
    if program.get("checks"):
        lines.append(f"checks {program['checks']}")
    return "\n".join(lines) + "\n"
