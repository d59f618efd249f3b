"""``AdaptiveLogSoftmaxWithLoss``: the adaptive softmax of Grave et al. (2016), as torch.nn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import lucid
from lucid._state import current_tracer
from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.container import ModuleList, Sequential
from lucid.nn.modules.linear import Linear
from lucid.nn.modules.module import Module

__all__ = ["AdaptiveLogSoftmaxWithLoss"]


class _ASMoutput(NamedTuple):
    output: Tensor
    loss: Tensor


class AdaptiveLogSoftmaxWithLoss(Module):
    """Frequent classes (below ``cutoffs[0]``) in the head, rarer ones in tail clusters of
    shrinking hidden size (``in_features // div_value**(i + 1)``). ``forward(input, target)``
    returns ``(output, loss)``: each target's log-probability and their negated mean.

    Every cluster is evaluated for every row and the rows of other clusters are masked out, so
    the call is a fixed graph (``lucid.compile`` traces it); torch evaluates each cluster on its
    rows only, with the same values and gradients."""

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        cutoffs: Sequence[int],
        div_value: float = 4.0,
        head_bias: bool = False,
        device: object = None,
        dtype: object = None,
    ) -> None:
        super().__init__()
        cutoffs = list(cutoffs)
        if (
            len(cutoffs) == 0
            or cutoffs != sorted(cutoffs)
            or min(cutoffs) <= 0
            or max(cutoffs) > n_classes - 1
            or len(set(cutoffs)) != len(cutoffs)
            or any(int(c) != c for c in cutoffs)
        ):
            raise ValueError(
                "cutoffs should be a sequence of unique, positive integers sorted in an "
                "increasing order, where each value is between 1 and n_classes-1"
            )
        self.in_features, self.n_classes = in_features, n_classes
        self.cutoffs = cutoffs + [n_classes]
        self.div_value, self.head_bias = div_value, head_bias
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        kw = {"device": device, "dtype": dtype}
        self.head = Linear(in_features, self.head_size, bias=head_bias, **kw)
        self.tail = ModuleList()
        for i in range(self.n_clusters):
            hidden = int(in_features // (div_value ** (i + 1)))
            size = self.cutoffs[i + 1] - self.cutoffs[i]
            self.tail.append(
                Sequential(
                    Linear(in_features, hidden, bias=False, **kw),
                    Linear(hidden, size, bias=False, **kw),
                )
            )

    def reset_parameters(self) -> None:
        self.head.reset_parameters()
        for cluster in self.tail:
            for layer in cluster:
                layer.reset_parameters()

    def forward(self, input: Tensor, target: Tensor) -> _ASMoutput:  # noqa: A002
        if target.ndim == 1:
            if input.ndim != 2:
                raise RuntimeError(
                    f"1D target tensor expects 2D input tensors, but found inputs with size "
                    f"{tuple(input.shape)}"
                )
            if input.shape[0] != target.shape[0]:
                raise RuntimeError(
                    "Input and target should have the same size in the batch dimension "
                    f"({input.shape[0]} and {target.shape[0]})"
                )
        elif target.ndim == 0:
            if input.ndim != 1:
                raise RuntimeError(
                    f"0D target tensor expects 1D input tensors, but found inputs with size "
                    f"{tuple(input.shape)}"
                )
            return _ASMoutput(*(
                t.squeeze(0) if i == 0 else t
                for i, t in enumerate(self.forward(input.unsqueeze(0), target.unsqueeze(0)))
            ))  # fmt: skip
        else:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        if current_tracer() is None:  # a traced call cannot read the targets
            low, high = int(target.min().item()), int(target.max().item())
            if low < 0 or high >= self.n_classes:
                raise RuntimeError(
                    f"Target values should be in [0, {self.n_classes - 1}], but values in range "
                    f"[{low}, {high}] were found."
                )
        head_index = target
        output = None
        for i in range(self.n_clusters):
            low, high = self.cutoffs[i], self.cutoffs[i + 1]
            in_cluster = (target >= low) & (target < high)
            cluster_logprob = F.log_softmax(self.tail[i](input), dim=1)
            relative = lucid.where(in_cluster, target - low, 0)
            local = cluster_logprob.gather(1, relative.unsqueeze(1)).squeeze(1)
            masked = lucid.where(in_cluster, local, 0.0)
            output = masked if output is None else output + masked
            head_index = lucid.where(in_cluster, self.shortlist_size + i, head_index)
        head_logprob = F.log_softmax(self.head(input), dim=1)
        head_part = head_logprob.gather(1, head_index.unsqueeze(1)).squeeze(1)
        output = head_part if output is None else output + head_part
        return _ASMoutput(output, (-output).mean())

    def _get_full_log_prob(self, input: Tensor, head_output: Tensor) -> Tensor:  # noqa: A002
        head_logprob = F.log_softmax(head_output, dim=1)
        pieces = [head_logprob[:, : self.shortlist_size]]
        for i in range(self.n_clusters):
            cluster_logprob = F.log_softmax(self.tail[i](input), dim=1)
            pieces.append(cluster_logprob + head_logprob[:, self.shortlist_size + i].unsqueeze(1))
        return lucid.cat(pieces, 1)

    def log_prob(self, input: Tensor) -> Tensor:  # noqa: A002
        """Log-probabilities of every class, (N, n_classes) (or (n_classes,))."""
        if input.ndim not in (1, 2):
            raise ValueError(f"log_prob: expected a 1-d or 2-d input, got {tuple(input.shape)}")
        batch = input if input.ndim == 2 else input.unsqueeze(0)
        out = self._get_full_log_prob(batch, self.head(batch))
        return out if input.ndim == 2 else out.squeeze(0)

    def predict(self, input: Tensor) -> Tensor:  # noqa: A002
        """The most likely class of each row (``log_prob(input).argmax(-1)``)."""
        return self.log_prob(input).argmax(-1)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, n_classes={self.n_classes}, "
            f"cutoffs={self.cutoffs[:-1]}, div_value={self.div_value}, head_bias={self.head_bias}"
        )
