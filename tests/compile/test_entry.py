"""Cache entries are typed: every attribute an entry carries is one of its declared fields."""

from __future__ import annotations

import dataclasses

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
import lucid.optim as optim
from lucid.compile.entry import ForwardEntry, GradEntry, StepEntry

# Class attributes an entry may shadow per instance (a hit served by the backend's direct call).
_SHADOWS = {"hit"}


def _undeclared(entry: object) -> set[str]:
    declared = {f.name for f in dataclasses.fields(entry)}
    return set(vars(entry)) - declared - _SHADOWS


def _model() -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_module_entries_carry_only_declared_fields():
    cm = lucid.compile(_model())
    x = lucid.randn(2, 4)
    with lucid.no_grad():
        cm(x)
    cm(x).sum().backward()  # grad mode: parameters require grad
    kinds = {type(e): e for e in cm._entries.values()}
    assert set(kinds) == {ForwardEntry, GradEntry}
    for entry in kinds.values():
        assert _undeclared(entry) == set(), type(entry).__name__


def test_step_entries_carry_only_declared_fields():
    model = _model()
    step = lucid.compile.fused_step(model, F.cross_entropy, optim.Adam(model.parameters()))
    step(lucid.randn(2, 4), lucid.tensor([0, 2]))
    entries = list(step._entries.values())
    assert entries and all(type(e) is StepEntry for e in entries)
    assert all(_undeclared(e) == set() for e in entries)
