"""Whole models through the compiler: ``lucid.compile.trace(model, x)`` -> import ->
``canonicalize,cse,dce,lower-to-prim`` -> prim interpreter and native CPU executable, compared with
eager within float32 tolerance."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import _native
from lucid.backends.cpu.emit import compile_program, emit_program
from lucid.ir import import_trace, interpret
from lucid.ir.importer import feed_roles, forward_func
from lucid.ir.prim.dialect import PrimIROp
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace

HAS_NATIVE = hasattr(_native, "compile")
PIPELINE = "canonicalize,cse,dce,lower-to-prim"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.log_softmax(self.fc(x), dim=-1)


def _models():
    lucid.manual_seed(0)
    cnn = CNN()
    for bn in (cnn.bn1, cnn.bn2):  # eval-mode statistics that are not the identity
        bn.running_mean.copy_(lucid.randn(bn.num_features) * 0.1)
        bn.running_var.copy_(lucid.rand(bn.num_features) + 0.5)
    return {
        "mlp": (MLP(), (lucid.randn(7, 12),)),
        "cnn_batchnorm": (cnn, (lucid.randn(2, 3, 10, 10),)),
        "transformer_block": (
            nn.TransformerEncoderLayer(16, 4, dim_feedforward=24, batch_first=True),
            (lucid.randn(2, 6, 16),),
        ),
        "transformer_norm_first_gelu": (
            nn.TransformerEncoderLayer(
                16, 2, dim_feedforward=20, batch_first=True, norm_first=True, activation="gelu"
            ),
            (lucid.randn(3, 5, 16),),
        ),
        "lstm": (nn.LSTM(6, 10, num_layers=2, batch_first=True), (lucid.randn(3, 7, 6),)),
    }


MODELS = _models()


def _flat(out) -> list[np.ndarray]:
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _flat(o)]
    return [out.detach().numpy()]


def _compiled(name: str):
    model, inputs = MODELS[name]
    model.eval()
    module = import_trace(trace(model, *inputs))
    named = {f"param:{k}": v for k, v in model.named_parameters()}
    named.update({f"buffer:{k}": v for k, v in model.named_buffers()})
    named.update({f"input:{i}": t for i, t in enumerate(inputs)})
    feeds = [named[r].detach().numpy() for r in feed_roles(forward_func(module))]
    with lucid.no_grad():
        eager = _flat(model(*inputs))
    return module, feeds, eager


def _check(got: list[np.ndarray], eager: list[np.ndarray], what: str) -> None:
    assert len(got) == len(eager), what
    for g, e in zip(got, eager, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, what
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_lowers_fully_and_prim_interpreter_matches_eager(name):
    module, feeds, eager = _compiled(name)
    _check(interpret(module, feeds), eager, f"{name}: lucid interpreter")
    PassManager(PIPELINE).run(module)
    module.verify()
    ops = list(forward_func(module).body.blocks.first.ops)
    assert ops and all(isinstance(op, PrimIROp) for op in ops[:-1])
    _check(interpret_prim(module, feeds), eager, f"{name}: prim interpreter")


@pytest.mark.skipif(not HAS_NATIVE, reason="lucid._native has no CPU runtime in this build")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_runs_natively_and_matches_eager(name):
    module, feeds, eager = _compiled(name)
    PassManager(PIPELINE).run(module)
    program = emit_program(module)
    executable = compile_program(program)
    _check(executable.run(feeds), eager, f"{name}: native CPU")
    unfused = compile_program(program, fuse=False, cache=False)
    _check(unfused.run(feeds), eager, f"{name}: native CPU without elementwise fusion")
    # A second compile of the same program is a cache hit with the same answers.
    again = compile_program(emit_program(module))
    assert again.hash == executable.hash
    _check(again.run(feeds), eager, f"{name}: native CPU (cached)")


@pytest.mark.skipif(not HAS_NATIVE, reason="lucid._native has no CPU runtime in this build")
def test_new_weights_need_no_recompile():
    module, feeds, _ = _compiled("mlp")
    PassManager(PIPELINE).run(module)
    program = emit_program(module)
    executable = compile_program(program)
    rng = np.random.default_rng(3)
    new_feeds = [rng.standard_normal(f.shape).astype(f.dtype) for f in feeds]
    np.testing.assert_allclose(
        executable.run(new_feeds)[0], interpret_prim(module, new_feeds)[0], rtol=1e-5, atol=1e-5
    )
