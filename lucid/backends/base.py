"""The backend interface: what a backend gives the compiler (``lucid/compile``).

The compiler takes a traced call through the backend-neutral stages (import, graph passes,
``lower-to-prim``) and then hands the ``prim`` module to a backend, reached only by name through
the registry in ``lucid/backends/__init__.py``. A backend gives:

- ``pipeline``: its passes over ``prim`` after ``lower-to-prim`` (legalization, backend
  passes), as a pass-pipeline string: the compiler runs ``lower-to-prim,<pipeline>``;
- ``compile(module, inplace_updates=...)``: an :class:`Executable` of the prim module (after
  ``pipeline``). With ``inplace_updates`` the ``update:<role>`` results are written into the feed
  bound to ``<role>`` after a successful run; without, they are only returned;
- ``stage_ir(module)``: the text of the last stage (``CompiledModule.ir(stage="final")``: the
  prim module after ``pipeline`` plus the backend's own program);
- ``available()``: ``(True, "")`` or ``(False, why)`` on this machine; ``check_settings()`` raises
  ``ValueError`` naming a bad setting of the backend's environment variables;
- ``supported_ops()`` and ``refusal(module)``: what ``diagnose`` reports (with
  ``reports_when_unavailable``, also where the backend cannot run);
- ``refusals``: the exception types ``compile`` (or a ``pipeline`` pass) raises for a graph it
  cannot handle; the compiler turns them into a fallback (or ``CompileError``) with the message
  as the reason. Other exceptions are bugs and surface as such;
- optionally ``program_format``, ``export_program(module) -> str`` and
  ``import_program(text) -> Executable``: the backend's final program as text (for
  ``save_compiled`` and the disk cache); without them a saved signature is rebuilt from its IR;
- optionally ``supports_symbolic_batch`` and ``compile_symbolic(module, probe)``: one executable
  serving every batch size (``LUCID_COMPILE_DYNAMIC=1``). Without it, the compiler specialises
  the symbolic trace per batch size and calls ``compile`` for each.

An :class:`Executable` runs feeds (numpy arrays in the order of the module's feed roles, exact
dtypes and shapes, C-contiguous) to results (in the order of the result roles). A run that raises
leaves every feed unchanged. ``TypeError``/``ValueError`` from ``run`` mean "a feed does not match"
(the compiler then re-lays out or recompiles); an ``IndexError`` is the user's error (an index out
of range), raised as eager raises it.

>>> from lucid.backends import get_backend
>>> backend = get_backend("cpu")
>>> PassManager("lower-to-prim," + backend.pipeline).run(module)
>>> exe = backend.compile(module, inplace_updates=True)
>>> results = exe.run(feeds)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["Backend", "BackendUnavailable", "Executable", "Unsupported"]


class Executable(Protocol):
    """A compiled program. ``run`` takes the feeds in order and returns the results in order;
    in-place results (when compiled with ``inplace_updates``) are written into their feeds after
    a successful run. Optional: ``dump() -> str`` (the program as text) and
    ``profile(feeds, repeats) -> [(index, op, seconds)]`` (per-instruction time)."""

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class Unsupported(Exception):
    """A backend cannot compile this graph; the message is the reason the user sees (the
    signature falls back to eager, or ``CompileError`` for the training entry points)."""


class BackendUnavailable(ValueError):
    """The backend asked for cannot run on this machine; the message says why."""


class Backend(ABC):
    """One way to execute ``prim`` modules (the CPU runtime, MPSGraph, ...)."""

    name: str = "abstract"
    #: Passes over ``prim`` run after ``lower-to-prim`` (a pass-pipeline string, may be empty).
    pipeline: str = ""
    #: Exception types meaning "this graph cannot be compiled here" (besides ``Unsupported``).
    refusals: tuple[type[BaseException], ...] = ()
    #: True when ``compile_symbolic`` builds one executable for every batch size.
    supports_symbolic_batch: bool = False
    #: True when ``refusal`` needs nothing of this machine (pure Python over the prim module):
    #: reports (``diagnose``) then show the backend even where it is not available.
    reports_when_unavailable: bool = False

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when this backend runs on this machine, else ``(False, why)``."""
        return True, ""

    def check_settings(self) -> None:  # noqa: B027 (optional: most backends have no settings)
        """Raise ``ValueError`` naming a bad setting of this backend (environment variables);
        called once per compile, before anything is traced."""

    @abstractmethod
    def supported_ops(self) -> frozenset[str]:
        """The prim op names this backend can compile."""

    @abstractmethod
    def compile(self, module: Any, *, inplace_updates: bool = True) -> Executable:
        """An executable of the prim ``module`` (``pipeline`` already run on it). Raises
        ``Unsupported`` (or one of ``refusals``) for a graph it cannot compile."""

    @abstractmethod
    def stage_ir(self, module: Any) -> str:
        """The final stage of the prim ``module`` (``pipeline`` already run) as text."""

    def compile_symbolic(
        self, module: Any, probe: Any, *, inplace_updates: bool = True
    ) -> Executable:
        """One executable for every batch size, from the same trace lowered at two batch sizes
        (``module`` and ``probe``). Only called when ``supports_symbolic_batch``; raise
        ``Unsupported`` (or one of ``refusals``) when it cannot be proven safe."""
        raise Unsupported(f"backend {self.name!r} compiles one executable per batch size")

    #: Names and versions the text of ``export_program``; None: the backend exports nothing.
    program_format: str | None = None

    def export_program(self, module: Any, *, inplace_updates: bool = True) -> str | None:
        """The final program of the prim ``module`` (``pipeline`` already run) as text that
        ``import_program`` turns back into an executable (no code in it), or None
        (``inplace_updates`` as for ``compile``)."""
        return None

    def import_program(self, text: str, *, inplace_updates: bool = True) -> Executable:
        """An executable from ``export_program``'s text; ValueError when the text is not a
        valid program of this backend (the caller then rebuilds from the IR)."""
        raise ValueError(f"backend {self.name!r} does not import programs")

    def refusal(self, module: Any) -> str | None:
        """Why this backend would refuse the prim ``module`` (None: it would not), without
        compiling. The default compares the module's prim ops with ``supported_ops``."""
        ops = {
            op.name.split(".", 1)[1]
            for fn in module.ops
            for block in fn.regions[0].blocks
            for op in block.ops
            if op.name.startswith("prim.")
        }
        missing = sorted(ops - self.supported_ops())
        return f"lacks prim ops {', '.join(missing)}" if missing else None

    def run(self, executable: Executable, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run ``executable`` on ``feeds`` (numpy arrays, exact dtypes and shapes)."""
        return executable.run(feeds)

    def bound_call(
        self,
        executable: Executable,
        positions: Sequence[int],
        tensors: Sequence[Any],
        *,
        single: bool,
    ) -> Any:
        """Optional fast path for a cache hit: a ``call(args, kwargs=None)`` that feeds
        ``args[p]._data`` for each of ``positions`` then ``t._data`` for each of ``tensors``, runs
        ``executable`` and returns Tensors (the Tensor itself with ``single``, else a list). None
        (the default) lets ``lucid.compile`` bind, ``run`` and wrap in Python."""
        return None
