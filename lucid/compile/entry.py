"""The cache entries of the compiled wrappers, one typed dataclass per kind.

``ForwardEntry``: a ``CompiledModule`` signature without gradients; ``GradEntry`` (with its
``GradProgram``): one with gradients, whose outputs carry a ``grad_fn`` running a compiled
backward; ``StepEntry``: one signature of a compiled training step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from lucid import _random
from lucid._autograd import Node
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.compile._binding import name_feeds
from lucid.compile._pytree import _at
from lucid.compile.errors import FeedMismatch
from lucid.ops._registry import OpDef

__all__ = ["ForwardEntry", "GradEntry", "GradProgram", "StepEntry"]


@dataclass
class ForwardEntry:
    """One cached signature of ``CompiledModule`` without gradients: the executable and how to
    bind and unpack it."""

    graph: Any  # CompiledGraph
    bind: Callable[[tuple, dict], list]
    finish: Callable[[tuple, dict, list], Any]
    trace: Any
    compile_ms: float
    passes_ms: dict[str, float]
    feed_roles: list[str] = field(default_factory=list)
    captured_tensors: list[Tensor] = field(default_factory=list)
    # For save_compiled (aot.module): the output structure and the bound feeds.
    aot_output: tuple | None = None
    aot_captured: dict[str, Tensor] = field(default_factory=dict)
    n_hits: int = 0
    last_used: int = 0  # recency stamp for the entry LRU
    run_graph: Callable[[list], list] = field(init=False)
    # The backend's direct call serving hits, when it has one (see ``serve_hits_with``).
    direct: Any = field(init=False, default=None)
    _last_run_ms: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        # The executable's own run, without the CompiledGraph wrapper frame (hot path).
        exe = getattr(self.graph, "executable", None)
        self.run_graph = exe.run if exe is not None else self.graph.run

    def serve_hits_with(self, direct: Any, rebuild: Callable[[list], Any] | None) -> None:
        """Serve hits with ``direct`` (``direct(args, kwargs)`` returns the output Tensor, or
        the list of output Tensors that ``rebuild`` turns into the model's return structure)."""
        self.direct = direct
        if rebuild is None:
            self.hit = direct
        else:

            def hit(args: tuple, kwargs: dict) -> Any:
                return rebuild(direct(args, kwargs))

            self.hit = hit

    @property
    def last_run_ms(self) -> float:
        """Wall time of the last run (ms), however it ran."""
        return self.direct.last_run_ms if self.direct is not None else self._last_run_ms

    @last_run_ms.setter
    def last_run_ms(self, ms: float) -> None:
        if self.direct is not None:
            self.direct.last_run_ms = ms
        else:
            self._last_run_ms = ms

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        t0 = perf_counter()
        out = self.finish(args, kwargs, self.run_graph(self.bind(args, kwargs)))
        self.last_run_ms = (perf_counter() - t0) * 1e3
        return out

    # What a cache hit calls: ``hit(args, kwargs)``. ``serve_hits_with`` shadows it with the
    # backend's direct call (binding, running and wrapping in one call) when there is one.
    hit = __call__


@dataclass(eq=False)
class GradProgram:
    """The compiled forward and backward of one concrete shape, with their feed plans."""

    fwd: Any  # CompiledGraph
    bwd: Any  # the backward executable
    fwd_plan: list[tuple[str, Any]]
    fwd_results: list[tuple[str, Any]]
    bwd_plan: list[tuple[str, Any]]
    wrt: list[tuple[str, Any]]
    grad_roles: list[str]
    fwd_module: Any
    bwd_module: Any
    pipeline: str = ""  # the graph pipeline as a spec over the imported trace (for bisection)


@dataclass(eq=False)
class GradEntry:
    """An entry of ``CompiledModule``'s cache for grad mode: ``entry(args, kwargs)`` runs the
    compiled forward and returns outputs whose ``grad_fn`` runs the compiled backward.

    A symbolic-batch entry (``symbolic``) holds one trace for every batch size; the program of a
    batch size is made on first sight (``shape-specialize`` then ``vjp``, no retrace) and kept."""

    program: GradProgram
    symbolic: bool
    build: Callable[..., GradProgram]  # build(batch): the program of one batch size
    by_batch: Any  # LRU of batch size -> GradProgram (symbolic entries)
    cot_dtypes: dict[int, Any]
    tensor_pos: list[tuple]  # the access path of each tensor argument (``args[i][k]...``)
    n_leaves: int
    passthrough: dict[int, tuple[str, Any]]
    rebuild: Callable[[list], Any]
    trace: Any
    compile_ms: float
    passes_ms: dict[str, float]
    fwd_module: Any
    bwd_module: Any
    captured_tensors: list[Tensor]
    captured: dict[str, Tensor]
    n_hits: int = 0
    last_used: int = 0  # recency stamp for the entry LRU
    last_run_ms: float = 0.0
    # The positions of the tensor arguments when none is inside a container (the common case,
    # read without walking paths), else None.
    _flat_pos: list[int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if all(len(p) == 1 for p in self.tensor_pos):
            self._flat_pos = [p[0] for p in self.tensor_pos]

    def tensor_args(self, args: tuple) -> list[Tensor]:
        """The tensor arguments in feed order (``input:0``, ``input:1``, ...)."""
        flat = self._flat_pos
        if flat is not None:
            return [args[i] for i in flat]
        return [_at(args, p) for p in self.tensor_pos]

    def _program_for(self, args: tuple) -> GradProgram:
        if not self.symbolic:
            return self.program
        batch = _at(args, self.tensor_pos[0]).shape[0]
        prog = self.by_batch.get(batch)
        if prog is None:
            prog = self.build(batch)
            self.by_batch.put(batch, prog)
        return prog

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        t0 = time.perf_counter()
        prog = self._program_for(args) if self.symbolic else self.program
        tensor_args = self.tensor_args(args)
        feeds = []
        rng = rng_before = None
        for kind, ref in prog.fwd_plan:
            if kind == "input":
                feeds.append(_c_layout(tensor_args[ref]._data))
            elif kind == "kw":
                feeds.append(_c_layout(kwargs[ref]._data))
            elif kind == "rng":
                rng = _random.get_rng_state()._data
                feeds.append(rng)
                # The runtime advances ``rng`` in place; the backward (dropout's mask) needs the
                # state the forward drew from.
                rng_before = rng.copy()
            else:
                feeds.append(ref._data)
        try:
            res = prog.fwd.run(feeds)
        except (TypeError, ValueError) as e:
            raise FeedMismatch(name_feeds(str(e), prog.fwd.feed_roles)) from e
        outs: list[Any] = [None] * self.n_leaves
        residuals: list[np.ndarray] = []
        for i, (kind, ref) in enumerate(prog.fwd_results):
            if kind == "output":
                outs[ref] = Tensor._wrap(res[i])
            elif kind == "rng":
                _random.set_rng_state(rng)
            elif kind == "update":
                ref._version[0] += 1
            else:
                residuals.append(res[i])
        wrt = [
            tensor_args[ref] if kind == "input" else kwargs[ref] if kind == "kw" else ref
            for kind, ref in prog.wrt
        ]
        if _state.grad_enabled and any(t._requires_grad for t in wrt):
            self._attach(prog, outs, wrt, tensor_args, kwargs, residuals, rng_before)
        if self.passthrough:
            outs = self._with_passthrough(outs, tensor_args, kwargs)
        result = self.rebuild(outs)
        self.last_run_ms = (time.perf_counter() - t0) * 1e3
        return result

    hit = __call__  # what CompiledModule calls on a cache hit

    def _with_passthrough(self, outs: list, tensor_args: list, kwargs: dict) -> list:
        """Every output leaf in order: the computed ones, and the inputs returned unchanged as
        the very objects passed in."""
        computed = iter(outs)
        leaves = []
        for j in range(len(outs) + len(self.passthrough)):
            kind, ref = self.passthrough.get(j, (None, None))
            if kind is None:
                leaves.append(next(computed))
            else:
                leaves.append(tensor_args[ref] if kind == "input" else kwargs[ref])
        return leaves

    def _attach(
        self,
        prog: GradProgram,
        outs: list,
        wrt: list,
        tensor_args: list,
        kwargs: dict,
        residuals: list,
        rng_before: Any,
    ) -> None:
        bwd, bwd_plan, cot_dtypes = prog.bwd, prog.bwd_plan, self.cot_dtypes
        saved = [
            tensor_args[ref] if kind == "input" else kwargs[ref] if kind == "kw" else ref
            for kind, ref in bwd_plan
            if kind in ("input", "kw", "tensor")
        ]
        kw_tensors = dict(kwargs)

        def vjp(ctx, *gouts):
            if _state.tracer is not None or _state.grad_enabled:
                raise RuntimeError(
                    "create_graph=True (higher-order gradients) or tracing the backward through "
                    "a compiled call is not supported: run the model eagerly for those"
                )
            feeds = []
            for kind, ref in bwd_plan:
                if kind == "residual":
                    feeds.append(residuals[ref])
                elif kind == "cot":
                    g = gouts[ref]
                    # np.ascontiguousarray would make a 0-d cotangent (a scalar loss) 1-d.
                    feeds.append(np.asarray(g._data, dtype=cot_dtypes[ref], order="C"))
                elif kind == "rng":
                    feeds.append(rng_before)
                else:
                    # An input viewed with other strides (``idx.t()``): the runtime takes
                    # C-contiguous arrays only (the version check proves the values unchanged).
                    feeds.append(_c_layout(_feed_tensor(kind, ref, tensor_args, kw_tensors)._data))
            grads = bwd.run(feeds)
            return [Tensor._wrap(g) for g in grads]

        op = OpDef(
            name="CompiledCall",
            operands=tuple(f"x{i}" for i in range(len(wrt))),
            infer=lambda *a: None,
            kernel=lambda *a: None,
            vjp=vjp,
            n_outputs=len(outs),
            saves_inputs=False,
            saves_outputs=False,
        )
        Node.attach(op, tuple(wrt), {}, outs)
        node = next((t._node for t in outs if t._node is not None), None)
        if node is not None:
            node.versions = [(t, t._version[0]) for t in saved]


def _c_layout(data: np.ndarray) -> np.ndarray:
    """``data``, or a C-contiguous aligned copy when the runtime would refuse its layout."""
    flags = data.flags
    if flags.c_contiguous and flags.aligned:
        return data
    return np.array(data, order="C", copy=True)  # 0-d stays 0-d, unlike ascontiguousarray


def _feed_tensor(kind: str, ref: Any, tensor_args: list, kwargs: dict) -> Tensor:
    if kind == "input":
        return tensor_args[ref]
    if kind == "kw":
        return kwargs[ref]
    return ref


class _Slot:
    """A mutable holder with the ``_data`` attribute feeds are read from (scalars, RNG)."""

    __slots__ = ("_data",)

    def __init__(self, data: np.ndarray):
        self._data = data


@dataclass
class StepEntry:
    """One compiled training step for one signature, with its feed and result plans."""

    executable: Any
    feed_roles: list[str]
    result_roles: list[str]
    refs: list[Any]  # one object with ``_data`` per feed (None at input positions)
    input_pos: list[tuple[int, int]]  # (feed index, index among the step's tensor inputs)
    scalar_slots: dict[str, _Slot]
    scalar_plan: list[tuple[np.ndarray, int, Tensor | None, str]]
    rng_slot: _Slot | None
    loss_index: int | None
    grad_index: list[tuple[int, Tensor]]
    updated: list[Tensor]  # tensors the run writes in place (their versions are bumped)
    commits: list[tuple[int, Any]]  # (result index, target) when not in place
    inplace: bool
    compile_ms: float
    first_scalars: dict[str, float] | None = None
    scalar_last: list | None = None
    created_state: dict | None = None
    n_runs: int = 0
    tm: Any = None
    last_used: int = 0  # recency stamp for the entry LRU
    passes_ms: dict[str, float] | None = None  # time of each compile stage (timing())
    last_run_ms: float = 0.0
    rng_index: int = -1  # the RNG feed's position, when the step draws random numbers
    # A step loaded from a file (aot.step): what was saved with it.
    saved_runs: int = 0
    statics: Any = None
    saved_key: Any = None
    saved_training: bool = False
    saved_ir: str | None = None

    def set_scalars(self, values: dict[str, float]) -> None:
        for role, v in values.items():
            self.scalar_slots[role]._data[()] = v
        # What refresh compares against (Python floats: cheaper than reading the 0-d arrays).
        self.scalar_last = [None] * len(self.scalar_plan)

    def run(self, tensor_inputs: Sequence[Tensor]) -> list:
        feeds = [r._data if r is not None else None for r in self.refs]
        for fi, ii in self.input_pos:
            feeds[fi] = tensor_inputs[ii]._data
        rng = self.rng_slot
        if rng is not None:
            rng._data = _random.get_rng_state()._data
            feeds[self.rng_index] = rng._data
        t0 = time.perf_counter()
        results = self.executable.run(feeds)
        self.last_run_ms = (time.perf_counter() - t0) * 1e3
        self.n_runs += 1
        return results

    def feed_copies(self, tensor_inputs: Sequence[Tensor]) -> list[np.ndarray]:
        """Copies of the arrays ``run`` would feed (for ``profile``: in-place results go to
        them, not to the model)."""
        feeds = [r._data if r is not None else None for r in self.refs]
        for fi, ii in self.input_pos:
            feeds[fi] = tensor_inputs[ii]._data
        if self.rng_slot is not None:
            feeds[self.rng_index] = _random.get_rng_state()._data
        return [np.array(f, order="C", copy=True) for f in feeds]

    def after_success(self, results: list) -> None:
        """Commit the non-in-place results, bump versions, advance the RNG."""
        for i, target in self.commits:
            if target == "rng":
                continue
            np.copyto(target._data, results[i])
        for t in self.updated:
            t._version[0] += 1
        if self.rng_slot is not None:
            _random.set_rng_state(
                self.rng_slot._data if self.inplace else self._rng_result(results)
            )

    def _rng_result(self, results: list) -> np.ndarray:
        return results[self.result_roles.index("update:rng")]
