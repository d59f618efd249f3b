"""Loss ops, with PyTorch's documented formulas and reductions ('none' | 'mean' | 'sum').

``cross_entropy`` and ``nll_loss`` are single registry ops whose gradients are registry ops too
(``cross_entropy_backward``, ``nll_loss_backward``). The pointwise losses (l1, smooth_l1, huber,
binary cross entropy with and without logits) share one pattern: an op that computes the loss and
reduces it, and a ``<name>_backward`` op giving the gradients for input and target. ``mse_loss``'s
VJP is written with Lucid ops. An absent weight is the scalar operand 1.0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._registry import AVal, OpDef, broadcast_shapes, register, shape_of

__all__: list[str] = []

_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _reduce(loss: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "sum":
        return np.sum(loss)
    if reduction == "mean":
        return np.mean(loss)
    return loss


def _scale(grad: np.ndarray, shape: tuple, reduction: str) -> np.ndarray:
    """The upstream gradient as it reaches each element of a loss of ``shape``."""
    if reduction == "mean":
        n = int(np.prod(shape)) if shape else 1
        return grad / n if n else grad
    return grad


# --- nll_loss / cross_entropy: class-index or class-probability targets


def _class_dim(ndim: int) -> int:
    return 0 if ndim == 1 else 1


def _nll_infer(op: str, label_smoothing_ok: bool):
    def infer(input, target, weight, ignore_index, reduction, label_smoothing=0.0) -> AVal:  # noqa: A002
        _check_reduction(op, reduction)
        if not input.dtype.is_floating_point:
            raise TypeError(f"{op}: expected a floating point input, got {input.dtype}")
        if input.ndim == 0:
            raise ValueError(f"{op}: input must have a class dimension, got a 0-d tensor")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
        in_shape = tuple(input.shape)
        cdim = _class_dim(input.ndim)
        n_classes = in_shape[cdim]
        reduced = in_shape[:cdim] + in_shape[cdim + 1 :]
        t_shape = tuple(shape_of(target))
        if _is_tensor(target) and target.dtype.is_floating_point:
            if not label_smoothing_ok:
                raise TypeError(f"{op}: target must hold class indices (an integer tensor)")
            if t_shape != in_shape:
                raise ValueError(
                    f"{op}: probability target shape {t_shape} must equal the input shape "
                    f"{in_shape}"
                )
        elif not _is_tensor(target) or target.dtype.category != 1:
            dt = getattr(target, "dtype", type(target).__name__)
            raise TypeError(f"{op}: target must be an integer tensor of class indices, got {dt}")
        elif t_shape != reduced:
            raise ValueError(
                f"{op}: expected a target of shape {reduced} for input of shape {in_shape}, "
                f"got {t_shape}"
            )
        if _is_tensor(weight) and tuple(weight.shape) != (n_classes,):
            raise ValueError(
                f"{op}: weight must have shape ({n_classes},) (one per class), got "
                f"{tuple(weight.shape)}"
            )
        return AVal(reduced if reduction == "none" else (), input.dtype)

    return infer


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def target_out_of_range(op: str, n_classes: int) -> str:
    """The message of a class target outside [0, n_classes) (``{}`` stands for the target): eager
    raises it, and the lowering hands it to ``prim.check_index``."""
    return f"{op}: target {{}} is out of bounds for {n_classes} classes"


class _NLL:
    """The shared maths of nll_loss and cross_entropy, on log-probabilities with classes last."""

    def __init__(self, op, logp, target, weight, ignore_index, reduction, label_smoothing):
        self.cdim = _class_dim(logp.ndim)
        self.lp = np.moveaxis(logp, self.cdim, -1)
        self.n_classes = self.lp.shape[-1]
        self.w = np.broadcast_to(weight.astype(logp.dtype), (self.n_classes,))
        self.reduction = reduction
        self.ls = label_smoothing
        self.prob = target.dtype.kind == "f"
        if self.prob:
            tp = np.moveaxis(target.astype(logp.dtype), self.cdim, -1)
            self.tp = tp * (1 - self.ls) + self.ls / self.n_classes if self.ls else tp
            return
        valid = target != ignore_index
        bad = valid & ((target < 0) | (target >= self.n_classes))
        if bad.any():
            raise IndexError(
                target_out_of_range(op, self.n_classes).format(int(target[bad].flat[0]))
            )
        self.valid = valid
        self.t = np.where(valid, target, 0)
        self.wt = self.w[self.t] * valid  # each target's class weight, 0 where ignored

    def loss(self) -> np.ndarray:
        if self.prob:
            per = -np.sum(self.lp * self.tp * self.w, axis=-1)
            if self.reduction == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    return np.sum(per) / np.float64(per.size)
            return _reduce(per, self.reduction)
        picked = np.take_along_axis(self.lp, self.t[..., None], axis=-1)[..., 0]
        per = -picked * self.wt
        if self.ls:
            smooth = -np.sum(self.lp * self.w, axis=-1) * self.valid
            per = (1 - self.ls) * per + (self.ls / self.n_classes) * smooth
        if self.reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.sum(per) / np.sum(self.wt)
        return _reduce(per, self.reduction)

    def grad_logp(self, grad: np.ndarray) -> np.ndarray:
        """d loss / d logp with classes last, given the upstream gradient."""
        if self.reduction == "none":
            s = grad[..., None]
        elif self.reduction == "mean":
            denom = self.lp[..., 0].size if self.prob else np.sum(self.wt)
            with np.errstate(invalid="ignore", divide="ignore"):
                s = grad / denom
        else:
            s = grad
        if self.prob:
            return -s * self.w * self.tp
        onehot = np.zeros_like(self.lp)
        np.put_along_axis(onehot, self.t[..., None], 1.0, axis=-1)
        g = -(1 - self.ls) * onehot * self.wt[..., None]
        if self.ls:
            g = g - (self.ls / self.n_classes) * self.w * self.valid[..., None]
        return s * g


def _classes_back(g_last: np.ndarray, cdim: int) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(g_last, -1, cdim))


_NLL_ATTRS = {"ignore_index": -100, "reduction": "mean"}
_CE_ATTRS = {**_NLL_ATTRS, "label_smoothing": 0.0}


def _nll_kernel(input, target, weight, ignore_index, reduction):  # noqa: A002
    return _NLL("nll_loss", input, target, weight, ignore_index, reduction, 0.0).loss()


def _nll_backward_kernel(grad, input, target, weight, ignore_index, reduction):  # noqa: A002
    nll = _NLL("nll_loss", input, target, weight, ignore_index, reduction, 0.0)
    return _classes_back(nll.grad_logp(grad), nll.cdim).astype(input.dtype)


def _ce_kernel(input, target, weight, ignore_index, reduction, label_smoothing):  # noqa: A002
    lp = _log_softmax(input, _class_dim(input.ndim))
    return _NLL(
        "cross_entropy", lp, target, weight, ignore_index, reduction, label_smoothing
    ).loss()


def _ce_backward_kernel(grad, input, target, weight, ignore_index, reduction, label_smoothing):  # noqa: A002
    lp = _log_softmax(input, _class_dim(input.ndim))
    nll = _NLL("cross_entropy", lp, target, weight, ignore_index, reduction, label_smoothing)
    g_lp = nll.grad_logp(grad)
    p = np.exp(nll.lp)
    g_x = g_lp - p * np.sum(g_lp, axis=-1, keepdims=True)
    return _classes_back(g_x, nll.cdim).astype(input.dtype)


def _backward_infer(grad, input, *_rest, **_attrs) -> AVal:  # noqa: A002
    return AVal(tuple(input.shape), input.dtype)


def _prob_target_grad(c, g, logp):
    """Gradient of a probability target: -(1 - eps) * w_c * logp scaled by the reduction."""
    input, target, weight = c.inputs  # noqa: A001
    attrs = c.attrs
    cdim = _class_dim(input.ndim)
    n_classes = input.shape[cdim]
    if attrs["reduction"] == "none":
        g = g.reshape(*g.shape[:cdim], 1, *g.shape[cdim:])
    elif attrs["reduction"] == "mean":
        g = g * (n_classes / max(int(np.prod(input.shape)), 1))
    out = logp * g * (attrs.get("label_smoothing", 0.0) - 1.0)
    if isinstance(weight, Tensor):
        out = out * weight.reshape(n_classes, *([1] * (input.ndim - cdim - 1)))
    return out


def _nll_vjp(c, g):
    input, target, weight = c.inputs  # noqa: A001
    gx = gt = None
    if c.needs_input_grad[0]:
        gx = apply("nll_loss_backward", g, input, target, weight, **c.attrs)
    return gx, gt, None


def _ce_vjp(c, g):
    input, target, weight = c.inputs  # noqa: A001
    gx = gt = None
    if c.needs_input_grad[0]:
        gx = apply("cross_entropy_backward", g, input, target, weight, **c.attrs)
    if c.needs_input_grad[1]:
        logp = apply("log_softmax", input, dim=_class_dim(input.ndim))
        gt = _prob_target_grad(c, g, logp)
    return gx, gt, None


register(
    OpDef(
        "nll_loss",
        ("input", "target", "weight"),
        _nll_infer("nll_loss", label_smoothing_ok=False),
        _nll_kernel,
        _nll_vjp,
        attrs=dict(_NLL_ATTRS),
        saves_outputs=False,
        doc="Negative log likelihood of class-index targets; input holds log-probabilities.",
    )
)
register(
    OpDef(
        "nll_loss_backward",
        ("grad", "input", "target", "weight"),
        _backward_infer,
        _nll_backward_kernel,
        None,
        attrs=dict(_NLL_ATTRS),
        saves_outputs=False,
        unsupported={"vjp": "double backward through nll_loss is not implemented"},
    )
)
register(
    OpDef(
        "cross_entropy",
        ("input", "target", "weight"),
        _nll_infer("cross_entropy", label_smoothing_ok=True),
        _ce_kernel,
        _ce_vjp,
        attrs=dict(_CE_ATTRS),
        saves_outputs=False,
        doc="log_softmax + nll_loss over dim 1 (dim 0 for unbatched input), or a soft-target "
        "cross entropy when target holds class probabilities.",
    )
)


def _with_class_axis(t, cdim: int):
    return t.reshape(*t.shape[:cdim], 1, *t.shape[cdim:])


def _ce_grad_class_sum(c):
    """S = sum over classes of d loss / d logp (classes kept as a size-1 dim), in Lucid ops.

    cross_entropy_backward is G - softmax(x) * S with G independent of x, so S is all its second
    derivative needs.
    """
    import lucid

    grad, input, target, weight = c.inputs  # noqa: A001
    attrs = c.attrs
    cdim = _class_dim(input.ndim)
    n_classes = input.shape[cdim]
    ls, reduction = attrs["label_smoothing"], attrs["reduction"]
    has_weight = isinstance(weight, Tensor)
    if target.dtype.is_floating_point:
        smoothed = target * (1.0 - ls) + ls / n_classes
        if has_weight:
            smoothed = smoothed * weight.reshape(n_classes, *([1] * (input.ndim - cdim - 1)))
        s = _with_class_axis(grad, cdim) if reduction == "none" else grad
        if reduction == "mean":
            s = s * (n_classes / max(int(np.prod(input.shape)), 1))
        return -(s * smoothed.sum(cdim, keepdim=True))
    keep = target != attrs["ignore_index"]
    valid = keep.type(input.dtype)
    if has_weight:
        picked = apply("embedding", lucid.where(keep, target, 0), weight.reshape(n_classes, 1))
        wt = picked.reshape(*target.shape) * valid
        weight_total = weight.sum()
    else:
        wt, weight_total = valid, float(n_classes)
    s = grad / wt.sum() if reduction == "mean" else grad
    per_sample = -(s * (wt * (1.0 - ls) + valid * weight_total * (ls / n_classes)))
    return _with_class_axis(per_sample, cdim)


def _ce_backward_vjp(c, gg):
    grad, input, target, weight = c.inputs  # noqa: A001
    cdim = _class_dim(input.ndim)
    d_grad = d_input = d_target = None
    if c.needs_input_grad[0]:
        # linear in grad: its gradient is gg against the backward of a unit upstream gradient
        unit = apply(
            "cross_entropy_backward", apply("ones_like", grad), input, target, weight, **c.attrs
        )
        d_grad = (gg * unit).sum(cdim) if c.attrs["reduction"] == "none" else (gg * unit).sum()
    p = apply("softmax", input, dim=cdim)
    gg_centered = gg - (gg * p).sum(cdim, keepdim=True)
    if c.needs_input_grad[1]:
        d_input = -(p * gg_centered * _ce_grad_class_sum(c))
    if c.needs_input_grad[2]:
        ls = c.attrs["label_smoothing"]
        s = _with_class_axis(grad, cdim) if c.attrs["reduction"] == "none" else grad
        if c.attrs["reduction"] == "mean":
            s = s * (input.shape[cdim] / max(int(np.prod(input.shape)), 1))
        d_target = gg_centered * s * (ls - 1.0)
        if isinstance(weight, Tensor):
            d_target = d_target * weight.reshape(
                input.shape[cdim], *([1] * (input.ndim - cdim - 1))
            )
    return d_grad, d_input, d_target, None


register(
    OpDef(
        "cross_entropy_backward",
        ("grad", "input", "target", "weight"),
        _backward_infer,
        _ce_backward_kernel,
        _ce_backward_vjp,
        attrs=dict(_CE_ATTRS),
        saves_outputs=False,
    )
)


# --- mse_loss: VJP in Lucid ops


def _pointwise_infer(op: str, n_operands: int):
    def infer(*operands, reduction, **_attrs) -> AVal:
        _check_reduction(op, reduction)
        input, target = operands[:2]  # noqa: A001
        dt = _dtype.result_type(input, target)
        if not dt.is_floating_point:
            raise TypeError(f"{op}: expected floating point input/target, got {dt}")
        shapes = [shape_of(x) for x in operands[:n_operands] if _is_tensor(x)]
        shape = broadcast_shapes(*shapes, op=op)
        return AVal(shape if reduction == "none" else (), dt)

    return infer


def _mse_kernel(input, target, reduction):  # noqa: A002
    d = np.subtract(input, target, dtype=np.result_type(input, target))
    return _reduce(d * d, reduction)


def _mse_vjp(c, g):
    input, target = c.inputs  # noqa: A001
    shape = broadcast_shapes(shape_of(input), shape_of(target))
    scale = 2.0
    if c.attrs["reduction"] == "mean":
        scale /= max(int(np.prod(shape)), 1) if shape else 1
    d = (input - target) * (g * scale)
    return (d if c.needs_input_grad[0] else None, -d if c.needs_input_grad[1] else None)


register(
    OpDef(
        "mse_loss",
        ("input", "target"),
        _pointwise_infer("mse_loss", 2),
        _mse_kernel,
        _mse_vjp,
        attrs={"reduction": "mean"},
        saves_outputs=False,
    )
)


# --- pointwise losses with backward ops


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _l1(x, y):
    d = x - y
    return np.abs(d), np.sign(d)


def _smooth_l1(x, y, beta):
    d = x - y
    ad = np.abs(d)
    if beta == 0:
        return ad, np.sign(d)
    loss = np.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)
    return loss, np.where(ad < beta, d / beta, np.sign(d))


def _huber(x, y, delta):
    d = x - y
    ad = np.abs(d)
    loss = np.where(ad <= delta, 0.5 * d * d, delta * (ad - 0.5 * delta))
    return loss, np.where(ad <= delta, d, delta * np.sign(d))


_BCE_EPS = 1e-12  # torch clamps the denominator x(1-x) of BCE's gradient at this value


def _bce(x, y, w):
    if np.any((x < 0) | (x > 1)) or np.any(np.isnan(x)):
        raise ValueError("binary_cross_entropy: all elements of input should be between 0 and 1")
    with np.errstate(divide="ignore"):
        log_x = np.maximum(np.log(x), -100.0)
        log_1mx = np.maximum(np.log1p(-x), -100.0)
    loss = -w * (y * log_x + (1 - y) * log_1mx)
    dx = w * (x - y) / np.maximum(x * (1 - x), _BCE_EPS)
    return loss, dx, -w * (log_x - log_1mx)


def _bce_logits(x, y, w, pos_weight):
    sp_pos, sp_neg = _softplus(x), _softplus(-x)  # -log(1 - sigmoid(x)), -log(sigmoid(x))
    loss = w * (pos_weight * y * sp_neg + (1 - y) * sp_pos)
    s = _sigmoid(x)
    dx = w * ((1 - y) * s - pos_weight * y * (1 - s))
    return loss, dx, w * (pos_weight * sp_neg - sp_pos)


def _with_target_grad(fn):
    """Losses of x - y: the target's gradient is minus the input's."""

    def wrapped(*args, **attrs):
        loss, dx = fn(*args, **attrs)
        return loss, dx, -dx

    return wrapped


def _register_pointwise(name: str, extras: tuple[str, ...], fn: Callable, attrs: dict) -> None:
    operands = ("input", "target", *extras)

    def compute(arrays, attrs):
        dt = np.result_type(arrays[0], arrays[1])
        arrays = [np.asarray(a, dtype=dt) for a in arrays]
        return dt, fn(*arrays, **attrs)

    def kernel(*arrays, reduction, **attrs):
        dt, (loss, _dx, _dy) = compute(arrays, attrs)
        return np.asarray(_reduce(loss, reduction), dtype=dt)

    def backward_kernel(grad, *arrays, reduction, **attrs):
        dt, (loss, dx, dy) = compute(arrays, attrs)
        s = _scale(grad, loss.shape, reduction)
        return (s * dx).astype(dt), (s * dy).astype(dt)

    def backward_infer(grad, *operands, reduction, **_attrs):
        shape = broadcast_shapes(*(shape_of(x) for x in operands if _is_tensor(x)))
        dt = _dtype.result_type(operands[0], operands[1])
        return AVal(shape, dt), AVal(shape, dt)

    def vjp(c, g):
        gx, gy = apply(f"{name}_backward", g, *c.inputs, **c.attrs)
        need = c.needs_input_grad
        return (gx if need[0] else None, gy if need[1] else None) + (None,) * len(extras)

    all_attrs = {"reduction": "mean", **attrs}
    register(
        OpDef(
            name,
            operands,
            _pointwise_infer(name, len(operands)),
            kernel,
            vjp,
            attrs=dict(all_attrs),
            saves_outputs=False,
        )
    )
    register(
        OpDef(
            f"{name}_backward",
            ("grad", *operands),
            backward_infer,
            backward_kernel,
            None,
            attrs=dict(all_attrs),
            n_outputs=2,
            saves_outputs=False,
            unsupported={"vjp": f"double backward through {name} is not implemented"},
            doc=f"Gradients of {name} with respect to input and target.",
        )
    )


_register_pointwise("l1_loss", (), _with_target_grad(_l1), {})
_register_pointwise("smooth_l1_loss", (), _with_target_grad(_smooth_l1), {"beta": 1.0})
_register_pointwise("huber_loss", (), _with_target_grad(_huber), {"delta": 1.0})
_register_pointwise("binary_cross_entropy", ("weight",), _bce, {})
_register_pointwise("binary_cross_entropy_with_logits", ("weight", "pos_weight"), _bce_logits, {})
