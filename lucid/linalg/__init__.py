"""``lucid.linalg``: linear algebra as ``torch.linalg`` (a subset).

``inv``, ``det``, ``solve``, ``cholesky``, ``eigh``, ``qr`` and ``svd`` are registry ops (numpy
kernels, VJP rules; ``lucid.compile`` falls back to eager for them with the reason); ``slogdet``
and the norms compose them and other Lucid ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor

__all__ = [
    "inv",
    "det",
    "slogdet",
    "solve",
    "cholesky",
    "eigh",
    "eigvalsh",
    "qr",
    "svd",
    "svdvals",
    "vector_norm",
    "matrix_norm",
    "norm",
]


def inv(A: Tensor) -> Tensor:  # noqa: N803
    """The inverse of each (..., n, n) matrix; a singular one raises ``ValueError``."""
    return apply("linalg_inv", A)


def det(A: Tensor) -> Tensor:  # noqa: N803
    """The determinant of each (..., n, n) matrix."""
    return apply("linalg_det", A)


def slogdet(A: Tensor) -> tuple[Tensor, Tensor]:  # noqa: N803
    """``(sign, log|det|)``; the gradient flows through ``log|det|``."""
    d = det(A)
    return d.sign().detach(), d.abs().log()


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:  # noqa: N803
    """``X`` with ``A X = B`` (``B`` (..., n, k), or (n,) for one vector); ``left=False``
    solves ``X A = B``."""
    if not left:
        return apply("linalg_solve", A.mT, B.mT).mT
    return apply("linalg_solve", A, B)


def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:  # noqa: N803
    """The lower Cholesky factor ``L`` (``A = L L^T``) of a symmetric positive-definite matrix
    (``upper=True``: ``L^T``)."""
    low = apply("linalg_cholesky", A)
    return low.mT if upper else low


def eigh(A: Tensor, UPLO: str = "L") -> tuple[Tensor, Tensor]:  # noqa: N803
    """Eigenvalues (ascending) and orthonormal eigenvectors (columns) of a symmetric matrix,
    read from its lower (``UPLO="L"``) or upper triangle."""
    if UPLO not in ("L", "U"):
        raise ValueError(f"linalg.eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    values, vectors = apply("linalg_eigh", A, UPLO=UPLO)
    return values, vectors


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:  # noqa: N803
    """The eigenvalues (ascending) of a symmetric matrix."""
    return eigh(A, UPLO)[0]


def qr(A: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:  # noqa: N803
    """``(Q, R)`` with ``A = Q R``, Q's columns orthonormal, R upper-triangular. ``mode``:
    ``"reduced"`` (Q (m, k), R (k, n), k = min(m, n)), ``"complete"`` (Q (m, m), R (m, n)) or
    ``"r"`` (an empty Q, the reduced R). The gradient needs R's diagonal nonzero; ``"complete"``
    with m > n has none, as in PyTorch."""
    if mode == "r":
        r = apply("linalg_qr", A, mode="reduced")[1]
        return Tensor._wrap(np.empty((0,), dtype=A.dtype.numpy)), r
    q, r = apply("linalg_qr", A, mode=mode)
    return q, r


def svd(A: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:  # noqa: N803
    """``(U, S, Vh)`` with ``A = U diag(S) Vh``, singular values descending. The gradient
    through U or Vh needs distinct nonzero singular values (repeated ones divide by zero, as in
    PyTorch); ``full_matrices``' extra columns get none."""
    u, s, vh = apply("linalg_svd", A, full_matrices=bool(full_matrices))
    return u, s, vh


def svdvals(A: Tensor) -> Tensor:  # noqa: N803
    """The singular values, descending; their gradient is ``U diag(gS) Vh`` (defined for
    repeated values too)."""
    return apply("linalg_svd", A, full_matrices=False, values_only=True)[1]


def vector_norm(
    x: Tensor,
    ord: Any = 2,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: Any = None,  # noqa: A002
) -> Tensor:
    """The ``ord``-norm of ``x`` over ``dim`` (every element when None)."""
    from lucid.ops.reduction import norm as _norm

    return _norm(x if dtype is None else x.type(dtype), ord, dim, keepdim)


def matrix_norm(
    A: Tensor,
    ord: Any = "fro",
    dim: tuple = (-2, -1),
    keepdim: bool = False,  # noqa: N803,A002
) -> Tensor:
    """Frobenius (``"fro"``), 1 / -1 (max / min column sum of |A|) or inf / -inf (max / min
    row sum) norm of the matrices over ``dim``."""
    if ord == "fro":
        return vector_norm(A, 2, dim, keepdim)
    inf = float("inf")
    if ord in (1, -1, inf, -inf):
        rows, cols = dim
        summed_over, reduced = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = A.abs().sum(summed_over, keepdim=True)
        out = sums.amax(reduced, keepdim=True) if ord > 0 else sums.amin(reduced, keepdim=True)
        return out if keepdim else out.squeeze(tuple(sorted(d % A.ndim for d in dim)))
    raise ValueError(
        f"linalg.matrix_norm: ord {ord!r} is not supported (use 'fro', 1, -1, inf or -inf)"
    )


def norm(
    A: Tensor,
    ord: Any = None,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: Any = None,  # noqa: N803,A002
) -> Tensor:
    """``vector_norm`` for ``ord`` None or a 1-d ``dim`` (2-norm of everything by default),
    ``matrix_norm`` for a 2-d ``dim`` (or a 2-d input with a matrix ``ord``)."""
    if dtype is not None:
        A = A.type(dtype)
    if isinstance(dim, int):
        dim = (dim,)
    if dim is not None and len(dim) == 2 or (dim is None and ord is not None and A.ndim == 2):
        return matrix_norm(A, "fro" if ord is None else ord, dim or (-2, -1), keepdim)
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim)
