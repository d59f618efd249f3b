"""``optimizer-fusion``: identical per-parameter update chains become one flat chain; the
module computes the same updates (interpreted before/after), keeps its signature and in-place
result roles, and chains that differ stay apart."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import optim
from lucid.compile.training import build_training_module
from lucid.ir import feed_roles, forward_func, import_trace, interpret, result_roles
from lucid.ir.types import dtype_of_type, shape_of_type
from lucid.passes import PassManager
from lucid.passes.optimizer_fusion import fuse_optimizer_updates
from lucid.trace import _tracing

_spec = importlib.util.spec_from_file_location(
    "training_models", os.path.join(os.path.dirname(__file__), "_training_models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

OPTIMIZERS = [
    (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, amsgrad=True)),
    (optim.AdamW, dict(lr=0.01)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (optim.Adagrad, dict(lr=0.1)),
    (optim.Adadelta, dict(lr=1.0)),
    (optim.Adamax, dict(lr=0.01)),
    (optim.NAdam, dict(lr=0.01)),
    (optim.RAdam, dict(lr=0.01)),
]


def _op_names(module) -> list[str]:
    return [op.name for op in forward_func(module).body.blocks.first.ops]


def _random_feeds(module, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    fn = forward_func(module)
    feeds = {}
    for role, arg in zip(feed_roles(fn), fn.body.blocks.first.args, strict=True):
        dt = dtype_of_type(arg.type)
        # positive values: second-moment state and step counts must be valid
        feeds[role] = rng.uniform(0.5, 1.5, shape_of_type(arg.type)).astype(dt.numpy)
    return feeds


def _traced_step(cls, options, params, seed=0):
    """The optimizer update alone, traced against ghost gradient feeds (roles as
    ``build_training_module`` gives them)."""
    opt = cls(params, **options)
    for p in params:
        p.grad = lucid.zeros_like(p)
    with lucid.no_grad():
        items = list(opt._param_updates())
        with _tracing() as tr:
            for k, (p, _, st, scalars) in enumerate(items):
                for key, t in st.items():
                    tr._names[id(t)] = f"state:p{k}.{key}"
                tr._names[id(p)] = f"param:p{k}"
                ghost = tr.input(tuple(p.shape), p.dtype, role=f"ghost:param:p{k}")
                fed = {
                    key: v
                    if key in cls._static_keys
                    else tr.input((), lucid.float32, role=f"scalar:{k}:{key}")
                    for key, v in scalars.items()
                }
                opt._update(p, ghost, st, **fed)
            trace = tr.finish([])
    return import_trace(trace)


@pytest.mark.parametrize("cls, options", OPTIMIZERS, ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_fused_update_computes_the_same_as_per_parameter_chains(cls, options):
    params = [lucid.ones(s, requires_grad=True) for s in ((3, 4), (4,), (2, 2, 2), (5,))]
    module = _traced_step(cls, options, params)
    fn = forward_func(module)
    roles_before, args_before = result_roles(fn), feed_roles(fn)
    feeds = _random_feeds(module)
    before = interpret(module, feeds)
    PassManager("optimizer-fusion,canonicalize,cse,dce", verify_each=True).run(module)
    after = interpret(module, feeds)
    assert result_roles(forward_func(module)) == roles_before  # in-place outputs kept
    assert feed_roles(forward_func(module)) == args_before
    for role, b, a in zip(roles_before, before, after, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, role
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=role)
    names = _op_names(module)
    assert names.count("lucid.cat") >= 2  # flat buffers of parameters, gradients, state
    assert "lucid.index" in names  # split back into each tensor's update


@pytest.mark.parametrize("cls, options", OPTIMIZERS, ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_training_module_is_the_same_with_and_without_fusion(cls, options):
    results = []
    counts = []
    for fuse in (False, True):
        model, loss_fn, inputs = models.make("cnn")
        tm = build_training_module(
            model, loss_fn, inputs, cls(model.parameters(), **options), fuse_optimizer=fuse
        )
        results.append(
            dict(zip(tm.result_roles, interpret(tm.module, tm.feed_values(*inputs)), strict=True))
        )
        names = _op_names(tm.module)
        counts.append(sum(n in ("lucid.div", "lucid.sqrt", "lucid.mul") for n in names))
    unfused, fused = results
    assert unfused.keys() == fused.keys()
    for role in unfused:
        np.testing.assert_allclose(fused[role], unfused[role], rtol=1e-6, atol=1e-7, err_msg=role)
    assert counts[1] < counts[0]  # one chain instead of one per parameter


def test_all_parameters_of_one_optimizer_form_one_chain():
    params = [lucid.ones(s, requires_grad=True) for s in ((3, 4), (4,), (2, 5))]
    module = _traced_step(optim.Adam, dict(lr=0.01), params)
    n_sqrt_before = _op_names(module).count("lucid.sqrt")
    assert fuse_optimizer_updates(forward_func(module)) == 3
    assert n_sqrt_before == 3 and _op_names(module).count("lucid.sqrt") == 1


def test_different_chains_are_not_fused_together():
    a = [lucid.ones((3,), requires_grad=True), lucid.ones((2, 2), requires_grad=True)]
    b = [lucid.ones((4,), requires_grad=True), lucid.ones((5,), requires_grad=True)]
    # weight decay changes the chain's structure: two groups, each fused on its own
    opt_groups = [{"params": a, "weight_decay": 0.1}, {"params": b}]
    opt = optim.SGD(opt_groups, lr=0.1, momentum=0.9)
    with lucid.no_grad():
        for p in a + b:
            p.grad = lucid.zeros_like(p)
        items = list(opt._param_updates())
        with _tracing() as tr:
            for k, (p, _, st, scalars) in enumerate(items):
                tr._names[id(p)] = f"param:p{k}"
                for key, t in st.items():
                    tr._names[id(t)] = f"state:p{k}.{key}"
                ghost = tr.input(tuple(p.shape), p.dtype, role=f"ghost:param:p{k}")
                opt._update(p, ghost, st, **scalars)
            module = import_trace(tr.finish([]))
    feeds = _random_feeds(module, seed=1)
    before = interpret(module, feeds)
    assert fuse_optimizer_updates(forward_func(module)) == 4
    module.verify()
    cats = [op for op in forward_func(module).body.blocks.first.ops if op.name == "lucid.cat"]
    sizes = {shape_of_type(op.results[0].type) for op in cats}
    assert sizes == {(7,), (9,)}  # 3 + 4 (with decay) and 4 + 5 (without)
    for b_, a_ in zip(before, interpret(module, feeds), strict=True):
        np.testing.assert_allclose(a_, b_, rtol=1e-6)


def test_mixed_dtypes_stay_apart_and_min_group_is_honoured():
    params = [
        lucid.ones((3,), requires_grad=True),
        lucid.ones((2,), dtype=lucid.float64, requires_grad=True),
    ]
    module = _traced_step(optim.Adam, dict(lr=0.01), params)
    n_ops = len(_op_names(module))
    assert fuse_optimizer_updates(forward_func(module)) == 0  # float32 and float64 chains
    assert len(_op_names(module)) == n_ops
    params = [lucid.ones((3,), requires_grad=True), lucid.ones((2,), requires_grad=True)]
    module = _traced_step(optim.Adam, dict(lr=0.01), params)
    PassManager("optimizer-fusion{min-group=3}").run(module)
    assert "lucid.cat" not in _op_names(module)


@settings(max_examples=10)
@given(
    shapes=st.lists(
        st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple), min_size=2, max_size=4
    ),
    dtype=st.sampled_from([lucid.float32, lucid.float64]),
    which=st.integers(0, len(OPTIMIZERS) - 1),
)
def test_fusion_preserves_results_for_any_parameter_shapes(shapes, dtype, which):
    cls, options = OPTIMIZERS[which]
    params = [lucid.ones(s, dtype=dtype, requires_grad=True) for s in shapes]
    module = _traced_step(cls, options, params)
    feeds = _random_feeds(module, seed=which)
    before = interpret(module, feeds)
    fuse_optimizer_updates(forward_func(module))
    module.verify()
    for b, a in zip(before, interpret(module, feeds), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls, options", OPTIMIZERS, ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_optimizer_module_steps_like_eager(cls, options):
    from lucid.compile.training import build_optimizer_module

    rng = np.random.default_rng(0)
    shapes = ((3, 2), (2,), (4,))
    data = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [lucid.tensor(d, requires_grad=True) for d in data]
    eager = [lucid.tensor(d, requires_grad=True) for d in data]
    opt, eager_opt = cls(params, **options), cls(eager, **options)
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(2)]
    for p, g in zip(params[:2], grads[0], strict=False):  # the last parameter has no gradient
        p.grad = lucid.tensor(g)
    om = build_optimizer_module(opt)
    assert "update:param:0.2" not in om.result_roles
    assert "lucid.cat" in _op_names(om.module)
    for step in range(2):
        for p, ep, g in zip(params[:2], eager[:2], grads[step], strict=False):
            p.grad, ep.grad = lucid.tensor(g), lucid.tensor(g)
        om.write_back(interpret(om.module, om.feed_values()))
        om.refresh_scalars()
        eager_opt.step()
        for p, ep in zip(params, eager, strict=True):
            np.testing.assert_allclose(
                p.detach().numpy(), ep.detach().numpy(), rtol=1e-5, atol=1e-7
            )


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_fusion_after_ghost_grads_keeps_the_results(kind):
    model, loss_fn, inputs = models.make(kind)
    opt = optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    tm = build_training_module(model, loss_fn, inputs, opt, fuse_optimizer=False)
    feeds = tm.feed_values(*inputs)
    before = interpret(tm.module, feeds)
    n_sqrt = _op_names(tm.module).count("lucid.sqrt")
    PassManager("optimizer-fusion,cse,dce", verify_each=True).run(tm.module)
    assert result_roles(forward_func(tm.module)) == tm.result_roles
    assert _op_names(tm.module).count("lucid.sqrt") < n_sqrt
    for b, a in zip(before, interpret(tm.module, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
