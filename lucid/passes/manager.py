"""The pass manager: pipelines from spec strings, run with MLIR-style instrumentation.

``PassManager("canonicalize,cse,dce", print_ir_after_all=True).run(module)`` parses the spec
(``name{opt=value other=1,2}``), runs each pass, and on request prints the IR before/after every
pass (or only after a pass that changed it, or at a failure), writes one file per pass into a
tree directory, verifies after each pass, and reports per-pass wall time and op counts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lucid.ir import _xdsl as x
from lucid.ir._gc import paused_gc
from lucid.ir.text import make_context, print_ir
from lucid.passes.instrumentation import Instrumentation
from lucid.passes.registry import available_passes, pass_loader

__all__ = [
    "Instrumentation",
    "PassFailure",
    "PassManager",
    "PassRecord",
    "PipelineError",
    "PipelineReport",
    "parse_pipeline_spec",
]


class PipelineError(ValueError):
    """A pass pipeline spec that cannot be run: bad syntax, unknown pass, bad option."""


class PassFailure(RuntimeError):
    """A pass raised, or the IR failed to verify after it. ``ir`` is the module text at the
    failure (the failing pass's partial result)."""

    def __init__(self, pass_name: str, cause: BaseException, ir: str | None):
        self.pass_name = pass_name
        self.cause = cause
        self.ir = ir
        super().__init__(f"pass '{pass_name}' failed: {type(cause).__name__}: {cause}")


def parse_pipeline_spec(spec: str) -> tuple[x.ModulePass, ...]:
    """Passes of a spec string such as ``"canonicalize{fold-limit=16},cse,dce"``."""
    spec = spec.strip()
    if not spec:
        return ()
    try:
        arg_specs = list(x.parse_pipeline(spec))
    except (x.ArgSpecParseError, ValueError) as e:  # the message has a caret under the error
        raise PipelineError(f"bad pass pipeline {spec!r}:\n{e}") from None
    out = []
    for s in arg_specs:
        loader = pass_loader(s.name)
        if loader is None:
            raise PipelineError(
                f"unknown pass {s.name!r} in pipeline {spec!r}; available passes: "
                f"{', '.join(sorted(available_passes()))}"
            )
        cls = loader()
        try:
            out.append(cls.from_spec(s))
        except Exception as e:
            options = ", ".join(
                f"{f.name.replace('_', '-')}: {f.type}" for f in dataclasses.fields(cls)
            )
            raise PipelineError(
                f"bad options for pass {s.name!r}: {e} (its options: {options or 'none'})"
            ) from None
    return tuple(out)


@dataclass
class PassRecord:
    """One pass run: wall time, and op counts when statistics were on."""

    name: str
    spec: str
    seconds: float
    ops_before: int | None = None
    ops_after: int | None = None


@dataclass
class PipelineReport:
    records: list[PassRecord] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def passes_ms(self) -> dict[str, float]:
        """Wall time per pass in ms (a pass run twice is summed)."""
        out: dict[str, float] = {}
        for r in self.records:
            out[r.name] = out.get(r.name, 0.0) + r.seconds * 1e3
        return out

    def format_timing(self) -> str:
        """An MLIR-style ``-mlir-timing`` report."""
        total = self.total_seconds or 1e-12
        bar = "===" + "-" * 73 + "==="
        lines = [
            bar,
            "Pass execution timing report".center(79).rstrip(),
            bar,
            f"  Total Execution Time: {self.total_seconds:.4f} seconds",
            "",
            "  ----Wall Time----   ----Ops----------   ----Name----",
        ]
        for r in self.records:
            ops = ""
            if r.ops_before is not None:
                ops = f"{r.ops_before:>6} -> {r.ops_after:<6}"
            lines.append(
                f"  {r.seconds:.4f} ({100 * r.seconds / total:5.1f}%)   {ops:<17}   {r.spec}"
            )
        lines.append(f"  {self.total_seconds:.4f} (100.0%)   {'':<17}   Total")
        return "\n".join(lines) + "\n"


def count_ops(module: x.Operation) -> int:
    return sum(1 for _ in module.walk()) - 1


class PassManager:
    """Runs a pipeline of passes over a module, with instrumentation.

    ``pipeline`` is a spec string or a sequence of pass instances; the instrumentation comes as
    an ``Instrumentation`` or as its fields by keyword.
    """

    def __init__(
        self,
        pipeline: str | Sequence[x.ModulePass] = "",
        instrumentation: Instrumentation | None = None,
        **flags,
    ):
        if isinstance(pipeline, str):
            self.passes = parse_pipeline_spec(pipeline)
        else:
            self.passes = tuple(pipeline)
            for p in self.passes:
                if not isinstance(p, x.ModulePass):
                    raise TypeError(f"expected ModulePass instances, got {type(p).__name__}")
        inst = instrumentation or Instrumentation()
        self.instrumentation = dataclasses.replace(inst, **flags) if flags else inst

    @property
    def spec(self) -> str:
        return ",".join(str(p.spec()) for p in self.passes)

    def _emit(self, header: str, module: x.Operation, text: str | None = None) -> str:
        inst = self.instrumentation
        text = (
            text
            if text is not None
            else print_ir(module, generic=inst.generic, debuginfo=inst.debuginfo)
        )
        stream = inst.stream or sys.stderr
        stream.write(f"// -----// IR Dump {header} //----- //\n{text}\n")
        stream.flush()
        return text

    def run(self, module: x.ModuleOp, ctx: x.Context | None = None) -> PipelineReport:
        """Run every pass on ``module`` in place and return the timing report."""
        with paused_gc():  # see lucid.ir._gc: collections cost more than they free here
            return self._run(module, ctx)

    def _run(self, module: x.ModuleOp, ctx: x.Context | None) -> PipelineReport:
        inst = self.instrumentation
        ctx = ctx or make_context()
        report = PipelineReport()
        counting = inst.timing or inst.statistics
        tree = inst.print_ir_tree_dir
        if tree:
            os.makedirs(tree, exist_ok=True)
            self._write_tree(tree, 0, "input", module)
        text_before = None
        for i, p in enumerate(self.passes, 1):
            name = p.name
            if inst.print_ir_before_all:
                text_before = self._emit(f"Before {name}", module)
            if inst.print_ir_after_change and text_before is None:
                text_before = print_ir(module, generic=inst.generic, debuginfo=inst.debuginfo)
            ops_before = count_ops(module) if counting else None
            t0 = time.perf_counter()
            try:
                p.apply(ctx, module)
                if inst.verify_each:
                    try:
                        module.verify()
                    except Exception as e:
                        raise PassFailure(name, e, None) from e
            except PassFailure as e:
                self._fail(e, module, verify=True)
            except Exception as e:
                self._fail(PassFailure(name, e, None), module, verify=False)
            seconds = time.perf_counter() - t0
            ops_after = count_ops(module) if counting else None
            report.records.append(PassRecord(name, str(p.spec()), seconds, ops_before, ops_after))
            text_after = None
            if inst.print_ir_after_all:
                text_after = self._emit(f"After {name}", module)
            elif inst.print_ir_after_change:
                text_after = print_ir(module, generic=inst.generic, debuginfo=inst.debuginfo)
                if text_after != text_before:
                    self._emit(f"After {name}", module, text_after)
            if tree:
                self._write_tree(tree, i, name, module)
            text_before = text_after if inst.print_ir_after_change else None
        if inst.timing:
            stream = inst.stream or sys.stderr
            stream.write(report.format_timing())
            stream.flush()
        return report

    def _fail(self, failure: PassFailure, module: x.ModuleOp, verify: bool) -> None:
        inst = self.instrumentation
        try:
            failure.ir = print_ir(module, generic=inst.generic, debuginfo=inst.debuginfo)
        except Exception:  # the IR may be too broken to print; the failure is what matters
            failure.ir = None
        if inst.print_ir_after_failure and failure.ir is not None:
            what = "Failed Verification" if verify else "Failed"
            self._emit(f"After {failure.pass_name} {what}", module, failure.ir)
        raise failure from failure.cause

    def _write_tree(self, tree: str, index: int, name: str, module: x.ModuleOp) -> None:
        path = os.path.join(tree, f"{index:02d}_{name}.mlir")
        with open(path, "w") as f:
            f.write(
                print_ir(
                    module,
                    generic=self.instrumentation.generic,
                    debuginfo=self.instrumentation.debuginfo,
                )
            )
