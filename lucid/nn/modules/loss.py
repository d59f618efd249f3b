"""Loss modules: each stores its options and calls the functional form."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.module import Module

__all__ = [
    "CrossEntropyLoss",
    "LinearCrossEntropyLoss",
    "NLLLoss",
    "MSELoss",
    "L1Loss",
    "BCELoss",
    "BCEWithLogitsLoss",
    "SmoothL1Loss",
    "HuberLoss",
    "KLDivLoss",
    "TripletMarginLoss",
    "MarginRankingLoss",
    "SoftMarginLoss",
    "HingeEmbeddingLoss",
    "CosineEmbeddingLoss",
    "PoissonNLLLoss",
    "GaussianNLLLoss",
    "MultiLabelSoftMarginLoss",
    "TripletMarginWithDistanceLoss",
    "MultiMarginLoss",
    "CTCLoss",
    "MultiLabelMarginLoss",
    "NLLLoss2d",
]


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(
                f"{reduction} is not a valid value for reduction; use 'none', 'mean' or 'sum'"
            )
        self.reduction = reduction


class _WeightedLoss(_Loss):
    def __init__(self, weight: Tensor | None = None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        if weight is not None and not isinstance(weight, Tensor):
            raise TypeError(f"weight must be a Tensor or None, got {type(weight).__name__}")
        self.register_buffer("weight", weight)


class _LegacyLoss(_Loss):
    """A loss taking torch's deprecated ``size_average`` and ``reduce`` before ``reduction``."""

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))


class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy between logits (N, C, ...) and class indices or class probabilities."""

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class NLLLoss(_WeightedLoss):
    """Negative log likelihood of log-probabilities (N, C, ...) at class-index targets."""

    def __init__(
        self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> None:
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.nll_loss(
            input, target, weight=self.weight, ignore_index=self.ignore_index,
            reduction=self.reduction,
        )  # fmt: skip


class MSELoss(_Loss):
    """Mean squared error."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """Mean absolute error."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities in [0, 1]."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid + binary cross entropy, computed stably; ``pos_weight`` weighs positives."""

    def __init__(
        self,
        weight: Tensor | None = None,
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> None:
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy_with_logits(
            input, target, weight=self.weight, reduction=self.reduction,
            pos_weight=self.pos_weight,
        )  # fmt: skip


class SmoothL1Loss(_Loss):
    """``0.5 d^2 / beta`` where ``|d| < beta``, ``|d| - 0.5 beta`` elsewhere."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be non-negative, got {beta}")
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """``0.5 d^2`` where ``|d| < delta``, ``delta (|d| - 0.5 delta)`` elsewhere."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        if delta <= 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta}")
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """KL divergence with log-probability inputs (``reduction='batchmean'`` as torch advises)."""

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
        log_target: bool = False,
    ) -> None:
        reduction = F._legacy_reduction(size_average, reduce, reduction)
        super().__init__("mean" if reduction == "batchmean" else reduction)
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class TripletMarginLoss(_Loss):
    """``max(d(a, p) - d(a, n) + margin, 0)`` with the pairwise p-distance."""

    def __init__(
        self,
        margin: float = 1.0,
        p: float = 2.0,
        eps: float = 1e-6,
        swap: bool = False,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))
        if margin <= 0:
            raise ValueError(f"TripletMarginLoss: margin must be greater than 0, got {margin}")
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return F.triplet_margin_loss(
            anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
            reduction=self.reduction,
        )  # fmt: skip


class MarginRankingLoss(_Loss):
    """``max(0, -y * (x1 - x2) + margin)``."""

    def __init__(
        self,
        margin: float = 0.0,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return F.margin_ranking_loss(input1, input2, target, self.margin, reduction=self.reduction)


class SoftMarginLoss(_LegacyLoss):
    """``log(1 + exp(-y * x))``."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.soft_margin_loss(input, target, reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
    """``x`` for y = 1, ``max(0, margin - x)`` for y = -1."""

    def __init__(
        self,
        margin: float = 1.0,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))
        self.margin = margin

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)


class CosineEmbeddingLoss(_Loss):
    """``1 - cos(x1, x2)`` for y = 1, ``max(0, cos(x1, x2) - margin)`` for y = -1."""

    def __init__(
        self,
        margin: float = 0.0,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return F.cosine_embedding_loss(
            input1, input2, target, self.margin, reduction=self.reduction
        )


class PoissonNLLLoss(_Loss):
    """Poisson negative log-likelihood (``log_input``: the input is the log-rate)."""

    def __init__(
        self,
        log_input: bool = True,
        full: bool = False,
        size_average: bool | None = None,
        eps: float = 1e-8,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(F._legacy_reduction(size_average, reduce, reduction))
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input: Tensor, target: Tensor) -> Tensor:
        return F.poisson_nll_loss(
            log_input, target, self.log_input, self.full, eps=self.eps, reduction=self.reduction
        )


class GaussianNLLLoss(_Loss):
    """Gaussian negative log-likelihood with predicted variances ``var``."""

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.full, self.eps = full, eps

    def forward(self, input: Tensor, target: Tensor, var: Tensor | float) -> Tensor:  # noqa: A002
        return F.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """Per-class logistic loss averaged over classes, for multi-label targets in {0, 1}."""

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, F._legacy_reduction(size_average, reduce, reduction))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.multilabel_soft_margin_loss(
            input, target, weight=self.weight, reduction=self.reduction
        )


class TripletMarginWithDistanceLoss(_Loss):
    """``max(d(a, p) - d(a, n) + margin, 0)`` with any ``distance_function``."""

    def __init__(
        self,
        *,
        distance_function: Any = None,
        margin: float = 1.0,
        swap: bool = False,
        reduction: str = "mean",
    ) -> None:
        super().__init__(reduction)
        if margin <= 0:
            raise ValueError(
                f"TripletMarginWithDistanceLoss: margin must be greater than 0, got {margin}"
            )
        self.distance_function, self.margin, self.swap = distance_function, margin, swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return F.triplet_margin_with_distance_loss(
            anchor, positive, negative, distance_function=self.distance_function,
            margin=self.margin, swap=self.swap, reduction=self.reduction,
        )  # fmt: skip


class MultiMarginLoss(_WeightedLoss):
    """Multi-class hinge loss over logits (N, C) and class indices (N,)."""

    def __init__(
        self,
        p: int = 1,
        margin: float = 1.0,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,  # noqa: A002
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, F._legacy_reduction(size_average, reduce, reduction))
        if p not in (1, 2):
            raise ValueError(f"MultiMarginLoss: only p == 1 and p == 2 are supported, got {p}")
        self.p, self.margin = p, margin

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.multi_margin_loss(
            input, target, self.p, self.margin, self.weight, reduction=self.reduction
        )


class MultiLabelMarginLoss(_LegacyLoss):
    """Multi-label hinge loss; each target row lists class indices, ended by the first -1."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.multilabel_margin_loss(input, target, reduction=self.reduction)


class NLLLoss2d(NLLLoss):
    """Deprecated alias of ``NLLLoss`` (which takes (N, C, H, W) inputs itself)."""


class LinearCrossEntropyLoss(_WeightedLoss):
    """A ``Linear(in_features, num_classes)`` layer followed by cross entropy, as one loss
    (``linear_cross_entropy``); its parameters live in ``self.linear``."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        out_features: tuple[int, ...] = (),
        bias: bool = False,
        device: Any = None,
        dtype: Any = None,
        reduction: str = "mean",
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        options: Any = None,
    ) -> None:
        from lucid.nn.modules.linear import Linear

        super().__init__(weight, reduction)
        if tuple(out_features):
            raise ValueError(
                "LinearCrossEntropyLoss: out_features (a K-dimensional loss) is not supported, "
                f"got {out_features!r}"
            )
        self.in_features, self.num_classes = in_features, num_classes
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.linear = Linear(in_features, num_classes, bias=bias, device=device, dtype=dtype)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.linear_cross_entropy(
            input, self.linear.weight, target, linear_bias=self.linear.bias, weight=self.weight,
            reduction=self.reduction, ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
        )  # fmt: skip


class CTCLoss(_Loss):
    """Connectionist Temporal Classification loss (``F.ctc_loss``)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(
        self, log_probs: Tensor, targets: Tensor, input_lengths: Any, target_lengths: Any
    ) -> Tensor:
        return F.ctc_loss(
            log_probs, targets, input_lengths, target_lengths, blank=self.blank,
            reduction=self.reduction, zero_infinity=self.zero_infinity,
        )  # fmt: skip
