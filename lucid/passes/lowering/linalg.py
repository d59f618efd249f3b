"""Lowering rules and refusals of the ``lucid.linalg`` factorisations and the index-valued
searches: ``searchsorted`` (a broadcast comparison counted along the sequence), refusals for the
matrix factorisations (no prim op solves or factorises a matrix) and for ``bincount``/``unique``
(their result shapes depend on the input's values).
"""

from __future__ import annotations

from lucid import _dtype
from lucid.passes.lowering._core import PV, Builder, rule, unsupported

_FACTORISATION = (
    "it factorises a matrix (LU, Cholesky, QR, SVD, a symmetric eigensolver, or the matrix "
    "exponential's scaling and squaring) and prim has no "
    "such op; "
    "the compiled path runs it eagerly"
)
for _name in (
    "linalg_inv",
    "linalg_det",
    "linalg_solve",
    "linalg_cholesky",
    "linalg_eigh",
    "linalg_qr",
    "linalg_svd",
    "linalg_lu",
    "linalg_matrix_exp",
    "linalg_pinv",
):
    unsupported(_name, _FACTORISATION)
unsupported("bincount", "its output length depends on the input's values (a graph break)")
unsupported("unique", "its output shape depends on the input's values (a graph break)")


@rule("searchsorted")
def _searchsorted(b: Builder, seq: PV, values: PV, right):
    """Count the sequence entries before each value's insertion point. NaN sorts last, as in
    eager's numpy: a NaN value goes after every number (``left``) or after everything
    (``right``)."""
    work = _dtype.result_type(seq, values)
    seq, values = b.cast(seq, work), b.cast(values, work)
    n = seq.shape[-1] if seq.ndim else 1
    if seq.ndim <= 1:
        row = b.reshape(seq, (1,) * values.ndim + (n,))
    else:  # one sorted row per leading index: rows against their values, (..., m, n)
        row = b.reshape(seq, seq.shape[:-1] + (1, n))
    query = b.reshape(values, values.shape + (1,))
    before = b.op("le" if right else "lt", row, query)
    if work.is_floating_point:
        nan_value = b.op("isnan", query)
        if not right:  # a NaN value goes before the sequence's own NaNs
            nan_value = b.op("logical_and", nan_value, b.op("logical_not", b.op("isnan", row)))
        before = b.op("logical_or", before, nan_value)
    count = b.reduce("reduce_sum", b.cast(before, _dtype.int64), (before.ndim - 1,))
    return b.reshape(count, b.outs[0].shape)
