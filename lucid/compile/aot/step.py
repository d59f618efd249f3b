"""AOT export of compiled training steps: what ``fused_step`` and ``make_step`` return.

``save_step`` writes every compiled entry of a step (its backend program, its lowered IR, its
feed and result roles, its step-scalar plan) with the tensors the entries bind (parameters,
buffers, optimizer state), the optimizer (class name among ``lucid.optim``'s, options and
non-tensor state), an attached learning-rate scheduler's state and the global RNG state, into
the same ``lucid.compiled`` file ``save_compiled`` writes (``aot.file``). ``load_step`` turns
it back into a ``LoadedStep``: a callable that continues the training exactly where the
original left it (the same executables, fed the same step scalars computed by a real
``lucid.optim`` optimizer rebuilt from the file).

Nothing in the file is executed: the optimizer and scheduler classes are looked up in a fixed
table of ``lucid.optim`` classes, and their state is plain JSON (``_encode``/``_decode``).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.compile.aot.file import STEP_KINDS, _scalar
from lucid.compile.options import backend_of
from lucid.compile.training.fused import FusedStep
from lucid.ir import print_ir
from lucid.optim import lr_scheduler as sched
from lucid.optim.optimizer import required

logger = logging.getLogger("lucid.compile")

KINDS = STEP_KINDS


class NotSaveable(Exception):
    """The step cannot be written (the message says why)."""


# --- JSON with the Python types optimizer options and scheduler state use ----------------------
def _encode(value: Any) -> Any:
    """``value`` as JSON: tuples, non-finite floats, dicts with non-string keys and Counters are
    tagged so ``_decode`` gives them back with their types."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, np.generic):
        return _encode(value.item())
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        tag = "$counter" if isinstance(value, Counter) else "$dict"
        return {tag: [[_encode(k), _encode(v)] for k, v in value.items()]}
    raise NotSaveable(f"a value of type {type(value).__name__} is not plain data")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError("a tagged value has one key")
    (tag, body), = value.items()  # fmt: skip
    if tag == "$float":
        if body not in ("inf", "-inf", "nan"):
            raise ValueError(f"not a float: {body!r}")
        return float(body)
    if tag == "$tuple":
        return tuple(_decode(v) for v in body)
    if tag in ("$dict", "$counter"):
        items = {_hashable(_decode(k)): _decode(v) for k, v in body}
        return Counter(items) if tag == "$counter" else items
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(key: Any) -> Any:
    hash(key)  # a list key is a malformed file: TypeError, reported by the caller
    return key


def _optimizer_classes() -> dict[str, type]:
    import lucid.optim as optim

    return {
        name: cls
        for name in optim.__all__
        if isinstance(cls := getattr(optim, name), type)
        and issubclass(cls, optim.Optimizer)
        and cls is not optim.Optimizer
    }


def _scheduler_classes() -> dict[str, type]:
    # LambdaLR holds functions: their code is not data, so it cannot be saved.
    return {
        name: cls
        for name in sched.__all__
        if isinstance(cls := getattr(sched, name), type)
        and issubclass(cls, sched.LRScheduler)
        and name not in ("LRScheduler", "LambdaLR")
    }


# --- save --------------------------------------------------------------------------------------
def _sig_json(sig: tuple) -> list:
    """The JSON form of a step key's input signature (``signature.step_input_sig``)."""

    out = []
    for item in sig:
        first, second = item
        if isinstance(first, tuple):  # (shape, numpy dtype)
            out.append(["tensor", [int(d) for d in first], np.dtype(second).name])
        else:  # (type, value)
            try:
                out.append(_scalar(second))
            except Exception as e:
                raise NotSaveable(str(e)) from None
    return out


def _input_json(inputs: tuple) -> list:
    out = []
    for a in inputs:
        if isinstance(a, Tensor):
            if a._data is None:
                raise TypeError("a loaded training step cannot take a trace tensor as input")
            out.append(["tensor", list(a._data.shape), a._data.dtype.name])
        else:
            try:
                out.append(_scalar(a))
            except Exception:
                out.append(["unsaveable", type(a).__name__])
    return out


def _match(sig: list, training: bool) -> str:
    return json.dumps([sig, bool(training)], separators=(",", ":"))


def save_step(step: Any, scheduler: Any = None) -> tuple[dict, dict[str, str], dict]:
    """The manifest fields, parts and tensors (by role) of a ``FusedStep`` or ``TrainStep``.
    Raises ``NotSaveable`` when the step has no compiled entry or holds what is not data."""

    kind = "fused_step" if isinstance(step, FusedStep) else "make_step"
    if getattr(step, "_scaler", None) is not None:
        # A loaded step could not write its scale back to the user's GradScaler.
        raise NotSaveable("it was built with a GradScaler (scaler=)")
    entries = list(step._entries.items())
    if not entries:
        raise NotSaveable("the step has no compiled entry (call it once first)")
    # A loaded step knows one training flag, not per-submodule modes: mixed-mode entries stay.
    # A loaded step matches calls without an autocast region: entries traced inside one stay.
    entries = [
        (key, entry) for key, entry in entries if not isinstance(key[1], tuple) and key[-1] is None
    ]
    if not entries:
        raise NotSaveable(
            "every compiled entry has submodules in mixed train/eval modes or was traced "
            "inside an autocast region"
        )
    tensors: dict[str, Tensor] = {}  # role -> tensor; one role per object (the first seen)
    role_of: dict[int, str] = {}

    def bind(role: str, t: Tensor) -> str:
        first = role_of.setdefault(id(t), role)
        tensors.setdefault(first, t)
        return first

    for n, p in step.model.named_parameters():
        bind(f"param:{n}", p)
    if hasattr(step.model, "named_buffers"):
        for n, b in step.model.named_buffers():
            if b is not None:
                bind(f"buffer:{n}", b)
    backend = backend_of(step.backend)
    parts: dict[str, str] = {}
    records = []
    for index, (key, entry) in enumerate(entries):
        aliases = {}
        for role, t in entry.tm.feeds.items():
            canonical = bind(role, t)
            if canonical != role:
                aliases[role] = canonical
        scalar_sources = []
        for src in entry.tm._scalar_sources:
            group_index = next(
                i for i, g in enumerate(step.optimizer.param_groups) if g is src.group
            )
            scalar_sources.append([src.role, group_index, role_of[id(src.param)], src.key])
        module = entry.tm.module  # lowered in place by the compile: the prim module
        parts[f"ir/{index}"] = print_ir(module)
        record = {
            "key": repr(key),
            "match": _match(_sig_json(key[0]), key[1]),
            "training": bool(key[1]),
            "statics": _encode(key[2]) if kind == "fused_step" else None,
            "feed_roles": list(entry.feed_roles),
            "result_roles": list(entry.result_roles),
            "aliases": aliases,
            "scalars": {r: float(v) for r, v in entry.tm.scalars.items()},
            "first_scalars": (
                {r: float(v) for r, v in entry.first_scalars.items()}
                if entry.n_runs == 0 and entry.first_scalars is not None
                else None
            ),
            "scalar_sources": scalar_sources,
            "grads": [role for role in entry.result_roles if role.startswith("grad:")],
            "inplace": bool(entry.inplace),
            "n_runs": int(entry.n_runs),
            "ir": f"ir/{index}",
        }
        program = None
        if getattr(backend, "program_format", None) is not None:
            program = backend.export_program(module, inplace_updates=entry.inplace)
        if program is not None:
            parts[f"program/{index}"] = program
            record["program"] = f"program/{index}"
        records.append(record)
    fields: dict[str, Any] = {
        "kind": kind,
        "backend": step.backend,
        "entries": records,
        # A list: the manifest's keys are sorted, and parameters() keeps the model's order.
        "trainable": [[role, bool(t.requires_grad)] for role, t in tensors.items()],
        "model_training": bool(getattr(step.model, "training", False)),
        "rng_state": [int(v) for v in _random.get_rng_state()._data],
    }
    if kind == "fused_step":
        fields["check_finite"] = bool(step.check_finite)
        fields["optimizer"] = _save_optimizer(step.optimizer, role_of, bind)
    elif scheduler is not None:
        raise NotSaveable("make_step has no optimizer, so no scheduler to save")
    if scheduler is not None:
        if getattr(scheduler, "optimizer", None) is not step.optimizer:
            raise NotSaveable("the scheduler does not schedule the step's optimizer")
        name = type(scheduler).__name__
        if _scheduler_classes().get(name) is not type(scheduler):
            raise NotSaveable(f"scheduler {name} is not one of lucid.optim.lr_scheduler's that "
                              "hold only data (LambdaLR holds functions)")  # fmt: skip
        fields["scheduler"] = {"class": name, "state": _encode(scheduler.state_dict())}
    arrays = {role: np.array(t._data, order="C") for role, t in tensors.items()}
    return fields, parts, arrays


def _save_optimizer(opt: Any, role_of: dict[int, str], bind: Any) -> dict:
    name = type(opt).__name__
    if _optimizer_classes().get(name) is not type(opt):
        raise NotSaveable(f"optimizer {name} is not one of lucid.optim's")
    groups = []
    for group in opt.param_groups:
        roles = []
        for p in group["params"]:
            if id(p) not in role_of:
                raise NotSaveable("the optimizer holds a parameter that is not the model's")
            roles.append(role_of[id(p)])
        options = {k: v for k, v in group.items() if k != "params"}
        groups.append({"params": roles, "options": _encode(options)})
    state = {}
    for p, st in opt.state.items():
        pname = role_of[id(p)][len("param:") :]
        entry = {}
        for k, v in st.items():
            if isinstance(v, Tensor):
                entry[k] = {"tensor": bind(f"state:{pname}.{k}", v)}
            else:
                entry[k] = {"value": _encode(v)}
        state[role_of[id(p)]] = entry

    defaults = {k: v for k, v in opt.defaults.items() if v is not required}
    return {"class": name, "defaults": _encode(defaults), "groups": groups, "state": state}
