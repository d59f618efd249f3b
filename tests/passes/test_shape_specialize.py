"""``shape-specialize``: a symbolic-batch module specialised by the pass is the module of the trace
specialised in Python (``specialize_batch``), and both compute what eager does, through
``lower-to-prim`` and the prim interpreter."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile.session import specialize_batch
from lucid.ir import import_trace, interpret, print_ir
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassFailure, PassManager, PipelineError, get_pass
from lucid.passes.shape_specialize import ShapeSpecialize, ShapeSpecializeError, specialize_module
from lucid.trace import _tracing


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x):
        return F.softmax(self.fc2(F.gelu(self.ln(self.fc1(x)))), dim=-1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = F.max_pool2d(F.leaky_relu(self.conv(x), 0.1), 2)
        return F.log_softmax(self.fc(h.reshape(h.shape[0], -1)), dim=1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out, self.norm = nn.Linear(8, 24), nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.norm(x + F.elu(self.out(a)))


class ConvStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, stride=2)

    def forward(self, x):
        h = F.max_pool2d(F.leaky_relu(self.c1(x), 0.1), 2)
        return F.softmax(F.adaptive_avg_pool2d(self.c2(h), (1, 1)), dim=1)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.ln, self.fc = nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, ids):
        return F.log_softmax(self.fc(F.elu(self.ln(self.emb(ids)))), dim=-1)


# name: (class, per-example shape, input dtype); the first three use only the ops the dynamic
# path accepts (symbolic-batch safe); the last two also a reshape and basic slicing (`index`).
MODELS = {
    "mlp": (MLP, (8,), lucid.float32),
    "convstack": (ConvStack, (3, 8, 8), lucid.float32),
    "embed": (Embed, (5,), lucid.int64),
    "convnet": (ConvNet, (3, 8, 8), lucid.float32),
    "attention": (Attention, (5, 8), lucid.float32),
}
SAFE_MODELS = ["mlp", "convstack", "embed"]


def _symbolic_trace(model: nn.Module, feature_shape: tuple, dtype=lucid.float32):
    with _tracing(model) as tracer:
        x = tracer.input((None, *feature_shape), dtype)
        return tracer.finish(model(x))


def _lowered(module):
    PassManager("lower-to-prim", verify_each=True).run(module)
    return module


@pytest.fixture(scope="module")
def symbolic():
    out = {}
    for name, (cls, feature_shape, dtype) in MODELS.items():
        lucid.manual_seed(0)
        model = cls()
        out[name] = (model, feature_shape, dtype, _symbolic_trace(model, feature_shape, dtype))
    return out


def _feeds(model, feature_shape, dtype, batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    if dtype is lucid.int64:
        x = rng.integers(0, 10, (batch, *feature_shape))
    else:
        x = rng.standard_normal((batch, *feature_shape)).astype(np.float32)
    return {"input:0": x} | {f"param:{n}": p.numpy() for n, p in model.named_parameters()}


def _eager(model, x: np.ndarray) -> np.ndarray:
    with lucid.no_grad():
        return model(lucid.tensor(x)).numpy()


def test_symbolic_traces_have_symbolic_dims_and_safe_models_are_safe(symbolic):
    from lucid.compile.signature import _SYMBOLIC_SAFE_OPS

    for name, (_, _, _, tr) in symbolic.items():
        assert "tensor<?x" in print_ir(import_trace(tr))
        unsafe = {op.name for op in tr.ops} - _SYMBOLIC_SAFE_OPS()
        assert (name in SAFE_MODELS) == (not unsafe), (name, unsafe)


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(SAFE_MODELS), batch=st.integers(1, 9), seed=st.integers(0, 99))
def test_pass_equals_specializing_the_trace_in_python(symbolic, name, batch, seed):
    model, feature_shape, dtype, tr = symbolic[name]
    by_pass = import_trace(tr)
    PassManager(f"shape-specialize{{batch={batch}}}").run(by_pass)
    by_python = import_trace(specialize_batch(tr, batch))
    assert "?" not in print_ir(by_pass)
    assert print_ir(by_pass) == print_ir(by_python)

    feeds = _feeds(model, feature_shape, dtype, batch, seed)
    got = interpret_prim(_lowered(by_pass), feeds)
    want = interpret_prim(_lowered(by_python), feeds)
    assert len(got) == len(want) == 1
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[0], _eager(model, feeds["input:0"]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["convnet", "attention"])
@pytest.mark.parametrize("batch", [1, 4])
def test_pass_is_right_beyond_the_symbolic_safe_ops(symbolic, name, batch):
    # A reshape's rows and basic slicing's open ends (None in a nested index spec, which
    # specialize_batch would turn into the batch size) come out right through the pass.
    model, feature_shape, dtype, tr = symbolic[name]
    module = import_trace(tr)
    PassManager(f"shape-specialize{{batch={batch}}}", verify_each=True).run(module)
    feeds = _feeds(model, feature_shape, dtype, batch, 0)
    (got,) = interpret_prim(_lowered(module), feeds)
    np.testing.assert_allclose(got, _eager(model, feeds["input:0"]), rtol=1e-4, atol=1e-5)


def test_result_types_are_inferred_not_substituted():
    # specialize_batch would give the reshape 3 rows; the registry's rule gives 6.
    def f(x):
        return x.exp().reshape(-1, 4)

    with _tracing() as tracer:
        tr = tracer.finish(f(tracer.input((None, 8), lucid.float32)))
    module = import_trace(tr)
    specialize_module(module, 3)
    assert "-> tensor<6x4xf32>" in print_ir(module)
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(interpret(module, [x])[0], np.exp(x).reshape(6, 4), rtol=1e-6)


def test_the_pass_shows_in_print_ir_after_all_and_in_the_registry(symbolic):
    _, _, _, tr = symbolic["mlp"]
    module = import_trace(tr)
    stream = io.StringIO()
    PassManager("shape-specialize{batch=4},cse", print_ir_after_all=True, stream=stream).run(module)
    dumps = stream.getvalue()
    assert "// -----// IR Dump After shape-specialize //----- //" in dumps
    after = dumps.split("IR Dump After shape-specialize")[1].split("IR Dump After cse")[0]
    assert "tensor<4x8xf32>" in after and "?" not in after
    assert get_pass("shape-specialize") is ShapeSpecialize
    assert str(ShapeSpecialize(batch=4).spec()) == "shape-specialize{batch=4}"


def test_pass_instance_and_specialize_module_agree(symbolic):
    _, _, _, tr = symbolic["convnet"]
    a, b = import_trace(tr), import_trace(tr)
    PassManager([ShapeSpecialize(batch=2)]).run(a)
    specialize_module(b, 2)
    assert print_ir(a) == print_ir(b)


@pytest.mark.parametrize("spec", ["shape-specialize", "shape-specialize{batch=-1}"])
def test_bad_options_are_pipeline_errors(spec):
    with pytest.raises(PipelineError, match="bad options for pass 'shape-specialize'"):
        PassManager(spec)


@pytest.mark.parametrize("batch", [-1, True, 2.0])
def test_specialize_module_refuses_a_bad_size(batch):
    with pytest.raises(ShapeSpecializeError, match="batch must be an integer >= 0"):
        specialize_module(import_trace(_symbolic_trace(MLP(), (8,))), batch)


def test_a_size_the_graph_cannot_take_names_the_op():
    def f(x, y):
        return x + y

    with _tracing() as tracer:
        tr = tracer.finish(f(tracer.input((None, 3)), tracer.input((5, 3))))
    module = import_trace(tr)
    specialize_module(import_trace(tr), 5)  # 5 broadcasts against 5 rows
    with pytest.raises(PassFailure, match=r"op #0 lucid\.add: broadcast"):
        PassManager("shape-specialize{batch=4}").run(module)


def test_after_lowering_there_is_nothing_symbolic_left_to_specialize(symbolic):
    _, _, _, tr = symbolic["mlp"]
    module = import_trace(tr)
    PassManager("shape-specialize{batch=2},lower-to-prim,shape-specialize{batch=7}").run(module)
    assert "tensor<2x8xf32>" in print_ir(module)  # prim ops are static: the second run is a no-op
