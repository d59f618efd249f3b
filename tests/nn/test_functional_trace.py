"""The nn ops under the tracer: forward graphs and every VJP rule run symbolically.

A VJP rule must use Lucid ops only, because the ``vjp`` pass runs the same rule on trace tensors
to emit the backward graph. Each rule here runs under a tracer, the recorded graph is imported,
printed, re-parsed and interpreted, and the result must equal eager autograd's gradients.
"""

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid.ir import import_trace, interpret, parse_ir, print_ir
from lucid.ops import REGISTRY
from lucid.ops._registry import VJPContext
from lucid.testing import assert_close
from lucid.trace import _tracing, trace

rng = np.random.default_rng(0)


def normal(*shape):
    return rng.standard_normal(shape)


def run_traced(fn, arrays, captured=()):
    inputs = [lucid.tensor(a) for a in arrays]
    eager = fn(*inputs)
    module = import_trace(trace(fn, *inputs))
    module.verify()
    feeds = {f"input:{i}": a for i, a in enumerate(arrays)}
    feeds.update({f"capture:{i}": c.numpy() for i, c in enumerate(captured)})
    return eager, interpret(parse_ir(print_ir(module)), feeds)[0]


def test_traced_cnn_with_loss_matches_eager():
    w = lucid.tensor(normal(4, 1, 3, 3).astype(np.float32))
    w_fc = lucid.tensor(normal(3, 64).astype(np.float32))

    def cnn(x, t):
        h = F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 2)
        h = F.avg_pool2d(h, 1) + F.adaptive_avg_pool2d(h, 4)
        return F.cross_entropy(F.linear(h.reshape(2, -1), w_fc), t, label_smoothing=0.1)

    x = normal(2, 1, 8, 8).astype(np.float32)
    eager, got = run_traced(cnn, [x, np.array([0, 2])], captured=(w, w_fc))
    assert_close(got, eager.numpy(), rtol=1e-5)


def test_traced_attention_block_matches_eager():
    def block(q, k):
        a = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        a = F.layer_norm(F.gelu(a), 4) + F.rms_norm(a, 4) + F.softmax(a, -1)
        a = a + F.log_softmax(a, 1) + F.group_norm(a, 1)
        return F.batch_norm(a, None, None, training=True).sum() + F.mse_loss(a, q)

    q, k = normal(2, 3, 4).astype(np.float32), normal(2, 3, 4).astype(np.float32)
    eager, got = run_traced(block, [q, k])
    assert_close(got, eager.numpy(), rtol=1e-5, atol=1e-5)


# --- every VJP rule, run symbolically


def _f(*shape):
    return normal(*shape)


def _probs(*shape):
    return rng.uniform(0.1, 0.9, shape)


# (op, operands (arrays or Python scalars), attrs); float arrays are differentiated
VJP_CASES = [
    ("relu", [_f(3, 4)], {}),
    ("hardtanh", [_f(3, 4)], {"min_val": -0.5, "max_val": 0.5}),
    ("leaky_relu", [_f(3, 4)], {"negative_slope": 0.1}),
    ("elu", [_f(3, 4)], {"alpha": 1.3}),
    ("gelu", [_f(3, 4)], {}),
    ("gelu", [_f(3, 4)], {"approximate": "tanh"}),
    ("softplus", [_f(3, 4)], {"beta": 2.0}),
    ("softmax", [_f(3, 4)], {"dim": 0}),
    ("log_softmax", [_f(3, 4)], {"dim": -1}),
    ("linear", [_f(2, 3, 4), _f(5, 4), _f(5)], {}),
    ("linear", [_f(3, 4), _f(5, 4), 0.0], {}),
    (
        "conv2d",
        [_f(2, 4, 5, 5), _f(6, 2, 3, 2), _f(6)],
        {"stride": (2, 1), "padding": (1, 0, 1, 1), "dilation": (1, 2), "groups": 2},
    ),
    ("max_pool2d", [_f(2, 2, 5, 5)], {"kernel_size": (2, 2), "stride": (2, 2)}),
    (
        "avg_pool2d",
        [_f(2, 2, 5, 5)],
        {"kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1), "count_include_pad": False},
    ),
    ("adaptive_avg_pool2d", [_f(2, 2, 5, 7)], {"output_size": (2, 3)}),
    ("layer_norm", [_f(2, 3, 4), _f(3, 4), _f(3, 4)], {"normalized_shape": (3, 4)}),
    ("batch_norm", [_f(4, 3, 2), _f(3), _f(3)], {}),
    ("rms_norm", [_f(2, 4), _f(4)], {"normalized_shape": (4,)}),
    ("embedding", [np.array([[0, 2], [3, 2]]), _f(4, 3)], {"padding_idx": 2}),
    ("scaled_dot_product_attention", [_f(2, 3, 4), _f(2, 5, 4), _f(2, 5, 2), 0.0], {}),
    (
        "scaled_dot_product_attention",
        [_f(2, 3, 4), _f(2, 3, 4), _f(2, 3, 2), 0.0],
        {"is_causal": True},
    ),
    ("cross_entropy", [_f(3, 4), np.array([0, 3, 1]), _probs(4)], {"label_smoothing": 0.2}),
    ("cross_entropy", [_f(3, 4), _probs(3, 4), 1.0], {"reduction": "sum"}),
    ("nll_loss", [_f(3, 4), np.array([0, 3, -100]), 1.0], {"reduction": "none"}),
    ("mse_loss", [_f(3, 4), _f(3, 4)], {}),
    ("l1_loss", [_f(3, 4), _f(3, 4)], {"reduction": "sum"}),
    ("smooth_l1_loss", [_f(3, 4), _f(3, 4)], {"beta": 0.5}),
    ("huber_loss", [_f(3, 4), _f(3, 4)], {"reduction": "none"}),
    ("binary_cross_entropy", [_probs(3, 4), _probs(3, 4), 1.0], {}),
    ("binary_cross_entropy_with_logits", [_f(3, 4), _probs(3, 4), 1.0, _probs(4)], {}),
    # backward ops with rules of their own (double backward); the last item lists the operands
    # differentiated
    (
        "cross_entropy_backward",
        [_f(3), _f(3, 4), np.array([0, 3, -100]), _probs(4)],
        {"reduction": "none", "label_smoothing": 0.1},
        (0, 1),
    ),
    ("cross_entropy_backward", [_f(), _f(3, 4), _probs(3, 4), 1.0], {}, (0, 1, 2)),
    ("conv2d_input_grad", [_f(1, 2, 3, 3), _f(2, 2, 2, 2)], {"input_shape": (1, 2, 4, 4)}),
    ("conv2d_weight_grad", [_f(1, 2, 4, 4), _f(1, 2, 3, 3)], {"weight_shape": (2, 2, 2, 2)}),
    ("gelu_backward", [_f(3, 4), _f(3, 4)], {"approximate": "tanh"}),
    ("softplus_backward", [_f(3, 4), _f(3, 4)], {}),
    (
        "avg_pool2d_backward",
        [_f(1, 1, 2, 2)],
        {"input_shape": (1, 1, 4, 4), "kernel_size": (2, 2), "stride": (2, 2)},
    ),
]


def _reduce_to(g, shape):
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


@pytest.mark.parametrize("case", VJP_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(VJP_CASES)])
def test_vjp_rule_runs_under_the_tracer_and_matches_eager(case):
    name, operands, attrs, *explicit = case
    opdef = REGISTRY[name]
    is_array = [isinstance(o, np.ndarray) for o in operands]
    wrt = [i for i, o in enumerate(operands) if isinstance(o, np.ndarray) and o.dtype.kind == "f"]
    if opdef.operands[:2] == ("input", "target"):
        wrt = [i for i in wrt if i < 2]  # class weights and pos_weight take no gradient
    if explicit:
        wrt = list(explicit[0])

    # eager autograd
    eager_ops = [
        lucid.tensor(o, requires_grad=i in wrt) if a else o
        for i, (o, a) in enumerate(zip(operands, is_array, strict=True))
    ]
    out = apply(name, *eager_ops, **attrs)
    out0 = out[0] if isinstance(out, tuple) else out
    cot = normal(*out0.shape)
    expected = lucid.autograd.grad(
        out0, [eager_ops[i] for i in wrt], grad_outputs=lucid.tensor(cot, dtype=out0.dtype)
    )

    # the same rule, recorded under a tracer
    with _tracing() as tr:
        traced = [
            tr.input(o.shape, lucid.tensor(o).dtype) if a else o
            for o, a in zip(operands, is_array, strict=True)
        ]
        g = tr.input(cot.shape, out0.dtype)
        outs = apply(name, *traced, **attrs)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        gouts = [g] + [apply("zeros_like", o) for o in outs[1:]]
        needs = tuple(i in wrt for i in range(len(operands)))
        ctx = VJPContext(tuple(traced), outs, opdef.bind_attrs(attrs), needs)
        grads = opdef.vjp(ctx, *gouts)
        result = tr.finish([grads[i] for i in wrt])
    feeds = [o for o, a in zip(operands, is_array, strict=True) if a] + [cot]
    feeds = [np.asarray(f, dtype=lucid.tensor(f).dtype.numpy) for f in feeds]
    got = interpret(parse_ir(print_ir(import_trace(result))), feeds)
    for i, e, gv in zip(wrt, expected, got, strict=True):
        assert_close(_reduce_to(np.asarray(gv), operands[i].shape), e.numpy(), rtol=1e-4, atol=1e-5)


def test_symbolic_batch_forward_runs_on_any_batch_size():
    w = lucid.tensor(normal(6, 4).astype(np.float32))
    conv_w = lucid.tensor(normal(2, 1, 3, 3).astype(np.float32))
    with _tracing() as tr:
        x = tr.input((None, 3, 4))
        img = tr.input((None, 1, 6, 6))
        h = F.gelu(F.linear(F.layer_norm(x, 4), w))
        h = F.scaled_dot_product_attention(h, h, h).sum()
        p = F.max_pool2d(F.relu(F.conv2d(img, conv_w, padding=1)), 2)
        out = tr.finish([h, F.adaptive_avg_pool2d(F.avg_pool2d(p, 1), 1)])
    module = import_trace(out)
    for batch in (1, 3):
        xa = normal(batch, 3, 4).astype(np.float32)
        ia = normal(batch, 1, 6, 6).astype(np.float32)
        got = interpret(
            module,
            {"input:0": xa, "input:1": ia, "capture:0": w.numpy(), "capture:1": conv_w.numpy()},
        )
        xt, it = lucid.tensor(xa), lucid.tensor(ia)
        eh = F.gelu(F.linear(F.layer_norm(xt, 4), w))
        eh = F.scaled_dot_product_attention(eh, eh, eh).sum()
        ep = F.adaptive_avg_pool2d(F.max_pool2d(F.relu(F.conv2d(it, conv_w, padding=1)), 2), 1)
        assert_close(got[0], eh.numpy(), rtol=1e-5)
        assert_close(got[1], ep.numpy(), rtol=1e-5)


def test_traced_batch_norm_updates_running_stats_as_extra_outputs():
    running_mean = lucid.tensor(np.zeros(3, np.float32))
    running_var = lucid.tensor(np.ones(3, np.float32))

    def bn(x):
        return F.batch_norm(x, running_mean, running_var, None, None, True, 0.1, 1e-5)

    x = normal(4, 3, 2).astype(np.float32)
    result = trace(bn, lucid.tensor(x))
    roles = [role for role, _ in result.outputs]
    assert roles == ["output:0", "update:capture:0", "update:capture:1"]
    feeds = {
        "input:0": x,
        "capture:0": np.zeros(3, np.float32),
        "capture:1": np.ones(3, np.float32),
    }
    _, new_mean, new_var = interpret(import_trace(result), feeds)
    assert_close(new_mean, 0.1 * x.mean((0, 2)), rtol=1e-5)
    assert_close(new_var, 0.9 + 0.1 * x.var((0, 2), ddof=1), rtol=1e-5)
    # tracing does not touch the real buffers
    assert_close(running_mean, np.zeros(3, np.float32))
