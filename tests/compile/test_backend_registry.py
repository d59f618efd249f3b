"""One backend interface (issue 10): lucid/compile reaches backends only by name through the
registry. A toy backend that runs prim modules with the prim interpreter
(``lucid/ir/prim_interpreter.py``), registered here, serves ``lucid.compile``, gradients through
``cm(x)``, ``make_step``, ``fused_step``, ``compile_optimizer`` and ``diagnose``, proving that no
CPU assumption is left in lucid/compile; and lucid/compile names no backend and no ``_native``."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.backends import (
    Backend,
    BackendUnavailable,
    Unsupported,
    available_backends,
    get_backend,
    register_backend,
    registered_backends,
    resolve_backend,
    unregister_backend,
)
from lucid.compile import CompileError, compile_optimizer, diagnose, fused_step, make_step
from lucid.ir import forward_func, print_ir
from lucid.ir.importer import feed_roles, result_roles
from lucid.ir.prim import PRIM_OPS
from lucid.ir.prim.interpreter import interpret_prim

COMPILE_DIR = Path(lucid.__file__).resolve().parent / "compile"


class _InterpreterExecutable:
    """Runs the prim module with the interpreter; writes in-place results after a full run."""

    def __init__(self, module, inplace: bool):
        fn = forward_func(module)
        self.module = module
        self.roles = feed_roles(fn)
        self.results = result_roles(fn)
        by_role = {r: i for i, r in enumerate(self.roles)}
        self.inplace = []
        if inplace:
            for j, role in enumerate(self.results):
                target = role[len("update:") :] if role.startswith("update:") else None
                if target in by_role:
                    self.inplace.append((j, by_role[target]))
        self.runs = 0

    def run(self, feeds):
        feeds = list(feeds)
        if len(feeds) != len(self.roles):
            raise ValueError(f"expected {len(self.roles)} feeds, got {len(feeds)}")
        out = [np.array(r) for r in interpret_prim(self.module, feeds)]
        for j, f in self.inplace:
            np.copyto(feeds[f], out[j])
            out[j] = feeds[f]
        self.runs += 1
        return out


class InterpreterBackend(Backend):
    """A backend with no native code at all: the prim interpreter."""

    name = "toy-interpreter"
    pipeline = ""  # no backend passes
    compiled = 0

    def supported_ops(self):
        return frozenset(PRIM_OPS) - {"conv2d"}  # pretend one is missing (diagnose shows it)

    def compile(self, module, *, inplace_updates=True):
        missing = self.refusal(module)
        if missing:
            raise Unsupported(f"toy-interpreter {missing}")
        type(self).compiled += 1
        return _InterpreterExecutable(module.clone(), inplace_updates)

    def stage_ir(self, module):
        return print_ir(module) + "\n// toy: interpreted\n"


class UnavailableBackend(InterpreterBackend):
    name = "toy-unavailable"

    def available(self):
        return False, "it needs a quantum accelerator"


@pytest.fixture
def toy():
    register_backend("toy-interpreter", InterpreterBackend)
    register_backend("toy-unavailable", UnavailableBackend)
    InterpreterBackend.compiled = 0
    yield "toy-interpreter"
    unregister_backend("toy-interpreter")
    unregister_backend("toy-unavailable")


def _mlp(seed=0):
    lucid.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _data():
    rng = np.random.default_rng(0)
    return (
        lucid.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
        lucid.tensor(np.array([0, 2, 1, 0])),
    )


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(
        np.asarray(a.detach().numpy()), np.asarray(b.detach().numpy()), rtol=tol, atol=tol
    )


def test_registry(toy):
    assert {"cpu", "mpsgraph", "mpsgraph-reference", toy} <= set(registered_backends())
    assert toy in available_backends() and "toy-unavailable" not in available_backends()
    assert resolve_backend("auto") in available_backends()
    assert isinstance(get_backend(toy), InterpreterBackend)
    assert get_backend(toy) is get_backend(toy)  # one instance per name
    with pytest.raises(BackendUnavailable, match="needs a quantum accelerator"):
        get_backend("toy-unavailable")
    with pytest.raises(ValueError, match="unknown backend 'tpu'.*cpu"):
        get_backend("tpu")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(toy, InterpreterBackend)


def test_unavailable_backend_is_refused_by_every_entry_point(toy):
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1)
    for make in (
        lambda: lucid.compile(model, backend="toy-unavailable"),
        lambda: make_step(model, F.cross_entropy, backend="toy-unavailable"),
        lambda: fused_step(model, F.cross_entropy, opt, backend="toy-unavailable"),
        lambda: compile_optimizer(opt, backend="toy-unavailable"),
        lambda: diagnose(model, _data()[0], backend="toy-unavailable"),
    ):
        with pytest.raises(BackendUnavailable, match="toy-unavailable.*quantum accelerator"):
            make()


def test_compile_forward_and_gradients_through_the_toy(toy):
    model = _mlp()
    ref = copy.deepcopy(model)
    cm = lucid.compile(model, backend=toy, strict=True)
    x, _ = _data()
    with lucid.no_grad():
        _close(cm(x), ref(x))
    cm(x).sum().backward()
    ref(x).sum().backward()
    _close(model[0].weight.grad, ref[0].weight.grad)
    assert InterpreterBackend.compiled >= 3  # inference, forward and backward executables
    assert "// toy: interpreted" in cm.ir(stage="final")
    assert "prim." in cm.ir(stage="prim")


def test_env_variable_selects_the_backend(toy, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_BACKEND", toy)
    cm = lucid.compile(_mlp())
    with lucid.no_grad():
        cm(_data()[0])
    assert InterpreterBackend.compiled == 1


def test_batchnorm_buffers_are_written_back_through_the_toy(toy):
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    ref = copy.deepcopy(model)
    cm = lucid.compile(model, backend=toy, strict=True)
    x, _ = _data()
    with lucid.no_grad():
        cm(x)
        ref(x)
    _close(model[1].running_mean, ref[1].running_mean)


def test_training_entry_points_through_the_toy(toy):
    x, y = _data()
    ref = _mlp()
    ref_opt = optim.Adam(ref.parameters(), lr=0.01)
    for _ in range(2):
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        ref_opt.step()

    m1 = _mlp()
    step = make_step(m1, F.cross_entropy, backend=toy)
    loss = step(x, y)
    loss.backward()
    eager = _mlp()
    F.cross_entropy(eager(x), y).backward()
    _close(m1[0].weight.grad, eager[0].weight.grad)

    m2 = _mlp()
    fstep = fused_step(m2, F.cross_entropy, optim.Adam(m2.parameters(), lr=0.01), backend=toy)
    for _ in range(2):
        fstep(x, y)
    _close(m2[2].weight, ref[2].weight, tol=1e-4)

    m3 = _mlp()
    opt3 = compile_optimizer(optim.Adam(m3.parameters(), lr=0.01), backend=toy)
    for _ in range(2):
        opt3.zero_grad()
        F.cross_entropy(m3(x), y).backward()
        opt3.step()
    _close(m3[2].weight, ref[2].weight, tol=1e-4)

    m4 = _mlp()
    cm = lucid.compile(m4, backend=toy)
    loss = cm.step(x, y, loss_fn=F.cross_entropy)
    loss.backward()
    _close(m4[0].weight.grad, eager[0].weight.grad)
    assert InterpreterBackend.compiled >= 4


def test_a_refusal_falls_back_or_raises_compile_error(toy):
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    x = lucid.randn(1, 1, 4, 4)
    cm = lucid.compile(model, backend=toy)
    with lucid.no_grad():
        _close(cm(x), model(x))
    (reason,) = cm.cache_info()["reasons"].values()
    assert "toy-interpreter lacks prim ops conv2d" in reason
    step = make_step(model, lambda out, t: (out * t).sum(), backend=toy)
    with pytest.raises(CompileError, match="lacks prim ops conv2d"):
        step(x, lucid.ones(1, 2))


def test_diagnose_reports_on_the_backend_asked_for(toy):
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    report = diagnose(model, lucid.randn(1, 1, 4, 4), backend=toy)
    stages = {s.name: s.stages for s in report.support}
    assert stages["conv2d"][toy] == "no: lacks prim ops conv2d"
    assert stages["linear"][toy] == "yes"
    assert "cpu" not in stages["linear"]
    everywhere = diagnose(model, lucid.randn(1, 1, 4, 4))
    assert {toy, "cpu"} <= set(everywhere.support[0].stages)


def test_compile_names_no_backend_and_no_native_module():
    # Backend names (as words or quoted) and the native module: only the registry knows them.
    pattern = re.compile(r"_native|\bcpu\b|mpsgraph|\bmetal\b|\bmps\b|openblas", re.IGNORECASE)
    hits = []
    for path in sorted(COMPILE_DIR.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.name}:{n}: {line.strip()}")
    assert hits == []


def test_auto_prefers_mpsgraph_where_it_runs():
    import lucid.backends as registry

    real = registry._FACTORIES["mpsgraph"]

    class FakeMetal(InterpreterBackend):
        name = "mpsgraph"

    try:
        assert resolve_backend("auto") == "cpu"  # Linux: mpsgraph is not available
        register_backend("mpsgraph", FakeMetal, replace=True)
        assert resolve_backend("auto") == "mpsgraph"
        cm = lucid.compile(_mlp())  # backend="auto"
        with lucid.no_grad():
            cm(_data()[0])
        assert cm._options.backend == "mpsgraph"
    finally:
        register_backend("mpsgraph", real, replace=True)
    assert resolve_backend("auto") == "cpu"


def test_unknown_env_backend_is_refused_by_the_training_entry_points(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_BACKEND", "tpu")
    model = _mlp()
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        make_step(model, F.cross_entropy)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        fused_step(model, F.cross_entropy, optim.SGD(model.parameters(), lr=0.1))
    # An explicit backend= wins over the variable.
    make_step(model, F.cross_entropy, backend="cpu")(*_data())


def test_diagnose_follows_the_env_variable(toy, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_BACKEND", toy)
    report = diagnose(_mlp(), _data()[0])
    assert set(report.support[0].stages) == {"lowers to prim", toy}
