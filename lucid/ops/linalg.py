"""Linear algebra: matmul (``@``), mm, bmm, einsum, outer, dot.

``matmul`` and ``einsum`` are registry ops; ``mm``, ``bmm``, ``dot`` and ``outer`` are composites
that add PyTorch's stricter shape checks. ``einsum`` equations are canonicalised in the front
(``...`` becomes explicit letters, the implicit output is spelled out), so the op's attribute is a
plain equation whose VJP is an einsum too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid._dispatch import apply
from lucid._dtype import result_type
from lucid._tensor import Tensor, _tensor_from
from lucid.ops._front import tensor_method
from lucid.ops._registry import (
    PROMOTE,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    broadcast_shapes,
    register,
)

__all__ = [
    "matmul",
    "mm",
    "bmm",
    "einsum",
    "outer",
    "dot",
    "inner",
    "tensordot",
    "kron",
    "cross",
    "addmm",
    "addmv",
    "baddbmm",
    "cdist",
    "dist",
    "block_diag",
]

_PROPS = frozenset({PROMOTE, SYMBOLIC_BATCH_SAFE})


# --- matmul -------------------------------------------------------------------------------------


def _matmul_infer(x, y):
    xs, ys = tuple(getattr(x, "shape", ())), tuple(getattr(y, "shape", ()))
    if len(xs) == 0 or len(ys) == 0:
        raise ValueError(f"matmul: both arguments need at least 1 dim, got shapes {xs} and {ys}")
    x2 = (1, *xs) if len(xs) == 1 else xs
    y2 = (*ys, 1) if len(ys) == 1 else ys
    k1, k2 = x2[-1], y2[-2]
    if k1 is not None and k2 is not None and k1 != k2:
        raise ValueError(
            f"matmul: shapes {xs} and {ys} cannot be multiplied ({k1} != {k2} in the contracted "
            "dim)"
        )
    batch = broadcast_shapes(x2[:-2], y2[:-2], op=f"matmul of {xs} and {ys}: batch dims")
    out = batch + ((x2[-2],) if len(xs) > 1 else ()) + ((y2[-1],) if len(ys) > 1 else ())
    return AVal(out, result_type(x, y))


def _matmul_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.matmul(x, y)


def _matmul_vjp(c, g):
    x, y = c.inputs
    if x.ndim == 1 and y.ndim == 1:
        return g * y, g * x
    # Promote 1-d operands to matrices as matmul does, so one pair of products covers every case;
    # autograd then sums broadcast batch dims back to each operand's shape.
    x2 = x.unsqueeze(0) if x.ndim == 1 else x
    y2 = y.unsqueeze(-1) if y.ndim == 1 else y
    g2 = g.unsqueeze(-2) if x.ndim == 1 else g
    g2 = g2.unsqueeze(-1) if y.ndim == 1 else g2
    gx = gy = None
    if c.needs_input_grad[0]:
        gx = matmul(g2, y2.mT)
        gx = gx.squeeze(-2) if x.ndim == 1 else gx
    if c.needs_input_grad[1]:
        gy = matmul(x2.mT, g2)
        gy = gy.squeeze(-1) if y.ndim == 1 else gy
    return gx, gy


register(
    OpDef(
        "matmul",
        ("x", "y"),
        _matmul_infer,
        _matmul_kernel,
        _matmul_vjp,
        props=_PROPS,
        saves_outputs=False,
    )
)


def _as_tensor(v: Any) -> Any:
    if isinstance(v, (Tensor, bool, int, float)):
        return v
    return _tensor_from(v)


@tensor_method("matmul", "__matmul__")
def matmul(x: Tensor, y: Tensor) -> Tensor:
    """Matrix product with PyTorch's rules: 1-d·1-d is a dot product, a 1-d operand is a row
    (left) or column (right) vector that is dropped from the result, and leading dims are batch
    dims that broadcast."""
    return apply("matmul", x, _as_tensor(y))


def _rmatmul(y: Tensor, x: Any) -> Tensor:
    return apply("matmul", _as_tensor(x), y)


Tensor.__rmatmul__ = _rmatmul


@tensor_method()
def mm(x: Tensor, y: Tensor) -> Tensor:
    """Product of two matrices (both strictly 2-d); either may be a ``lucid.sparse`` matrix."""
    if getattr(x, "is_sparse", False) or getattr(y, "is_sparse", False):
        from lucid import sparse

        return sparse.mm(x, y)
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(
            f"mm: both arguments must be 2-d matrices, got shapes {tuple(x.shape)} and "
            f"{tuple(y.shape)}"
        )
    return matmul(x, y)


@tensor_method()
def bmm(x: Tensor, y: Tensor) -> Tensor:
    """Batched product of (b, n, m) and (b, m, p) tensors: strictly 3-d, equal batch sizes."""
    if x.ndim != 3 or y.ndim != 3:
        raise ValueError(
            f"bmm: both arguments must be 3-d, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    bx, by = x.shape[0], y.shape[0]
    if bx is not None and by is not None and bx != by:
        raise ValueError(
            f"bmm: batch sizes differ: {tuple(x.shape)} and {tuple(y.shape)} ({bx} != {by})"
        )
    return matmul(x, y)


@tensor_method()
def dot(x: Tensor, y: Tensor) -> Tensor:
    """Dot product of two 1-d tensors of the same length."""
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(
            f"dot: both arguments must be 1-d, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape[0] is not None and y.shape[0] is not None and x.shape[0] != y.shape[0]:
        raise ValueError(
            f"dot: the lengths differ: {x.shape[0]} and {y.shape[0]} (shapes {tuple(x.shape)} "
            f"and {tuple(y.shape)})"
        )
    return matmul(x, y)


@tensor_method("outer", "ger")
def outer(x: Tensor, y: Tensor) -> Tensor:
    """The outer product ``x[i] * y[j]`` of two 1-d tensors."""
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(
            f"outer: both arguments must be 1-d, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    return x.unsqueeze(1) * y.unsqueeze(0)


# --- einsum -------------------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _tokens(term: str, equation: str) -> list[str]:
    out, i = [], 0
    while i < len(term):
        if term.startswith("...", i):
            out.append("...")
            i += 3
        elif term[i] in _LETTERS:
            out.append(term[i])
            i += 1
        else:
            raise ValueError(f"einsum: invalid subscript {term[i]!r} in equation {equation!r}")
    if out.count("...") > 1:
        raise ValueError(f"einsum: more than one '...' in term {term!r} of {equation!r}")
    return out


def canonical_equation(equation: str, ndims: Sequence[int]) -> str:
    """``equation`` with ``...`` replaced by fresh letters and the output spelled out.

    Ellipsis dims broadcast from the right, as numpy's; if the output omits ``...``, the
    ellipsis dims are summed.
    """
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ValueError(f"einsum: more than one '->' in {equation!r}")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_tokens(t, equation) for t in lhs.split(",")]
    if len(terms) != len(ndims):
        raise ValueError(
            f"einsum: the equation {equation!r} has {len(terms)} operand terms but "
            f"{len(ndims)} operands were given"
        )
    used = {ch for ch in eq if ch in _LETTERS}
    fresh = [ch for ch in _LETTERS if ch not in used]
    n_ell = 0
    for i, (term, nd) in enumerate(zip(terms, ndims, strict=True)):
        n_labels = len(term) - ("..." in term)
        if n_labels > nd or ("..." not in term and n_labels != nd):
            raise ValueError(
                f"einsum: term {''.join(term)!r} of {equation!r} has {n_labels} subscripts but "
                f"operand {i} has {nd} dims"
            )
        if "..." in term:
            n_ell = max(n_ell, nd - n_labels)
    if n_ell > len(fresh):
        raise ValueError(f"einsum: too many dims for {equation!r}")
    ell = fresh[:n_ell]

    def spell(term: list[str], nd: int) -> str:
        k = nd - (len(term) - 1)
        return "".join(("".join(ell[n_ell - k :]) if tok == "..." else tok) for tok in term)

    ins = [spell(t, nd) for t, nd in zip(terms, ndims, strict=True)]
    if arrow:
        out_tokens = _tokens(rhs, equation)
        labels = [t for t in out_tokens if t != "..."]
        if len(set(labels)) != len(labels):
            raise ValueError(f"einsum: an output subscript repeats in {equation!r}")
        for t in labels:
            if not any(t in term for term in terms):
                raise ValueError(
                    f"einsum: output subscript {t!r} appears in no input of {equation!r}"
                )
        out = spell(out_tokens, len(out_tokens) - 1 + n_ell) if "..." in out_tokens else rhs
    else:
        counts: dict[str, int] = {}
        for term in terms:
            for t in term:
                if t != "...":
                    counts[t] = counts.get(t, 0) + 1
        out = "".join(ell) + "".join(sorted(t for t, n in counts.items() if n == 1))
    return ",".join(ins) + "->" + out


def _label_sizes(equation: str, shapes: Sequence[tuple]) -> dict[str, Any]:
    lhs, _, _ = equation.partition("->")
    sizes: dict[str, Any] = {}
    for i, (term, shape) in enumerate(zip(lhs.split(","), shapes, strict=True)):
        for label, n in zip(term, shape, strict=True):
            have = sizes.get(label, 1)
            if n == 1:
                sizes.setdefault(label, 1)
            elif n is None:
                if have == 1:
                    sizes[label] = None
            elif have in (1, None):
                sizes[label] = n
            elif have != n:
                raise ValueError(
                    f"einsum: subscript {label!r} has size {have} in one operand and {n} in "
                    f"operand {i} ({equation!r}, shapes {[tuple(s) for s in shapes]})"
                )
    return sizes


def _einsum_infer(operands, equation):
    if not operands:
        raise ValueError("einsum: needs at least one operand")
    shapes = [tuple(getattr(x, "shape", ())) for x in operands]
    eq = canonical_equation(equation, [len(s) for s in shapes])
    sizes = _label_sizes(eq, shapes)
    out = eq.partition("->")[2]
    return AVal(tuple(sizes[label] for label in out), result_type(*operands))


def _einsum_kernel(operands: list, equation: str) -> np.ndarray:
    eq = canonical_equation(equation, [a.ndim for a in operands])
    # optimize=True contracts pairs through BLAS (tensordot) instead of einsum's own C loop.
    r = np.einsum(eq, *operands, optimize=len(operands) > 1)
    if any(np.may_share_memory(r, a) for a in operands):
        r = r.copy()  # einsum may return a view (a transpose, a diagonal)
    return r


def _einsum_operand_grad(g, operands, k, eq, shape):
    """The gradient of operand ``k`` of the canonical einsum ``eq``, as an einsum of ``g``."""
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    term = terms[k]
    others = [t for j, t in enumerate(terms) if j != k]
    available = set(out).union(*others)
    uniq = list(dict.fromkeys(term))
    keep = "".join(label for label in uniq if label in available)
    inputs = [g] + [x for j, x in enumerate(operands) if j != k]
    grad = apply("einsum", inputs, equation=",".join([out, *others]) + "->" + keep)
    first = {label: shape[term.index(label)] for label in uniq}
    if len(keep) != len(uniq):
        # Labels summed inside this operand alone: their gradient is g broadcast along them.
        grad = grad.reshape(
            tuple(grad.shape[keep.index(lab)] if lab in keep else 1 for lab in uniq)
        )
        grad = grad.expand(*(-1 if lab in keep else first[lab] for lab in uniq))
    if len(uniq) != len(term):
        # A repeated label reads a diagonal: its gradient lives on the diagonal, placed there by
        # products with identity matrices.
        used = set(eq)
        fresh = iter(ch for ch in _LETTERS if ch not in used)
        spelled, eyes, seen = [], [], set()
        for label in term:
            if label in seen:
                new = next(fresh)
                spelled.append(new)
                n = first[label]
                eyes.append((label + new, Tensor._wrap(np.eye(n, dtype=grad.dtype.numpy))))
            else:
                spelled.append(label)
                seen.add(label)
        sub = ",".join(["".join(uniq), *(s for s, _ in eyes)]) + "->" + "".join(spelled)
        grad = apply("einsum", [grad, *(e for _, e in eyes)], equation=sub)
    return grad


def _einsum_vjp(c, g):
    operands = c.inputs[0]
    eq = canonical_equation(c.attrs["equation"], [x.ndim for x in operands])
    grads = []
    for k, (x, need) in enumerate(zip(operands, c.needs_input_grad, strict=True)):
        grads.append(_einsum_operand_grad(g, operands, k, eq, tuple(x.shape)) if need else None)
    return (grads,)


register(
    OpDef(
        "einsum",
        ("operands*",),
        _einsum_infer,
        _einsum_kernel,
        _einsum_vjp,
        attrs={"equation": ""},
        props=frozenset({PROMOTE}),
        saves_outputs=False,
    )
)


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation, as ``torch.einsum``: ``einsum("bij,bjk->bik", a, b)``. Supports
    ``...``, the implicit output (labels used once, in alphabetical order), repeated labels
    (diagonals) and size-1 broadcasting."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    for i, x in enumerate(operands):
        if not isinstance(x, Tensor):
            raise TypeError(f"einsum: operand {i} is a {type(x).__name__}, not a Tensor")
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a string, got {type(equation).__name__}")
    eq = canonical_equation(equation, [x.ndim for x in operands])
    return apply("einsum", list(operands), equation=eq)


# --- composites of matmul, einsum, reductions and shape ops ------------------------------------


@tensor_method()
def inner(x: Tensor, y: Tensor) -> Tensor:
    """Sum over the last dims of ``x`` and ``y``: ``inner(x, y)[i..., j...]``; scalars
    multiply."""
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    return tensordot(x, y, ([-1], [-1]))


def tensordot(x: Tensor, y: Tensor, dims: Any = 2) -> Tensor:
    """Contract the last ``dims`` dims of ``x`` with the first ``dims`` of ``y``, or the dim
    lists ``dims = (dims_x, dims_y)``."""
    if isinstance(dims, int):
        if dims < 0:
            raise ValueError(f"tensordot: dims must be non-negative, got {dims}")
        dx, dy = list(range(x.ndim - dims, x.ndim)), list(range(dims))
    else:
        dx, dy = ([d] if isinstance(d, int) else list(d) for d in dims)
    dx = [d % x.ndim for d in dx]
    dy = [d % y.ndim for d in dy]
    if len(dx) != len(dy):
        raise ValueError(f"tensordot: {len(dx)} dims of x but {len(dy)} dims of y to contract")
    for a, b in zip(dx, dy, strict=True):
        if x.shape[a] != y.shape[b]:
            raise ValueError(
                f"tensordot: contracted dims differ in size: x dim {a} is {x.shape[a]}, "
                f"y dim {b} is {y.shape[b]}"
            )
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lx = [next(letters) for _ in range(x.ndim)]
    ly = [next(letters) for _ in range(y.ndim)]
    for a, b in zip(dx, dy, strict=True):
        ly[b] = lx[a]
    out = [c for i, c in enumerate(lx) if i not in dx] + [
        c for i, c in enumerate(ly) if i not in dy
    ]
    return einsum(f"{''.join(lx)},{''.join(ly)}->{''.join(out)}", x, y)


@tensor_method()
def kron(x: Tensor, y: Tensor) -> Tensor:
    """The Kronecker product: block ``(i, j)`` of the result is ``x[i, j] * y`` (any ndim; the
    shorter shape is padded with leading 1s)."""
    n = max(x.ndim, y.ndim)
    xs = (1,) * (n - x.ndim) + tuple(x.shape)
    ys = (1,) * (n - y.ndim) + tuple(y.shape)
    # Interleave the dims: x's on even positions, y's on odd ones, then merge each pair.
    xe = x.reshape(*[d for s in xs for d in (s, 1)])
    ye = y.reshape(*[d for s in ys for d in (1, s)])
    return (xe * ye).reshape(*[a * b for a, b in zip(xs, ys, strict=True)])


@tensor_method()
def cross(x: Tensor, y: Tensor, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (the first dim of size 3 when None; inputs
    broadcast)."""
    from lucid.ops.shape import broadcast_to, stack

    shape = broadcast_shapes(tuple(x.shape), tuple(y.shape), op="cross")
    x, y = broadcast_to(x, shape), broadcast_to(y, shape)
    if dim is None:
        dim = next((i for i, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise ValueError(f"cross: no dimension of size 3 in shape {shape}")
    dim = dim % len(shape)
    if shape[dim] != 3:
        raise ValueError(f"cross: dimension {dim} must have size 3, got {shape[dim]}")
    a0, a1, a2 = x.unbind(dim)
    b0, b1, b2 = y.unbind(dim)
    return stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim)


# Not exported as lucid.trace: that name is the tracer package (lucid/trace); Tensor.trace only.
@tensor_method()
def trace(x: Tensor) -> Tensor:
    """The sum of a matrix's main diagonal."""
    if x.ndim != 2:
        raise ValueError(f"trace: expected a matrix, got shape {tuple(x.shape)}")
    return x.diagonal().sum()


def _scaled_sum(base: Tensor, product: Tensor, beta: float, alpha: float) -> Tensor:
    product = product if alpha == 1 else product * alpha
    if beta == 0:  # as torch: base is ignored (its NaNs and infinities do not propagate)
        return product
    return (base if beta == 1 else base * beta) + product


@tensor_method()
def addmm(
    input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1
) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (mat1 @ mat2)``."""
    return _scaled_sum(input, mm(mat1, mat2), beta, alpha)


@tensor_method()
def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (mat @ vec)``."""
    if mat.ndim != 2 or vec.ndim != 1:
        raise ValueError(
            f"addmv: expected a matrix and a vector, got shapes {tuple(mat.shape)} and "
            f"{tuple(vec.shape)}"
        )
    return _scaled_sum(input, matmul(mat, vec), beta, alpha)


@tensor_method()
def baddbmm(
    input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1
) -> Tensor:  # noqa: A002
    """``beta * input + alpha * (batch1 @ batch2)`` for 3-d batches."""
    return _scaled_sum(input, bmm(batch1, batch2), beta, alpha)


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str | None = None) -> Tensor:
    """Pairwise p-norm distances between the rows of ``x1`` (..., P, M) and ``x2`` (..., R, M):
    (..., P, R)."""
    if x1.ndim < 2 or x2.ndim < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"cdist: expected (..., P, M) and (..., R, M) inputs, got {tuple(x1.shape)} and "
            f"{tuple(x2.shape)}"
        )
    if p < 0:
        raise ValueError(f"cdist: p must be non-negative, got {p}")
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).type(diff.dtype).sum(-1)
    if p == float("inf"):
        return diff.amax(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        # sqrt has no finite derivative at 0: the distance of equal rows gets a zero gradient.
        from lucid.ops.elementwise import where

        squared = (diff * diff).sum(-1)
        positive = squared > 0
        return where(positive, where(positive, squared, 1.0) ** 0.5, 0.0)
    return (diff**p).sum(-1) ** (1.0 / p)


@tensor_method()
def dist(x: Tensor, y: Tensor, p: float = 2) -> Tensor:
    """The p-norm of ``x - y`` (inputs broadcast)."""
    diff = (x - y).abs().reshape(-1)
    if p == float("inf"):
        return diff.amax()
    if p == 0:
        return (diff != 0).type(diff.dtype).sum()
    return (diff**p).sum() ** (1.0 / p)


def block_diag(*tensors: Tensor) -> Tensor:
    """The block-diagonal matrix of the given matrices (0-d and 1-d inputs count as 1 x n)."""
    from lucid.ops.shape import cat

    mats = [t.reshape(1, -1) if t.ndim < 2 else t for t in tensors]
    if any(m.ndim != 2 for m in mats):
        raise ValueError("block_diag: inputs must have at most 2 dims")
    if not mats:
        from lucid.ops.creation import zeros

        return zeros(1, 0)
    cols = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        right = cols - left - m.shape[1]
        rows.append(apply("pad", m, pad=(left, right), value=0))
        left += m.shape[1]
    return cat(rows, 0)


# --- lucid.linalg: inv, det, solve, cholesky, eigh (registry ops) and the norms ---------------


def _square_infer(name: str):
    def check(a) -> tuple:
        shape = tuple(getattr(a, "shape", ()))
        if len(shape) < 2 or (None not in shape[-2:] and shape[-1] != shape[-2]):
            raise ValueError(f"{name}: expected a (..., n, n) matrix, got shape {shape}")
        if not a.dtype.is_floating_point:
            raise TypeError(f"{name}: expected a floating point matrix, got {a.dtype}")
        return shape

    return check


_check_inv = _square_infer("linalg.inv")
_check_det = _square_infer("linalg.det")
_check_solve = _square_infer("linalg.solve")
_check_cholesky = _square_infer("linalg.cholesky")
_check_eigh = _square_infer("linalg.eigh")


def _numpy_linalg(fn, *arrays, name: str):
    try:
        return fn(*arrays)
    except np.linalg.LinAlgError as exc:
        raise ValueError(
            f"{name}: {exc} (the matrix is singular or not positive-definite)"
        ) from None


def _inv_vjp(c, g):
    inv_t = c.outputs[0].mT
    return (-(inv_t @ g @ inv_t),)


register(
    OpDef(
        "linalg_inv",
        ("a",),
        lambda a: AVal(_check_inv(a), a.dtype),
        lambda a: _numpy_linalg(np.linalg.inv, a, name="linalg.inv"),
        _inv_vjp,
        saves_inputs=False,
    )
)


def _det_vjp(c, g):
    (a,), (det,) = c.inputs, c.outputs
    scale = (g * det).unsqueeze(-1).unsqueeze(-1)
    return (scale * apply("linalg_inv", a).mT,)


register(
    OpDef(
        "linalg_det",
        ("a",),
        lambda a: AVal(_check_det(a)[:-2], a.dtype),
        lambda a: np.asarray(np.linalg.det(a), dtype=a.dtype),
        _det_vjp,
    )
)


def _solve_infer(a, b):
    shape = _check_solve(a)
    bs = tuple(b.shape)
    vector = len(bs) == 1
    n = shape[-1]
    if (bs[0] if vector else (bs[-2] if len(bs) >= 2 else None)) not in (n, None):
        raise ValueError(
            f"linalg.solve: A of shape {shape} and B of shape {bs} do not match (B needs {n} rows)"
        )
    if vector:
        return AVal(shape[:-2] + (n,), result_type(a, b))
    batch = broadcast_shapes(shape[:-2], bs[:-2], op="linalg.solve batch dims")
    return AVal(batch + bs[-2:], result_type(a, b))


def _solve_kernel(a, b):
    if b.ndim == 1:
        return _numpy_linalg(lambda m, v: np.linalg.solve(m, v[..., None])[..., 0], a, b,
                             name="linalg.solve")  # fmt: skip
    return _numpy_linalg(np.linalg.solve, a, b, name="linalg.solve")


def _solve_vjp(c, g):
    (a, b), (x,) = c.inputs, c.outputs
    gb = apply("linalg_solve", a.mT, g)
    ga = None
    if c.needs_input_grad[0]:
        ga = -(gb.unsqueeze(-1) * x.unsqueeze(-2)) if b.ndim == 1 else -(gb @ x.mT)
    return ga, gb


register(
    OpDef(
        "linalg_solve",
        ("a", "b"),
        _solve_infer,
        _solve_kernel,
        _solve_vjp,
        props=frozenset({PROMOTE}),
    )  # fmt: skip
)


def _cholesky_vjp(c, g):
    # Murray (2016): with P = Phi(L^T G) (lower triangle, diagonal halved),
    # grad A = sym(L^-T P L^-1), sym(X) = (X + X^T) / 2.
    from lucid.ops.shape import tril

    (low,) = c.outputs
    phi = tril(low.mT @ tril(g))
    phi = phi - 0.5 * phi.diagonal(0, -2, -1).diag_embed()
    low_inv = apply("linalg_inv", low)
    grad = low_inv.mT @ phi @ low_inv
    return (0.5 * (grad + grad.mT),)


register(
    OpDef(
        "linalg_cholesky",
        ("a",),
        lambda a: AVal(_check_cholesky(a), a.dtype),
        lambda a: _numpy_linalg(np.linalg.cholesky, a, name="linalg.cholesky"),
        _cholesky_vjp,
        saves_inputs=False,
    )
)


def _eigh_vjp(c, g_values, g_vectors):
    # grad A = V (diag(g_values) + F o skew(V^T g_vectors)) V^T, F_ij = 1 / (l_j - l_i).
    values, vectors = c.outputs
    inner = 0
    if g_vectors is not None:
        vtg = vectors.mT @ g_vectors
        gaps = values.unsqueeze(-2) - values.unsqueeze(-1)
        off_diagonal = 1.0 - Tensor._wrap(np.eye(values.shape[-1], dtype=values.dtype.numpy))
        safe = gaps + (1.0 - off_diagonal)
        inner = 0.5 * (vtg - vtg.mT) / safe * off_diagonal
    if g_values is not None:
        inner = inner + g_values.diag_embed()
    return (vectors @ inner @ vectors.mT,)


def _eigh_kernel(a, UPLO):  # noqa: N803
    values, vectors = _numpy_linalg(lambda m: np.linalg.eigh(m, UPLO=UPLO), a, name="linalg.eigh")
    return values.astype(a.dtype), vectors.astype(a.dtype)


register(
    OpDef(
        "linalg_eigh",
        ("a",),
        lambda a, UPLO: (AVal(_check_eigh(a)[:-1], a.dtype), AVal(tuple(a.shape), a.dtype)),  # noqa: N803
        _eigh_kernel,
        _eigh_vjp,
        attrs={"UPLO": "L"},
        n_outputs=2,
        saves_inputs=False,
    )
)


# --- QR and SVD ------------------------------------------------------------------------------


def _check_float_matrix(name: str, a) -> tuple:
    shape = tuple(getattr(a, "shape", ()))
    if len(shape) < 2:
        raise ValueError(f"{name}: expected a (..., m, n) matrix, got shape {shape}")
    if not a.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating point matrix, got {a.dtype}")
    return shape


def _qr_infer(a, mode):
    shape = _check_float_matrix("linalg.qr", a)
    if mode not in ("reduced", "complete"):
        raise ValueError(f"linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    m, n = shape[-2:]
    k = m if mode == "complete" or None in (m, n) else min(m, n)
    return AVal(shape[:-2] + (m, k), a.dtype), AVal(shape[:-2] + (k, n), a.dtype)


def _qr_kernel(a, mode):
    q, r = np.linalg.qr(a, mode=mode)
    return q.astype(a.dtype), r.astype(a.dtype)


def _copy_lower_to_upper(m):
    from lucid.ops.shape import tril

    low = tril(m, -1)
    return low + low.mT + m.diagonal(0, -2, -1).diag_embed()


def _square_qr_vjp(q, r, g_q, g_r):
    # A = QR with m >= n (Q m x n): M = R gR^T - gQ^T Q,
    # grad A = (gQ + Q copyltu(M)) R^-T, copyltu mirroring M's lower triangle upwards.
    m = r @ g_r.mT - g_q.mT @ q
    b = g_q + q @ _copy_lower_to_upper(m)
    return apply("linalg_solve", r, b.mT).mT


def _qr_vjp(c, g_q, g_r):
    from lucid.ops.creation import zeros_like

    (q, r) = c.outputs
    rows, cols = q.shape[-2], r.shape[-1]
    if c.attrs["mode"] == "complete" and rows > cols:
        raise ValueError(
            "linalg.qr: mode='complete' with more rows than columns has no gradient (the extra "
            "columns of Q are not determined by A); use mode='reduced'"
        )
    g_q = zeros_like(q) if g_q is None else g_q
    g_r = zeros_like(r) if g_r is None else g_r
    if rows >= cols:
        return (_square_qr_vjp(q, r, g_q, g_r),)
    # A = [X | Y] with X = Q R_X square and Y = Q R_Y: R_Y's gradient reaches Y through Q and
    # adds Y gR_Y^T to Q's gradient for the square part.
    from lucid.ops.shape import cat

    a = c.inputs[0]
    y = a[..., rows:]
    g_ry = g_r[..., rows:]
    g_x = _square_qr_vjp(q, r[..., :rows], g_q + y @ g_ry.mT, g_r[..., :rows])
    return (cat([g_x, q @ g_ry], -1),)


register(
    OpDef(
        "linalg_qr",
        ("a",),
        _qr_infer,
        _qr_kernel,
        _qr_vjp,
        attrs={"mode": "reduced"},
        n_outputs=2,
        doc="The QR factorisation: Q with orthonormal columns and upper-triangular R.",
    )
)


def _svd_infer(a, full_matrices, values_only):
    shape = _check_float_matrix("linalg.svd", a)
    m, n = shape[-2:]
    k = None if None in (m, n) else min(m, n)
    batch = shape[:-2]
    u_cols, vh_rows = (m, n) if full_matrices else (k, k)
    return (
        AVal(batch + (m, u_cols), a.dtype),
        AVal(batch + (k,), a.dtype),
        AVal(batch + (vh_rows, n), a.dtype),
    )


def _svd_kernel(a, full_matrices, values_only):
    u, s, vh = _numpy_linalg(
        lambda x: np.linalg.svd(x, full_matrices=full_matrices), a, name="linalg.svd"
    )
    return u.astype(a.dtype), s.astype(a.dtype), vh.astype(a.dtype)


def _svd_vjp(c, g_u, g_s, g_vh):
    # PyTorch's svd_backward (real case), on the reduced factors (full_matrices' extra columns
    # carry no gradient). With E_ij = s_j^2 - s_i^2 off the diagonal (1 on it),
    # J = skew(U^T gU), K = skew(V^T gV), skew(X) = X - X^T:
    #   grad A = U ((J S + S K) / E + diag(gS)) V^T
    #            + (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T).
    # Repeated singular values divide by zero; a zero one does so when U or V is differentiated.
    u, s, vh = c.outputs
    if c.attrs["values_only"]:  # svdvals: U and Vh never reach the user
        g_u = g_vh = None
    k = s.shape[-1]
    rows, cols = u.shape[-2], vh.shape[-1]
    u, vh = u[..., :k], vh[..., :k, :]
    g_u = None if g_u is None else g_u[..., :k]
    g_vh = None if g_vh is None else g_vh[..., :k, :]
    if g_u is None and g_vh is None:
        return (u @ (g_s.unsqueeze(-1) * vh),) if g_s is not None else (None,)
    s_row, s_col = s.unsqueeze(-2), s.unsqueeze(-1)
    squares = s * s
    eye = Tensor._wrap(np.eye(k, dtype=s.dtype.numpy))
    gaps = squares.unsqueeze(-2) - squares.unsqueeze(-1) + eye
    inner = 0
    if g_u is not None:
        j = u.mT @ g_u
        inner = (j - j.mT) * s_row
    if g_vh is not None:
        kv = vh @ g_vh.mT
        inner = inner + s_col * (kv - kv.mT)
    inner = inner / gaps
    if g_s is not None:
        inner = inner + g_s.diag_embed()
    if rows > cols and g_u is not None:
        g_u_scaled = g_u / s_row
        return ((u @ inner + g_u_scaled - u @ (u.mT @ g_u_scaled)) @ vh,)
    if rows < cols and g_vh is not None:
        scaled_g_vh = g_vh / s_col
        return (u @ (inner @ vh + scaled_g_vh - (scaled_g_vh @ vh.mT) @ vh),)
    return (u @ inner @ vh,)


register(
    OpDef(
        "linalg_svd",
        ("a",),
        _svd_infer,
        _svd_kernel,
        _svd_vjp,
        # values_only (svdvals): only S is handed out, so U's and Vh's (zero) gradients are
        # skipped, which keeps S's gradient finite for repeated singular values.
        attrs={"full_matrices": True, "values_only": False},
        n_outputs=3,
        saves_inputs=False,
        doc="The singular value decomposition U diag(S) Vh, singular values descending.",
    )
)


# --- LU, the matrix exponential and the pseudo-inverse ------------------------------------------


def _lu_infer(a, pivot):
    shape = _check_float_matrix("linalg.lu", a)
    m, n = shape[-2:]
    k = None if None in (m, n) else min(m, n)
    batch = shape[:-2]
    return (
        AVal(batch + (m, m), a.dtype),
        AVal(batch + (m, k), a.dtype),
        AVal(batch + (k, n), a.dtype),
        AVal(batch + (k,), _dtype_int32()),
    )


def _dtype_int32():
    from lucid._dtype import int32

    return int32


def _lu_kernel(a, pivot):
    """Gaussian elimination with partial pivoting (LAPACK getrf's choices: the first largest
    |entry| of each column; a zero pivot leaves its column unscaled), batched."""
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    k = min(m, n)
    work = a.reshape((-1, m, n)).astype(a.dtype, copy=True)
    rows = np.arange(work.shape[0])
    perm = np.tile(np.arange(m), (work.shape[0], 1))
    pivots = np.zeros((work.shape[0], k), dtype=np.int32)
    for j in range(k):
        p = j + np.argmax(np.abs(work[:, j:, j]), axis=1) if pivot else np.full(len(rows), j)
        pivots[:, j] = p + 1
        work[rows, j], work[rows, p] = work[rows, p].copy(), work[rows, j].copy()
        perm[rows, j], perm[rows, p] = perm[rows, p], perm[rows, j].copy()
        head = work[:, j, j]
        if not pivot and np.any(head == 0):
            raise ValueError("linalg.lu: a zero pivot without pivoting (use pivot=True)")
        scale = np.where(head == 0, 1.0, head)[:, None]
        work[:, j + 1 :, j] /= scale
        work[:, j + 1 :, j + 1 :] -= work[:, j + 1 :, j : j + 1] * work[:, j : j + 1, j + 1 :]
    low = np.tril(work[:, :, :k], -1) + np.eye(m, k, dtype=a.dtype)
    up = np.triu(work[:, :k, :])
    perm_matrix = np.zeros((work.shape[0], m, m), dtype=a.dtype)
    # P^T A = A[perm]: row i of P^T A is row perm[i] of A, so P[perm[i], i] = 1.
    perm_matrix[rows[:, None], perm, np.arange(m)[None, :]] = 1
    return (
        perm_matrix.reshape(batch + (m, m)),
        low.reshape(batch + (m, k)),
        up.reshape(batch + (k, n)),
        pivots.reshape(batch + (k,)),
    )


def _square_lu_vjp(p, low, up, g_low, g_up):
    # A = P L U: grad A = P L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T.
    from lucid.ops.shape import tril, triu

    inner = tril(low.mT @ g_low, -1) + triu(g_up @ up.mT)
    left = apply("linalg_solve", low.mT, inner)  # L^-T inner
    return p @ apply("linalg_solve", up, left.mT).mT  # (... ) U^-T


def _lu_vjp(c, g_p, g_low, g_up, g_pivots):
    from lucid.ops.creation import zeros_like
    from lucid.ops.shape import cat

    p, low, up, _ = c.outputs
    g_low = zeros_like(low) if g_low is None else g_low
    g_up = zeros_like(up) if g_up is None else g_up
    m, n = low.shape[-2], up.shape[-1]
    if m == n:
        return (_square_lu_vjp(p, low, up, g_low, g_up),)
    if m < n:
        # A = P L [U1 | U2]: U2 = L^-1 P^T A2 feeds gL back through L.
        up1, up2 = up[..., :m], up[..., m:]
        g_up1, g_up2 = g_up[..., :m], g_up[..., m:]
        g_low = g_low - apply("linalg_solve", low.mT, g_up2 @ up2.mT)
        g_a2 = p @ apply("linalg_solve", low.mT, g_up2)
        return (cat([_square_lu_vjp(p, low, up1, g_low, g_up1), g_a2], -1),)
    # P^T A = [L1; L2] U: L2 = (P^T A)_2 U^-1 feeds gU back through U.
    low1, low2 = low[..., :n, :], low[..., n:, :]
    g_low1, g_low2 = g_low[..., :n, :], g_low[..., n:, :]
    g_low2_u = apply("linalg_solve", up, g_low2.mT).mT  # gL2 U^-T
    g_up = g_up - low2.mT @ g_low2_u
    eye_n = Tensor._wrap(np.eye(n, dtype=low.dtype.numpy))
    g_top = _square_lu_vjp(eye_n, low1, up, g_low1, g_up)
    return (p @ cat([g_top, g_low2_u], -2),)


register(
    OpDef(
        "linalg_lu",
        ("a",),
        _lu_infer,
        _lu_kernel,
        _lu_vjp,
        attrs={"pivot": True},
        n_outputs=4,
        saves_inputs=False,
        doc="The LU factorisation A = P L U with partial pivoting, and LAPACK's 1-based pivots.",
    )
)


def _expm_single(a: np.ndarray) -> np.ndarray:
    # Scaling and squaring: exp(A) = exp(A / 2^s)^(2^s) with |A / 2^s|_1 <= 1/2, where a
    # degree-18 Taylor polynomial is exact to double precision (0.5^19 / 19! < 1e-22).
    norm = np.abs(a).sum(0).max() if a.size else 0.0
    s = int(max(0, np.ceil(np.log2(norm / 0.5)))) if norm > 0.5 else 0
    x = a / (2.0**s)
    term = np.eye(a.shape[0], dtype=a.dtype)
    out = term.copy()
    for k in range(1, 19):
        term = term @ x / k
        out = out + term
    for _ in range(s):
        out = out @ out
    return out


def _matrix_exp_kernel(a):
    work = a.astype(np.float64).reshape((-1,) + a.shape[-2:])
    out = np.stack([_expm_single(m) for m in work]) if work.shape[0] else work.copy()
    return out.reshape(a.shape).astype(a.dtype)


def _matrix_exp_vjp(c, g):
    # d<G, exp(A)> = the upper-right block of exp([[A^T, G], [0, A^T]]) (Mathias, 1996).
    from lucid.ops.creation import zeros_like
    from lucid.ops.shape import cat

    (a,) = c.inputs
    n = a.shape[-1]
    at = a.mT
    block = cat([cat([at, g], -1), cat([zeros_like(at), at], -1)], -2)
    return (apply("linalg_matrix_exp", block)[..., :n, n:],)


register(
    OpDef(
        "linalg_matrix_exp",
        ("a",),
        lambda a: AVal(_square_infer("linalg.matrix_exp")(a), a.dtype),
        _matrix_exp_kernel,
        _matrix_exp_vjp,
        doc="The matrix exponential sum_k A^k / k!.",
    )
)


def _pinv_infer(a, atol, rtol, hermitian):
    shape = _check_float_matrix("linalg.pinv", a)
    return AVal(shape[:-2] + (shape[-1], shape[-2]), a.dtype)


def _pinv_kernel(a, atol, rtol, hermitian):
    """The pseudo-inverse from the SVD (eigendecomposition when ``hermitian``): singular values
    at most max(atol, rtol * largest) count as zero."""
    if hermitian:
        values, vectors = np.linalg.eigh(a)
        s, u, vh = np.abs(values), vectors, np.swapaxes(vectors * np.sign(values)[..., None, :],
                                                       -1, -2)  # fmt: skip
    else:
        u, s, vh = np.linalg.svd(a, full_matrices=False)
    largest = s.max(-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
    cutoff = np.maximum(atol, rtol * largest)
    keep = s > cutoff
    inv_s = np.where(keep, 1.0 / np.where(keep, s, 1.0), 0.0)
    out = np.swapaxes(vh, -1, -2) @ (inv_s[..., :, None] * np.swapaxes(u, -1, -2))
    return out.astype(a.dtype)


def _pinv_vjp(c, g):
    # Golub and Pereyra (1973), for a locally constant rank: with X = A^+,
    # grad A = -X^T G X^T + (I - A X) G^T X X^T + X^T X G^T (I - X A).
    (a,), (x,) = c.inputs, c.outputs
    xt = x.mT
    term_rows = g.mT @ (x @ xt)
    term_rows = term_rows - a @ (x @ term_rows)
    term_cols = (xt @ x) @ g.mT
    term_cols = term_cols - (term_cols @ x) @ a
    return (-(xt @ g @ xt) + term_rows + term_cols,)


register(
    OpDef(
        "linalg_pinv",
        ("a",),
        _pinv_infer,
        _pinv_kernel,
        _pinv_vjp,
        attrs={"atol": 0.0, "rtol": 0.0, "hermitian": False},
        doc="The Moore-Penrose pseudo-inverse.",
    )
)
