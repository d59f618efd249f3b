"""Whole models through the spine: trace -> import -> verify -> print -> parse -> interpret,
against the eager result, before and after canonicalize,cse,dce."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import _random
from lucid.ir import import_trace, interpret, parse_ir, print_ir, result_roles
from lucid.ir.importer import forward_func
from lucid.passes import PassManager
from lucid.trace import GraphBreak, _tracing


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(out[:, -1]), h, c


def _input(shape, seed=0):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


CASES = {
    "mlp": (MLP, (4, 12), False),
    "cnn_train": (CNN, (2, 1, 8, 8), True),
    "cnn_eval": (CNN, (2, 1, 8, 8), False),
    "transformer_train": (Block, (2, 5, 16), True),
    "transformer_eval": (Block, (2, 5, 16), False),
    "lstm": (LSTMHead, (3, 4, 6), False),
}


def _eager_and_trace(name):
    cls, shape, training = CASES[name]
    lucid.manual_seed(0)
    model = cls()
    model.train(training)
    x = _input(shape)
    with _tracing(model) as tracer:
        out = model(tracer.input_like(x))
        trace = tracer.finish(out)
    feeds = {"input:0": x.numpy().copy()}
    feeds.update({r: t.numpy().copy() for r, t in tracer.feed_tensors().items()})
    if any(f.role == "rng" for f in trace.feeds):
        feeds["rng"] = _random.get_rng_state().numpy().copy()
    eager = model(x)  # after the snapshot: train-mode batch norm updates its buffers
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    buffers = dict(model.named_buffers())
    for role, _ in trace.outputs:
        if role.startswith("update:buffer:"):
            eager.append(buffers[role.removeprefix("update:buffer:")])
        elif role == "update:rng":
            eager.append(_random.get_rng_state())
    return trace, feeds, [e.detach().numpy() for e in eager]


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_imports_verifies_round_trips_and_interprets_to_eager(name):
    trace, feeds, eager = _eager_and_trace(name)
    module = import_trace(trace)
    module.verify()
    text = print_ir(module)
    parsed = parse_ir(text)
    parsed.verify()
    assert print_ir(parsed) == text
    generic = parse_ir(print_ir(module, generic=True))
    assert print_ir(generic) == text
    got = interpret(parsed, feeds)
    assert len(got) == len(eager)
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    PassManager("canonicalize,cse,dce", verify_each=True).run(module)
    optimized = interpret(module, feeds)
    for g, e in zip(optimized, eager, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_generic_form_of_each_model_parses_with_upstream_mlir_opt(mlir_opt):
    for name in ("mlp", "cnn_train", "transformer_train", "lstm"):
        trace, _, _ = _eager_and_trace(name)
        out = mlir_opt(print_ir(import_trace(trace), generic=True))
        assert out.returncode == 0, f"{name}: {out.stderr[:2000]}"


def test_model_roles_name_parameters_buffers_and_updates():
    trace, _, _ = _eager_and_trace("cnn_train")
    module = import_trace(trace)
    roles = [f.role for f in trace.feeds]
    assert "input:0" in roles and "param:conv1.weight" in roles and "param:fc.bias" in roles
    assert "buffer:bn.running_mean" in roles
    out_roles = result_roles(forward_func(module))
    assert out_roles[0] == "output:0"
    assert "update:buffer:bn.running_mean" in out_roles
    assert "update:buffer:bn.running_var" in out_roles


def test_dropout_in_training_reads_the_rng_feed_and_advances_it():
    trace, _, _ = _eager_and_trace("transformer_train")
    assert [f.role for f in trace.feeds].count("rng") == 1
    assert [r for r, _ in trace.outputs].count("update:rng") == 1


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # MARK-model-branch
            y = -y
        return y


def test_graph_break_in_a_model_forward_names_its_source_line():
    model = Branchy()
    with pytest.raises(GraphBreak) as e:
        with _tracing(model) as tracer:
            model(tracer.input((2, 3)))
    src = open(__file__).read().splitlines()
    line = next(i + 1 for i, s in enumerate(src) if s.endswith("# MARK-model-branch"))
    assert (e.value.filename, e.value.lineno) == (__file__, line)
    assert "if y.sum() > 0" in str(e.value)
