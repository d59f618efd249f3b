"""``lucid.linalg``: linear algebra as ``torch.linalg`` (real matrices).

``inv``, ``det``, ``solve``, ``cholesky``, ``eigh``, ``qr``, ``svd``, ``lu``, ``matrix_exp`` and
``pinv`` are registry ops (numpy kernels, VJP rules; ``lucid.compile`` falls back to eager for them
with the reason); everything else composes them and other Lucid ops, so gradients follow. ``eig``
and ``eigvals`` are absent: their results are complex and Lucid has no complex dtype.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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
    "cholesky_ex",
    "cond",
    "cross",
    "diagonal",
    "householder_product",
    "inv_ex",
    "lstsq",
    "lu",
    "lu_factor",
    "lu_factor_ex",
    "ldl_factor",
    "ldl_factor_ex",
    "ldl_solve",
    "lu_solve",
    "matmul",
    "matrix_exp",
    "matrix_power",
    "matrix_rank",
    "multi_dot",
    "pinv",
    "solve_ex",
    "solve_triangular",
    "tensorinv",
    "tensorsolve",
    "vander",
    "vecdot",
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
    if ord in (2, -2, "nuc"):
        return _spectral_norm(A, ord, dim, keepdim)
    inf = float("inf")
    if ord in (1, -1, inf, -inf):
        rows, cols = dim
        summed_over, reduced = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = A.abs().sum(summed_over, keepdim=True)
        out = sums.amax(reduced, keepdim=True) if ord > 0 else sums.amin(reduced, keepdim=True)
        return out if keepdim else out.squeeze(tuple(sorted(d % A.ndim for d in dim)))
    raise ValueError(
        f"linalg.matrix_norm: ord {ord!r} is not supported (use 'fro', 'nuc', 2, -2, 1, -1, inf "
        "or -inf)"
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


# --- composites: norms and ranks from the singular values ---------------------------------------


def _matrices_last(A: Tensor, dim: tuple) -> tuple[Tensor, tuple[int, int]]:  # noqa: N803
    rows, cols = (d % A.ndim for d in dim)
    if rows == cols:
        raise ValueError(f"linalg: the two matrix dims must differ, got {dim}")
    rest = [d for d in range(A.ndim) if d not in (rows, cols)]
    return A.permute(*rest, rows, cols), (rows, cols)


def _spectral_norm(A: Tensor, ord: Any, dim: tuple, keepdim: bool) -> Tensor:  # noqa: N803,A002
    moved, (rows, cols) = _matrices_last(A, dim)
    s = svdvals(moved)
    out = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
    if keepdim:
        for d in sorted((rows, cols)):
            out = out.unsqueeze(d)
    return out


def _default_rtol(A: Tensor, atol: Any, rtol: Any) -> float:  # noqa: N803
    """torch's tolerance rule: rtol = eps * max(m, n) unless atol > 0 is given alone."""
    if rtol is not None:
        return float(rtol)
    if atol is not None and float(atol) > 0:
        return 0.0
    return float(np.finfo(A.dtype.numpy).eps) * max(A.shape[-2:])


def matrix_rank(
    A: Tensor,  # noqa: N803
    *,
    atol: Any = None,
    rtol: Any = None,
    hermitian: bool = False,
) -> Tensor:
    """The number of singular values above ``max(atol, rtol * largest)`` (int64; not
    differentiable)."""
    from lucid.ops.reduction import sum as _sum

    A = A.detach()  # noqa: N806
    s = eigvalsh(A).abs() if hermitian else svdvals(A)
    tol = _default_rtol(A, atol, rtol) * s.amax(-1, keepdim=True)
    if atol is not None:
        from lucid.ops.elementwise import maximum

        tol = maximum(tol, tol * 0 + float(atol))
    return _sum((s > tol).long(), -1)


def cond(A: Tensor, p: Any = None) -> Tensor:  # noqa: N803
    """The condition number in the ``p``-norm: s_max / s_min for None or 2 (s_min / s_max for
    -2), else ``matrix_norm(A, p) * matrix_norm(inv(A), p)`` for square A."""
    if p in (None, 2, -2):
        s = svdvals(A)
        high, low = s[..., 0], s[..., -1]
        return high / low if p in (None, 2) else low / high
    return matrix_norm(A, p) * matrix_norm(inv(A), p)


def pinv(
    A: Tensor,  # noqa: N803
    *,
    atol: Any = None,
    rtol: Any = None,
    hermitian: bool = False,
) -> Tensor:
    """The Moore-Penrose pseudo-inverse; singular values at most ``max(atol, rtol * largest)``
    count as zero (torch's defaults). Its gradient assumes the rank does not change nearby."""
    return apply(
        "linalg_pinv",
        A,
        atol=0.0 if atol is None else float(atol),
        rtol=_default_rtol(A, atol, rtol),
        hermitian=bool(hermitian),
    )


class _LstsqResult(NamedTuple):
    solution: Tensor
    residuals: Tensor
    rank: Tensor
    singular_values: Tensor


def lstsq(
    A: Tensor,  # noqa: N803
    B: Tensor,  # noqa: N803
    rcond: float | None = None,
    *,
    driver: str | None = None,
) -> _LstsqResult:
    """The least-squares solution of ``A X = B`` (the minimum-norm one when A is rank-deficient)
    as ``pinv(A) @ B``, with torch's extra results for ``driver`` (default ``"gelsy"``):
    ``residuals`` (squared, when m > n and A has full rank), ``rank`` (not for ``"gels"``) and
    ``singular_values`` (``"gelsd"``/``"gelss"`` only); what a driver does not give is empty."""
    driver = "gelsy" if driver is None else driver
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise ValueError(
            f"linalg.lstsq: driver must be gels, gelsy, gelsd or gelss, got {driver!r}"
        )
    if A.ndim < 2 or B.ndim < 1:
        raise ValueError(
            f"linalg.lstsq: expected A (*, m, n) and B (*, m, k), got {tuple(A.shape)} and "
            f"{tuple(B.shape)}"
        )
    vector = B.ndim == A.ndim - 1
    rhs = B.unsqueeze(-1) if vector else B
    if rhs.shape[-2] != A.shape[-2]:
        raise ValueError(
            f"linalg.lstsq: A has {A.shape[-2]} rows but B has {rhs.shape[-2]} (shapes "
            f"{tuple(A.shape)} and {tuple(B.shape)})"
        )
    m, n = A.shape[-2:]
    rtol = None if rcond is None or rcond < 0 else rcond
    solution = pinv(A, rtol=rtol) @ rhs
    empty = Tensor._wrap(np.empty((0,), dtype=A.dtype.numpy))
    rank = matrix_rank(A, rtol=rtol) if driver != "gels" else Tensor._wrap(np.empty((0,), np.int64))
    residuals = empty
    if m > n and bool((matrix_rank(A) == n).all()):
        residuals = ((A @ solution - rhs) ** 2).sum(-2)
    values = svdvals(A.detach()) if driver in ("gelsd", "gelss") else empty
    if vector:
        solution = solution.squeeze(-1)
        residuals = residuals.squeeze(-1) if residuals.numel() else residuals
    return _LstsqResult(solution, residuals, rank, values)


# --- composites of matmul, solve and inv ------------------------------------------------------


def matmul(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """``lucid.matmul``."""
    from lucid.ops.linalg import matmul as _matmul

    return _matmul(input, other)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """The dot product of vectors along ``dim`` (inputs broadcast)."""
    return (x * y).sum(dim)


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:  # noqa: A002
    """The cross product of 3-vectors along ``dim`` (default the last; inputs broadcast)."""
    from lucid.ops.linalg import cross as _cross

    return _cross(input, other, dim)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:  # noqa: N803
    """The diagonals of the matrices over ``(dim1, dim2)``, as ``Tensor.diagonal``."""
    return A.diagonal(offset, dim1, dim2)


def matrix_power(A: Tensor, n: int) -> Tensor:  # noqa: N803
    """``A`` to the integer power ``n`` by repeated squaring (``inv(A)`` first for n < 0, the
    identity for n = 0)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"linalg.matrix_power: n must be an int, got {type(n).__name__}")
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"linalg.matrix_power: expected (*, n, n) matrices, got {tuple(A.shape)}")
    if n == 0:
        from lucid.ops.creation import eye

        return eye(A.shape[-1], dtype=A.dtype).expand(*A.shape) + A * 0
    base = inv(A) if n < 0 else A
    n = abs(n)
    result = None
    while n:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if n:
            base = base @ base
    return result


def multi_dot(tensors: Any) -> Tensor:
    """The product of a chain of matrices in the cheapest order; the first may be a row and the
    last a column vector (1-d), dropped from the result as torch does."""
    mats = list(tensors)
    if len(mats) < 2:
        raise ValueError("linalg.multi_dot: expected at least 2 tensors")
    first_vector, last_vector = mats[0].ndim == 1, mats[-1].ndim == 1
    if first_vector:
        mats[0] = mats[0].unsqueeze(0)
    if last_vector:
        mats[-1] = mats[-1].unsqueeze(-1)
    for i, m in enumerate(mats):
        if m.ndim != 2:
            raise ValueError(
                f"linalg.multi_dot: tensor {i} must be 2-d (the first and last may be 1-d), got "
                f"shape {tuple(m.shape)}"
            )
        if i and mats[i - 1].shape[1] != m.shape[0]:
            raise ValueError(
                f"linalg.multi_dot: tensors {i - 1} and {i} cannot be multiplied "
                f"({tuple(mats[i - 1].shape)} and {tuple(m.shape)})"
            )
    dims = [mats[0].shape[0]] + [m.shape[1] for m in mats]
    out = _chain(mats, _chain_order(dims), 0, len(mats) - 1)
    if first_vector:
        out = out.squeeze(0)
    if last_vector:
        out = out.squeeze(-1)
    return out


def _chain_order(dims: list[int]) -> list[list[int]]:
    """The classic matrix-chain dynamic programme: split[i][j] of the cheapest product."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


def _chain(mats: list[Tensor], split: list[list[int]], i: int, j: int) -> Tensor:
    if i == j:
        return mats[i]
    k = split[i][j]
    return _chain(mats, split, i, k) @ _chain(mats, split, k + 1, j)


def tensorinv(A: Tensor, ind: int = 2) -> Tensor:  # noqa: N803
    """The inverse of ``A`` seen as a linear map from its last dims to its first ``ind`` dims:
    the result has shape ``A.shape[ind:] + A.shape[:ind]``."""
    if ind <= 0:
        raise ValueError(f"linalg.tensorinv: ind must be positive, got {ind}")
    out_shape, in_shape = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    rows, cols = math.prod(out_shape), math.prod(in_shape)
    if rows != cols:
        raise ValueError(
            f"linalg.tensorinv: prod(A.shape[:ind]) = {rows} must equal prod(A.shape[ind:]) = "
            f"{cols}"
        )
    return inv(A.reshape(rows, cols)).reshape(*in_shape, *out_shape)


def tensorsolve(A: Tensor, B: Tensor, dims: Any = None) -> Tensor:  # noqa: N803
    """``X`` with ``tensordot(A, X, X.ndim) = B``; ``dims`` moves those dims of A to the end
    first."""
    if dims is not None:
        dims = [d % A.ndim for d in dims]
        rest = [d for d in range(A.ndim) if d not in dims]
        A = A.permute(*rest, *dims)  # noqa: N806
    x_shape = tuple(A.shape[B.ndim :])
    rows, cols = B.numel(), math.prod(x_shape)
    if tuple(A.shape[: B.ndim]) != tuple(B.shape) or rows != cols:
        raise ValueError(
            f"linalg.tensorsolve: A {tuple(A.shape)} must start with B's shape {tuple(B.shape)} "
            "and be square as a matrix"
        )
    return solve(A.reshape(rows, cols), B.reshape(rows)).reshape(*x_shape)


def solve_triangular(
    A: Tensor,  # noqa: N803
    B: Tensor,  # noqa: N803
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> Tensor:
    """``X`` with ``A X = B`` (``X A = B`` when not ``left``) reading only A's upper or lower
    triangle (and a unit diagonal when ``unitriangular``); A's gradient is triangular too."""
    from lucid.ops.shape import tril, triu

    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(
            f"linalg.solve_triangular: expected A (*, n, n) and B (*, n, k), got "
            f"{tuple(A.shape)} and {tuple(B.shape)}"
        )
    tri = triu(A, 1 if unitriangular else 0) if upper else tril(A, -1 if unitriangular else 0)
    if unitriangular:
        from lucid.ops.creation import eye

        tri = tri + eye(A.shape[-1], dtype=A.dtype)
    return solve(tri, B, left=left)


def householder_product(A: Tensor, tau: Tensor) -> Tensor:  # noqa: N803
    """The first n columns of H_1 ... H_k, H_i = I - tau_i v_i v_i^T with v_i = (0, .., 0, 1,
    A[i+1:, i]) (the Householder vectors below A's diagonal, as LAPACK's orgqr)."""
    from lucid.ops.creation import eye
    from lucid.ops.shape import tril

    if A.ndim < 2 or tau.shape[-1] > A.shape[-1] or A.shape[-1] > A.shape[-2]:
        raise ValueError(
            f"linalg.householder_product: expected A (*, m, n) with m >= n >= k and tau (*, k), "
            f"got {tuple(A.shape)} and {tuple(tau.shape)}"
        )
    m, n = A.shape[-2:]
    k = tau.shape[-1]
    identity = eye(m, dtype=A.dtype)
    vectors = tril(A[..., :, :k], -1) + eye(m, k, dtype=A.dtype)
    q = None
    for i in range(k):
        v = vectors[..., :, i : i + 1]
        h = identity - tau[..., i : i + 1].unsqueeze(-1) * (v @ v.mT)
        q = h if q is None else q @ h
    if q is None:
        return eye(m, n, dtype=A.dtype).expand(*A.shape) + A * 0
    return q[..., :, :n]


def vander(x: Tensor, N: int | None = None) -> Tensor:  # noqa: N803
    """The Vandermonde matrix with columns x^0, x^1, ..., x^(N-1) (N = len(x) by default), as
    cumulative products so the gradient is exact at 0."""
    from lucid.ops.creation import ones_like
    from lucid.ops.reduction import cumprod
    from lucid.ops.shape import cat

    if x.ndim < 1:
        raise ValueError("linalg.vander: expected a tensor with at least 1 dim")
    N = x.shape[-1] if N is None else N  # noqa: N806
    if N < 1:
        raise ValueError(f"linalg.vander: N must be positive, got {N}")
    col = x.unsqueeze(-1)
    if N == 1:
        return ones_like(col)
    return cumprod(cat([ones_like(col), col.expand(*x.shape, N - 1)], -1), -1)


def matrix_exp(A: Tensor) -> Tensor:  # noqa: N803
    """The matrix exponential of each (*, n, n) matrix."""
    return apply("linalg_matrix_exp", A)


# --- LU --------------------------------------------------------------------------------------


def lu(A: Tensor, *, pivot: bool = True) -> tuple[Tensor, Tensor, Tensor]:  # noqa: N803
    """``(P, L, U)`` with ``A = P L U``: P a permutation, L unit lower-triangular (m, k), U upper
    (k, n), k = min(m, n), partial pivoting as LAPACK."""
    p, low, up, _ = apply("linalg_lu", A, pivot=bool(pivot))
    return p, low, up


def _packed_lu(low: Tensor, up: Tensor) -> Tensor:
    from lucid.ops.shape import tril, triu

    m, n = low.shape[-2], up.shape[-1]
    k = min(m, n)
    strict_low = tril(low, -1)
    if m > k:
        return strict_low + apply("pad", triu(up), pad=(0, 0, 0, m - k), value=0)
    return apply("pad", strict_low, pad=(0, n - k), value=0) + triu(up)


def lu_factor(A: Tensor, *, pivot: bool = True) -> tuple[Tensor, Tensor]:  # noqa: N803
    """``(LU, pivots)``: L (without its unit diagonal) and U packed in one matrix, and LAPACK's
    1-based row interchanges (int32)."""
    _, low, up, pivots = apply("linalg_lu", A, pivot=bool(pivot))
    return _packed_lu(low, up), pivots


def _pivot_matrix(pivots: Tensor, m: int, dtype: Any) -> Tensor:
    """The permutation P (A = P L U) of LAPACK's row interchanges."""
    piv = pivots.numpy().astype(np.int64) - 1
    if np.any(piv < 0) or np.any(piv >= m):
        raise ValueError(f"linalg.lu_solve: pivots must lie in [1, {m}]")
    batch = piv.shape[:-1]
    flat = piv.reshape(-1, piv.shape[-1])
    perm = np.tile(np.arange(m), (flat.shape[0], 1))
    rows = np.arange(flat.shape[0])
    for j in range(flat.shape[1]):
        p = flat[:, j]
        perm[rows, j], perm[rows, p] = perm[rows, p], perm[rows, j].copy()
    out = np.zeros((flat.shape[0], m, m), dtype=dtype.numpy)
    out[rows[:, None], perm, np.arange(m)[None, :]] = 1
    return Tensor._wrap(out.reshape(batch + (m, m)))


def lu_solve(
    LU: Tensor,  # noqa: N803
    pivots: Tensor,
    B: Tensor,  # noqa: N803
    *,
    left: bool = True,
    adjoint: bool = False,
) -> Tensor:
    """Solve ``A X = B`` from ``lu_factor(A)`` (``X A = B`` when not ``left``; A^T in place of A
    with ``adjoint``). Differentiable in ``LU`` and ``B``."""
    if LU.ndim < 2 or LU.shape[-1] != LU.shape[-2]:
        raise ValueError(f"linalg.lu_solve: LU must be (*, n, n), got {tuple(LU.shape)}")
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return lu_solve(LU, pivots, B.mT, adjoint=not adjoint).mT
    p = _pivot_matrix(pivots, LU.shape[-1], LU.dtype)
    if adjoint:  # A^T X = B: U^T L^T P^T X = B
        y = solve_triangular(LU.mT, B, upper=False)
        return p @ solve_triangular(LU.mT, y, upper=True, unitriangular=True)
    y = solve_triangular(LU, p.mT @ B, upper=False, unitriangular=True)
    return solve_triangular(LU, y, upper=True)


# --- the *_ex spellings: an info code instead of an error -----------------------------------


def _lu_info(a: np.ndarray) -> np.ndarray:
    """getrf's info per matrix: the 1-based index of U's first exactly-zero pivot, 0 if none."""
    from lucid.ops.linalg import _lu_kernel

    up = _lu_kernel(a, True)[2]
    diag = np.diagonal(up, axis1=-2, axis2=-1)
    zero = diag == 0
    return np.where(zero.any(-1), zero.argmax(-1) + 1, 0).astype(np.int32)


def _cholesky_info(a: np.ndarray) -> np.ndarray:
    """potrf's info per matrix: the order of the first leading minor that is not positive
    definite, 0 if none."""
    flat = a.reshape((-1,) + a.shape[-2:])
    info = np.zeros(flat.shape[0], dtype=np.int32)
    for i, m in enumerate(flat):
        try:
            np.linalg.cholesky(m)
        except np.linalg.LinAlgError:
            info[i] = next(
                k for k in range(1, m.shape[0] + 1) if not _is_positive_definite(m[:k, :k])
            )
    return info.reshape(a.shape[:-2])


def _is_positive_definite(m: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        return False
    return True


def _raise_or_info(name: str, info: np.ndarray, check_errors: bool, what: str) -> Tensor:
    if check_errors and np.any(info):
        first = int(info[info != 0].reshape(-1)[0])
        raise ValueError(f"linalg.{name}: {what} (info = {first})")
    return Tensor._wrap(info)


def _guarded(A: Tensor, info: np.ndarray, fn) -> Tensor:  # noqa: N803
    """``fn`` of A with the failed matrices (info != 0) swapped for identities first and their
    results set to NaN afterwards, so the others keep their values and gradients."""
    if not np.any(info):
        return fn(A)
    from lucid.ops.creation import eye
    from lucid.ops.elementwise import where

    failed = Tensor._wrap((info != 0)[..., None, None])
    out = fn(where(failed, eye(A.shape[-1], dtype=A.dtype).expand(*A.shape), A))
    return where(failed.reshape(*info.shape, *([1] * (out.ndim - info.ndim))), float("nan"), out)


def inv_ex(A: Tensor, *, check_errors: bool = False) -> tuple[Tensor, Tensor]:  # noqa: N803
    """``(inverse, info)``: info (int32) > 0 marks a singular matrix (its inverse NaN) instead
    of raising, unless ``check_errors``."""
    info = _lu_info(A.detach().numpy())
    code = _raise_or_info("inv_ex", info, check_errors, "the matrix is singular")
    return _guarded(A, info, inv), code


def cholesky_ex(
    A: Tensor,  # noqa: N803
    *,
    upper: bool = False,
    check_errors: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(L, info)``: info (int32) > 0 is the order of the first leading minor that is not
    positive-definite (that factor NaN) instead of raising, unless ``check_errors``."""
    info = _cholesky_info(A.detach().numpy())
    code = _raise_or_info("cholesky_ex", info, check_errors, "the matrix is not positive-definite")
    return _guarded(A, info, lambda a: cholesky(a, upper=upper)), code


def solve_ex(
    A: Tensor,  # noqa: N803
    B: Tensor,  # noqa: N803
    *,
    left: bool = True,
    check_errors: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(X, info)``: ``solve`` with info (int32) > 0 marking a singular A (its X NaN)."""
    info = _lu_info(A.detach().numpy())
    code = _raise_or_info("solve_ex", info, check_errors, "the matrix is singular")
    return _guarded(A, info, lambda a: solve(a, B, left=left)), code


def lu_factor_ex(
    A: Tensor,  # noqa: N803
    *,
    pivot: bool = True,
    check_errors: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(LU, pivots, info)``: info (int32) > 0 is the 1-based index of U's first zero pivot
    (the factorisation is still complete, as LAPACK's)."""
    packed, pivots = lu_factor(A, pivot=pivot)
    info = _lu_info(A.detach().numpy())
    return packed, pivots, _raise_or_info("lu_factor_ex", info, check_errors, "U is singular")


# --- LDL (Bunch-Kaufman): LAPACK sytrf's factorisation, computed with numpy -------------------

_BUNCH_KAUFMAN_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _sytf2_lower(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Bunch-Kaufman diagonal pivoting of one symmetric matrix (its lower triangle), as LAPACK's
    unblocked sytf2: the compact LD, 1-based pivots (negative pairs mark 2x2 blocks), info."""
    w = np.tril(a).astype(np.float64)
    w = w + np.tril(w, -1).T  # work on the full symmetric matrix, read the lower triangle
    n = w.shape[0]
    piv = np.zeros(n, dtype=np.int32)
    info, k = 0, 0
    while k < n:
        step = 1
        absakk = abs(w[k, k])
        imax = k + 1 + int(np.argmax(np.abs(w[k + 1 :, k]))) if k < n - 1 else k
        colmax = abs(w[imax, k]) if k < n - 1 else 0.0
        if max(absakk, colmax) == 0.0 or np.isnan(absakk):
            info = info or k + 1
            kp = k
        else:
            if absakk >= _BUNCH_KAUFMAN_ALPHA * colmax:
                kp = k
            else:
                rowmax = np.max(np.abs(w[imax, k:imax]))
                if imax < n - 1:
                    rowmax = max(rowmax, np.max(np.abs(w[imax + 1 :, imax])))
                if absakk >= _BUNCH_KAUFMAN_ALPHA * colmax * (colmax / rowmax):
                    kp = k
                elif abs(w[imax, imax]) >= _BUNCH_KAUFMAN_ALPHA * rowmax:
                    kp = imax
                else:
                    kp, step = imax, 2
            kk = k + step - 1
            if kp != kk:  # symmetric interchange of kk and kp in the trailing matrix
                w[[kk, kp], k:] = w[[kp, kk], k:]
                w[k:, [kk, kp]] = w[k:, [kp, kk]]
            if step == 1:
                d11 = 1.0 / w[k, k]
                col = w[k + 1 :, k].copy()
                w[k + 1 :, k + 1 :] -= d11 * np.outer(col, col)
                w[k + 1 :, k] = col * d11
                w[k, k + 1 :] = w[k + 1 :, k]
            elif k < n - 2:
                d21 = w[k + 1, k]
                d11, d22 = w[k + 1, k + 1] / d21, w[k, k] / d21
                t = 1.0 / (d11 * d22 - 1.0)
                d21 = t / d21
                cols = w[k + 2 :, k : k + 2].copy()
                wk = d21 * (d11 * cols[:, 0] - cols[:, 1])
                wkp1 = d21 * (d22 * cols[:, 1] - cols[:, 0])
                w[k + 2 :, k + 2 :] -= np.outer(cols[:, 0], wk) + np.outer(cols[:, 1], wkp1)
                w[k + 2 :, k], w[k + 2 :, k + 1] = wk, wkp1
                w[k, k + 2 :], w[k + 1, k + 2 :] = wk, wkp1
        if step == 1:
            piv[k] = kp + 1
        else:
            piv[k] = piv[k + 1] = -(kp + 1)
        k += step
    return np.tril(w), piv, info


def _ldl_matrix(ld: np.ndarray, piv: np.ndarray) -> np.ndarray:
    """A = M D M^T rebuilt from sytrf's compact form, M = P(1) L(1) P(2) L(2) ..."""
    n = ld.shape[0]
    m, d, k = np.eye(n), np.zeros((n, n)), 0
    while k < n:
        step = 1 if piv[k] > 0 else 2
        swap = (k if step == 1 else k + 1), abs(int(piv[k])) - 1
        perm = np.eye(n)
        perm[list(swap)] = perm[list(swap[::-1])]
        unit = np.eye(n)
        unit[k + step :, k : k + step] = ld[k + step :, k : k + step]
        d[k : k + step, k : k + step] = np.tril(ld[k : k + step, k : k + step])
        d[k : k + step, k : k + step] += np.tril(ld[k : k + step, k : k + step], -1).T
        m = m @ perm @ unit
        k += step
    return m @ d @ m.T


def ldl_factor_ex(
    A: Tensor,  # noqa: N803
    *,
    hermitian: bool = False,
    check_errors: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(LD, pivots, info)``: the Bunch-Kaufman factorisation A = P L D L^T P^T of symmetric
    matrices (their lower triangle read), in LAPACK sytrf's compact form. Not differentiable
    (as in torch); info > 0 marks an exactly singular D."""
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"linalg.ldl_factor: expected (*, n, n) matrices, got {tuple(A.shape)}")
    if not A.dtype.is_floating_point:
        raise TypeError(f"linalg.ldl_factor: expected a floating point matrix, got {A.dtype}")
    a = A.detach().numpy()
    flat = a.reshape((-1,) + a.shape[-2:])
    results = [_sytf2_lower(m) for m in flat]
    ld = np.stack([r[0] for r in results]).reshape(a.shape).astype(a.dtype)
    piv = np.stack([r[1] for r in results]).reshape(a.shape[:-1])
    info = np.array([r[2] for r in results], dtype=np.int32).reshape(a.shape[:-2])
    code = _raise_or_info("ldl_factor_ex", info, check_errors, "D is singular")
    return Tensor._wrap(ld), Tensor._wrap(piv), code


def ldl_factor(A: Tensor, *, hermitian: bool = False) -> tuple[Tensor, Tensor]:  # noqa: N803
    """``(LD, pivots)`` of ``ldl_factor_ex``, raising when D is singular."""
    ld, piv, _ = ldl_factor_ex(A, hermitian=hermitian, check_errors=True)
    return ld, piv


def ldl_solve(
    LD: Tensor,  # noqa: N803
    pivots: Tensor,
    B: Tensor,  # noqa: N803
    *,
    hermitian: bool = False,
) -> Tensor:
    """X with A X = B from ``ldl_factor(A)``; differentiable in B."""
    if LD.ndim < 2 or LD.shape[-1] != LD.shape[-2]:
        raise ValueError(f"linalg.ldl_solve: LD must be (*, n, n), got {tuple(LD.shape)}")
    ld, piv = LD.detach().numpy(), pivots.numpy()
    flat_ld = ld.reshape((-1,) + ld.shape[-2:])
    flat_piv = piv.reshape((-1, piv.shape[-1]))
    rebuilt = np.stack([_ldl_matrix(m, p) for m, p in zip(flat_ld, flat_piv, strict=True)])
    a = Tensor._wrap(rebuilt.reshape(ld.shape).astype(ld.dtype))
    return solve(a, B)
