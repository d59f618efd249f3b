"""``Dropout`` zeroes elements with probability p during training and scales the rest by
1/(1-p); ``Dropout1d/2d/3d`` zero whole channels."""

from __future__ import annotations

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"]


class Dropout(Module):
    """Identity in eval mode; in training each element is kept with probability ``1 - p``."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if self.inplace and self.training and self.p > 0:
            return input._apply_inplace(lambda x: F.dropout(x, self.p, True))
        return F.dropout(input, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class _FeatureDropout(Dropout):
    """Zeroes whole channels (every spatial position of a (sample, channel) together)."""

    _spatial_dims = 1

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.feature_dropout(
            input, self.p, self.training, self.inplace, self._spatial_dims, type(self).__name__
        )


class Dropout1d(_FeatureDropout):
    """Channel dropout over (N, C, L) or unbatched (C, L) inputs."""

    _spatial_dims = 1


class Dropout2d(_FeatureDropout):
    """Channel dropout over (N, C, H, W) or unbatched (C, H, W) inputs."""

    _spatial_dims = 2


class Dropout3d(_FeatureDropout):
    """Channel dropout over (N, C, D, H, W) or unbatched (C, D, H, W) inputs."""

    _spatial_dims = 3


class AlphaDropout(Dropout):
    """Dropout for SELU networks: keeps the activations' mean and variance (``F.alpha_dropout``)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.alpha_dropout(input, self.p, self.training, self.inplace)


class FeatureAlphaDropout(Dropout):
    """``AlphaDropout`` of whole channels."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.feature_alpha_dropout(input, self.p, self.training, self.inplace)
