"""Loading a saved training step: ``load_step`` rebuilds what ``aot.step`` wrote into a
``LoadedStep`` that continues the training where the original left it (parameters, optimizer
state and step scalars as they were). Nothing in the file is executed: the optimizer and
scheduler classes come from a fixed table of ``lucid.optim`` classes."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from lucid import _random
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.backends import Unsupported as BackendUnsupported
from lucid.compile import introspect
from lucid.compile.aot.file import _bad, _lucid_version, _model_weights, _owned
from lucid.compile.aot.step import (
    KINDS,
    _decode,
    _encode,
    _input_json,
    _match,
    _optimizer_classes,
    _scheduler_classes,
)
from lucid.compile.cache import SignatureCache
from lucid.compile.options import backend_of
from lucid.compile.training.builder import TrainingModule, _ScalarSource
from lucid.compile.training.entries import (
    _make_entry,
    _OptimizerView,
    _run_checked,
    profile_entry,
)
from lucid.compile.training.make_step import _attach_grads
from lucid.ir import feed_roles, forward_func, parse_ir, result_roles
from lucid.ir.prim.dialect import prim_dialect
from lucid.ir.text import make_context
from lucid.nn.parameter import Parameter
from lucid.passes import PassFailure, PassManager

logger = logging.getLogger("lucid.compile")

__all__ = ["LoadedStep", "load_step"]


# --- load --------------------------------------------------------------------------------------
class LoadedStep:
    """What ``load_compiled`` returns for a saved training step: ``step(x, *extra) -> loss``
    continuing the saved training (parameters, optimizer state and step scalars as they were).
    ``named_parameters()``/``parameters()``, ``optimizer`` and ``scheduler`` (when saved) are the
    live objects the step trains. Like a live step: ``cache_info()``, ``timing()``,
    ``ir(key, stage)``, ``module(key)``, ``profile(x, *extra)``, and ``train()``/``eval()``
    choosing which saved entries (those compiled in training or in eval mode) calls run."""

    _what = "load_compiled step"

    def __init__(self, path: str, fields: dict, tensors: dict[str, Tensor], optimizer: Any,
                 scheduler: Any, entries: dict[str, Any], sources: dict[str, str],
                 build_ms: dict[str, float], parts: dict[str, str], backend: str,
                 model: Any = None) -> None:  # fmt: skip

        self.path = path
        self.kind = fields["kind"]
        self.training = bool(fields["model_training"])
        self.check_finite = bool(fields.get("check_finite", False))
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.backend = backend
        self._tensors = tensors
        self._cache = SignatureCache.holding(entries)  # keyed by the saved match text
        self._entries = self._cache.entries
        self._sources = sources
        self._build_ms = build_ms
        self._parts = parts
        self._model = model
        self._view = _OptimizerView(optimizer) if optimizer is not None else None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"LoadedStep({self.path!r}, {self.kind}, {len(self._entries)} entr(y/ies))"

    def train(self, mode: bool = True) -> LoadedStep:
        """Run the entries saved in training mode (``mode``) or in eval mode; with ``model=``
        the model's mode follows, as ``Module.train`` would set it."""
        self.training = bool(mode)
        if self._model is not None and hasattr(self._model, "train"):
            self._model.train(mode)
        return self

    def eval(self) -> LoadedStep:
        return self.train(False)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return [(r[len("param:") :], t) for r, t in self._tensors.items() if r.startswith("param:")]

    def parameters(self) -> list[Tensor]:
        return [t for _, t in self.named_parameters()]

    def named_buffers(self) -> list[tuple[str, Tensor]]:
        return [
            (r[len("buffer:") :], t) for r, t in self._tensors.items() if r.startswith("buffer:")
        ]

    def _entry_for(self, inputs: tuple) -> tuple[str, Any]:
        match = _match(_input_json(inputs), self.training)
        entry = self._cache.get(match)
        if entry is None:
            saved = "; ".join(e.saved_key for e in self._entries.values())
            modes = {e.saved_training for e in self._entries.values()}
            hint = ""
            if self.training not in modes:
                hint = (
                    f" (this step is in {'training' if self.training else 'eval'} mode and "
                    f"every saved entry was compiled in the other: call "
                    f"{'eval' if self.training else 'train'}())"
                )
            raise ValueError(
                f"load_compiled: the step's inputs match no saved entry (a saved step runs only "
                f"the signatures it was compiled for){hint}; saved: {saved}"
            )
        return match, entry

    def __call__(self, x: Any, *extra: Any) -> Tensor:
        with self._lock:  # one call at a time, as a live step (see lucid.compile.training)
            return self._step(x, *extra)

    def _step(self, x: Any, *extra: Any) -> Tensor:
        inputs = (x, *extra)
        _, entry = self._entry_for(inputs)
        view = self._view
        if view is not None:
            if view.changed():
                raise RuntimeError(
                    "load_compiled: the loaded step's optimizer state or param_groups were "
                    "replaced (load_state_dict); load the file again instead"
                )
            scalars = view.group_scalars()
            if entry.statics is not None and _encode(view.statics(scalars)) != entry.statics:
                raise ValueError(
                    "load_compiled: the optimizer's structural options (e.g. nesterov, amsgrad) "
                    "differ from the saved step's; they are compiled in"
                )
            view.prepare(entry, scalars)
        tensors = [a for a in inputs if isinstance(a, Tensor)]
        t0 = time.perf_counter()
        res = _run_checked(entry, tensors, "load_compiled step")
        loss_arr = res[entry.loss_index]
        if self.check_finite and not np.isfinite(loss_arr).all():
            raise FloatingPointError(
                f"loaded step: the loss is {float(loss_arr)}; parameters and optimizer state "
                "were left unchanged"
            )
        entry.after_success(res)
        entry.first_scalars = None
        entry.last_run_ms = (time.perf_counter() - t0) * 1e3
        loss = Tensor._wrap(loss_arr)
        if self.kind == "make_step" and _state.grad_enabled and entry.grad_index:
            _attach_grads(loss, [(p, res[i]) for i, p in entry.grad_index])
        return loss

    # --- introspection (the live steps' surface, over what the file holds) ----------------------
    def cache_info(self) -> dict[str, Any]:
        """``entries``, ``keys`` (the saved entries' keys), ``n_calls`` and ``sources``
        (``program`` or ``ir``) per entry."""
        entries = list(self._entries.values())
        return introspect.cache_info(
            self._cache,
            keys=tuple(e.saved_key for e in entries),
            n_calls={e.saved_key: e.n_runs - e.saved_runs for e in entries},
            sources={e.saved_key: self._sources[e.saved_key] for e in entries},
        )

    def timing(self) -> list[dict[str, Any]]:
        """One row per saved entry, with a live step's keys: ``key``, ``compile_ms`` (here:
        building its executable from the file), ``last_run_ms``, ``n_runs`` (the saved count
        plus this process's runs) and ``passes_ms`` (``load-program`` or ``rebuild-from-ir``);
        and ``load_ms`` (= ``compile_ms``), ``n_hits`` (runs since loading), ``source`` and
        ``from_file``."""
        rows = []
        for e in self._entries.values():
            ms = self._build_ms[e.saved_key]
            source = self._sources[e.saved_key]
            stage = "load-program" if source == "program" else "rebuild-from-ir"
            rows.append(
                introspect.timing_row(
                    e.saved_key,
                    e,
                    compile_ms=ms,
                    n_runs=e.n_runs,
                    passes_ms={stage: ms},
                    load_ms=ms,
                    n_hits=e.n_runs - e.saved_runs,
                    source=source,
                    from_file=True,
                )
            )
        return rows

    def _saved(self, key: Any) -> Any:
        """A saved entry by key (its repr, as in ``cache_info()["keys"]``) or index (default:
        the last)."""
        entries = list(self._entries.values())
        if key is None:
            key = -1
        if isinstance(key, int) and not isinstance(key, bool):
            if not -len(entries) <= key < len(entries):
                raise KeyError(f"{self._what}: no entry {key}: {len(entries)} saved")
            return entries[key]
        for e in entries:
            if e.saved_key == str(key):
                return e
        saved = "; ".join(e.saved_key for e in entries)
        raise KeyError(f"{self._what}: no saved entry {key!r}; saved: {saved}")

    def module(self, key: Any = -1) -> Any:
        """The saved training module of an entry (forward, backward and update in the ``prim``
        dialect, as the original compiled it), parsed from the file."""

        ctx = make_context()
        ctx.load_dialect(prim_dialect())
        return parse_ir(self._parts[self._saved(key).saved_ir], ctx=ctx)

    def ir(self, key: Any = None, stage: str = "final") -> str:
        """The MLIR text of a saved entry at ``stage``: ``prim`` (as saved: lowered, forward,
        backward and update) or ``final`` (the backend's program). The file holds no trace, so
        ``imported`` and ``optimized`` are not available (ask the live step before saving)."""
        if stage not in ("prim", "final"):
            raise ValueError(
                f"{self._what}: stage {stage!r} is not in the file; a saved step holds its "
                "'prim' IR (and the 'final' program built from it)"
            )
        entry = self._saved(key)
        text = self._parts[entry.saved_ir]
        if stage == "prim":
            return text

        # The saved module is lowered: only the backend's own passes remain.
        return introspect.ir_at(self.module(key), "lowered", "final", backend=self.backend)

    def profile(self, *inputs: Any, repeats: int = 100) -> list[dict[str, Any]]:
        """Where a step's time goes: the executable of the saved entry ``inputs`` match, run
        ``repeats`` times on copies of its feeds (parameters, optimizer state, buffers and the
        RNG are left as they were): one row per instruction, slowest first: ``index``, ``op``,
        ``ms`` (mean) and ``instr``."""

        introspect.check_repeats(repeats)
        if not inputs:
            raise TypeError("profile: pass the step's inputs (x, *extra)")
        _, entry = self._entry_for(inputs)
        return profile_entry(entry, inputs, repeats, self.backend)


def _check_fields(fields: dict) -> None:
    """The types the loader relies on (the checksum proves integrity, not sense)."""
    if fields.get("kind") not in KINDS:
        raise ValueError(f"unknown kind {fields.get('kind')!r}")
    if not isinstance(fields.get("entries"), list) or not fields["entries"]:
        raise ValueError("no entries")
    if not isinstance(fields.get("trainable"), list):
        raise ValueError("no parameter list")


def load_step(path: str, manifest: dict, parts: dict, arrays: dict[str, np.ndarray],
              backend_name: str, model: Any = None) -> LoadedStep:  # fmt: skip
    """Rebuild a saved training step (see ``LoadedStep``); ``model=`` provides the parameters
    and buffers by name (checked against the file) instead of the file's copies."""

    try:
        _check_fields(manifest)
        specs = manifest["weights"]
        tensors: dict[str, Tensor] = {}
        from_model = _model_weights(model) if model is not None else {}
        for role, trainable in manifest["trainable"]:
            spec = specs[role]
            if role in from_model:
                t = from_model[role]
                got = [list(t._data.shape), t._data.dtype.name]
                if got != [spec["shape"], spec["dtype"]]:
                    raise ValueError(
                        f"load_compiled: model= has {role} of shape {tuple(got[0])} and dtype "
                        f"{got[1]}; the file was saved with {tuple(spec['shape'])} {spec['dtype']}"
                    )
                tensors[role] = t
                continue
            if role not in arrays:
                raise KeyError(f"weight {role!r}")
            arr = _owned(arrays[role])
            tensors[role] = Parameter(Tensor._wrap(arr), requires_grad=bool(trainable)) \
                if role.startswith("param:") else Tensor._wrap(arr)  # fmt: skip
        for role in specs:
            if role not in tensors:
                if role not in arrays:
                    raise KeyError(f"weight {role!r}")
                tensors[role] = Tensor._wrap(_owned(arrays[role]))
        optimizer = scheduler = None
        if manifest["kind"] == "fused_step":
            optimizer = _load_optimizer(manifest["optimizer"], tensors)
            if "scheduler" in manifest:
                scheduler = _load_scheduler(manifest["scheduler"], optimizer)
        entries: dict[str, Any] = {}
        sources: dict[str, str] = {}
        build_ms: dict[str, float] = {}
        for record in manifest["entries"]:
            t0 = time.perf_counter()
            entry, source = _build_entry(record, manifest, parts, tensors, optimizer, backend_name)
            build_ms[record["key"]] = (time.perf_counter() - t0) * 1e3
            sources[record["key"]] = source
            entries[record["match"]] = entry
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        problem = f"the saved step is incomplete or malformed ({type(e).__name__}: {e})"
        raise _bad(path, problem) from None
    rng = manifest.get("rng_state")
    uses_rng = any("rng" in r["feed_roles"] for r in manifest["entries"])
    if uses_rng and isinstance(rng, list):
        # The step draws random numbers (dropout): continuing exactly means continuing the
        # saved process's random stream.
        _random.set_rng_state(np.array(rng, dtype=np.int64))
    return LoadedStep(path, manifest, tensors, optimizer, scheduler, entries, sources, build_ms,
                      parts, backend_name, model)  # fmt: skip


def _load_optimizer(saved: dict, tensors: dict[str, Tensor]) -> Any:
    cls = _optimizer_classes().get(saved["class"])
    if cls is None:
        raise ValueError(f"load_compiled: unknown optimizer class {saved['class']!r}")
    groups = []
    for g in saved["groups"]:
        options = _decode(g["options"])
        groups.append({**options, "params": [tensors[r] for r in g["params"]]})
    opt = cls(groups)
    opt.defaults = _decode(saved["defaults"])
    for prole, entry in saved["state"].items():
        st = {}
        for k, v in entry.items():
            st[k] = tensors[v["tensor"]] if "tensor" in v else _decode(v["value"])
        opt.state[tensors[prole]] = st
    return opt


def _load_scheduler(saved: dict, optimizer: Any) -> Any:
    cls = _scheduler_classes().get(saved["class"])
    if cls is None:
        raise ValueError(f"load_compiled: unknown scheduler class {saved['class']!r}")
    state = _decode(saved["state"])
    if not isinstance(state, dict) or any(
        not isinstance(k, str) or k == "optimizer" or callable(getattr(cls, k, None)) for k in state
    ):
        raise ValueError("load_compiled: the scheduler's state names a method or the optimizer")
    scheduler = cls.__new__(cls)  # its state is restored whole below: no __init__ side effects
    scheduler.optimizer = optimizer
    scheduler.load_state_dict(state)
    return scheduler


def _build_entry(record: dict, manifest: dict, parts: dict, tensors: dict[str, Tensor],
                 optimizer: Any, backend_name: str) -> tuple[Any, str]:  # fmt: skip

    backend = backend_of(backend_name)
    inplace = bool(record["inplace"])
    executable, source = None, "ir"
    same = (
        manifest.get("backend") == backend_name
        and manifest.get("lucid_version") == _lucid_version()
        and manifest.get("program_format") == getattr(backend, "program_format", None)
    )
    if record.get("program") is not None and same:
        try:
            executable = backend.import_program(parts[record["program"]], inplace_updates=inplace)
            source = "program"
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            logger.info("load_compiled: rebuilding %s from its IR: %s", record["key"], e)
    if executable is None:
        executable = _rebuild(record, parts, backend, inplace)
    feeds = {}
    for role in record["feed_roles"]:
        if role.startswith(("input:", "scalar:")) or role == "rng":
            continue
        feeds[role] = tensors[record["aliases"].get(role, role)]
    params = {}
    for role in record["grads"]:
        target = role[len("grad:") :]
        params[target] = tensors[target]
    sources = []
    if optimizer is not None:
        for role, gi, prole, key in record["scalar_sources"]:
            sources.append(_ScalarSource(role, optimizer.param_groups[gi], tensors[prole], key))
    tm = TrainingModule(
        module=None,
        feed_roles=list(record["feed_roles"]),
        result_roles=list(record["result_roles"]),
        feeds=feeds,
        scalars=dict(record["scalars"]),
        n_inputs=sum(r.startswith("input:") for r in record["feed_roles"]),
        optimizer=optimizer,
        params=params,
        _scalar_sources=sources,
    )
    entry = _make_entry(tm, executable, inplace=inplace, compile_ms=0.0)
    entry.first_scalars = (
        dict(record["first_scalars"]) if record.get("first_scalars") is not None else None
    )
    entry.n_runs = entry.saved_runs = int(record["n_runs"])
    entry.statics = record.get("statics")
    entry.saved_key = record["key"]
    entry.saved_training = bool(record["training"])
    entry.saved_ir = record["ir"]
    return entry, source


def _rebuild(record: dict, parts: dict, backend: Any, inplace: bool) -> Any:
    """The executable of an entry from its saved (prim-dialect) IR, for this backend."""

    ctx = make_context()
    ctx.load_dialect(prim_dialect())  # the saved IR is the lowered (prim) module
    try:
        module = parse_ir(parts[record["ir"]], ctx=ctx)
    except Exception as e:  # the parser's own errors have no common base
        raise ValueError(f"load_compiled: the IR of {record['key']} does not parse: {e}") from e
    fn = forward_func(module)
    if feed_roles(fn) != record["feed_roles"] or result_roles(fn) != record["result_roles"]:
        raise ValueError(f"load_compiled: the IR of {record['key']} disagrees with the manifest")

    try:
        if backend.pipeline:  # the saved module is lowered: only the backend's own passes
            PassManager(backend.pipeline).run(module)
        return backend.compile(module, inplace_updates=inplace)
    except (PassFailure, BackendUnsupported, *backend.refusals) as e:
        raise ValueError(f"load_compiled: cannot rebuild {record['key']}: {e}") from e
