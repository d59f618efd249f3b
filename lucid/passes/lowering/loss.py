"""Lowering rules of losses and their backward ops, following eager's formulas (PyTorch's).

Class targets go through ``prim.check_index`` with eager's message, so a target out of range
raises the same ``IndexError`` compiled as eager. Other value checks of eager kernels (a BCE input
outside [0, 1]) are not part of the lowering (see docs/lowering.md).
"""

from __future__ import annotations

import math

from lucid import _dtype
from lucid._dtype import result_type
from lucid.ops.loss import target_out_of_range
from lucid.passes.lowering._core import PV, Builder, lower_dtype, rule

_BCE_EPS = 1e-12

# --- pointwise losses: (loss, d loss/d input, d loss/d target) on broadcast operands


def _l1(b: Builder, dt, x, y):
    d = b.binary("sub", x, y, dt)
    return b.op("abs", d), b.op("sign", d)


def _smooth_l1(b: Builder, dt, x, y, beta):
    d = b.binary("sub", x, y, dt)
    ad = b.op("abs", d)
    if beta == 0:
        return ad, b.op("sign", d)
    small = b.binary("lt", ad, beta, dt)
    quad = b.binary("div", b.binary("mul", b.op("mul", d, d), 0.5, dt), beta, dt)
    loss = b.op("select", small, quad, b.binary("sub", ad, 0.5 * beta, dt))
    return loss, b.op("select", small, b.binary("div", d, beta, dt), b.op("sign", d))


def _huber(b: Builder, dt, x, y, delta):
    d = b.binary("sub", x, y, dt)
    ad = b.op("abs", d)
    small = b.binary("le", ad, delta, dt)
    quad = b.binary("mul", b.op("mul", d, d), 0.5, dt)
    lin = b.binary("mul", b.binary("sub", ad, 0.5 * delta, dt), delta, dt)
    loss = b.op("select", small, quad, lin)
    return loss, b.op("select", small, d, b.binary("mul", b.op("sign", d), delta, dt))


def _bce(b: Builder, dt, x, y, w):
    x, y, w = (b.cast(v, dt) for v in (x, y, w))
    log_x = b.binary("maximum", b.op("log", x), -100.0, dt)
    log_1mx = b.binary("maximum", b.op("log1p", b.op("neg", x)), -100.0, dt)
    one_minus_y = b.binary("sub", 1.0, y, dt)
    inner = b.op("add", b.op("mul", y, log_x), b.op("mul", one_minus_y, log_1mx))
    loss = b.op("neg", b.op("mul", w, inner))
    denom = b.binary("maximum", b.op("mul", x, b.binary("sub", 1.0, x, dt)), _BCE_EPS, dt)
    dx = b.op("div", b.op("mul", w, b.op("sub", x, y)), denom)
    dy = b.op("neg", b.op("mul", w, b.op("sub", log_x, log_1mx)))
    return loss, dx, dy


def _softplus(b: Builder, v: PV) -> PV:
    dt = v.dtype
    return b.op(
        "add",
        b.binary("maximum", v, 0, dt),
        b.op("log1p", b.op("exp", b.op("neg", b.op("abs", v)))),
    )


def _bce_logits(b: Builder, dt, x, y, w, pos_weight):
    x, y, w, pw = (b.cast(v, dt) for v in (x, y, w, pos_weight))
    sp_pos, sp_neg = _softplus(b, x), _softplus(b, b.op("neg", x))
    one_minus_y = b.binary("sub", 1.0, y, dt)
    loss = b.op(
        "mul",
        w,
        b.op("add", b.op("mul", b.op("mul", pw, y), sp_neg), b.op("mul", one_minus_y, sp_pos)),
    )
    s = b.op("sigmoid", x)
    dx = b.op(
        "mul",
        w,
        b.op(
            "sub",
            b.op("mul", one_minus_y, s),
            b.op("mul", b.op("mul", pw, y), b.binary("sub", 1.0, s, dt)),
        ),
    )
    dy = b.op("mul", w, b.op("sub", b.op("mul", pw, sp_neg), sp_pos))
    return loss, dx, dy


def _with_target_grad(fn):
    def wrapped(b, dt, *args):
        loss, dx = fn(b, dt, *args)
        return loss, dx, b.op("neg", dx)

    return wrapped


def _reduce_loss(b: Builder, loss: PV, reduction: str) -> PV:
    axes = tuple(range(loss.ndim))
    if reduction == "sum":
        return b.reduce("reduce_sum", loss, axes)
    if reduction == "mean":
        return b.reduce("reduce_mean", loss, axes)
    return loss


def _pointwise(name: str, fn, extras: tuple[str, ...], attr_names: tuple[str, ...]):
    n_extra = len(extras)

    def forward(b: Builder, x, y, *rest, reduction, **attrs):
        dt = result_type(x, y)
        loss, _dx, _dy = fn(b, dt, x, y, *rest[:n_extra], *(attrs[a] for a in attr_names))
        shape = _broadcast_shape(x, y, *rest[:n_extra])
        return _reduce_loss(b, b.broadcast_to(loss, shape), reduction)

    def backward(b: Builder, grad, x, y, *rest, reduction, **attrs):
        dt = result_type(x, y)
        loss, dx, dy = fn(b, dt, x, y, *rest[:n_extra], *(attrs[a] for a in attr_names))
        shape = b.outs[0].shape
        s = b.cast(grad, dt)
        if reduction == "mean" and math.prod(shape):
            s = b.binary("div", s, float(math.prod(shape)), dt)
        return tuple(b.broadcast_to(b.op("mul", s, d), shape) for d in (dx, dy))

    rule(name)(forward)
    rule(f"{name}_backward")(backward)


def _broadcast_shape(*xs) -> tuple:
    import numpy as np

    return tuple(np.broadcast_shapes(*(v.shape for v in xs if isinstance(v, PV))))


_pointwise("l1_loss", _with_target_grad(_l1), (), ())
_pointwise("smooth_l1_loss", _with_target_grad(_smooth_l1), (), ("beta",))
_pointwise("huber_loss", _with_target_grad(_huber), (), ("delta",))
_pointwise("binary_cross_entropy", _bce, ("weight",), ())
_pointwise("binary_cross_entropy_with_logits", _bce_logits, ("weight", "pos_weight"), ())


@rule("mse_loss")
def _mse_loss(b: Builder, x, y, reduction):
    dt = b.outs[0].dtype
    d = b.binary("sub", x, y, dt)
    return _reduce_loss(b, b.op("mul", d, d), reduction)


# --- nll_loss / cross_entropy


def _class_dim(ndim: int) -> int:
    return 0 if ndim == 1 else 1


class _NLL:
    """Eager's ``_NLL`` in prim ops: log-probabilities with classes last."""

    def __init__(self, b: Builder, logp: PV, target, weight, ignore_index, reduction, ls):
        self.b = b
        dt = self.dt = logp.dtype
        self.cdim = _class_dim(logp.ndim)
        perm = [d for d in range(logp.ndim) if d != self.cdim] + [self.cdim]
        self.perm = perm
        self.lp = b.transpose(logp, perm)
        c = self.n_classes = self.lp.shape[-1]
        self.w = b.broadcast_to(b.cast(weight, dt), (c,))
        self.reduction, self.ls = reduction, ls
        self.prob = target.dtype.is_floating_point
        if self.prob:
            tp = b.transpose(b.cast(target, dt), perm)
            if ls:
                tp = b.binary("add", b.binary("mul", tp, 1 - ls, dt), ls / c, dt)
            self.tp = tp
            return
        t = b.cast(target, _dtype.int64)
        self.valid = b.binary("ne", t, ignore_index, _dtype.int64)
        # Ignored targets become class 0 first, so only real targets are range-checked (eager's
        # error, named after the user's op also in the backward rules).
        op = b.op_name.removesuffix("_backward")
        self.t = b.check_index(
            b.select(self.valid, t, 0, _dtype.int64), 0, c, target_out_of_range(op, c)
        )
        self.valid_f = b.cast(self.valid, dt)
        self.wt = b.op("mul", b.op("gather", self.w, self.t, axis=0), self.valid_f)

    def loss(self) -> PV:
        b, dt = self.b, self.dt
        last = self.lp.ndim - 1
        if self.prob:
            prod = b.op("mul", b.op("mul", self.lp, self.tp), self.w)
            per = b.op("neg", b.reduce("reduce_sum", prod, (last,)))
            if self.reduction == "mean":
                total = b.reduce("reduce_sum", per, tuple(range(per.ndim)))
                return b.binary("div", total, float(per.size), dt)
            return _reduce_loss(b, per, self.reduction)
        idx = b.reshape(self.t, (*self.t.shape, 1))
        picked = b.reshape(b.op("gather_along_axis", self.lp, idx, axis=last), self.t.shape)
        per = b.op("neg", b.op("mul", picked, self.wt))
        if self.ls:
            smooth = b.op("neg", b.reduce("reduce_sum", b.op("mul", self.lp, self.w), (last,)))
            smooth = b.op("mul", smooth, self.valid_f)
            per = b.op(
                "add",
                b.binary("mul", per, 1 - self.ls, dt),
                b.binary("mul", smooth, self.ls / self.n_classes, dt),
            )
        if self.reduction == "mean":
            all_axes = tuple(range(per.ndim))
            return b.op(
                "div",
                b.reduce("reduce_sum", per, all_axes),
                b.reduce("reduce_sum", self.wt, all_axes),
            )
        return _reduce_loss(b, per, self.reduction)

    def grad_logp(self, grad: PV) -> PV:
        b, dt = self.b, self.dt
        grad = b.cast(grad, dt)
        if self.reduction == "none":
            s = b.reshape(grad, (*grad.shape, 1))
        elif self.reduction == "mean":
            if self.prob:
                s = b.binary("div", grad, float(math.prod(self.lp.shape[:-1])), dt)
            else:
                denom = b.reduce("reduce_sum", self.wt, tuple(range(self.wt.ndim)))
                s = b.op("div", grad, denom)
        else:
            s = grad
        if self.prob:
            return b.op("neg", b.op("mul", b.op("mul", s, self.w), self.tp))
        onehot = b.op("one_hot", self.t, depth=self.n_classes, axis=-1, dtype=lower_dtype(dt))
        wt = b.reshape(self.wt, (*self.wt.shape, 1))
        g = b.binary("mul", b.op("mul", onehot, wt), -(1 - self.ls), dt)
        if self.ls:
            valid = b.reshape(self.valid_f, (*self.valid_f.shape, 1))
            smooth = b.binary("mul", b.op("mul", self.w, valid), self.ls / self.n_classes, dt)
            g = b.op("sub", g, smooth)
        return b.op("mul", s, g)

    def classes_back(self, v: PV) -> PV:
        inverse = [self.perm.index(d) for d in range(len(self.perm))]
        return self.b.transpose(v, inverse)


@rule("nll_loss")
def _nll_loss(b: Builder, v, target, weight, ignore_index, reduction):
    return _NLL(b, v, target, weight, ignore_index, reduction, 0.0).loss()


@rule("nll_loss_backward")
def _nll_loss_backward(b: Builder, grad, v, target, weight, ignore_index, reduction):
    nll = _NLL(b, v, target, weight, ignore_index, reduction, 0.0)
    return nll.classes_back(nll.grad_logp(grad))


@rule("cross_entropy")
def _cross_entropy(b: Builder, v, target, weight, ignore_index, reduction, label_smoothing):
    logp = b.op("log_softmax", v, axis=_class_dim(v.ndim))
    return _NLL(b, logp, target, weight, ignore_index, reduction, label_smoothing).loss()


@rule("cross_entropy_backward")
def _cross_entropy_backward(
    b: Builder, grad, v, target, weight, ignore_index, reduction, label_smoothing
):
    logp = b.op("log_softmax", v, axis=_class_dim(v.ndim))
    nll = _NLL(b, logp, target, weight, ignore_index, reduction, label_smoothing)
    g_lp = nll.grad_logp(grad)
    p = b.op("exp", nll.lp)
    last = nll.lp.ndim - 1
    g_x = b.op("sub", g_lp, b.op("mul", p, b.reduce("reduce_sum", g_lp, (last,), True)))
    return nll.classes_back(g_x)
