"""``lucid.nn.functional`` (``F``): the functional forms of the layers, as ``torch.nn.functional``.

Ops with a registry entry are called through ``lucid._dispatch.apply``; thin compositions (silu,
mish, relu6, conv1d, group_norm, ...) are written here with Lucid ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops import activation as _act
from lucid.ops.conv import conv1d, conv2d, conv_transpose2d, linear
from lucid.ops.rnn import lstm, lstm_cell
from lucid.ops.upsample import interpolate

__all__ = [
    "bilinear",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "celu",
    "conv1d",
    "conv2d",
    "conv_transpose1d",
    "conv_transpose2d",
    "cosine_similarity",
    "cross_entropy",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "elu",
    "embedding",
    "gelu",
    "glu",
    "group_norm",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "huber_loss",
    "instance_norm",
    "interpolate",
    "kl_div",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log_softmax",
    "logsigmoid",
    "lstm",
    "lstm_cell",
    "max_pool1d",
    "max_pool2d",
    "mish",
    "mse_loss",
    "nll_loss",
    "normalize",
    "one_hot",
    "pad",
    "pixel_shuffle",
    "pixel_unshuffle",
    "relu",
    "relu6",
    "rms_norm",
    "scaled_dot_product_attention",
    "selu",
    "sigmoid",
    "silu",
    "smooth_l1_loss",
    "softmax",
    "softmin",
    "softplus",
    "softsign",
    "tanh",
    "tanhshrink",
    "threshold",
    "prelu",
    "hardshrink",
    "softshrink",
    "pairwise_distance",
    "triplet_margin_loss",
    "margin_ranking_loss",
    "soft_margin_loss",
    "hinge_embedding_loss",
    "cosine_embedding_loss",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "multilabel_soft_margin_loss",
    "channel_shuffle",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "lp_pool1d",
    "lp_pool2d",
    "local_response_norm",
    "triplet_margin_with_distance_loss",
    "multi_margin_loss",
    "ctc_loss",
    "unfold",
    "fold",
    "relu_",
    "elu_",
    "selu_",
    "celu_",
    "leaky_relu_",
    "hardtanh_",
    "threshold_",
    "upsample",
    "upsample_nearest",
    "upsample_bilinear",
    "pdist",
    "gumbel_softmax",
    "alpha_dropout",
    "feature_alpha_dropout",
    "rrelu",
    "rrelu_",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "multilabel_margin_loss",
    "avg_pool3d",
    "max_pool3d",
    "lp_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d_with_indices",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
    "affine_grid",
    "grid_sample",
    "conv3d",
    "conv_transpose3d",
    "embedding_bag",
    "linear_cross_entropy",
    "fractional_max_pool2d",
    "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d",
    "fractional_max_pool3d_with_indices",
]


def _inplace(x: Tensor, fn, *args: Any) -> Tensor:
    return x._apply_inplace(fn, *args)


# --- activations


def relu6(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """min(max(x, 0), 6)."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardtanh(
    input: Tensor,  # noqa: A002
    min_val: float = -1.0,
    max_val: float = 1.0,
    inplace: bool = False,
) -> Tensor:
    """x clamped to [min_val, max_val]; the gradient is 1 strictly inside, else 0."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    fn = lambda x: apply("hardtanh", x, min_val=float(min_val), max_val=float(max_val))  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def leaky_relu(
    input: Tensor,  # noqa: A002
    negative_slope: float = 0.01,
    inplace: bool = False,
) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    fn = lambda x: apply("leaky_relu", x, negative_slope=float(negative_slope))  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """x where x > 0, else alpha * (exp(x) - 1)."""
    fn = lambda x: apply("elu", x, alpha=float(alpha))  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    """x * Phi(x) (Phi the standard normal CDF), or its tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply("gelu", input, approximate=approximate)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""
    return apply("softplus", input, beta=float(beta), threshold=float(threshold))


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """1 / (1 + exp(-x))."""
    import lucid

    return lucid.sigmoid(input)


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    """Hyperbolic tangent."""
    import lucid

    return lucid.tanh(input)


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """x * sigmoid(x)."""
    fn = lambda x: x * sigmoid(x)  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """x * tanh(softplus(x))."""
    fn = lambda x: x * tanh(softplus(x))  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """max(x, 0)."""
    return _inplace(input, _act.relu) if inplace else _act.relu(input)


def softmax(
    input: Tensor,  # noqa: A002
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: Any = None,
) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim``."""
    return _act.softmax(input, dim, dtype)


def log_softmax(
    input: Tensor,  # noqa: A002
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: Any = None,
) -> Tensor:
    """log(softmax(x)) along ``dim``, computed stably."""
    return _act.log_softmax(input, dim, dtype)


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """log(sigmoid(x)) = -softplus(-x), stable for large |x|."""
    return -softplus(-input)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """0 for x <= -3, 1 for x >= 3, x / 6 + 1 / 2 between."""
    fn = lambda x: hardtanh(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """x * hardsigmoid(x)."""
    fn = lambda x: x * hardsigmoid(x)  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """scale * elu(x, alpha) with the self-normalising constants."""
    fn = lambda x: elu(x, _SELU_ALPHA) * _SELU_SCALE  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    fn = lambda x: elu(x * (1.0 / alpha), 1.0) * alpha  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def softsign(input: Tensor) -> Tensor:  # noqa: A002
    """x / (1 + |x|)."""
    return input / (input.abs() + 1.0)


def tanhshrink(input: Tensor) -> Tensor:  # noqa: A002
    """x - tanh(x)."""
    return input - tanh(input)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:  # noqa: A002
    """x where x > threshold, else value."""
    import lucid

    fn = lambda x: lucid.where(x > threshold, x, value)  # noqa: E731
    return _inplace(input, fn) if inplace else fn(input)


def glu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    """a * sigmoid(b) where a, b are the two halves of ``input`` along ``dim``."""
    size = input.shape[dim]
    if size % 2:
        raise ValueError(f"glu: halving dim {dim} needs an even size, got {size}")
    a, b = input.chunk(2, dim)
    return a * sigmoid(b)


def softmin(
    input: Tensor,  # noqa: A002
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: Any = None,
) -> Tensor:
    """softmax(-x) along ``dim``."""
    return _act.softmax(-input, dim, dtype)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y[..., o] = x1[..., i] * weight[o, i, j] * x2[..., j] + bias[o]."""
    import lucid

    if (
        weight.ndim != 3
        or input1.shape[-1] != weight.shape[1]
        or input2.shape[-1] != weight.shape[2]
    ):
        raise ValueError(
            f"bilinear: weight {tuple(weight.shape)} must be (out, in1, in2) matching input1 "
            f"{tuple(input1.shape)} and input2 {tuple(input2.shape)} in their last dims"
        )
    out = lucid.einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else out + bias


# --- dropout (owned by lucid.ops.random)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    """Zero each element with probability p and scale the rest by 1 / (1 - p), when training."""
    from lucid.ops.random import dropout as _dropout

    return _dropout(input, p, training, inplace)


def feature_dropout(
    input: Tensor,  # noqa: A002
    p: float,
    training: bool,
    inplace: bool,
    spatial_dims: int,
    name: str,
) -> Tensor:
    """Channel dropout (``dropout1d/2d/3d``): whole (sample, channel) slices are zeroed."""
    from lucid.ops.random import feature_dropout as _feature_dropout

    return _feature_dropout(input, p, training, inplace, spatial_dims, name)


def dropout1d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:  # noqa: A002
    """Zero whole channels of (N, C, L) or (C, L) inputs with probability p, when training."""
    return feature_dropout(input, p, training, inplace, 1, "dropout1d")


def dropout2d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:  # noqa: A002
    """Zero whole channels of (N, C, H, W) or (C, H, W) inputs with probability p, when
    training."""
    return feature_dropout(input, p, training, inplace, 2, "dropout2d")


def dropout3d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:  # noqa: A002
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) inputs with probability p, when
    training."""
    return feature_dropout(input, p, training, inplace, 3, "dropout3d")


# --- pixel shuffle: reshape / permute compositions


def _check_pixel_factor(factor: Any, name: str, op: str) -> int:
    if isinstance(factor, bool) or not isinstance(factor, int) or factor <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {factor!r}")
    return factor


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:  # noqa: A002
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r): channel blocks become r x r pixel blocks."""
    r = _check_pixel_factor(upscale_factor, "upscale_factor", "pixel_shuffle")
    if input.ndim < 3 or input.shape[-3] % (r * r):
        raise ValueError(
            f"pixel_shuffle: expected an input of at least 3 dims whose channel dim (-3) is "
            f"divisible by upscale_factor**2 = {r * r}, got shape {tuple(input.shape)}"
        )
    *batch, c, h, w = input.shape
    nb = len(batch)
    x = input.reshape(*batch, c // (r * r), r, r, h, w)
    x = x.permute(*range(nb), nb, nb + 3, nb + 1, nb + 4, nb + 2)
    return x.reshape(*batch, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:  # noqa: A002
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W): the inverse of ``pixel_shuffle``."""
    r = _check_pixel_factor(downscale_factor, "downscale_factor", "pixel_unshuffle")
    if input.ndim < 3 or input.shape[-2] % r or input.shape[-1] % r:
        raise ValueError(
            f"pixel_unshuffle: expected an input of at least 3 dims whose height and width are "
            f"divisible by downscale_factor = {r}, got shape {tuple(input.shape)}"
        )
    *batch, c, h, w = input.shape
    nb = len(batch)
    x = input.reshape(*batch, c, h // r, r, w // r, r)
    x = x.permute(*range(nb), nb, nb + 2, nb + 4, nb + 1, nb + 3)
    return x.reshape(*batch, c * r * r, h // r, w // r)


# --- losses


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def _weight_operand(weight, default: float = 1.0):
    return default if weight is None else weight


def cross_entropy(
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy between logits (N, C, ...) and class indices (N, ...) or probabilities."""
    return apply(
        "cross_entropy",
        input,
        target,
        _weight_operand(weight),
        ignore_index=int(ignore_index),
        reduction=_legacy_reduction(size_average, reduce, reduction),
        label_smoothing=float(label_smoothing),
    )


def nll_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """Negative log likelihood of log-probabilities (N, C, ...) at class indices (N, ...)."""
    return apply(
        "nll_loss",
        input,
        target,
        _weight_operand(weight),
        ignore_index=int(ignore_index),
        reduction=_legacy_reduction(size_average, reduce, reduction),
    )


def mse_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """Mean squared error (x - y)^2, reduced."""
    return apply(
        "mse_loss", input, target, reduction=_legacy_reduction(size_average, reduce, reduction)
    )


def l1_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """|x - y|, reduced."""
    return apply(
        "l1_loss", input, target, reduction=_legacy_reduction(size_average, reduce, reduction)
    )


def smooth_l1_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = x - y), reduced."""
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    return apply(
        "smooth_l1_loss",
        input,
        target,
        reduction=_legacy_reduction(size_average, reduce, reduction),
        beta=float(beta),
    )


def huber_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    reduction: str = "mean",
    delta: float = 1.0,
) -> Tensor:
    """0.5 d^2 where |d| <= delta, delta (|d| - 0.5 delta) elsewhere (d = x - y), reduced."""
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    return apply("huber_loss", input, target, reduction=reduction, delta=float(delta))


def binary_cross_entropy(
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """-w (y log x + (1 - y) log(1 - x)) with the logs clamped at -100, reduced."""
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(
            f"binary_cross_entropy: target size {tuple(target.shape)} must be the same as input "
            f"size {tuple(input.shape)}"
        )
    return apply(
        "binary_cross_entropy",
        input,
        target,
        _weight_operand(weight),
        reduction=_legacy_reduction(size_average, reduce, reduction),
    )


def binary_cross_entropy_with_logits(
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """-w (p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))), p = pos_weight, reduced."""
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(
            f"binary_cross_entropy_with_logits: target size {tuple(target.shape)} must be the "
            f"same as input size {tuple(input.shape)}"
        )
    return apply(
        "binary_cross_entropy_with_logits",
        input,
        target,
        _weight_operand(weight),
        _weight_operand(pos_weight),
        reduction=_legacy_reduction(size_average, reduce, reduction),
    )


# --- pooling


def _pool_pair(v, name: str, op: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(v)
    if len(t) == 1:
        t = t * 2
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")
    return t


def _batched(input: Tensor, spatial: int, op: str) -> tuple[Tensor, bool]:  # noqa: A002
    """Adds the batch dim to an unbatched input; says whether it did."""
    if input.ndim == spatial + 1:
        return input.reshape(1, *input.shape), True
    if input.ndim != spatial + 2:
        raise ValueError(
            f"{op}: expected a {spatial + 1}-d or {spatial + 2}-d input, got shape "
            f"{tuple(input.shape)}"
        )
    return input, False


def _unbatch(out: Tensor, unbatched: bool) -> Tensor:
    return out.reshape(*out.shape[1:]) if unbatched else out


def max_pool2d(
    input: Tensor,  # noqa: A002
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Max over (dilated) windows; with ``return_indices`` also each max's flat H*W index."""
    kernel = _pool_pair(kernel_size, "kernel_size", "max_pool2d")
    x, unbatched = _batched(input, 2, "max_pool2d")
    values, indices = apply(
        "max_pool2d",
        x,
        kernel_size=kernel,
        stride=kernel
        if stride is None or stride == ()
        else _pool_pair(stride, "stride", "max_pool2d"),
        padding=_pool_pair(padding, "padding", "max_pool2d"),
        dilation=_pool_pair(dilation, "dilation", "max_pool2d"),
        ceil_mode=bool(ceil_mode),
    )
    values, indices = _unbatch(values, unbatched), _unbatch(indices, unbatched)
    return (values, indices) if return_indices else values


def avg_pool2d(
    input: Tensor,  # noqa: A002
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """Mean over windows (``count_include_pad``: padded zeros count in the divisor)."""
    kernel = _pool_pair(kernel_size, "kernel_size", "avg_pool2d")
    if divisor_override is not None and divisor_override <= 0:
        raise ValueError(f"avg_pool2d: divisor_override must be positive, got {divisor_override}")
    x, unbatched = _batched(input, 2, "avg_pool2d")
    out = apply(
        "avg_pool2d",
        x,
        kernel_size=kernel,
        stride=kernel
        if stride is None or stride == ()
        else _pool_pair(stride, "stride", "avg_pool2d"),
        padding=_pool_pair(padding, "padding", "avg_pool2d"),
        ceil_mode=bool(ceil_mode),
        count_include_pad=bool(count_include_pad),
        divisor_override=divisor_override,
    )
    return _unbatch(out, unbatched)


def adaptive_avg_pool2d(input: Tensor, output_size: int | tuple[int | None, int | None]) -> Tensor:  # noqa: A002
    """Mean over windows chosen so the output has ``output_size`` (None keeps that dim)."""
    x, unbatched = _batched(input, 2, "adaptive_avg_pool2d")
    sizes = (
        (output_size, output_size)
        if isinstance(output_size, int) or output_size is None
        else tuple(output_size)
    )
    if len(sizes) != 2:
        raise ValueError(
            f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}"
        )
    sizes = tuple(x.shape[2 + i] if s is None else int(s) for i, s in enumerate(sizes))
    return _unbatch(apply("adaptive_avg_pool2d", x, output_size=sizes), unbatched)


def _as_1d(input: Tensor, op: str) -> tuple[Tensor, bool]:  # noqa: A002
    x, unbatched = _batched(input, 1, op)
    return x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]), unbatched


def _from_1d(out: Tensor, unbatched: bool) -> Tensor:
    out = out.reshape(out.shape[0], out.shape[1], out.shape[3])
    return _unbatch(out, unbatched)


def _one(v, name: str, op: str) -> int:
    if isinstance(v, int):
        return v
    t = tuple(v)
    if len(t) != 1 or not isinstance(t[0], int):
        raise ValueError(f"{op}: {name} must be an int or a 1-tuple, got {v!r}")
    return t[0]


def max_pool1d(
    input: Tensor,  # noqa: A002
    kernel_size: int | tuple[int],
    stride: int | tuple[int] | None = None,
    padding: int | tuple[int] = 0,
    dilation: int | tuple[int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """1-d max pooling over (N, C, L) or (C, L), run as max_pool2d over a height of 1."""
    k = _one(kernel_size, "kernel_size", "max_pool1d")
    s = k if stride is None or stride == () else _one(stride, "stride", "max_pool1d")
    x, unbatched = _as_1d(input, "max_pool1d")
    values, indices = max_pool2d(
        x,
        (1, k),
        (1, s),
        (0, _one(padding, "padding", "max_pool1d")),
        (1, _one(dilation, "dilation", "max_pool1d")),
        ceil_mode,
        return_indices=True,
    )
    values, indices = _from_1d(values, unbatched), _from_1d(indices, unbatched)
    return (values, indices) if return_indices else values


def avg_pool1d(
    input: Tensor,  # noqa: A002
    kernel_size: int | tuple[int],
    stride: int | tuple[int] | None = None,
    padding: int | tuple[int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """1-d average pooling over (N, C, L) or (C, L)."""
    k = _one(kernel_size, "kernel_size", "avg_pool1d")
    s = k if stride is None or stride == () else _one(stride, "stride", "avg_pool1d")
    x, unbatched = _as_1d(input, "avg_pool1d")
    out = avg_pool2d(
        x, (1, k), (1, s), (0, _one(padding, "padding", "avg_pool1d")), ceil_mode, count_include_pad
    )
    return _from_1d(out, unbatched)


def adaptive_avg_pool1d(input: Tensor, output_size: int | tuple[int]) -> Tensor:  # noqa: A002
    """1-d adaptive average pooling over (N, C, L) or (C, L)."""
    x, unbatched = _as_1d(input, "adaptive_avg_pool1d")
    out = adaptive_avg_pool2d(x, (1, _one(output_size, "output_size", "adaptive_avg_pool1d")))
    return _from_1d(out, unbatched)


# --- normalisation


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


def layer_norm(
    input: Tensor,  # noqa: A002
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims (biased variance), then scale/shift."""
    return apply(
        "layer_norm",
        input,
        _weight_operand(weight, 1.0),
        _weight_operand(bias, 0.0),
        normalized_shape=_shape_tuple(normalized_shape),
        eps=float(eps),
    )


def rms_norm(
    input: Tensor,  # noqa: A002
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dims (eps None: machine epsilon)."""
    return apply(
        "rms_norm",
        input,
        _weight_operand(weight, 1.0),
        normalized_shape=_shape_tuple(normalized_shape),
        eps=None if eps is None else float(eps),
    )


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    return t.reshape(1, t.shape[0], *([1] * (ndim - 2)))


def _update_running(running: Tensor, batch_value: Tensor, momentum: float) -> None:
    from lucid._autograd import no_grad

    with no_grad():
        running.mul_(1.0 - momentum).add_(batch_value.detach().type(running.dtype) * momentum)


def batch_norm(
    input: Tensor,  # noqa: A002
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation over all dims but 1.

    Training (or no running statistics): the batch's mean and biased variance normalise, and
    ``running_mean`` / ``running_var`` (when given) are updated in place with the batch mean and
    the unbiased variance: ``running = (1 - momentum) * running + momentum * batch``.
    Otherwise the running statistics normalise.
    """
    if input.ndim < 2:
        raise ValueError(
            f"batch_norm: expected an input of at least 2 dims, got {tuple(input.shape)}"
        )
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and tuple(t.shape) != (c,):
            raise ValueError(f"batch_norm: {name} must have shape ({c},), got {tuple(t.shape)}")
    if training or running_mean is None or running_var is None:
        n = input.numel() // c if c else 0
        if training and n == 0:
            # An empty batch: PyTorch returns an empty result (still depending on the affine
            # parameters, whose gradients are zero) and leaves the running statistics alone.
            y = input * 1.0
            if weight is not None:
                y = y * _channel_view(weight, input.ndim)
            if bias is not None:
                y = y + _channel_view(bias, input.ndim)
            return y
        if training and n == 1:
            raise ValueError(
                f"batch_norm: expected more than 1 value per channel when training, got input "
                f"size {tuple(input.shape)}"
            )
        y, mean, var = apply(
            "batch_norm",
            input,
            _weight_operand(weight, 1.0),
            _weight_operand(bias, 0.0),
            eps=float(eps),
        )
        if training and running_mean is not None:
            _update_running(running_mean, mean, momentum)
        if training and running_var is not None:
            _update_running(running_var, var * (n / (n - 1)), momentum)
        return y
    rstd = (running_var + eps) ** -0.5
    y = (input - _channel_view(running_mean, input.ndim)) * _channel_view(rstd, input.ndim)
    if weight is not None:
        y = y * _channel_view(weight, input.ndim)
    if bias is not None:
        y = y + _channel_view(bias, input.ndim)
    return y


def group_norm(
    input: Tensor,  # noqa: A002
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each group of ``C / num_groups`` channels (with all spatial dims) per sample."""
    if input.ndim < 2:
        raise ValueError(
            f"group_norm: expected an input of at least 2 dims, got {tuple(input.shape)}"
        )
    n, c = input.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise ValueError(
            f"group_norm: num_channels {c} must be divisible by num_groups {num_groups}"
        )
    grouped = input.reshape(n, num_groups, -1)
    y = layer_norm(grouped, grouped.shape[-1], eps=eps).reshape(*input.shape)
    if weight is not None:
        y = y * _channel_view(weight, input.ndim)
    if bias is not None:
        y = y + _channel_view(bias, input.ndim)
    return y


def instance_norm(
    input: Tensor,  # noqa: A002
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each (sample, channel) over its spatial dims; running stats as batch_norm."""
    if input.ndim < 3:
        raise ValueError(
            f"instance_norm: expected an input of at least 3 dims, got {tuple(input.shape)}"
        )
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise ValueError(
                "instance_norm: use_input_stats=False needs running_mean and running_var"
            )
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    n, c = input.shape[:2]
    flat = input.reshape(n, c, -1)
    length = flat.shape[-1]
    y = layer_norm(flat, length, eps=eps).reshape(*input.shape)
    if running_mean is not None or running_var is not None:
        from lucid._autograd import no_grad

        with no_grad():
            stats = flat.detach()
            mean = stats.sum(-1, keepdim=True) * (1.0 / length)
            if running_mean is not None:
                _update_running(running_mean, mean.reshape(n, c).sum(0) * (1.0 / n), momentum)
            if running_var is not None and length > 1:
                var = ((stats - mean) ** 2).sum(-1) * (1.0 / (length - 1))
                _update_running(running_var, var.sum(0) * (1.0 / n), momentum)
    if weight is not None:
        y = y * _channel_view(weight, input.ndim)
    if bias is not None:
        y = y + _channel_view(bias, input.ndim)
    return y


def normalize(
    input: Tensor,  # noqa: A002
    p: float = 2.0,
    dim: int = 1,
    eps: float = 1e-12,
    out: None = None,
) -> Tensor:
    """x / max(||x||_p along dim, eps)."""
    if out is not None:
        raise TypeError("normalize: out= is not supported")
    norm = (input.abs() ** p).sum(dim, keepdim=True) ** (1.0 / p)
    return input / norm.clamp_min(eps)


# --- embedding, one_hot, pad


def embedding(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Rows of ``weight`` at the integer ``input``; ``padding_idx``'s row gets no gradient.

    ``max_norm`` renormalises (in place, without gradient) each looked-up row whose
    ``norm_type``-norm exceeds it, as torch does.
    """
    if sparse:
        raise ValueError("embedding: sparse gradients are not supported; use sparse=False")
    n = weight.shape[0]
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise ValueError(f"embedding: padding_idx {padding_idx} must be within [-{n}, {n})")
        padding_idx = padding_idx % n
    if max_norm is not None:
        _embedding_renorm(input, weight, max_norm, norm_type)
    return apply(
        "embedding",
        input,
        weight,
        padding_idx=padding_idx,
        scale_grad_by_freq=bool(scale_grad_by_freq),
    )


def _embedding_renorm(input: Tensor, weight: Tensor, max_norm: float, norm_type: float) -> None:  # noqa: A002
    import numpy as np

    rows = np.unique(np.asarray(input.numpy()).reshape(-1))
    if rows.size and (rows.min() < -weight.shape[0] or rows.max() >= weight.shape[0]):
        raise IndexError(f"embedding: an index is out of range for {weight.shape[0]} embeddings")
    data = weight.detach().numpy()
    norms = np.linalg.norm(data[rows], ord=norm_type, axis=1)
    scale = np.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    data[rows] *= scale[:, None].astype(data.dtype)
    weight._version[0] += 1


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot encoding along a new last dim; num_classes -1 means max(tensor) + 1."""
    if num_classes == -1:
        import numpy as np

        values = np.asarray(tensor.numpy())
        num_classes = int(values.max()) + 1 if values.size else 0
    if num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be -1 or non-negative, got {num_classes}")
    return apply("one_hot", tensor, num_classes=int(num_classes))


def pad(
    input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None
) -> Tensor:  # noqa: A002
    """Pad the last dims (amounts listed from the last dim backwards), as torch's F.pad."""
    from lucid.ops.shape import pad as _pad

    return _pad(input, pad, mode=mode, value=value)


# --- attention


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E) x (..., S, E) x (..., S, Ev).

    ``attn_mask``: bool (True = attend) or additive float, broadcast to (..., L, S);
    ``is_causal``: position i attends to j <= i; ``scale`` defaults to 1 / sqrt(E). With
    ``dropout_p > 0`` the attention weights go through dropout (always, as torch's function).
    The mask receives no gradient.
    """
    if enable_gqa:
        raise ValueError("scaled_dot_product_attention: enable_gqa=True is not supported")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(
            f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}"
        )
    mask = 0.0 if attn_mask is None else attn_mask
    if dropout_p == 0.0:
        return apply(
            "scaled_dot_product_attention",
            query,
            key,
            value,
            mask,
            is_causal=bool(is_causal),
            scale=None if scale is None else float(scale),
        )
    import lucid

    # With dropout, attention is a composition: the fused op stays deterministic.
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal=True")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = query.matmul(key.transpose(-2, -1)) * scale
    if attn_mask is not None:
        if attn_mask.dtype is lucid.bool_:
            scores = scores.masked_fill(lucid.logical_not(attn_mask), float("-inf"))
        else:
            scores = scores + attn_mask
    if is_causal:
        length, size = scores.shape[-2:]
        causal = lucid.tril(lucid.ones(length, size, dtype=lucid.bool_))
        scores = scores.masked_fill(lucid.logical_not(causal), float("-inf"))
    weights = dropout(softmax(scores, -1), dropout_p, True)
    return weights.matmul(value)


def kl_div(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """KL divergence with ``input`` as log-probabilities: target * (log(target) - input),
    0 where target is 0 (or exp(t) * (t - input) for log targets); reduction 'batchmean'
    divides the sum by the batch size."""
    import lucid

    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"kl_div: unknown reduction {reduction!r}")
    if log_target:
        pointwise = target.exp() * (target - input)
    else:
        positive = target > 0
        safe = lucid.where(positive, target, 1.0)
        pointwise = lucid.where(positive, target * (safe.log() - input), 0.0)
    if reduction == "none":
        return pointwise
    if reduction == "sum":
        return pointwise.sum()
    if reduction == "batchmean":
        return pointwise.sum() * (1.0 / (input.shape[0] if input.ndim else 1))
    return pointwise.mean()


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """x1 . x2 / max(||x1|| * ||x2||, eps) along ``dim`` (inputs broadcast)."""
    dot = (x1 * x2).sum(dim)
    norms = ((x1 * x1).sum(dim) * (x2 * x2).sum(dim)) ** 0.5
    return dot / norms.clamp_min(eps)


# --- more of torch.nn.functional: compositions of Lucid ops


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"{op}: unknown reduction {reduction!r}; expected 'none', 'mean' or 'sum'")


def prelu(input: Tensor, weight: Tensor) -> Tensor:  # noqa: A002
    """x where x >= 0, else weight * x; ``weight`` has one entry or one per channel (dim 1)."""
    import lucid

    per_channel = input.ndim >= 2 and weight.ndim == 1 and weight.shape[0] == input.shape[1]
    if weight.ndim != 1 or (weight.shape[0] != 1 and not per_channel):
        raise ValueError(
            f"prelu: weight must have 1 element or one per channel (dim 1), got weight shape "
            f"{tuple(weight.shape)} for input shape {tuple(input.shape)}"
        )
    w = weight if weight.shape[0] == 1 or input.ndim < 2 else _channel_view(weight, input.ndim)
    return lucid.where(input >= 0, input, w * input)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    """x where |x| > lambd, else 0."""
    import lucid

    return lucid.where(input.abs() > lambd, input, 0.0)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    """x - lambd above lambd, x + lambd below -lambd, 0 between."""
    import lucid

    if lambd < 0:
        raise ValueError(f"softshrink: lambd must be non-negative, got {lambd}")
    return lucid.where(
        input > lambd, input - lambd, lucid.where(input < -lambd, input + lambd, 0.0)
    )


def pairwise_distance(
    x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> Tensor:
    """The p-norm of ``x1 - x2 + eps`` over the last dim (inputs broadcast)."""
    diff = (x1 - x2 + eps).abs()
    if p == float("inf"):
        return diff.amax(-1, keepdim=keepdim)
    if p == 0:
        return (diff != 0).type(diff.dtype).sum(-1, keepdim=keepdim)
    return (diff**p).sum(-1, keepdim=keepdim) ** (1.0 / p)


def triplet_margin_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    margin: float = 1.0,
    p: float = 2.0,
    eps: float = 1e-6,
    swap: bool = False,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """max(d(a, p) - d(a, n) + margin, 0) with d the pairwise p-distance; ``swap`` uses the
    smaller of d(a, n) and d(p, n)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        import lucid

        d_neg = lucid.minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp_min(0.0), reduction, "triplet_margin_loss")


def margin_ranking_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """max(0, -target * (input1 - input2) + margin)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = (-target * (input1 - input2) + margin).clamp_min(0.0)
    return _reduce(loss, reduction, "margin_ranking_loss")


def soft_margin_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """log(1 + exp(-target * input)), computed as softplus."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _reduce(softplus(-target * input), reduction, "soft_margin_loss")


def hinge_embedding_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    margin: float = 1.0,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """x where target is 1, max(0, margin - x) where target is -1."""
    import lucid

    reduction = _legacy_reduction(size_average, reduce, reduction)
    hinge = (margin - input).clamp_min(0.0)
    loss = lucid.where(target == 1, input, 0.0) + lucid.where(target == -1, hinge, 0.0)
    return _reduce(loss, reduction, "hinge_embedding_loss")


def cosine_embedding_loss(
    input1: Tensor,
    input2: Tensor,
    target: Tensor,
    margin: float = 0.0,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """1 - cos(x1, x2) where target is 1, max(0, cos(x1, x2) - margin) where it is -1; the
    cosine over the last dim, with torch's eps of 1e-12 on the squared norms."""
    import lucid

    reduction = _legacy_reduction(size_average, reduce, reduction)
    dot = (input1 * input2).sum(-1)
    norms = (((input1 * input1).sum(-1) + 1e-12) * ((input2 * input2).sum(-1) + 1e-12)) ** 0.5
    cos = dot / norms
    loss = lucid.where(target == 1, 1.0 - cos, 0.0) + lucid.where(
        target == -1, (cos - margin).clamp_min(0.0), 0.0
    )
    return _reduce(loss, reduction, "cosine_embedding_loss")


def poisson_nll_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    log_input: bool = True,
    full: bool = False,
    size_average: bool | None = None,
    eps: float = 1e-8,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """exp(input) - target * input (log_input), or input - target * log(input + eps); ``full``
    adds Stirling's term target * log(target) - target + log(2 pi target) / 2 where target > 1."""
    import math

    import lucid

    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        safe = lucid.where(target > 1, target, 1.0)
        stirling = safe * safe.log() - safe + 0.5 * (2 * math.pi * safe).log()
        loss = loss + lucid.where(target > 1, stirling, 0.0)
    return _reduce(loss, reduction, "poisson_nll_loss")


def gaussian_nll_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    var: Tensor | float,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """(log(max(var, eps)) + (input - target)^2 / max(var, eps)) / 2, plus log(2 pi) / 2 with
    ``full``; ``var`` broadcasts (one variance per sample or per element)."""
    import math

    import lucid

    if not isinstance(var, Tensor):
        var = lucid.full_like(input, float(var))
    elif tuple(var.shape) != tuple(input.shape):
        if tuple(var.shape) == tuple(input.shape[:-1]):
            var = var.unsqueeze(-1)  # one variance per sample
        elif not (tuple(var.shape[:-1]) == tuple(input.shape[:-1]) and var.shape[-1] == 1):
            raise ValueError(
                f"gaussian_nll_loss: var of shape {tuple(var.shape)} does not fit input of shape "
                f"{tuple(input.shape)}"
            )
    if bool((var.detach() < 0).any()):
        raise ValueError("gaussian_nll_loss: var has negative entries")
    # Clamped for the value only, as torch (which clamps in place under no_grad): the gradient
    # reaches var unchanged.
    clamped = var.clamp_min(eps).detach() + (var - var.detach())
    loss = 0.5 * (clamped.log() + (input - target) ** 2 / clamped)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction, "gaussian_nll_loss")


def multilabel_soft_margin_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """-mean over classes of target * logsigmoid(x) + (1 - target) * logsigmoid(-x)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss.mean(-1), reduction, "multilabel_soft_margin_loss")


def channel_shuffle(input: Tensor, groups: int) -> Tensor:  # noqa: A002
    """(N, g*k, *) -> channels regrouped as k groups of g (ShuffleNet's shuffle)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError(f"channel_shuffle: groups must be a positive integer, got {groups!r}")
    if input.ndim < 3 or input.shape[1] % groups:
        raise ValueError(
            f"channel_shuffle: expected an input of at least 3 dims whose channel dim is "
            f"divisible by groups={groups}, got shape {tuple(input.shape)}"
        )
    n, c, *rest = input.shape
    x = input.reshape(n, groups, c // groups, *rest).transpose(1, 2)
    return x.reshape(n, c, *rest)


def conv_transpose1d(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """1-d transposed convolution over (N, C_in, L) or (C_in, L) input, weight (C_in,
    C_out/groups, k): the 2-d one with a height of 1."""
    if weight.ndim != 3:
        raise ValueError(
            f"conv_transpose1d: expected a 3-d weight (C_in, C_out/groups, k), got "
            f"{tuple(weight.shape)}"
        )
    if input.ndim not in (2, 3):
        raise ValueError(
            f"conv_transpose1d: expected a 2-d (unbatched) or 3-d input, got {tuple(input.shape)}"
        )

    def one(v: Any, name: str) -> int:
        v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
        if len(v) != 1:
            raise ValueError(f"conv_transpose1d: {name} must be an int or a 1-tuple, got {v}")
        return v[0]

    out = conv_transpose2d(
        input.unsqueeze(-2),
        weight.unsqueeze(-2),
        bias,
        (1, one(stride, "stride")),
        (0, one(padding, "padding")),
        (0, one(output_padding, "output_padding")),
        groups,
        (1, one(dilation, "dilation")),
    )
    return out.squeeze(-2)


def _adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """torch's adaptive pooling windows: [floor(i * size / out), ceil((i + 1) * size / out))."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _adaptive_max(input: Tensor, output_size: tuple, op: str, mean: bool = False) -> Tensor:  # noqa: A002
    """Adaptive pooling as a composite: each output cell reduces torch's window (max, or the
    mean with ``mean``), one dim at a time."""
    import lucid

    n = len(output_size)
    if input.ndim not in (n + 1, n + 2):
        raise ValueError(f"{op}: expected a {n + 1}D or {n + 2}D input, got {tuple(input.shape)}")
    x = input
    for axis, out in enumerate(output_size):
        d = x.ndim - n + axis
        size = x.shape[d]
        out = size if out is None else int(out)
        if out <= 0:
            raise ValueError(f"{op}: output_size must be positive, got {output_size}")
        windows = [x.narrow(d, lo, hi - lo) for lo, hi in _adaptive_bounds(size, out)]
        pieces = [w.mean(d, keepdim=True) if mean else w.amax(d, keepdim=True) for w in windows]
        x = lucid.cat(pieces, d)
    return x


def _adaptive_sizes(output_size: Any, dims: int) -> tuple:
    if isinstance(output_size, (tuple, list)):
        return tuple(output_size)
    return (output_size,) * dims


def _adaptive_max_with_indices(input: Tensor, output_size: tuple, op: str) -> tuple:  # noqa: A002
    """Adaptive max pooling and each max's flat index in the input's spatial dims (torch's
    ``return_indices``). The window max is taken one dim at a time, the last dim first, carrying
    the flat positions along: ties then resolve to the row-major first element, as torch."""
    import lucid

    n = len(output_size)
    if input.ndim not in (n + 1, n + 2):
        raise ValueError(f"{op}: expected a {n + 1}D or {n + 2}D input, got {tuple(input.shape)}")
    spatial = tuple(input.shape[input.ndim - n :])
    positions = lucid.arange(math.prod(spatial)).reshape(spatial).expand(*input.shape)
    values = input
    for axis in reversed(range(n)):
        d = values.ndim - n + axis
        out = spatial[axis] if output_size[axis] is None else int(output_size[axis])
        if out <= 0:
            raise ValueError(f"{op}: output_size must be positive, got {output_size}")
        value_cells, position_cells = [], []
        for lo, hi in _adaptive_bounds(spatial[axis], out):
            window = values.narrow(d, lo, hi - lo)
            best = window.argmax(d, keepdim=True)
            value_cells.append(window.gather(d, best))
            position_cells.append(positions.narrow(d, lo, hi - lo).gather(d, best))
        values, positions = lucid.cat(value_cells, d), lucid.cat(position_cells, d)
    return values, positions


def _adaptive_max_pool(input: Tensor, output_size: Any, return_indices: bool, dims: int) -> Tensor:  # noqa: A002
    op = f"adaptive_max_pool{dims}d"
    if return_indices:
        return _adaptive_max_with_indices(input, _adaptive_sizes(output_size, dims), op)
    return _adaptive_max(input, _adaptive_sizes(output_size, dims), op)


def adaptive_max_pool1d(input: Tensor, output_size: Any, return_indices: bool = False) -> Tensor:  # noqa: A002
    """Max over torch's adaptive windows to a fixed length (``return_indices``: also each max's
    index)."""
    return _adaptive_max_pool(input, output_size, return_indices, 1)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Tensor:  # noqa: A002
    """Max over torch's adaptive windows to a fixed (H, W) (an int, a pair, None keeps a dim)."""
    return _adaptive_max_pool(input, output_size, return_indices, 2)


def _lp_root(window_means: Tensor, window_size: int, norm_type: float) -> Tensor:
    """LP pooling from the windows' means of x^p: (sign(s) * relu(|s|))^(1/p) of their sums s,
    as torch computes it."""
    total = window_means * window_size
    return (total.sign() * relu(total.abs())) ** (1.0 / norm_type)


def lp_pool1d(
    input: Tensor,  # noqa: A002
    norm_type: float,
    kernel_size: int,
    stride: Any = None,
    ceil_mode: bool = False,
) -> Tensor:
    """(sum over each window of x^p)^(1/p), as torch (sign(s) * relu(|s|) before the root)."""
    k = kernel_size[0] if isinstance(kernel_size, (tuple, list)) else kernel_size
    return _lp_root(avg_pool1d(input**norm_type, k, stride, 0, ceil_mode), k, norm_type)


def lp_pool2d(
    input: Tensor,  # noqa: A002
    norm_type: float,
    kernel_size: Any,
    stride: Any = None,
    ceil_mode: bool = False,
) -> Tensor:
    """(sum over each window of x^p)^(1/p) over 2-d windows."""
    kh, kw = kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * 2
    pooled = avg_pool2d(input**norm_type, (kh, kw), stride, 0, ceil_mode)
    return _lp_root(pooled, kh * kw, norm_type)


def local_response_norm(
    input: Tensor,  # noqa: A002
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 1.0,
) -> Tensor:
    """x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels)^beta, the window
    centred as torch's (``size // 2`` channels before, ``(size - 1) // 2`` after)."""
    if input.ndim < 3:
        raise ValueError(
            f"local_response_norm: expected an input of at least 3 dims, got {tuple(input.shape)}"
        )
    c = input.shape[1]
    squared = input * input
    pads = [0, 0] * (input.ndim - 2) + [size // 2, (size - 1) // 2]
    padded = pad(squared, pads)
    window = padded.narrow(1, 0, c)
    for offset in range(1, size):
        window = window + padded.narrow(1, offset, c)
    return input / (k + window * (alpha / size)) ** beta


def triplet_margin_with_distance_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    *,
    distance_function: Any = None,
    margin: float = 1.0,
    swap: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """max(d(a, p) - d(a, n) + margin, 0) with any ``distance_function`` (pairwise 2-distance
    by default); ``swap`` uses the smaller of d(a, n) and d(p, n)."""
    import lucid

    dist = distance_function if distance_function is not None else pairwise_distance
    d_pos, d_neg = dist(anchor, positive), dist(anchor, negative)
    if swap:
        d_neg = lucid.minimum(d_neg, dist(positive, negative))
    loss = (d_pos - d_neg + margin).clamp_min(0.0)
    return _reduce(loss, reduction, "triplet_margin_with_distance_loss")


def multi_margin_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """Multi-class hinge loss: sum over classes i != y of max(0, margin - x[y] + x[i])^p / C
    (times ``weight[y]``)."""
    if p not in (1, 2):
        raise ValueError(f"multi_margin_loss: p must be 1 or 2, got {p}")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    x = input if input.ndim == 2 else input.unsqueeze(0)
    y = target.reshape(-1, 1)
    picked = x.gather(1, y)
    hinge = (margin - picked + x).clamp_min(0.0)
    if p == 2:
        hinge = hinge * hinge
    if weight is not None:
        hinge = hinge * weight[target.reshape(-1)].unsqueeze(1)
    not_target = one_hot(target.reshape(-1), x.shape[1]) == 0
    import lucid

    loss = lucid.where(not_target, hinge, 0.0).sum(1) * (1.0 / x.shape[1])
    loss = loss if input.ndim == 2 else loss.squeeze(0)
    return _reduce(loss, reduction, "multi_margin_loss")


def unfold(
    input: Tensor,  # noqa: A002
    kernel_size: Any,
    dilation: Any = 1,
    padding: Any = 0,
    stride: Any = 1,
) -> Tensor:
    """im2col: every (C, kh, kw) sliding block of (N, C, H, W) as a column, (N, C*kh*kw, L)."""
    import lucid

    def pair(v: Any) -> tuple[int, int]:
        return tuple(v) if isinstance(v, (tuple, list)) else (v, v)

    (kh, kw), (dh, dw) = pair(kernel_size), pair(dilation)
    (ph, pw), (sh, sw) = pair(padding), pair(stride)
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 4:
        raise ValueError(f"unfold: expected a 3D or 4D input, got {tuple(input.shape)}")
    x = pad(x, (pw, pw, ph, ph))
    n, c, h, w = x.shape
    out_h = (h - dh * (kh - 1) - 1) // sh + 1
    out_w = (w - dw * (kw - 1) - 1) // sw + 1
    if out_h <= 0 or out_w <= 0:
        raise ValueError(
            f"unfold: the kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit the padded input "
            f"{h}x{w}"
        )
    blocks = [
        x[
            :,
            :,
            i * dh : i * dh + sh * (out_h - 1) + 1 : sh,
            j * dw : j * dw + sw * (out_w - 1) + 1 : sw,
        ]
        for i in range(kh)
        for j in range(kw)
    ]
    out = lucid.stack(blocks, 2).reshape(n, c * kh * kw, out_h * out_w)
    return out.squeeze(0) if unbatched else out


def fold(
    input: Tensor,  # noqa: A002
    output_size: Any,
    kernel_size: Any,
    dilation: Any = 1,
    padding: Any = 0,
    stride: Any = 1,
) -> Tensor:
    """col2im, the adjoint of ``unfold``: the columns (N, C*kh*kw, L) summed back into
    (N, C, H, W) at the places their blocks came from (overlaps add up)."""
    import numpy as np

    import lucid

    def pair(v: Any, name: str) -> tuple[int, int]:
        t = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
        if len(t) != 2 or any(isinstance(k, bool) or not isinstance(k, int) for k in t):
            raise ValueError(f"fold: {name} must be an int or a pair of ints, got {v!r}")
        return t

    (h, w), (kh, kw) = pair(output_size, "output_size"), pair(kernel_size, "kernel_size")
    (dh, dw), (ph, pw), (sh, sw) = (
        pair(dilation, "dilation"),
        pair(padding, "padding"),
        pair(stride, "stride"),
    )
    unbatched = input.ndim == 2
    cols = input.unsqueeze(0) if unbatched else input
    if cols.ndim != 3:
        raise ValueError(f"fold: expected a 2D or 3D input, got {tuple(input.shape)}")
    n, ck, length = cols.shape
    if ck % (kh * kw):
        raise ValueError(
            f"fold: the input's dim 1 ({ck}) must be divisible by the kernel size {kh}x{kw}"
        )
    hp, wp = h + 2 * ph, w + 2 * pw
    out_h = (hp - dh * (kh - 1) - 1) // sh + 1
    out_w = (wp - dw * (kw - 1) - 1) // sw + 1
    if out_h <= 0 or out_w <= 0 or out_h * out_w != length:
        raise ValueError(
            f"fold: {length} blocks do not tile output_size {(h, w)} with kernel {kh}x{kw}, "
            f"dilation {(dh, dw)}, padding {(ph, pw)}, stride {(sh, sw)} "
            f"(expected {max(out_h, 0) * max(out_w, 0)})"
        )
    # The flat position in the padded (hp, wp) plane of every (kernel offset, block) entry.
    rows = (np.arange(kh) * dh)[:, None, None, None] + (np.arange(out_h) * sh)[None, None, :, None]
    columns = (np.arange(kw) * dw)[None, :, None, None] + (np.arange(out_w) * sw)[None, None, None]
    places = lucid.tensor((rows * wp + columns).reshape(-1))
    c = ck // (kh * kw)
    summed = lucid.zeros(n, c, hp * wp, dtype=cols.dtype).scatter_add(
        -1, places.expand(n, c, -1), cols.reshape(n, c, -1)
    )
    out = summed.reshape(n, c, hp, wp)[:, :, ph : ph + h, pw : pw + w]
    return out.squeeze(0) if unbatched else out


# --- in-place spellings and deprecated aliases, as torch.nn.functional has them


def relu_(input: Tensor) -> Tensor:  # noqa: A002
    """In-place ``relu``."""
    return relu(input, inplace=True)


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:  # noqa: A002
    """In-place ``elu``."""
    return elu(input, alpha, inplace=True)


def selu_(input: Tensor) -> Tensor:  # noqa: A002
    """In-place ``selu``."""
    return selu(input, inplace=True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:  # noqa: A002
    """In-place ``celu``."""
    return celu(input, alpha, inplace=True)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:  # noqa: A002
    """In-place ``leaky_relu``."""
    return leaky_relu(input, negative_slope, inplace=True)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:  # noqa: A002
    """In-place ``hardtanh``."""
    return hardtanh(input, min_val, max_val, inplace=True)


def threshold_(input: Tensor, threshold: float, value: float) -> Tensor:  # noqa: A002
    """In-place ``threshold``."""
    return globals()["threshold"](input, threshold, value, inplace=True)


def upsample(
    input: Tensor,  # noqa: A002
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
) -> Tensor:
    """Deprecated alias of ``interpolate``."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    """Deprecated alias of ``interpolate(mode="nearest")``."""
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input: Tensor, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    """Deprecated alias of ``interpolate(mode="bilinear", align_corners=True)``."""
    return interpolate(input, size, scale_factor, "bilinear", align_corners=True)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:  # noqa: A002
    """The p-distances between every pair of rows i < j of an (N, M) input, row-major."""
    import lucid

    if input.ndim != 2:
        raise ValueError(f"pdist: expected a 2-d input, got {tuple(input.shape)}")
    rows, cols = lucid.triu_indices(input.shape[0], input.shape[0], 1)
    return lucid.cdist(input, input, p)[rows, cols]


def gumbel_softmax(
    logits: Tensor, tau: float = 1.0, hard: bool = False, eps: float = 1e-10, dim: int = -1
) -> Tensor:
    """A sample of the Gumbel-softmax distribution: softmax((logits + g) / tau) with Gumbel
    noise g; ``hard`` gives the one-hot argmax with the soft sample's gradient."""
    import lucid

    gumbels = -(-lucid.rand_like(logits).clamp_min(1e-20).log()).log()
    soft = softmax((logits + gumbels) / tau, dim)
    if not hard:
        return soft
    index = soft.argmax(dim, keepdim=True)
    hard_sample = lucid.zeros_like(soft).scatter(dim, index, 1.0)
    return hard_sample - soft.detach() + soft


_SELU_NEGATIVE = -_SELU_ALPHA * _SELU_SCALE  # the SELU's negative saturation value


def _alpha_dropout(x: Tensor, p: float, training: bool, keep_shape: tuple, op: str) -> Tensor:
    import lucid

    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0.0
    keep = (lucid.rand(*keep_shape, dtype=x.dtype) >= p).type(x.dtype)
    a = ((1 - p) * (1 + p * _SELU_NEGATIVE**2)) ** -0.5
    b = -a * _SELU_NEGATIVE * p
    return (x * keep + _SELU_NEGATIVE * (1 - keep)) * a + b


def alpha_dropout(
    input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Tensor:  # noqa: A002
    """Dropout that keeps a SELU network's mean and variance: dropped units take SELU's negative
    saturation value, then an affine map restores the moments."""
    fn = lambda x: _alpha_dropout(x, p, training, tuple(x.shape), "alpha_dropout")  # noqa: E731
    return input._apply_inplace(fn) if inplace and training else fn(input)


def feature_alpha_dropout(
    input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Tensor:  # noqa: A002
    """``alpha_dropout`` of whole channels (dims 0 and 1 of the input pick the mask)."""

    def fn(x: Tensor) -> Tensor:
        keep_shape = tuple(x.shape[:2]) + (1,) * (x.ndim - 2)
        return _alpha_dropout(x, p, training, keep_shape, "feature_alpha_dropout")

    return input._apply_inplace(fn) if inplace and training else fn(input)


def rrelu(
    input: Tensor,  # noqa: A002
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    training: bool = False,
    inplace: bool = False,
) -> Tensor:
    """Leaky ReLU with a random slope U(lower, upper) per element in training, the mean slope
    ``(lower + upper) / 2`` otherwise."""
    import lucid

    def fn(x: Tensor) -> Tensor:
        if training:
            slope = lucid.rand_like(x) * (upper - lower) + lower
        else:
            slope = (lower + upper) / 2
        return lucid.where(x >= 0, x, x * slope)

    return input._apply_inplace(fn) if inplace else fn(input)


def rrelu_(
    input: Tensor,
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    training: bool = False,  # noqa: A002
) -> Tensor:
    """In-place ``rrelu``."""
    return rrelu(input, lower, upper, training, inplace=True)


def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:  # noqa: A002
    """Mean over torch's adaptive windows to a fixed (D, H, W) (None keeps a dim)."""
    size = _adaptive_sizes(output_size, 3)
    return _adaptive_max(input, size, "adaptive_avg_pool3d", mean=True)


def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Tensor:  # noqa: A002
    """Max over torch's adaptive windows to a fixed (D, H, W) (indices are not supported)."""
    return _adaptive_max_pool(input, output_size, return_indices, 3)


def multilabel_margin_loss(
    input: Tensor,  # noqa: A002
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,  # noqa: A002
    reduction: str = "mean",
) -> Tensor:
    """Multi-label hinge loss: ``target`` holds each sample's class indices, ended by the first
    -1; sum over target classes j and other classes i of max(0, 1 - x[j] + x[i]), over C."""
    import lucid

    reduction = _legacy_reduction(size_average, reduce, reduction)
    x = input if input.ndim == 2 else input.unsqueeze(0)
    y = target if target.ndim == 2 else target.unsqueeze(0)
    c = x.shape[1]
    # Entries up to the first -1 count.
    valid = ((y == -1).type(x.dtype).cumsum(1) == 0).type(x.dtype)
    safe = lucid.where(y >= 0, y, 0)
    is_target = ((one_hot(safe, c).type(x.dtype) * valid.unsqueeze(-1)).sum(1) > 0).type(x.dtype)
    picked = x.gather(1, safe)  # (N, C): x at each listed target
    hinge = (1 - picked.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0.0)  # (N, j, i)
    loss = (hinge * valid.unsqueeze(-1) * (1 - is_target).unsqueeze(1)).sum((1, 2)) * (1.0 / c)
    loss = loss if input.ndim == 2 else loss.squeeze(0)
    return _reduce(loss, reduction, "multilabel_margin_loss")


def _triple(v: Any, name: str, op: str) -> tuple[int, int, int]:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)
    if len(t) != 3 or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in t):
        raise ValueError(f"{op}: {name} must be a non-negative int or 3 of them, got {v!r}")
    return t


def _window_pool3d(
    input: Tensor,  # noqa: A002
    kernel_size: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    fill: float,
    op: str,
) -> tuple[Tensor, tuple]:
    """Every window of a 3-d pooling as a new last dim: (N, C, D', H', W', kd*kh*kw), from
    strided slices of the padded input (``fill`` in the padding), and the kernel size."""
    import lucid

    if ceil_mode:
        raise ValueError(f"{op}: ceil_mode=True is not supported")
    k = _triple(kernel_size, "kernel_size", op)
    s = k if stride is None else _triple(stride, "stride", op)
    p = _triple(padding, "padding", op)
    if 0 in k or 0 in s:
        raise ValueError(f"{op}: kernel_size and stride must be positive")
    if any(2 * pi > ki for pi, ki in zip(p, k, strict=True)):
        raise ValueError(f"{op}: padding {p} must be at most half of kernel_size {k}")
    unbatched = input.ndim == 4
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 5:
        raise ValueError(f"{op}: expected a 4D or 5D input, got {tuple(input.shape)}")
    x = pad(x, (p[2], p[2], p[1], p[1], p[0], p[0]), value=fill)
    out = [(x.shape[2 + i] - k[i]) // s[i] + 1 for i in range(3)]
    if min(out) <= 0:
        raise ValueError(f"{op}: the kernel {k} does not fit the padded input {tuple(x.shape)}")
    windows = [
        x[:, :, a : a + s[0] * (out[0] - 1) + 1 : s[0], b : b + s[1] * (out[1] - 1) + 1 : s[1],
          c : c + s[2] * (out[2] - 1) + 1 : s[2]]
        for a in range(k[0]) for b in range(k[1]) for c in range(k[2])
    ]  # fmt: skip
    stacked = lucid.stack(windows, -1)
    return (stacked.squeeze(0) if unbatched else stacked), k


def avg_pool3d(
    input: Tensor,  # noqa: A002
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """3-d average pooling over (N, C, D, H, W) or (C, D, H, W) inputs."""
    windows, k = _window_pool3d(input, kernel_size, stride, padding, ceil_mode, 0.0, "avg_pool3d")
    total = windows.sum(-1)
    if divisor_override is not None:
        return total / divisor_override
    if count_include_pad or not any(_triple(padding, "padding", "avg_pool3d")):
        return total / (k[0] * k[1] * k[2])
    ones = input.detach() * 0 + 1
    counts, _ = _window_pool3d(ones, kernel_size, stride, padding, ceil_mode, 0.0, "avg_pool3d")
    return total / counts.sum(-1)


def max_pool3d(
    input: Tensor,  # noqa: A002
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    """3-d max pooling over (N, C, D, H, W) or (C, D, H, W) inputs (no dilation); with
    ``return_indices`` also each max's flat D*H*W index (the first of ties, as torch)."""
    import lucid

    if _triple(dilation, "dilation", "max_pool3d") != (1, 1, 1):
        raise ValueError("max_pool3d: dilation is not supported")
    windows, _ = _window_pool3d(
        input, kernel_size, stride, padding, ceil_mode, float("-inf"), "max_pool3d"
    )
    if not return_indices:
        return windows.amax(-1)
    spatial = tuple(input.shape[-3:])
    positions = lucid.arange(math.prod(spatial)).reshape(spatial).expand(*input.shape)
    position_windows, _ = _window_pool3d(
        positions, kernel_size, stride, padding, ceil_mode, -1, "max_pool3d"
    )
    best = windows.argmax(-1, keepdim=True)
    return windows.gather(-1, best).squeeze(-1), position_windows.gather(-1, best).squeeze(-1)


def max_pool3d_with_indices(input: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``max_pool3d`` returning ``(values, indices)``."""
    kwargs["return_indices"] = True
    return max_pool3d(input, *args, **kwargs)


def lp_pool3d(
    input: Tensor,  # noqa: A002
    norm_type: float,
    kernel_size: Any,
    stride: Any = None,
    ceil_mode: bool = False,
) -> Tensor:
    """(sum over each 3-d window of x^p)^(1/p)."""
    k = _triple(kernel_size, "kernel_size", "lp_pool3d")
    pooled = avg_pool3d(input**norm_type, k, stride, 0, ceil_mode)
    return _lp_root(pooled, k[0] * k[1] * k[2], norm_type)


# --- the *_with_indices spellings, max unpooling, affine grids, linear + cross entropy ----------


def max_pool1d_with_indices(input: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``max_pool1d`` returning ``(values, indices)``."""
    kwargs["return_indices"] = True
    return max_pool1d(input, *args, **kwargs)


def max_pool2d_with_indices(input: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``max_pool2d`` returning ``(values, indices)``."""
    kwargs["return_indices"] = True
    return max_pool2d(input, *args, **kwargs)


def _adaptive_max_pool_with_indices(dims: int) -> Callable[..., tuple[Tensor, Tensor]]:
    def pool(input: Tensor, output_size: Any, return_indices: bool = False) -> tuple:  # noqa: A002
        return _adaptive_max_pool(input, output_size, True, dims)

    pool.__name__ = pool.__qualname__ = f"adaptive_max_pool{dims}d_with_indices"
    pool.__doc__ = f"``adaptive_max_pool{dims}d`` returning ``(values, indices)``."
    return pool


adaptive_max_pool1d_with_indices = _adaptive_max_pool_with_indices(1)
adaptive_max_pool2d_with_indices = _adaptive_max_pool_with_indices(2)
adaptive_max_pool3d_with_indices = _adaptive_max_pool_with_indices(3)


def _max_unpool(
    input: Tensor,  # noqa: A002
    indices: Tensor,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    output_size: Any,
    dims: int,
) -> Tensor:
    """Each value placed at its flat spatial index (a max pooling's ``indices``) in a zero
    output, whose size is the pooling's input size unless ``output_size`` says."""
    import lucid

    op = f"max_unpool{dims}d"

    def per_dim(v: Any, name: str) -> tuple[int, ...]:
        t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims
        if len(t) != dims or any(not isinstance(k, int) or k < 0 for k in t):
            raise ValueError(f"{op}: {name} must be an int or {dims} of them, got {v!r}")
        return t

    if input.ndim not in (dims + 1, dims + 2):
        raise ValueError(f"{op}: expected a {dims + 1}D or {dims + 2}D input, got {input.shape}")
    if tuple(indices.shape) != tuple(input.shape):
        raise ValueError(
            f"{op}: indices {tuple(indices.shape)} must have the input's shape {tuple(input.shape)}"
        )
    kernel = per_dim(kernel_size, "kernel_size")
    steps = kernel if stride is None or stride == () else per_dim(stride, "stride")
    pads = per_dim(padding, "padding")
    size_in = tuple(input.shape[input.ndim - dims :])
    size = tuple(
        (i - 1) * s - 2 * p + k for i, s, p, k in zip(size_in, steps, pads, kernel, strict=True)
    )
    if output_size is not None:
        if len(tuple(output_size)) not in (dims, dims + 2):
            raise ValueError(
                f"{op}: output_size needs {dims} or {dims + 2} sizes, got {output_size!r}"
            )
        size = tuple(int(n) for n in tuple(output_size)[-dims:])
    lead = tuple(input.shape[: input.ndim - dims])
    total = math.prod(size)
    flat_indices = indices.reshape(*lead, -1)
    out = lucid.zeros(*lead, total, dtype=input.dtype)
    out = out.scatter(-1, flat_indices, input.reshape(*lead, -1))
    return out.reshape(*lead, *size)


def _max_unpool_nd(dims: int) -> Callable[..., Tensor]:
    def unpool(
        input: Tensor,  # noqa: A002
        indices: Tensor,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        output_size: Any = None,
    ) -> Tensor:
        return _max_unpool(input, indices, kernel_size, stride, padding, output_size, dims)

    unpool.__name__ = unpool.__qualname__ = f"max_unpool{dims}d"
    unpool.__doc__ = (
        f"The partial inverse of a {dims}-d max pooling: maxima back at their indices (its "
        "``return_indices``), zeros elsewhere."
    )
    return unpool


max_unpool1d = _max_unpool_nd(1)
max_unpool2d = _max_unpool_nd(2)
max_unpool3d = _max_unpool_nd(3)


def affine_grid(theta: Tensor, size: Sequence[int], align_corners: bool | None = None) -> Tensor:
    """Sampling grids (N, H, W, 2) or (N, D, H, W, 3) of the affine maps ``theta`` (N, 2, 3) or
    (N, 3, 4), over normalised coordinates in [-1, 1] (pixel centres unless ``align_corners``)."""
    import lucid

    size = tuple(int(n) for n in size)
    dims = len(size) - 2
    if dims not in (2, 3):
        raise ValueError(f"affine_grid: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    if tuple(theta.shape) != (size[0], dims, dims + 1):
        raise ValueError(
            f"affine_grid: theta must have shape {(size[0], dims, dims + 1)} for size {size}, got "
            f"{tuple(theta.shape)}"
        )
    if not theta.dtype.is_floating_point:
        raise TypeError(f"affine_grid: theta must be floating point, got {theta.dtype}")

    def coords(n: int) -> Tensor:
        steps = lucid.arange(n, dtype=theta.dtype)
        if align_corners:
            return steps * (2.0 / (n - 1)) - 1.0 if n > 1 else steps * 0.0
        return (steps * 2.0 + 1.0) / n - 1.0

    spatial = size[2:]
    # The homogeneous coordinates (x, y[, z], 1) of every output point, x along the last dim.
    axes = [coords(n) for n in reversed(spatial)]
    mesh = lucid.meshgrid(*reversed(axes), indexing="ij")
    points = lucid.stack([*reversed(mesh), lucid.ones(*spatial, dtype=theta.dtype)], -1)
    grid = points.reshape(1, -1, dims + 1) @ theta.mT
    return grid.reshape(size[0], *spatial, dims)


def grid_sample(
    input: Tensor,  # noqa: A002
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool | None = None,
) -> Tensor:
    """Samples of (N, C, H, W) ``input`` at the normalised (x, y) points of ``grid``
    (N, Ho, Wo, 2), bilinear or nearest; outside points read zeros or the border."""
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"grid_sample: mode must be 'bilinear' or 'nearest', got {mode!r}")
    if padding_mode not in ("zeros", "border"):
        raise ValueError(
            f"grid_sample: padding_mode must be 'zeros' or 'border', got {padding_mode!r}"
        )
    if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise ValueError(
            "grid_sample: expected a (N, C, H, W) input and a (N, Ho, Wo, 2) grid, got "
            f"{tuple(input.shape)} and {tuple(grid.shape)}"
        )
    n, c, h, w = input.shape
    out_h, out_w = grid.shape[1], grid.shape[2]

    def pixel(coord: Tensor, size: int) -> Tensor:
        if align_corners:
            coord = (coord + 1) * ((size - 1) / 2)
        else:
            coord = ((coord + 1) * size - 1) / 2
        return coord.clamp(0, size - 1) if padding_mode == "border" else coord

    x, y = pixel(grid[..., 0], w), pixel(grid[..., 1], h)
    flat = input.reshape(n, c, h * w)

    def read(yi: Tensor, xi: Tensor) -> Tensor:
        """input at integer pixels (yi, xi) (N, Ho, Wo); zero where they fall outside."""
        inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        place = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).long()
        values = flat.gather(-1, place.reshape(n, 1, -1).expand(n, c, -1))
        return values.reshape(n, c, out_h, out_w) * inside.unsqueeze(1).type(input.dtype)

    if mode == "nearest":
        return read(y.detach().round(), x.detach().round())
    x0, y0 = x.detach().floor(), y.detach().floor()
    wx, wy = (x - x0).unsqueeze(1), (y - y0).unsqueeze(1)
    top = read(y0, x0) * (1 - wx) + read(y0, x0 + 1) * wx
    bottom = read(y0 + 1, x0) * (1 - wx) + read(y0 + 1, x0 + 1) * wx
    return top * (1 - wy) + bottom * wy


def linear_cross_entropy(
    input: Tensor,  # noqa: A002
    linear_weight: Tensor,
    target: Tensor,
    *,
    linear_bias: Tensor | None = None,
    weight: Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options: Any = None,
) -> Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)``; ``options``
    (torch's memory-saving chunking hints) change nothing here."""
    if input.ndim not in (1, 2):
        raise ValueError(
            f"linear_cross_entropy: expected a 1-d or 2-d input, got shape {tuple(input.shape)}"
        )
    if linear_weight.ndim != 2:
        raise ValueError(
            "linear_cross_entropy: expected a (classes, features) linear_weight, got shape "
            f"{tuple(linear_weight.shape)}"
        )
    logits = linear(input, linear_weight, linear_bias)
    return cross_entropy(
        logits,
        target,
        weight,
        ignore_index=-100 if ignore_index is None else ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )


def conv3d(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """3-D convolution of (N, C_in, D, H, W) or (C_in, D, H, W) with (C_out, C_in / groups, kd,
    kh, kw) weights: the strided windows of every kernel offset contracted in one einsum."""
    import lucid

    unbatched = input.ndim == 4
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(
            f"conv3d: expected a 4D or 5D input and a 5D weight, got {tuple(input.shape)} and "
            f"{tuple(weight.shape)}"
        )
    n, c_in = x.shape[0], x.shape[1]
    c_out, k = weight.shape[0], tuple(weight.shape[2:])
    if not isinstance(groups, int) or groups <= 0 or c_in % groups or c_out % groups:
        raise ValueError(
            f"conv3d: groups ({groups!r}) must be a positive int dividing in_channels ({c_in}) "
            f"and out_channels ({c_out})"
        )
    if weight.shape[1] * groups != c_in:
        raise ValueError(
            f"conv3d: the weight {tuple(weight.shape)} expects {weight.shape[1] * groups} input "
            f"channels with groups={groups}, got {c_in}"
        )
    s, d = _triple(stride, "stride", "conv3d"), _triple(dilation, "dilation", "conv3d")
    if 0 in s or 0 in d:
        raise ValueError(f"conv3d: stride {s} and dilation {d} must be positive")
    if padding == "valid":
        pads = [(0, 0)] * 3
    elif padding == "same":
        if s != (1, 1, 1):
            raise ValueError("conv3d: padding='same' is not supported for strided convolutions")
        totals = [di * (ki - 1) for di, ki in zip(d, k, strict=True)]
        pads = [(total // 2, total - total // 2) for total in totals]
    else:
        pads = [(p, p) for p in _triple(padding, "padding", "conv3d")]
    x = pad(x, [amount for lo_hi in reversed(pads) for amount in lo_hi])
    out = [(x.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(3)]
    if min(out) <= 0:
        raise ValueError(
            f"conv3d: the kernel {k} (dilation {d}) does not fit the padded input "
            f"{tuple(x.shape[2:])}"
        )
    windows = lucid.stack(
        [
            x[
                :,
                :,
                a * d[0] : a * d[0] + s[0] * (out[0] - 1) + 1 : s[0],
                b * d[1] : b * d[1] + s[1] * (out[1] - 1) + 1 : s[1],
                c * d[2] : c * d[2] + s[2] * (out[2] - 1) + 1 : s[2],
            ]
            for a in range(k[0])
            for b in range(k[1])
            for c in range(k[2])
        ],  # fmt: skip
        2,
    ).reshape(n, groups, c_in // groups, math.prod(k), *out)
    kernel = weight.reshape(groups, c_out // groups, c_in // groups, math.prod(k))
    y = lucid.einsum("ngckxyz,gock->ngoxyz", windows, kernel).reshape(n, c_out, *out)
    if bias is not None:
        y = y + bias.reshape(1, c_out, 1, 1, 1)
    return y.squeeze(0) if unbatched else y


def embedding_bag(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    offsets: Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> Tensor:
    """The sum, mean or max of each bag of embedding rows: the rows of a 2-D ``input``, or the
    runs of a 1-D ``input`` starting at ``offsets``; ``padding_idx`` entries are left out and an
    empty bag gives zeros."""
    import lucid

    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if per_sample_weights is not None and mode != "sum":
        raise ValueError("embedding_bag: per_sample_weights needs mode='sum'")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("embedding_bag: offsets must be None for a 2-D input")
        bags, length = input.shape
        offsets = lucid.arange(bags) * length
        include_last_offset = False
    elif input.ndim != 1 or offsets is None or offsets.ndim != 1:
        raise ValueError(
            "embedding_bag: expected a 2-D input, or a 1-D input with 1-D offsets, got "
            f"{tuple(input.shape)} and {None if offsets is None else tuple(offsets.shape)}"
        )
    flat = input.reshape(-1)
    rows = embedding(flat, weight, None, max_norm, norm_type)
    n_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    # member[b, i]: entry i lies in bag b (offsets[b] <= i < offsets[b + 1]) and is no padding.
    bag = lucid.searchsorted(offsets, lucid.arange(flat.shape[0]), right=True) - 1
    member = bag.unsqueeze(0) == lucid.arange(n_bags).unsqueeze(1)
    if padding_idx is not None:
        member = member & (flat != padding_idx % weight.shape[0]).unsqueeze(0)
    counts = member.sum(1, keepdim=True)
    if mode == "max":
        candidates = lucid.where(member.unsqueeze(-1), rows.unsqueeze(0), float("-inf"))
        best = candidates.argmax(1, keepdim=True)
        picked = rows.unsqueeze(0).expand(n_bags, -1, -1).gather(1, best).squeeze(1)
        return lucid.where(counts > 0, picked, 0.0)
    scale = member.type(rows.dtype)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.reshape(1, -1)
    total = scale @ rows
    return total / counts.clamp(min=1).type(rows.dtype) if mode == "mean" else total


def conv_transpose3d(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """3-D transposed convolution, weight (C_in, C_out / groups, kd, kh, kw): ``conv3d`` of the
    input with ``stride - 1`` zeros between its elements, padded by ``dilation * (k - 1) -
    padding`` (plus ``output_padding`` at the end), with the flipped, transposed weight."""
    unbatched = input.ndim == 4
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 5 or weight.ndim != 5:
        raise ValueError(
            "conv_transpose3d: expected a 4D or 5D input and a 5D weight, got "
            f"{tuple(input.shape)} and {tuple(weight.shape)}"
        )
    c_in, k = weight.shape[0], tuple(weight.shape[2:])
    if not isinstance(groups, int) or groups <= 0 or c_in % groups or x.shape[1] != c_in:
        raise ValueError(
            f"conv_transpose3d: the weight {tuple(weight.shape)} needs {c_in} input channels "
            f"divisible by groups ({groups!r}), got {x.shape[1]}"
        )
    s, d = _triple(stride, "stride", "conv_transpose3d"), _triple(dilation, "dilation", "conv3d")
    p = _triple(padding, "padding", "conv_transpose3d")
    extra = _triple(output_padding, "output_padding", "conv_transpose3d")
    if 0 in s or 0 in d or any(e >= max(si, di) for e, si, di in zip(extra, s, d, strict=True)):
        raise ValueError(
            f"conv_transpose3d: stride {s} and dilation {d} must be positive and output_padding "
            f"{extra} smaller than one of them"
        )
    for axis, step in enumerate(s):
        if step > 1:  # step - 1 zeros after every element, the trailing ones dropped
            dim = 2 + axis
            spread = x.unsqueeze(dim + 1)
            spread = pad(spread, [0, 0] * (spread.ndim - dim - 2) + [0, step - 1])
            merged = spread.reshape(*x.shape[:dim], -1, *x.shape[dim + 1 :])
            x = merged.narrow(dim, 0, (x.shape[dim] - 1) * step + 1)
    edges = []
    for axis in reversed(range(3)):
        before = d[axis] * (k[axis] - 1) - p[axis]
        edges += [before, before + extra[axis]]
    x = pad(x, edges)  # negative amounts crop, when padding exceeds dilation * (k - 1)
    c_out_group = weight.shape[1]
    flipped = (
        weight.reshape(groups, c_in // groups, c_out_group, *k)
        .transpose(1, 2)
        .reshape(groups * c_out_group, c_in // groups, *k)
        .flip(-3, -2, -1)
    )
    y = conv3d(x, flipped, bias, 1, 0, d, groups)
    return y.squeeze(0) if unbatched else y


def _as_int64_tensor(values: Any) -> Tensor:
    import lucid

    if isinstance(values, Tensor):
        return values.type(lucid.int64)
    return lucid.tensor(values, dtype=lucid.int64)


def _ctc_padded_targets(targets: Tensor, target_lengths: Tensor) -> Tensor:
    """(N, S) targets; a 1-D ``targets`` holds every sequence back to back (lengths concrete)."""
    import lucid

    if targets.ndim == 2:
        return targets.type(lucid.int64)
    lengths = [int(n) for n in target_lengths.reshape(-1).tolist()]
    if sum(lengths) != targets.shape[0]:
        raise ValueError(
            f"ctc_loss: 1-D targets hold {targets.shape[0]} labels but target_lengths add up to "
            f"{sum(lengths)}"
        )
    flat, rows, start = targets.tolist(), [], 0
    width = max(lengths, default=0)
    for n in lengths:
        rows.append(flat[start : start + n] + [0] * (width - n))
        start += n
    return lucid.tensor(rows, dtype=lucid.int64).reshape(len(lengths), width)


def ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Any,
    target_lengths: Any,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> Tensor:
    """Connectionist Temporal Classification loss of ``log_probs`` (T, N, C) (or (T, C)) against
    ``targets`` ((N, S) padded, or 1-D concatenated). The forward (alpha) recursion runs in log
    space over time, each sample frozen past its input length; ``reduction="mean"`` divides each
    loss by its target length (at least 1) before averaging, as PyTorch. An impossible
    alignment gives ``inf`` (``zero_infinity``: 0, with a zero gradient)."""
    import lucid

    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"ctc_loss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    batched = log_probs.ndim == 3
    if log_probs.ndim not in (2, 3) or not log_probs.dtype.is_floating_point:
        raise ValueError(
            f"ctc_loss: log_probs must be a floating (T, N, C) or (T, C) tensor, got shape "
            f"{tuple(log_probs.shape)} of {log_probs.dtype}"
        )
    if not batched:
        log_probs, targets = log_probs.unsqueeze(1), targets.reshape(1, -1)
    steps, batch, classes = log_probs.shape
    if not 0 <= blank < classes:
        raise ValueError(f"ctc_loss: blank {blank} is not a class index in [0, {classes})")
    input_lengths = _as_int64_tensor(input_lengths).reshape(-1)
    target_lengths = _as_int64_tensor(target_lengths).reshape(-1)
    if input_lengths.shape[0] != batch or target_lengths.shape[0] != batch:
        raise ValueError(
            f"ctc_loss: need {batch} input and target lengths, got {input_lengths.shape[0]} "
            f"and {target_lengths.shape[0]}"
        )
    padded = _ctc_padded_targets(targets, target_lengths)
    labels = padded.shape[1]
    # Extended labels: blank, l1, blank, l2, ..., blank; labels past a target's length read
    # as blank so the gather stays in range.
    in_target = lucid.arange(labels).unsqueeze(0) < target_lengths.unsqueeze(1)
    padded = lucid.where(in_target, padded, blank)
    blanks = lucid.full((batch, labels), blank, dtype=lucid.int64)
    extended = lucid.cat([lucid.stack([blanks, padded], 2).reshape(batch, 2 * labels),
                          blanks[:, :1]], 1)  # fmt: skip
    width = 2 * labels + 1
    emissions = log_probs.gather(2, extended.unsqueeze(0).expand(steps, batch, width))
    # A finite stand-in for log(0): logsumexp of -inf's has a NaN gradient.
    unreachable = -1e30
    skip_allowed = lucid.cat(
        [lucid.zeros(batch, 2, dtype=lucid.bool_),
         (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])], 1,
    )  # fmt: skip
    alpha = lucid.cat(
        [lucid.zeros(batch, 1, dtype=log_probs.dtype),
         lucid.full((batch, width - 1), unreachable, dtype=log_probs.dtype)], 1,
    )  # fmt: skip
    pad1 = lucid.full((batch, 1), unreachable, dtype=log_probs.dtype)
    pad2 = lucid.full((batch, 2), unreachable, dtype=log_probs.dtype)
    for t in range(steps):
        from_prev = lucid.cat([pad1, alpha[:, :-1]], 1)
        from_skip = lucid.where(skip_allowed, lucid.cat([pad2, alpha[:, :-2]], 1), unreachable)
        stepped = lucid.stack([alpha, from_prev, from_skip], 0).logsumexp(0) + emissions[t]
        alpha = lucid.where((input_lengths > t).unsqueeze(1), stepped, alpha)
    last = (2 * target_lengths).unsqueeze(1)
    end_blank = alpha.gather(1, last).squeeze(1)
    end_label = lucid.where(
        target_lengths > 0, alpha.gather(1, (last - 1).clamp_min(0)).squeeze(1), unreachable
    )
    likelihood = lucid.stack([end_blank, end_label], 0).logsumexp(0)
    impossible = likelihood < unreachable / 2
    loss = lucid.where(impossible, 0.0 if zero_infinity else math.inf, -likelihood)
    if reduction == "mean":
        return (loss / target_lengths.clamp_min(1).type(loss.dtype)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss if batched else loss.squeeze(0)


# --- fractional max pooling ---------------------------------------------------------------------

# Which of the per-plane random samples drives each spatial dim, in torch's order: 2-d pooling
# reads (W, H), 3-d pooling (T, H, W).
_FRACTIONAL_SAMPLE_OF_DIM = {2: (1, 0), 3: (0, 1, 2)}


def _fractional_starts(u: Tensor, size: int, out: int, kernel: int) -> Tensor:
    """torch's pseudo-random window starts along one dim, (..., out) int64 from samples u
    (...): ``trunc((i + u) * alpha) - trunc(u * alpha)`` with ``alpha = (size - kernel) /
    (out - 1)``, the last window flush with the end. Lucid ops only, so it traces."""
    import lucid

    last = lucid.full((*u.shape, 1), size - kernel, dtype=lucid.int64)
    if out == 1:
        return last
    alpha = (size - kernel) / (out - 1)
    steps = lucid.arange(out - 1, dtype=u.dtype)
    starts = ((steps + u.unsqueeze(-1)) * alpha).floor() - (u.unsqueeze(-1) * alpha).floor()
    return lucid.cat([starts.type(lucid.int64), last], -1)


def _fractional_max_pool(
    input: Tensor,  # noqa: A002
    kernel_size: Any,
    output_size: Any,
    output_ratio: Any,
    _random_samples: Tensor | None,
    dims: int,
) -> tuple[Tensor, Tensor]:
    """Fractional max pooling (Graham, 2015) as torch computes it: ``(values, indices)``, the
    indices flat in the input's spatial dims. The windows are gathered from the flattened planes
    and reduced with argmax (the first maximum of a window in row-major order, as torch)."""
    import lucid

    op = f"fractional_max_pool{dims}d"
    x, unbatched = _batched(input, dims, op)
    kernel = _fractional_tuple(kernel_size, "kernel_size", dims, op)
    spatial = tuple(x.shape[2:])
    if output_size is None:
        if output_ratio is None:
            raise ValueError(f"{op}: give output_size or output_ratio")
        ratios = _fractional_tuple(output_ratio, "output_ratio", dims, op, kind=float)
        if not all(0 < r < 1 for r in ratios):
            raise ValueError(f"{op}: output_ratio must be between 0 and 1, got {output_ratio!r}")
        output_size = tuple(int(s * r) for s, r in zip(spatial, ratios, strict=True))
    out = _fractional_tuple(output_size, "output_size", dims, op)
    for name, o, k, s in zip("THW"[3 - dims :], out, kernel, spatial, strict=True):
        if o < 1 or k < 1 or o + k - 1 > s:
            raise ValueError(
                f"{op}: output size {o} with kernel {k} does not fit input size {s} along {name} "
                "(needs output + kernel - 1 <= input)"
            )
    n, c = x.shape[:2]
    if _random_samples is None:
        samples = lucid.rand(n, c, dims, dtype=x.dtype)
    else:
        samples = _random_samples
        if tuple(samples.shape) != (n, c, dims):
            raise ValueError(
                f"{op}: _random_samples must have shape {(n, c, dims)}, got {tuple(samples.shape)}"
            )
        samples = samples.type(x.dtype)
    # flat[n, c, o_0.., k_0..] = sum_d (start_d[o_d] + k_d) * stride_d, a window position each.
    flat = None
    strides = [math.prod(spatial[d + 1 :]) for d in range(dims)]
    for d in range(dims):
        starts = _fractional_starts(
            samples[..., _FRACTIONAL_SAMPLE_OF_DIM[dims][d]], spatial[d], out[d], kernel[d]
        )
        rows = starts.unsqueeze(-1) + lucid.arange(kernel[d])
        shape = [n, c] + [1] * (2 * dims)
        shape[2 + d], shape[2 + dims + d] = out[d], kernel[d]
        term = rows.reshape(*shape) * strides[d]
        flat = term if flat is None else flat + term
    windows = flat.expand(n, c, *out, *kernel).reshape(n, c, math.prod(out), math.prod(kernel))
    planes = x.reshape(n, c, 1, math.prod(spatial)).expand(n, c, math.prod(out), -1)
    values = planes.gather(3, windows)
    best = values.argmax(3, keepdim=True)
    pooled = values.gather(3, best).reshape(n, c, *out)
    indices = windows.gather(3, best).reshape(n, c, *out)
    return _unbatch(pooled, unbatched), _unbatch(indices, unbatched)


def _fractional_tuple(v: Any, name: str, dims: int, op: str, kind: type = int) -> tuple:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims
    if len(t) != dims or any(isinstance(e, bool) or not isinstance(e, (kind, int)) for e in t):
        raise ValueError(f"{op}: {name} must be a {kind.__name__} or {dims} of them, got {v!r}")
    return t


def _fractional_max_pool_nd(dims: int, with_indices: bool) -> Callable[..., Any]:
    def pool(
        input: Tensor,  # noqa: A002
        kernel_size: Any,
        output_size: Any = None,
        output_ratio: Any = None,
        return_indices: bool = False,
        _random_samples: Tensor | None = None,
    ) -> Any:
        values, indices = _fractional_max_pool(
            input, kernel_size, output_size, output_ratio, _random_samples, dims
        )
        return (values, indices) if with_indices or return_indices else values

    name = f"fractional_max_pool{dims}d" + ("_with_indices" if with_indices else "")
    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = (
        f"{dims}-d fractional max pooling (torch's pseudo-random windows of size "
        "``kernel_size``, to ``output_size`` or ``output_ratio`` of the input); "
        + ("returns ``(values, indices)``." if with_indices else
           "``return_indices`` also returns each maximum's flat spatial index.")
    )  # fmt: skip
    return pool


fractional_max_pool2d = _fractional_max_pool_nd(2, False)
fractional_max_pool2d_with_indices = _fractional_max_pool_nd(2, True)
fractional_max_pool3d = _fractional_max_pool_nd(3, False)
fractional_max_pool3d_with_indices = _fractional_max_pool_nd(3, True)
