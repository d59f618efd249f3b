"""Acceptance tests of lucid.compile's CompiledModule (issue: CompiledModule and the cache)."""

import collections
import dataclasses
import importlib.util
import logging
import os
import threading

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F

_spec = importlib.util.spec_from_file_location(
    "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

RTOL, ATOL = 1e-4, 1e-5


def randn(*shape, seed=0):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.fixture(autouse=True)
def _inference_mode():
    with lucid.no_grad():
        yield


def assert_matches_eager(model, *inputs):
    cm = lucid.compile(model)
    got = cm(*inputs)
    want = model(*inputs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)
    info = cm.cache_info()
    assert info["eager_only"] == (), info["reasons"]
    assert info["entries"] == 1
    return cm


def test_cache_accounting_five_calls_one_entry_four_hits():
    cm = lucid.compile(models.MLP())
    x = randn(8, 16)
    for _ in range(5):
        cm(x)
    info = cm.cache_info()
    assert info["entries"] == 1
    (key,) = info["keys"]
    assert info["n_calls"][key] == 5
    (row,) = cm.timing()
    assert row["n_hits"] == 4
    assert row["compile_ms"] > 0
    assert set(row["passes_ms"]) >= {"import", "canonicalize", "cse", "dce"}


def test_four_batch_sizes_four_entries():
    cm = lucid.compile(models.MLP())
    for b in (1, 2, 3, 4):
        cm(randn(b, 16))
    assert cm.cache_info()["entries"] == 4


def test_cache_is_emptied_by_clear_cache():
    # train(), eval(), to() and load_state_dict() keep what stays valid: test_module_surface.py
    model = models.MLP()
    cm = lucid.compile(model)
    cm(randn(2, 16))
    assert cm.cache_info()["entries"] == 1
    cm.clear_cache()
    info = cm.cache_info()
    assert info["entries"] == 0 and info["n_calls"] == {}


@pytest.mark.parametrize(
    "make, shape",
    [
        (models.MLP, (5, 16)),
        (lambda: models.LeNet().eval(), (2, 1, 12, 12)),
        (lambda: models.BasicBlock().eval(), (2, 4, 6, 6)),
        (models.LSTMModel, (3, 5, 6)),
    ],
    ids=["mlp", "lenet-bn", "resnet-block", "lstm"],
)
def test_models_compile_and_match_eager(make, shape):
    lucid.manual_seed(0)
    assert_matches_eager(make(), randn(*shape))


def test_tiny_gpt_compiles_and_matches_eager():
    lucid.manual_seed(0)
    idx = lucid.tensor(np.random.default_rng(1).integers(0, 20, (2, 8)))
    assert_matches_eager(models.TinyGPT(), idx)


def test_different_input_gives_different_output_nothing_baked():
    model = models.MLP()
    cm = lucid.compile(model)
    a, b = randn(4, 16, seed=1), randn(4, 16, seed=2)
    ya, yb = cm(a), cm(b)
    assert not np.allclose(ya.numpy(), yb.numpy())
    np.testing.assert_allclose(yb.numpy(), model(b).numpy(), rtol=RTOL, atol=ATOL)


def test_parameter_change_in_place_is_seen_without_recompile():
    model = models.MLP()
    cm = lucid.compile(model)
    x = randn(4, 16)
    before = cm(x).numpy().copy()
    model.fc2.bias.add_(1.0)
    after = cm(x).numpy()
    np.testing.assert_allclose(after, before + 1.0, rtol=RTOL, atol=ATOL)
    assert cm.cache_info()["entries"] == 1
    assert cm.timing()[0]["n_hits"] == 1


def test_attribute_sensitive_models_do_not_share_executables():
    class SoftmaxModel(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, x):
            return F.softmax(x, dim=self.dim)

    x = randn(3, 4)
    a, b = lucid.compile(SoftmaxModel(0)), lucid.compile(SoftmaxModel(1))
    np.testing.assert_allclose(a(x).numpy(), F.softmax(x, dim=0).numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(b(x).numpy(), F.softmax(x, dim=1).numpy(), rtol=RTOL, atol=ATOL)


def test_dropout_p_changes_the_graph():
    x = lucid.ones(64, 64)
    outs = []
    for p in (0.1, 0.9):
        m = nn.Dropout(p)
        m.train()
        cm = lucid.compile(m)
        outs.append(float((cm(x).numpy() == 0).mean()))
    assert outs[0] < 0.3 < 0.7 < outs[1]


def test_item_in_forward_falls_back_with_reason_and_warns(caplog):
    class UsesItem(nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    cm = lucid.compile(UsesItem())
    x = randn(3)
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        y = cm(x)
    np.testing.assert_allclose(y.numpy(), (x * x.sum().item()).numpy(), rtol=RTOL)
    info = cm.cache_info()
    assert len(info["eager_only"]) == 1 and info["entries"] == 0
    (reason,) = info["reasons"].values()
    assert "item()" in reason and "test_compiled_module.py" in reason
    assert any("eagerly" in r.getMessage() for r in caplog.records)
    cm(x)  # the second call goes straight to eager
    assert info["eager_only"] == cm.cache_info()["eager_only"]


def test_strict_raises_instead_of_falling_back():
    class UsesItem(nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    with pytest.raises(lucid.compile.CompileError, match="item"):
        lucid.compile(UsesItem(), strict=True)(randn(3))


def test_output_structures_round_trip():
    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Out:
        y: lucid.Tensor
        tag: str

    def fn(x):
        return {"t": (x * 2.0, [x + 1.0]), "p": Pair(x.exp(), 3), "d": Out(x - 1.0, "hi"), "x": x}

    x = randn(2, 3)
    got = lucid.compile(fn)(x)
    assert isinstance(got["p"], Pair) and got["p"].b == 3
    assert isinstance(got["d"], Out) and got["d"].tag == "hi"
    assert got["x"] is x
    np.testing.assert_allclose(got["t"][1][0].numpy(), x.numpy() + 1.0, rtol=RTOL)
    np.testing.assert_allclose(got["p"].a.numpy(), np.exp(x.numpy()), rtol=RTOL)


def test_keyword_tensors_compile_and_scalar_keywords_rekey():
    def fn(x, *, bias, scale=1.0):
        return x * scale + bias

    cm = lucid.compile(fn)
    x, b = randn(2, 3), randn(3, seed=4)
    np.testing.assert_allclose(cm(x, bias=b).numpy(), (x + b).numpy(), rtol=RTOL)
    np.testing.assert_allclose(cm(x, bias=b, scale=2.0).numpy(), (x * 2.0 + b).numpy(), rtol=RTOL)
    info = cm.cache_info()
    assert info["entries"] == 2 and info["eager_only"] == ()


def test_unhashable_argument_runs_eagerly_without_polluting_the_cache():
    def fn(x, opts):
        return x * opts["k"]

    cm = lucid.compile(fn)
    x = randn(3)
    np.testing.assert_allclose(cm(x, {"k": 2.0}).numpy(), x.numpy() * 2.0, rtol=RTOL)
    info = cm.cache_info()
    assert info["entries"] == 0 and info["eager_only"] == () and info["n_calls"] == {}


def test_non_callable_target_is_a_type_error():
    with pytest.raises(TypeError, match="callable"):
        lucid.compile(42)


def test_decorator_forms():
    @lucid.compile
    def f(x):
        return x + 1.0

    @lucid.compile(dynamic=True)
    def g(x):
        return x * 3.0

    x = randn(4)
    np.testing.assert_allclose(f(x).numpy(), x.numpy() + 1.0, rtol=RTOL)
    np.testing.assert_allclose(g(x).numpy(), x.numpy() * 3.0, rtol=RTOL)
    assert g.dynamic and not f.dynamic


def test_attribute_fall_through_and_delegation():
    model = models.MLP()
    cm = lucid.compile(model)
    assert cm.fc1 is model.fc1
    assert cm.model is model
    assert [id(p) for p in cm.parameters()] == [id(p) for p in model.parameters()]
    assert cm.training == model.training
    cm.eval()
    assert not model.training and not cm.training


def test_batchnorm_training_mode_updates_running_stats_in_place():
    lucid.manual_seed(0)
    ref, model = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    model.load_state_dict(ref.state_dict())
    ref.train(), model.train()
    cm = lucid.compile(model)
    mean_buffer = model.running_mean
    for seed in range(3):
        x = randn(4, 3, 5, 5, seed=seed)
        np.testing.assert_allclose(cm(x).numpy(), ref(x).numpy(), rtol=RTOL, atol=ATOL)
    assert model.running_mean is mean_buffer
    np.testing.assert_allclose(model.running_mean.numpy(), ref.running_mean.numpy(), rtol=RTOL)
    np.testing.assert_allclose(model.running_var.numpy(), ref.running_var.numpy(), rtol=RTOL)
    assert cm.cache_info()["eager_only"] == ()


def test_dropout_training_is_random_per_call_and_reproducible():
    m = nn.Dropout(0.5)
    m.train()
    cm = lucid.compile(m)
    x = lucid.ones(32, 32)
    lucid.manual_seed(7)
    a, b = cm(x).numpy().copy(), cm(x).numpy().copy()
    assert not np.array_equal(a, b)
    lucid.manual_seed(7)
    np.testing.assert_array_equal(cm(x).numpy(), a)
    assert cm.cache_info()["eager_only"] == ()


def test_ir_stages_and_graph_dump():
    cm = lucid.compile(models.MLP())
    cm(randn(2, 16))
    imported = cm.ir(stage="imported")
    assert "lucid.linear" in imported or "lucid.matmul" in imported
    assert "prim." in cm.ir(stage="prim")
    dump = cm.graph_dump()
    assert "lucid.compile.trace/v1" in dump
    key = cm.cache_info()["keys"][0]
    assert "lucid.compile.trace/v1" in cm.graph_dump(key)
    assert cm.dump_trace(("no", "such")) == ""


def test_concurrent_calls_agree_with_eager_and_compile_once_per_shape():
    model = models.MLP()
    cm = lucid.compile(model)
    inputs = [randn(b, 16, seed=b) for b in (2, 3, 5)]
    expected = [model(x).numpy() for x in inputs]
    errors = []

    def worker(tid):
        try:
            lucid.set_grad_enabled(False).__enter__()  # grad mode is per thread, as in PyTorch
            for i in range(200):
                k = (i + tid) % 3
                np.testing.assert_allclose(cm(inputs[k]).numpy(), expected[k], rtol=RTOL, atol=ATOL)
        except Exception as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert cm.cache_info()["entries"] == 3


def test_non_contiguous_input_gives_the_eager_result():
    model = models.MLP()
    cm = lucid.compile(model)
    base = randn(16, 6)
    cm(base.T.contiguous() if hasattr(base.T, "contiguous") else base.T)
    xt = base.T  # a transposed view: not C-contiguous
    np.testing.assert_allclose(cm(xt).numpy(), model(xt).numpy(), rtol=RTOL, atol=ATOL)
    assert cm.cache_info()["entries"] == 1


def test_reading_a_concrete_buffer_value_is_a_graph_break_not_a_baked_constant():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", lucid.tensor(2.0))

        def forward(self, x):
            return x * self.scale.item()

    model = Scaled()
    cm = lucid.compile(model)
    x = randn(3)
    np.testing.assert_allclose(cm(x).numpy(), x.numpy() * 2.0, rtol=RTOL)
    model.scale.fill_(5.0)
    np.testing.assert_allclose(cm(x).numpy(), x.numpy() * 5.0, rtol=RTOL)
    (reason,) = cm.cache_info()["reasons"].values()
    assert "item()" in reason


def test_negative_zero_constant_keeps_its_sign():
    def fn(x):
        return (x * -0.0, x * 0.0)

    x = lucid.tensor([1.0, -2.0])
    neg, pos = lucid.compile(fn)(x)
    assert np.array_equal(np.signbit(neg.numpy()), [True, False])
    assert np.array_equal(np.signbit(pos.numpy()), [False, True])


def test_profile_times_every_instruction_without_touching_the_model():
    lucid.manual_seed(0)
    model = lucid.nn.Sequential(
        lucid.nn.Linear(6, 8), lucid.nn.BatchNorm1d(8), lucid.nn.ReLU(), lucid.nn.Linear(8, 3)
    )
    model.train()  # BatchNorm updates its running statistics in place on every call
    cm = lucid.compile(model)
    x = lucid.randn(5, 6)
    cm(x)
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    rows = cm.profile(x, repeats=7)
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert {"matmul", "gemm"} & {r["op"] for r in rows}  # the GEMMs (gemm: with their bias)
    assert all(r["ms"] > 0 and r["instr"].startswith("%") for r in rows)
    assert len({r["index"] for r in rows}) == len(rows) > 0
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        cm.profile(x, repeats=0)


def test_profile_of_arguments_that_run_eagerly_says_why():
    def breaks(t):
        return t * float(t.sum())  # reads a value: a graph break

    with pytest.raises(RuntimeError, match="run eagerly"):
        lucid.compile(breaks).profile(lucid.randn(3))


def test_deepcopy_of_a_compiled_module_and_of_a_tree_holding_one():
    import copy

    lucid.manual_seed(0)
    cm = lucid.compile(nn.Sequential(nn.Linear(4, 8), nn.GELU()), check_tolerance=(1e-4, 1e-5))
    tree = nn.Sequential(cm, nn.Linear(8, 2))
    x = lucid.randn(3, 4)
    with lucid.no_grad():
        cm(x)
        twin_tree = copy.deepcopy(tree)  # an EMA copy of a model with a compiled block
        twin = twin_tree[0]
        assert isinstance(twin, type(cm)) and twin is not cm
        assert twin._init_kwargs == cm._init_kwargs
        # Its own parameters (a deep copy), its own cache: editing one leaves the other.
        twin._orig_mod[0].weight.data = twin._orig_mod[0].weight * 0.0
        np.testing.assert_allclose(twin_tree(x).numpy(), tree[1](twin._orig_mod(x)).numpy())
        assert not np.allclose(tree(x).numpy(), twin_tree(x).numpy())
        assert twin.cache_info()["entries"] == 1 and cm.cache_info()["entries"] == 1


def test_a_graph_break_inside_lucid_points_at_the_users_line_not_the_standard_library():
    # BatchNorm with momentum=None reads its batch count (an item()) inside a no_grad block,
    # whose contextlib wrapper was named as the place.
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=None))
    cm = lucid.compile(m)
    with lucid.no_grad():
        cm(lucid.randn(5, 4))
    (reason,) = cm.cache_info()["reasons"].values()
    assert "contextlib" not in reason and os.path.basename(__file__) in reason
