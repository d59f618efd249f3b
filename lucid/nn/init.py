"""``lucid.nn.init``: in-place weight initialisation, as ``torch.nn.init``.

Every function fills its tensor in place under ``no_grad`` and returns it. Random draws come from
Lucid's global generator (``lucid.manual_seed`` reproduces a model's initial weights), or from
the ``lucid.Generator`` passed as ``generator=``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lucid._autograd import no_grad
from lucid._tensor import Tensor

__all__ = [
    "calculate_gain",
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
]


def _check_tensor(tensor: Any, fn: str) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fn}: expected a Tensor, got {type(tensor).__name__}")
    if tensor.is_traced:
        raise RuntimeError(f"{fn}: cannot initialise a trace tensor")


def _write(tensor: Tensor, values: np.ndarray) -> Tensor:
    """Copy ``values`` into ``tensor`` in place (a deterministic fill, not an op)."""
    np.copyto(tensor._data, values, casting="unsafe")
    tensor._version[0] += 1
    return tensor


def _draw(
    kind: str, like: Tensor, shape: tuple, a: float, b: float, generator: Any = None
) -> np.ndarray:
    """Draws from ``generator`` or the global RNG (float64 for a float64 ``like``, float32
    otherwise): ``uniform`` on [a, b), or ``normal`` (mean a, std b)."""
    np_dt = np.float64 if like._data.dtype == np.float64 else np.float32
    scratch = Tensor._wrap(np.zeros(shape, dtype=np_dt))
    with no_grad():
        if kind == "uniform":
            scratch.uniform_(a, b, generator=generator)
        else:
            scratch.normal_(a, b, generator=generator)
    return scratch._data.astype(np.float64)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table): relu sqrt(2), tanh 5/3, ..."""
    linear_fns = {
        "linear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    }
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out (out, in, *kernel), as PyTorch computes them."""
    if tensor.ndim < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for d in tensor.shape[2:]:
        receptive *= d
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with draws from U(a, b)."""
    _check_tensor(tensor, "uniform_")
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with draws from N(mean, std^2)."""
    _check_tensor(tensor, "normal_")
    if std < 0:
        raise ValueError(f"normal_: std must be non-negative, got {std}")
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def _norm_ppf(p: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF (Acklam's rational approximation, relative error < 1.2e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687,
         138.3577518672690, -30.66479806614716, 2.506628277459239)  # fmt: skip
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866,
         66.80131188771972, -13.28068155288572)  # fmt: skip
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838,
         -2.549732539343734, 4.374664141464968, 2.938163982698783)  # fmt: skip
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996, 3.754408661907416)
    p = np.clip(p, 1e-300, 1 - 1e-16)
    x = np.empty_like(p)
    lo, hi = p < 0.02425, p > 1 - 0.02425
    mid = ~(lo | hi)
    q = p[mid] - 0.5
    r = q * q
    x[mid] = (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )
    for mask, sign, pp in ((lo, 1.0, p[lo]), (hi, -1.0, 1 - p[hi])):
        q = np.sqrt(-2 * np.log(pp))
        x[mask] = (
            sign
            * (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
            / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
        )
    return x


def trunc_normal_(
    tensor: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: Any = None,
) -> Tensor:
    """Fill with draws from N(mean, std^2) truncated to [a, b] (a, b are absolute bounds)."""
    _check_tensor(tensor, "trunc_normal_")
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got a={a}, b={b}")

    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
    with no_grad():
        u = _draw("uniform", tensor, tensor.shape, lo, hi, generator)
        values = np.clip(mean + std * _norm_ppf(u), a, b)
        return _write(tensor, values)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    _check_tensor(tensor, "constant_")
    with no_grad():
        return _write(tensor, np.full(tensor.shape, val))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D tensor with the identity matrix (ones on the diagonal of a non-square one)."""
    _check_tensor(tensor, "eye_")
    if tensor.ndim != 2:
        raise ValueError(f"Only tensors with 2 dimensions are supported, got {tensor.ndim}")
    with no_grad():
        return _write(tensor, np.eye(*tensor.shape))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fill a 3-, 4- or 5-D conv weight with the Dirac delta (identity convolution)."""
    _check_tensor(tensor, "dirac_")
    if tensor.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    out_per_group = tensor.shape[0] // groups
    if tensor.shape[0] % groups:
        raise ValueError("dim 0 must be divisible by groups")
    min_dim = min(out_per_group, tensor.shape[1])
    values = np.zeros(tensor.shape)
    centre = tuple(k // 2 for k in tensor.shape[2:])
    for g in range(groups):
        for d in range(min_dim):
            values[(g * out_per_group + d, d, *centre)] = 1
    with no_grad():
        return _write(tensor, values)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """U(-r, r) with r = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_fan_and_gain(
    tensor: Tensor, a: float, mode: str, nonlinearity: str, name: str
) -> tuple[int, float] | None:
    """``(fan, gain)`` of a Kaiming init; None for a tensor with no elements, which is left as
    is (like torch)."""
    _check_tensor(tensor, name)
    if 0 in tensor.shape:
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return fan, calculate_gain(nonlinearity, a)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al., 2015)."""
    fan_and_gain = _kaiming_fan_and_gain(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    if fan_and_gain is None:
        return tensor
    fan, gain = fan_and_gain
    bound = math.sqrt(3.0) * gain / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """N(0, std^2) with std = gain / sqrt(fan) (He et al., 2015)."""
    fan_and_gain = _kaiming_fan_and_gain(tensor, a, mode, nonlinearity, "kaiming_normal_")
    if fan_and_gain is None:
        return tensor
    fan, gain = fan_and_gain
    std = gain / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix (rows or columns orthonormal), scaled by ``gain``.

    Tensors of more than 2 dims are flattened to (shape[0], rest), as PyTorch does.
    """
    _check_tensor(tensor, "orthogonal_")
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = _draw("normal", tensor, (rows, cols), 0.0, 1.0, generator)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    # Sign fix so Q is uniformly distributed (Mezzadri, 2007).
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    with no_grad():
        return _write(tensor, gain * q.reshape(tensor.shape))
