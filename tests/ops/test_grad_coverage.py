"""Every operand that can require grad gets a gradient, or backward() raises naming the op and
the operand. Walks the registry with the lowering tests' samples; attention's float mask gets
its gradient (checked against finite differences in float64)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid.ops import REGISTRY
from lucid.ops._registry import GRAD_SINK, OpDef

_spec = importlib.util.spec_from_file_location(
    "lowering_samples",
    os.path.join(os.path.dirname(__file__), "..", "passes", "test_lower_to_prim_ops.py"),
)
_samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_samples)
SAMPLES = _samples.SAMPLES

_DIFFERENTIABLE = sorted(
    n for n, op in REGISTRY.items() if op.vjp is not None and GRAD_SINK not in op.props
)


def _float(a) -> bool:
    return isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)


def _operand(a):
    """Float arrays become leaves requiring grad, other arrays plain tensors (also in lists)."""
    if isinstance(a, list):
        return [_operand(e) for e in a]
    if _float(a):
        return lucid.tensor(a, requires_grad=True)
    return lucid.tensor(a) if isinstance(a, np.ndarray) else a


@pytest.mark.parametrize("name", _DIFFERENTIABLE)
def test_each_float_operand_gets_a_gradient_or_backward_names_it(name):
    makers = SAMPLES.get(name)
    if not makers:
        pytest.skip(f"no sample for {name}")
    op = REGISTRY[name]
    for i, make in enumerate(makers):
        args, kw = make(np.random.default_rng(i))
        inputs = [_operand(a) for a in args]
        flat = [t for a in inputs for t in (a if isinstance(a, list) else [a])]
        if not any(isinstance(t, lucid.Tensor) and t.requires_grad for t in flat):
            continue
        try:
            out = apply(name, *inputs, **kw)
        except (IndexError, ValueError, TypeError):
            continue  # a lowering sample eager rejects (e.g. wrapped negative indices)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum(o.sum() for o in outs if o.dtype.is_floating_point and o.requires_grad)
        if not isinstance(loss, lucid.Tensor):
            continue
        try:
            loss.backward()
        except RuntimeError as e:
            # Either the engine's check (naming the op and the operand) or the op's own
            # refusal of this case (naming the op).
            assert name.removesuffix("_backward") in str(e), e
            if "computes no gradient" in str(e):
                assert any(f"'{op.operand_name(j)}'" in str(e) for j in range(len(flat))), e
            continue
        for j, t in enumerate(flat):
            if isinstance(t, lucid.Tensor) and t.requires_grad:
                declared = op.operand_name(j) in op.no_grad_operands
                assert t.grad is not None or declared, (name, op.operand_name(j))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_declared_no_grad_operands_exist_and_say_why(name):
    op = REGISTRY[name]
    names = {n.rstrip("*") for n in op.operands}
    for operand, why in op.no_grad_operands.items():
        assert operand in names and why.strip(), (name, operand)


def test_backward_raises_naming_op_and_operand_for_a_missing_gradient():
    from lucid.ops._registry import register

    op = OpDef(
        "_test_half_grad",
        ("a", "b"),
        lambda a, b: a,
        lambda a, b: a + b,
        lambda c, g: (g, None),
    )
    register(op)
    try:
        a = lucid.tensor([1.0, 2.0], requires_grad=True)
        b = lucid.tensor([3.0, 4.0], requires_grad=True)
        with pytest.raises(RuntimeError, match=r"_test_half_grad.*'b'"):
            apply("_test_half_grad", a, b).sum().backward()
        b2 = lucid.tensor([3.0, 4.0])  # b does not require grad: fine
        apply("_test_half_grad", a, b2).sum().backward()
        assert a.grad is not None
    finally:
        del REGISTRY["_test_half_grad"]


def _attention_loss(q, k, v, m, w):
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=m) * w).sum()


@pytest.mark.parametrize("mask_shape", [(2, 3, 4, 5), (4, 5), (1, 3, 1, 5)])
def test_attention_float_mask_gradient_matches_finite_differences(mask_shape):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 4, 6), (2, 3, 5, 6), (2, 3, 5, 2)))
    m = rng.standard_normal(mask_shape)
    w = lucid.tensor(rng.standard_normal((2, 3, 4, 2)))
    mt = lucid.tensor(m, requires_grad=True)
    qt = lucid.tensor(q, requires_grad=True)
    _attention_loss(qt, lucid.tensor(k), lucid.tensor(v), mt, w).backward()
    assert mt.grad is not None and tuple(mt.grad.shape) == mask_shape
    eps, fd = 1e-6, np.zeros_like(m)
    for idx in np.ndindex(m.shape):
        hi, lo = m.copy(), m.copy()
        hi[idx] += eps
        lo[idx] -= eps
        f = [
            _attention_loss(*(lucid.tensor(a) for a in (q, k, v, mm)), w).item() for mm in (hi, lo)
        ]
        fd[idx] = (f[0] - f[1]) / (2 * eps)
    np.testing.assert_allclose(mt.grad.numpy(), fd, rtol=1e-5, atol=1e-7)
    # The query's gradient is unchanged by asking for the mask's.
    q2 = lucid.tensor(q, requires_grad=True)
    _attention_loss(q2, lucid.tensor(k), lucid.tensor(v), lucid.tensor(m), w).backward()
    np.testing.assert_allclose(qt.grad.numpy(), q2.grad.numpy(), rtol=1e-12)
