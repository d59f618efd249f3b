"""Activation modules: thin wrappers over ``lucid.nn.functional``."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import check_positive_int, empty_parameter, factory_dtype
from lucid.nn.modules.module import Module

__all__ = [
    "ReLU",
    "ReLU6",
    "LeakyReLU",
    "ELU",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Hardtanh",
    "Mish",
    "Softmax",
    "LogSoftmax",
    "CELU",
    "SELU",
    "GLU",
    "Hardsigmoid",
    "Hardswish",
    "Hardshrink",
    "Softshrink",
    "LogSigmoid",
    "Softsign",
    "Tanhshrink",
    "Threshold",
    "Softmin",
    "Softmax2d",
    "PReLU",
    "RReLU",
]


class _Activation(Module):
    """An activation with an ``inplace`` flag (the result is written back into the input).

    Subclasses define ``_fn(input)``, the out-of-place computation.
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if self.inplace:
            return input._apply_inplace(self._fn)
        return self._fn(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Activation):
    """``max(x, 0)``."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.relu(input)


class ReLU6(_Activation):
    """``min(max(x, 0), 6)``."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.relu6(input)


class LeakyReLU(_Activation):
    """``x`` for x >= 0, ``negative_slope * x`` otherwise."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.negative_slope = negative_slope

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.leaky_relu(input, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(_Activation):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.alpha = alpha

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.elu(input, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class SiLU(_Activation):
    """``x * sigmoid(x)``."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.silu(input)


class Hardtanh(_Activation):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        if max_val <= min_val:
            raise ValueError(
                f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})"
            )
        self.min_val, self.max_val = min_val, max_val

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.hardtanh(input, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (
            ", inplace=True" if self.inplace else ""
        )


class GELU(Module):
    """Gaussian error linear unit; ``approximate='tanh'`` uses the tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.sigmoid(input)


class Tanh(Module):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.tanh(input)


class Mish(Module):
    """``x * tanh(softplus(x))``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.mish(input)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


def _implicit_dim(ndim: int) -> int:
    # torch's legacy rule for Softmax(dim=None).
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    """Softmax along ``dim`` (``dim=None`` follows torch's legacy implicit choice)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        dim = _implicit_dim(input.ndim) if self.dim is None else self.dim
        return F.softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """``log(softmax(x))`` along ``dim``, computed stably."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        dim = _implicit_dim(input.ndim) if self.dim is None else self.dim
        return F.log_softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class CELU(_Activation):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.alpha = alpha

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.celu(input, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class SELU(_Activation):
    """``scale * elu(x, alpha)`` with the self-normalising constants."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.selu(input)


class Hardsigmoid(_Activation):
    """0 below -3, 1 above 3, ``x / 6 + 1 / 2`` between."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.hardsigmoid(input)


class Hardswish(_Activation):
    """``x * hardsigmoid(x)``."""

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.hardswish(input)


class Threshold(_Activation):
    """``x`` where ``x > threshold``, else ``value``."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.threshold, self.value = threshold, value

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.threshold(input, self.threshold, self.value)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"threshold={self.threshold}, value={self.value}{inplace}"


class _Shrink(Module):
    _function = staticmethod(F.hardshrink)

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return self._function(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Hardshrink(_Shrink):
    """``x`` where ``|x| > lambd``, else 0."""

    _function = staticmethod(F.hardshrink)


class Softshrink(_Shrink):
    """``x -+ lambd`` outside ``[-lambd, lambd]``, else 0."""

    _function = staticmethod(F.softshrink)


class LogSigmoid(Module):
    """``log(sigmoid(x))``, stable for large ``|x|``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.logsigmoid(input)


class Softsign(Module):
    """``x / (1 + |x|)``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.softsign(input)


class Tanhshrink(Module):
    """``x - tanh(x)``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.tanhshrink(input)


class GLU(Module):
    """``a * sigmoid(b)`` for the halves ``a``, ``b`` of the input along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(Module):
    """``softmax(-x)`` along ``dim`` (``dim=None`` follows torch's legacy implicit choice)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        dim = _implicit_dim(input.ndim) if self.dim is None else self.dim
        return F.softmin(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax2d(Module):
    """Softmax over the channels of (N, C, H, W) or (C, H, W) inputs."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(
                f"Softmax2d: expected a 3D or 4D input, got {input.ndim}D input of shape "
                f"{tuple(input.shape)}"
            )
        return F.softmax(input, -3)


class PReLU(Module):
    """``x`` where ``x >= 0``, else ``a * x`` with a learnt ``a``: one shared value
    (``num_parameters=1``) or one per channel, initialised to ``init``."""

    def __init__(
        self, num_parameters: int = 1, init: float = 0.25, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        check_positive_int(num_parameters, "num_parameters", "PReLU")
        self.num_parameters, self.init = num_parameters, init
        self.weight = empty_parameter((num_parameters,), factory_dtype(device, dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.constant_(self.weight, self.init)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(_Activation):
    """Randomized leaky ReLU: slope U(lower, upper) per element in training, the mean slope in
    eval mode."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__(inplace)
        if not lower <= upper:
            raise ValueError(f"RReLU: lower ({lower}) must not exceed upper ({upper})")
        self.lower, self.upper = lower, upper

    def _fn(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.rrelu(input, self.lower, self.upper, self.training)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}" + (
            ", inplace=True" if self.inplace else ""
        )
