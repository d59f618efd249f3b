"""matmul / mm / bmm / dot / outer / einsum: values against numpy, gradients against finite
differences, shape errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid.testing import assert_close, gradcheck


def rand(*shape, seed=0, grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=grad)


# Every torch matmul case: (x shape, y shape).
MATMUL_CASES = [
    ((3,), (3,)),  # dot
    ((2, 3), (3, 4)),  # matrix
    ((3,), (3, 4)),  # vector @ matrix
    ((2, 3), (3,)),  # matrix @ vector
    ((5, 2, 3), (3, 4)),  # batched @ matrix
    ((2, 3), (5, 3, 4)),  # matrix @ batched
    ((5, 1, 2, 3), (4, 3, 2)),  # broadcast batch dims
    ((3,), (5, 3, 4)),  # vector @ batched
    ((5, 2, 3), (3,)),  # batched @ vector
    ((1, 1), (1, 1)),
]


@pytest.mark.parametrize(("xs", "ys"), MATMUL_CASES)
def test_matmul_matches_numpy(xs, ys):
    x, y = rand(*xs, grad=False), rand(*ys, seed=1, grad=False)
    assert_close(x @ y, np.matmul(x.numpy(), y.numpy()))
    assert_close(lucid.matmul(x, y), np.matmul(x.numpy(), y.numpy()))


@pytest.mark.parametrize(("xs", "ys"), MATMUL_CASES)
def test_matmul_gradients(xs, ys):
    gradcheck(lambda a, b: a @ b, rand(*xs), rand(*ys, seed=1))


@given(
    batch_x=st.lists(st.integers(1, 3), max_size=2),
    batch_y=st.lists(st.integers(1, 3), max_size=2),
    n=st.integers(1, 3),
    k=st.integers(1, 3),
    m=st.integers(1, 3),
)
def test_matmul_broadcast_batches_match_numpy(batch_x, batch_y, n, k, m):
    # Make the batch dims broadcastable by turning conflicts into 1s.
    lx, ly = len(batch_x), len(batch_y)
    for i in range(1, min(lx, ly) + 1):
        if batch_x[-i] != batch_y[-i]:
            batch_y[-i] = 1
    x = rand(*batch_x, n, k, grad=False)
    y = rand(*batch_y, k, m, seed=1, grad=False)
    assert_close(x @ y, np.matmul(x.numpy(), y.numpy()))


def test_matmul_with_float32_and_int_promotes():
    x = lucid.tensor([[1, 2], [3, 4]])
    y = lucid.tensor([[0.5, 0.0], [0.0, 2.0]])
    out = x @ y
    assert out.dtype is lucid.float32
    assert_close(out, np.array([[0.5, 4.0], [1.5, 8.0]], dtype=np.float32))


def test_rmatmul_with_numpy_operand():
    y = rand(3, 2, grad=False)
    a = np.arange(6.0).reshape(2, 3)
    out = a @ y
    assert isinstance(out, lucid.Tensor)
    assert_close(out, a @ y.numpy())


def test_matmul_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
        rand(2, 3) @ rand(4, 5)
    with pytest.raises(ValueError, match="at least 1 dim"):
        lucid.matmul(rand(), rand(3))
    with pytest.raises(ValueError, match="batch dims"):
        rand(2, 2, 3) @ rand(3, 3, 4)


def test_mm_bmm_are_strict():
    a, b = rand(2, 3, grad=False), rand(3, 4, grad=False)
    assert_close(lucid.mm(a, b), a.numpy() @ b.numpy())
    with pytest.raises(ValueError, match="mm: both arguments must be 2-d"):
        lucid.mm(rand(3), b)
    x, y = rand(4, 2, 3), rand(4, 3, 5, seed=1)
    assert_close(lucid.bmm(x, y), np.matmul(x.detach().numpy(), y.detach().numpy()))
    gradcheck(lucid.bmm, x, y)
    with pytest.raises(ValueError, match="bmm: both arguments must be 3-d"):
        lucid.bmm(rand(2, 3), rand(3, 2))
    with pytest.raises(ValueError, match="batch sizes differ"):
        lucid.bmm(rand(4, 2, 3), rand(2, 3, 5))


def test_dot_and_outer():
    x, y = rand(4), rand(4, seed=1)
    assert_close(lucid.dot(x, y), np.dot(x.detach().numpy(), y.detach().numpy()))
    gradcheck(lucid.dot, x, y)
    z = rand(3, seed=2)
    assert_close(lucid.outer(x, z), np.outer(x.detach().numpy(), z.detach().numpy()))
    gradcheck(lucid.outer, x, z)
    with pytest.raises(ValueError, match="lengths differ"):
        lucid.dot(x, z)
    with pytest.raises(ValueError, match="outer: both arguments must be 1-d"):
        lucid.outer(rand(2, 2), z)


EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->i", [(2, 3)]),  # a label summed inside one operand
    ("i,j->ij", [(2,), (3,)]),
    ("i,i->", [(3,), (3,)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("ii->i", [(3, 3)]),  # diagonal
    ("ii", [(3, 3)]),  # trace (implicit output)
    ("ba", [(2, 3)]),  # implicit output sorts the labels
    ("ij,jk", [(2, 3), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 2, 3), (3, 4)]),
    ("i...->...", [(2, 3, 4)]),
    ("...i,...i", [(2, 3), (3,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("i,i->i", [(1,), (3,)]),  # size-1 broadcasting of a label
]


@pytest.mark.parametrize(("eq", "shapes"), EINSUM_CASES)
def test_einsum_matches_numpy(eq, shapes):
    ops = [rand(*s, seed=i, grad=False) for i, s in enumerate(shapes)]
    assert_close(lucid.einsum(eq, *ops), np.einsum(eq, *(o.numpy() for o in ops)))


@pytest.mark.parametrize(("eq", "shapes"), EINSUM_CASES)
def test_einsum_gradients(eq, shapes):
    ops = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    gradcheck(lambda *a: lucid.einsum(eq, *a), *ops)


def test_einsum_accepts_a_list_and_spaces():
    a, b = rand(2, 3, grad=False), rand(3, 2, seed=1, grad=False)
    assert_close(lucid.einsum("i j , j k -> i k", [a, b]), a.numpy() @ b.numpy())


def test_einsum_ellipsis_not_in_output_sums_it():
    a = rand(2, 3, 4, grad=False)
    assert_close(lucid.einsum("...i->i", a), a.numpy().sum(axis=(0, 1)))


def test_einsum_errors():
    a = rand(2, 3)
    with pytest.raises(ValueError, match="2 operand terms but 1 operands"):
        lucid.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match="has 3 subscripts but operand 0 has 2 dims"):
        lucid.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="subscript 'j' has size 3 in one operand and 4"):
        lucid.einsum("ij,jk->ik", a, rand(4, 2))
    with pytest.raises(ValueError, match="output subscript 'z' appears in no input"):
        lucid.einsum("ij->z", a)
    with pytest.raises(ValueError, match="invalid subscript"):
        lucid.einsum("i1->i", a)
    with pytest.raises(TypeError, match="operand 0"):
        lucid.einsum("i->i", [1.0, 2.0])
