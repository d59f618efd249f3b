"""``Embedding``: a lookup table of ``num_embeddings`` vectors of size ``embedding_dim``;
``EmbeddingBag``: sums, means or maxima of bags of its rows."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import check_positive_int, empty_parameter, factory_dtype
from lucid.nn.modules.module import Module
from lucid.nn.parameter import Parameter

__all__ = ["Embedding", "EmbeddingBag"]


class Embedding(Module):
    """Rows of ``weight`` indexed by an integer tensor. Weight ~ N(0, 1); the ``padding_idx``
    row starts at zero and never receives a gradient."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        _weight: Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        check_positive_int(num_embeddings, "num_embeddings", "Embedding")
        check_positive_int(embedding_dim, "embedding_dim", "Embedding")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} must be within num_embeddings "
                    f"({num_embeddings})"
                )
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        dt = factory_dtype(device, dtype)
        if _weight is None:
            self.weight = empty_parameter((num_embeddings, embedding_dim), dt)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                    f"{(num_embeddings, embedding_dim)}"
                )
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None:
            self.weight._data[self.padding_idx] = 0
            self.weight._version[0] += 1

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.embedding(input, self.weight, self.padding_idx)

    @classmethod
    def from_pretrained(
        cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None
    ) -> Embedding:
        """An Embedding holding ``embeddings`` (2-D); ``freeze`` turns off its gradient."""
        if embeddings.ndim != 2:
            raise ValueError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, _weight=embeddings, _freeze=freeze)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s


class EmbeddingBag(Embedding):
    """An ``Embedding`` whose lookups are reduced per bag (``mode`` sum, mean or max): the rows
    of a 2-D input, or the runs of a 1-D input starting at ``offsets``."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        super().__init__(
            num_embeddings, embedding_dim, padding_idx, _weight, device=device, dtype=dtype
        )
        self.max_norm, self.norm_type, self.mode = max_norm, norm_type, mode
        self.include_last_offset = include_last_offset

    def forward(  # noqa: D102
        self,
        input: Tensor,  # noqa: A002
        offsets: Tensor | None = None,
        per_sample_weights: Tensor | None = None,
    ) -> Tensor:
        return F.embedding_bag(
            input, self.weight, offsets, self.max_norm, self.norm_type, mode=self.mode,
            per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
            padding_idx=self.padding_idx,
        )  # fmt: skip

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        mode: str = "mean",
        padding_idx: int | None = None,
        **kwargs: Any,
    ) -> EmbeddingBag:
        """An EmbeddingBag holding ``embeddings`` (2-D); ``freeze`` turns off its gradient."""
        if embeddings.ndim != 2:
            raise ValueError("Embeddings parameter is expected to be 2-dimensional")
        bag = cls(*embeddings.shape, mode=mode, padding_idx=padding_idx, _weight=embeddings,
                  **kwargs)  # fmt: skip
        bag.weight.requires_grad = not freeze
        return bag

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode}"
