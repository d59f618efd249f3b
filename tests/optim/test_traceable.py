"""Every optimizer's update traces into one straight-line graph (no graph break) whose per-step
scalars are feeds, and running that graph gives the eager step's parameters and state."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid import optim
from lucid._dispatch import _run_eager
from lucid.ops._registry import REGISTRY
from lucid.trace._trace import Const
from lucid.trace._tracing import _tracing

CASES = [
    (optim.SGD, dict(lr=0.1)),
    (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.1, maximize=True)),
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    (optim.AdamW, dict(lr=0.01, maximize=True)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9, weight_decay=0.1)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.1, weight_decay=0.1)),
    (optim.Adadelta, dict(weight_decay=0.1, maximize=True)),
    (optim.Adamax, dict(lr=0.01, weight_decay=0.1)),
    (optim.NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    (optim.RAdam, dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1)),
]


def _setup(cls, options, seed=0):
    rng = np.random.default_rng(seed)
    params = [
        lucid.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True)
        for s in ((3, 2), (2,))
    ]
    opt = cls(params, **options)
    for _ in range(3):  # warm up: a traced step is usually not the first
        for p in params:
            p.grad = lucid.tensor(rng.standard_normal(p.shape).astype(np.float32))
        opt.step()
    for p in params:
        p.grad = lucid.tensor(rng.standard_normal(p.shape).astype(np.float32))
    return params, opt


def _run_trace(trace, feeds):
    env = {f.value.id: feeds[f.role] for f in trace.feeds}

    def operand(x):
        if isinstance(x, list):
            return [operand(e) for e in x]
        return x.value if isinstance(x, Const) else env[x.id]

    for op in trace.ops:
        out = _run_eager(REGISTRY[op.name], tuple(operand(x) for x in op.inputs), op.attrs)
        for v, o in zip(op.outputs, out if isinstance(out, tuple) else (out,), strict=True):
            env[v.id] = o
    return {role: env[v.id] for role, v in trace.outputs}


@pytest.mark.parametrize("cls, options", CASES, ids=[c.__name__ for c, _ in CASES])
def test_traced_update_matches_eager_step(cls, options):
    eager_params, eager_opt = _setup(cls, options)
    params, opt = _setup(cls, options)
    eager_opt.step()

    scalar_values = {}
    with lucid.no_grad():
        items = list(opt._param_updates())  # eager: state creation and Python scalars
        with _tracing() as tracer:
            for i, (param, grad, state, scalars) in enumerate(items):
                fed = {}
                for k, v in scalars.items():
                    if k in cls._static_keys:
                        assert isinstance(v, bool), k
                        fed[k] = v
                    else:
                        role = f"scalar:{i}:{k}"
                        scalar_values[role] = lucid.tensor(v, dtype=lucid.float32)
                        fed[k] = tracer.input((), lucid.float32, role=role)
                opt._update(param, grad, state, **fed)
            trace = tracer.finish([])

    feeds = {**tracer.feed_tensors(), **scalar_values}
    with lucid.no_grad():
        results = _run_trace(trace, feeds)
    written = {role[len("update:") :]: value for role, value in results.items()}
    role_of = {id(t): role for role, t in tracer.feed_tensors().items()}

    # every parameter and every state tensor is written back through an update output
    for p, ep in zip(params, eager_params, strict=True):
        np.testing.assert_allclose(written[role_of[id(p)]].numpy(), ep.numpy(), rtol=1e-6)
        state, eager_state = opt.state[p], eager_opt.state[ep]
        for k, t in state.items():
            np.testing.assert_allclose(
                written[role_of[id(t)]].numpy(), eager_state[k].numpy(), rtol=1e-6, err_msg=k
            )
    # no numbers of a step baked in: learning rates and bias corrections are feeds
    baked = {x.value for op in trace.ops for x in op.inputs if isinstance(x, Const)}
    assert baked <= {1}  # only the step counter's increment
