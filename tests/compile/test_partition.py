"""The ``partition`` pass (``lucid.passes.partition``): the forward/backward split of a
grad-mode call. Checked with the IR interpreter: running ``@forward`` and feeding its residuals
to ``@backward`` gives the whole differentiated program's outputs, updates and gradients on
random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import nn
from lucid.ir import feed_roles, forward_func, import_trace, interpret, print_ir, result_roles
from lucid.passes import PassFailure, PassManager, get_pass, parse_pipeline_spec
from lucid.passes.partition import BACKWARD, Partition, split_module
from lucid.passes.vjp import VJP
from lucid.trace import _tracing


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x, y):
        h = self.bn(self.fc(x)).tanh()
        return h * y, (h.exp() + y).sum(dim=1)


def _models():
    return {
        "mlp": lambda: nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)),
        "norm": lambda: nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GELU()),
        "two-outputs": TwoOutputs,
    }


def _differentiated(model, inputs):
    """The grad-mode module ``lucid.compile`` builds: one cotangent feed per output and the
    gradients of ``sum_j (out_j * cot_j).sum()`` appended by ``vjp``."""
    with _tracing(model) as tracer:
        targs = [tracer.input_like(a) for a in inputs]
        out = model(*targs)
        outs = list(out) if isinstance(out, tuple) else [out]
        seeded = None
        for j, t in enumerate(outs):
            term = (t * tracer.input(tuple(t.shape), t.dtype, role=f"cot:{j}")).sum()
            seeded = term if seeded is None else seeded + term
        trace = tracer.finish([seeded, *outs])
    module = import_trace(trace)
    wrt = [r for r in feed_roles(forward_func(module)) if r.startswith(("param:", "input:0"))]
    PassManager([VJP(wrt=" ".join(wrt)), *parse_pipeline_spec("canonicalize,cse,dce")]).run(module)
    return module, outs


def _feeds(module, model, inputs, outs, rng):
    values = {f"input:{i}": np.array(a.numpy(), copy=True) for i, a in enumerate(inputs)}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        values[f"param:{name}"] = values[f"buffer:{name}"] = np.array(t.numpy(), copy=True)
    for j, t in enumerate(outs):
        values[f"cot:{j}"] = rng.standard_normal(tuple(t.shape)).astype(np.float32)
    return {r: values[r] for r in feed_roles(forward_func(module))}


def _run(module, feeds, name="forward"):
    fn = forward_func(module, name)
    results = interpret(module, {r: feeds[r] for r in feed_roles(fn)}, func_name=name)
    return dict(zip(result_roles(fn), results, strict=True))


@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from(sorted(_models())),
    batch=st.integers(2, 5),
    seed=st.integers(0, 2**31 - 1),
    training=st.booleans(),
)
def test_the_two_halves_composed_equal_the_whole_program(kind, batch, seed, training):
    lucid.manual_seed(seed % 1000)
    model = _models()[kind]().train(training)
    rng = np.random.default_rng(seed)
    inputs = [lucid.tensor(rng.standard_normal((batch, 4)).astype(np.float32))]
    if kind == "two-outputs":
        inputs.append(lucid.tensor(rng.standard_normal((batch, 3)).astype(np.float32)))
    module, outs = _differentiated(model, inputs)
    feeds = _feeds(module, model, inputs, outs, rng)
    whole = _run(module, feeds)

    PassManager([Partition()], verify_each=True).run(module)
    fwd_mod, bwd_mod = split_module(module)
    fwd = _run(fwd_mod, feeds)
    assert not any(r.startswith("cot:") for r in feed_roles(forward_func(fwd_mod)))
    residuals = {r: v for r, v in fwd.items() if r.startswith("residual:")}
    bwd = _run(bwd_mod, {**feeds, **residuals})
    assert set(bwd) == {r for r in whole if r.startswith("grad:")} and bwd
    for role, want in whole.items():
        if role == "output:0":  # the seeded sum: neither half returns it
            assert role not in fwd and role not in bwd
            continue
        got = bwd[role] if role.startswith("grad:") else fwd[role]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=role)


def test_the_module_holds_both_functions_after_the_pass():
    model = _models()["mlp"]()
    x = lucid.randn(3, 4)
    module, _ = _differentiated(model, [x])
    PassManager("partition").run(module)
    text = print_ir(module)
    assert "func.func @forward" in text and f"func.func @{BACKWARD}" in text
    bwd_roles = feed_roles(forward_func(module, BACKWARD))
    assert any(r.startswith("residual:") for r in bwd_roles)
    assert all(r.startswith("grad:") for r in result_roles(forward_func(module, BACKWARD)))
    assert get_pass("partition") is Partition


def test_partition_refuses_a_function_without_cotangents_or_already_split():
    with _tracing(None) as tracer:
        t = tracer.input((2, 2), lucid.float32)
        trace = tracer.finish([t.exp()])
    with pytest.raises(PassFailure, match="no cotangent"):
        PassManager("partition").run(import_trace(trace))
    module, _ = _differentiated(_models()["mlp"](), [lucid.randn(2, 4)])
    PassManager("partition").run(module)
    with pytest.raises(PassFailure, match="already has a @backward"):
        PassManager("partition").run(module)
