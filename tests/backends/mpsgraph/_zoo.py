"""A model zoo run through an MPSGraph backend at the prim level (trace -> import -> graph passes
-> lower-to-prim -> backend.compile -> run with in-place write-back), shared by the reference tests
(any machine) and the native tests (macOS with Metal)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import _random
from lucid._tensor import Tensor
from lucid.ir import import_trace
from lucid.passes import PassManager
from lucid.trace._tracing import _tracing

GRAPH_AND_LOWER = "canonicalize,cse,dce,lower-to-prim"


def lowered(fn: Callable, model: Any, inputs: list[Tensor]):
    """(prim module, captured tensors by role) of ``fn(*inputs)``."""
    with _tracing(model) as tracer:
        args = [tracer.input_like(x) for x in inputs]
        out = fn(*args)
        trace = tracer.finish(list(out) if isinstance(out, tuple) else [out])
        captured = tracer.feed_tensors()
    module = import_trace(trace)
    PassManager(GRAPH_AND_LOWER).run(module)
    return module, captured


def compile_and_run(backend, fn: Callable, model: Any, inputs: list[Tensor], **compile_kw):
    """Compile ``fn`` on ``backend`` and run it once on ``inputs``; in-place results (buffers,
    the RNG state) are written back into the model's tensors. Returns (outputs, executable)."""
    module, captured = lowered(fn, model, inputs)
    exe = backend.compile(module, **compile_kw)
    feeds = []
    for role in exe.feed_roles:
        kind, _, name = role.partition(":")
        if kind == "input":
            feeds.append(inputs[int(name)]._data)
        elif role == "rng":
            feeds.append(_random.get_rng_state()._data)
        else:
            feeds.append(captured[role]._data)
    outs = exe.run(feeds)
    if "rng" in exe.feed_roles:  # the state was a copy: advance the generator as eager does
        _random.set_rng_state(Tensor._wrap(feeds[exe.feed_roles.index("rng")]))
    n = sum(1 for r in exe.result_roles if not r.startswith("update:"))
    return outs[:n], exe


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    )


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.relu(self.conv2(F.pad(x, (1, 1, 1, 1))))
        x = F.avg_pool2d(x, 1)
        return self.fc(x.reshape(x.shape[0], -1))


def transformer() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 8, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def zoo() -> dict[str, tuple[Callable[[], nn.Module], Callable[[np.random.Generator], list]]]:
    """name -> (model factory, input maker)."""
    f32 = np.float32
    return {
        "mlp": (mlp, lambda r: [r.standard_normal((4, 6)).astype(f32)]),
        "cnn": (CNN, lambda r: [r.standard_normal((2, 3, 12, 12)).astype(f32)]),
        "transformer": (transformer, lambda r: [r.standard_normal((2, 5, 16)).astype(f32)]),
        "lstm": (LSTMHead, lambda r: [r.standard_normal((3, 4, 5)).astype(f32)]),
    }


def eager_and_compiled(backend, name: str, train: bool, seed: int = 0):
    """(eager outputs, compiled outputs, eager model after the call, compiled model after)."""
    make, inputs = zoo()[name]
    lucid.manual_seed(seed)
    model = make()
    model.train(train)
    twin = copy.deepcopy(model)
    arrays = inputs(np.random.default_rng(seed))
    eager = model(*(Tensor._wrap(a.copy()) for a in arrays))
    got, _ = compile_and_run(backend, twin, twin, [Tensor._wrap(a.copy()) for a in arrays])
    return [eager.detach().numpy()], got, model, twin


def buffers(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.named_buffers()}


def check_index_error_and_random_stream(backend) -> None:
    """An index out of range raises IndexError; random draws are eager's Philox stream (the
    same numbers from the same RNG state), and the RNG state advances as eager's does."""
    import pytest

    table = Tensor._wrap(np.arange(10, dtype=np.float32).reshape(5, 2))

    def lookup(i):
        return table[i]

    got, _ = compile_and_run(backend, lookup, None, [Tensor._wrap(np.array([4, -5]))])
    np.testing.assert_array_equal(got[0], [[8, 9], [0, 1]])
    bad = Tensor._wrap(np.array([0, 7]))
    with pytest.raises(IndexError) as eager_error:
        lookup(bad)
    with pytest.raises(IndexError) as compiled_error:
        compile_and_run(backend, lookup, None, [bad])
    assert str(compiled_error.value) == str(eager_error.value)  # eager's message, value 7

    def draw(x):
        return x + lucid.rand(4, 3), F.dropout(x + 1.0, 0.5, training=True)

    lucid.manual_seed(3)
    start = _random.get_rng_state().numpy().copy()
    x = Tensor._wrap(np.zeros((4, 3), np.float32))
    got, _ = compile_and_run(backend, draw, None, [x])
    after_compiled = _random.get_rng_state().numpy().copy()
    _random.set_rng_state(Tensor._wrap(start))
    want = draw(x)
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(after_compiled, _random.get_rng_state().numpy())


def compare_backends(backend: str, other: str, tol: dict) -> None:
    """The zoo of tests/compile/models.py through ``lucid.compile(..., backend=backend)`` against
    ``other`` and eager (forward in eval and train mode, buffers written back), and three
    ``fused_step`` Adam steps of the MLP on each backend against eager."""
    import importlib.util as iu
    import os

    from lucid import optim
    from lucid.compile import fused_step

    spec = iu.spec_from_file_location(
        "compile_models_cmp",
        os.path.join(os.path.dirname(__file__), "..", "..", "compile", "models.py"),
    )
    models = iu.module_from_spec(spec)
    spec.loader.exec_module(models)
    rng = np.random.default_rng(0)
    f32 = np.float32
    zoo_inputs = {
        models.MLP: lambda: lucid.tensor(rng.standard_normal((8, 16)).astype(f32)),
        models.LeNet: lambda: lucid.tensor(rng.standard_normal((4, 1, 12, 12)).astype(f32)),
        models.TinyGPT: lambda: lucid.tensor(rng.integers(0, 20, (2, 8))),
        models.LSTMModel: lambda: lucid.tensor(rng.standard_normal((3, 5, 6)).astype(f32)),
    }
    for cls, make_x in zoo_inputs.items():
        for train in (False, True):
            lucid.manual_seed(0)
            ref = cls()
            ref.train(train)
            a, b = copy.deepcopy(ref), copy.deepcopy(ref)
            x = make_x()
            want = ref(x).detach().numpy()
            got_a = lucid.compile(a, backend=backend)(x).detach().numpy()
            got_b = lucid.compile(b, backend=other)(x).detach().numpy()
            np.testing.assert_allclose(got_a, got_b, **tol, err_msg=f"{cls.__name__} {backend}")
            np.testing.assert_allclose(got_a, want, **tol, err_msg=f"{cls.__name__} eager")
            for (k, va), (_, vr) in zip(a.named_buffers(), ref.named_buffers(), strict=True):
                np.testing.assert_allclose(va.numpy(), vr.numpy(), **tol, err_msg=k)
    lucid.manual_seed(1)
    ref = models.MLP()
    x = lucid.tensor(rng.standard_normal((8, 16)).astype(f32))
    y = lucid.tensor(rng.integers(0, 4, 8))
    copies = {n: copy.deepcopy(ref) for n in (backend, other)}
    steps = {
        n: fused_step(m, F.cross_entropy, optim.Adam(m.parameters(), lr=0.01), backend=n)
        for n, m in copies.items()
    }
    ref_opt = optim.Adam(ref.parameters(), lr=0.01)
    for _ in range(3):
        ref_opt.zero_grad()
        want = F.cross_entropy(ref(x), y)
        want.backward()
        ref_opt.step()
        for n, step in steps.items():
            np.testing.assert_allclose(step(x, y).numpy(), want.detach().numpy(), **tol, err_msg=n)
    for n, m in copies.items():
        for p, q in zip(m.parameters(), ref.parameters(), strict=True):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **tol, err_msg=n)
