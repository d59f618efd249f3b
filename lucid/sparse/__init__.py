"""``lucid.sparse``: sparse COO matrices, enough for graph convolutions (as ``torch.sparse``).

A ``SparseTensor`` holds ``indices`` (an int64 (ndim, nnz) tensor) and ``values`` (nnz,). Its
products with dense tensors (``lucid.sparse.mm``, ``lucid.spmm``, ``sparse @ dense``) compose
registry ops (a gather of the dense rows, a product with the values, an ``index_add`` into the
rows of the result), so autograd reaches the dense operand (and the values, when they require
grad) and ``lucid.compile`` records the product with the sparsity pattern as a constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._tensor import Tensor, _tensor_from
from lucid.ops.creation import zeros

__all__ = ["SparseTensor", "sparse_coo_tensor", "mm", "spmm", "addmm", "sum", "FloatTensor"]


class SparseTensor:
    """A sparse tensor in COO layout (``layout == "sparse_coo"``).

    >>> s = lucid.sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], (2, 2))
    >>> s.to_dense()
    tensor([[0., 2.],
            [3., 0.]])
    """

    is_sparse = True
    layout = "sparse_coo"

    def __init__(self, indices: Tensor, values: Tensor, size: tuple, coalesced: bool = False):
        self._indices_t = indices
        self._values_t = values
        self._size = tuple(int(n) for n in size)
        self._coalesced = coalesced

    # --- what PyTorch's sparse tensors answer
    @property
    def shape(self) -> tuple:
        return self._size

    def size(self, dim: int | None = None) -> Any:
        return self._size if dim is None else self._size[dim]

    def dim(self) -> int:
        return len(self._size)

    @property
    def ndim(self) -> int:
        return len(self._size)

    @property
    def dtype(self) -> _dtype.dtype:
        return self._values_t.dtype

    @property
    def device(self) -> Any:
        return self._values_t.device

    @property
    def requires_grad(self) -> bool:
        return self._values_t.requires_grad

    def indices(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get indices on an uncoalesced tensor, please call .coalesce() first"
            )
        return self._indices_t

    def values(self) -> Tensor:
        if not self._coalesced:
            raise RuntimeError(
                "Cannot get values on an uncoalesced tensor, please call .coalesce() first"
            )
        return self._values_t

    def _indices(self) -> Tensor:
        return self._indices_t

    def _values(self) -> Tensor:
        return self._values_t

    def _index_array(self) -> np.ndarray:
        # The sparsity pattern is concrete data (a compiled product bakes it in as a constant),
        # so reading it is no graph break.
        return self._indices_t._data

    def _nnz(self) -> int:
        return int(self._values_t.shape[0])

    def is_coalesced(self) -> bool:
        return self._coalesced

    def coalesce(self) -> SparseTensor:
        """Indices sorted (row-major) and unique; values at repeated indices summed."""
        if self._coalesced:
            return self
        idx = self._index_array()
        if idx.shape[1] == 0:
            return SparseTensor(self._indices_t, self._values_t, self._size, True)
        flat = np.ravel_multi_index(tuple(idx), self._size)
        unique, slot = np.unique(flat, return_inverse=True)
        new_idx = np.stack(np.unravel_index(unique, self._size)).astype(np.int64)
        slot_index = Tensor._wrap(slot.astype(np.int64))
        values = zeros(len(unique), dtype=self.dtype).index_add(0, slot_index, self._values_t)
        return SparseTensor(Tensor._wrap(new_idx), values, self._size, True)

    def to_dense(self) -> Tensor:
        """The dense tensor (repeated indices add up); differentiable in the values."""
        flat_index = Tensor._wrap(
            np.ravel_multi_index(tuple(self._index_array()), self._size).astype(np.int64)
            if self._nnz()
            else np.zeros(0, np.int64)
        )
        numel = int(np.prod(self._size))
        dense = zeros(numel, dtype=self.dtype).index_add(0, flat_index, self._values_t)
        return dense.reshape(self._size)

    def to_sparse(self) -> SparseTensor:
        return self

    def t(self) -> SparseTensor:
        """The transpose of a 2-d sparse matrix."""
        if self.ndim != 2:
            raise ValueError(f"t(): expects a 2-d sparse tensor, got {self.ndim} dims")
        idx = self._index_array()[::-1].copy()
        return SparseTensor(Tensor._wrap(idx), self._values_t, self._size[::-1])

    def type(self, dtype: Any) -> SparseTensor:
        values = self._values_t.type(dtype)
        return SparseTensor(self._indices_t, values, self._size, self._coalesced)

    def to(self, *args: Any, **kwargs: Any) -> SparseTensor:
        values = self._values_t.to(*args, **kwargs)
        return SparseTensor(self._indices_t, values, self._size, self._coalesced)

    def float(self) -> SparseTensor:
        return self.type(_dtype.float32)

    def double(self) -> SparseTensor:
        return self.type(_dtype.float64)

    def cpu(self) -> SparseTensor:
        return self

    def detach(self) -> SparseTensor:
        return SparseTensor(self._indices_t, self._values_t.detach(), self._size, self._coalesced)

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        self._values_t.requires_grad_(requires_grad)
        return self

    def __matmul__(self, other: Tensor) -> Tensor:
        return mm(self, other)

    def __mul__(self, other: Any) -> SparseTensor:
        if isinstance(other, (Tensor, SparseTensor)):
            raise TypeError("a sparse tensor multiplies only by a Python number here")
        return SparseTensor(self._indices_t, self._values_t * other, self._size, self._coalesced)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return (
            f"tensor(indices={self._indices_t!r},\n       values={self._values_t!r},\n"
            f"       size={self._size}, nnz={self._nnz()}, layout=lucid.sparse_coo)"
        )


def sparse_coo_tensor(
    indices: Any,
    values: Any,
    size: Sequence[int] | None = None,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    check_invariants: bool | None = None,
    is_coalesced: bool | None = None,
) -> SparseTensor:
    """A sparse COO tensor with ``values[k]`` at ``indices[:, k]``; ``size`` defaults to the
    smallest that holds every index. Indices are checked to be in range."""
    idx = indices if isinstance(indices, Tensor) else _tensor_from(indices)
    if idx.dtype.is_floating_point or idx.dtype is _dtype.bool_:
        raise TypeError(f"sparse_coo_tensor: indices must be integers, got {idx.dtype}")
    idx = idx.detach().type(_dtype.int64)
    vals = values if isinstance(values, Tensor) else _tensor_from(values, dtype)
    if dtype is not None:
        vals = vals.type(dtype)
    if vals.ndim != 1:
        raise ValueError(
            f"sparse_coo_tensor: values must be 1-d (hybrid tensors are not supported), "
            f"got shape {tuple(vals.shape)}"
        )
    if idx.ndim != 2 or idx.shape[1] != vals.shape[0]:
        raise ValueError(
            f"sparse_coo_tensor: indices must have shape (ndim, nnz) = (ndim, {vals.shape[0]}), "
            f"got {tuple(idx.shape)}"
        )
    arr = idx._data
    if arr is None:
        raise TypeError("sparse_coo_tensor: indices must be concrete, not a trace tensor")
    if size is None:
        size = tuple(int(r.max()) + 1 if r.size else 0 for r in arr)
    size = tuple(int(n) for n in size)
    if len(size) != arr.shape[0]:
        raise ValueError(
            f"sparse_coo_tensor: size {size} has {len(size)} dims but indices index {arr.shape[0]}"
        )
    if arr.size and ((arr < 0).any() or (arr >= np.array(size)[:, None]).any()):
        raise IndexError(f"sparse_coo_tensor: an index is out of range for size {size}")
    if device is not None:
        vals = vals.to(device)
    if requires_grad:
        vals = vals.detach().requires_grad_(True)
    return SparseTensor(idx, vals, size, coalesced=bool(is_coalesced))


def FloatTensor(indices: Any, values: Any, size: Sequence[int] | None = None) -> SparseTensor:  # noqa: N802
    """The legacy ``torch.sparse.FloatTensor(indices, values, size)``: a float32 COO tensor."""
    return sparse_coo_tensor(indices, values, size, dtype=_dtype.float32)


def _to_sparse(x: Tensor, sparse_dim: int | None = None) -> SparseTensor:
    """The nonzero entries of a dense tensor as a coalesced sparse COO tensor."""
    if sparse_dim is not None and sparse_dim != x.ndim:
        raise ValueError("to_sparse: hybrid sparse tensors (sparse_dim < ndim) are not supported")
    idx = np.stack(np.nonzero(x.numpy() if not x.requires_grad else x.detach().numpy()))
    idx = idx.astype(np.int64).reshape(x.ndim, -1)
    index_tensor = Tensor._wrap(idx)
    values = x.reshape(-1)[Tensor._wrap(np.ravel_multi_index(tuple(idx), x.shape))] if x.ndim else x
    return SparseTensor(index_tensor, values.reshape(-1), tuple(x.shape), coalesced=True)


def mm(sparse: SparseTensor, dense: Tensor) -> Tensor:
    """``sparse @ dense`` for a 2-d sparse matrix and a 2-d dense one; gradients reach the dense
    operand and the sparse values."""
    if not isinstance(sparse, SparseTensor):
        if isinstance(dense, SparseTensor):
            return mm(dense.t(), sparse.t()).t()
        return sparse.mm(dense)
    if isinstance(dense, SparseTensor):
        raise TypeError("sparse.mm: sparse @ sparse is not supported; densify one operand")
    if sparse.ndim != 2 or dense.ndim != 2:
        raise ValueError(
            f"sparse.mm: expects a 2-d sparse matrix and a 2-d dense matrix, got shapes "
            f"{sparse.shape} and {tuple(dense.shape)}"
        )
    rows, cols = sparse.shape
    if dense.shape[0] != cols:
        raise ValueError(
            f"sparse.mm: shapes {sparse.shape} and {tuple(dense.shape)} cannot be multiplied "
            f"({cols} != {dense.shape[0]})"
        )
    idx = sparse._index_array()
    row, col = Tensor._wrap(idx[0].copy()), Tensor._wrap(idx[1].copy())
    values = sparse._values_t
    if values.dtype != dense.dtype:
        values = values.type(dense.dtype)
    contributions = dense.index_select(0, col) * values.unsqueeze(-1)
    return zeros(rows, dense.shape[1], dtype=dense.dtype).index_add(0, row, contributions)


def spmm(sparse: SparseTensor, dense: Tensor) -> Tensor:
    """``sparse @ dense`` (``torch.spmm``)."""
    return mm(sparse, dense)


def addmm(
    input: Tensor,  # noqa: A002
    sparse: SparseTensor,
    dense: Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> Tensor:
    """``beta * input + alpha * (sparse @ dense)``."""
    return input * beta + mm(sparse, dense) * alpha


def sum(sparse: SparseTensor, dim: Any = None) -> Tensor:  # noqa: A001
    """The sum of a sparse tensor's entries, over ``dim`` or over every entry, as a dense
    tensor."""
    if dim is None:
        return sparse._values_t.sum()
    return sparse.to_dense().sum(dim)


def _dense_to_dense(x: Tensor) -> Tensor:
    """A dense tensor is already dense (``Tensor.to_dense``)."""
    return x


Tensor.to_sparse = _to_sparse
Tensor.to_dense = _dense_to_dense
Tensor.is_sparse = False
Tensor.layout = "strided"
