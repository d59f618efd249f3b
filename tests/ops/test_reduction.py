"""Reductions: values against numpy over dims/keepdim, gradients against finite differences,
dtype rules, tie handling and bad dims."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import lucid
from lucid.testing import assert_close, gradcheck


def randn(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def t64(arr, requires_grad=True):
    return lucid.tensor(np.asarray(arr, dtype=np.float64), requires_grad=requires_grad)


def _lse(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


# (name, lucid call (x, dim, keepdim), numpy reference (x, axis, keepdims))
REDUCTIONS = [
    ("sum", lambda t, d, k: t.sum(d, keepdim=k), np.sum),
    ("mean", lambda t, d, k: t.mean(d, keepdim=k), np.mean),
    ("var", lambda t, d, k: t.var(d, keepdim=k), lambda x, axis, keepdims: np.var(
        x, axis=axis, keepdims=keepdims, ddof=1)),
    ("var_biased", lambda t, d, k: t.var(d, unbiased=False, keepdim=k), np.var),
    ("std", lambda t, d, k: t.std(d, keepdim=k), lambda x, axis, keepdims: np.std(
        x, axis=axis, keepdims=keepdims, ddof=1)),
    ("std_corr0", lambda t, d, k: lucid.std(t, d, keepdim=k, correction=0), np.std),
    ("amax", lambda t, d, k: t.amax(d, keepdim=k), np.amax),
    ("amin", lambda t, d, k: lucid.amin(t, d, keepdim=k), np.amin),
    ("logsumexp", lambda t, d, k: t.logsumexp(d, keepdim=k), _lse),
    ("prod", lambda t, d, k: t.prod(d, keepdim=k), np.prod),
    ("norm", lambda t, d, k: t.norm(dim=d, keepdim=k), lambda x, axis, keepdims: np.sqrt(
        np.sum(x * x, axis=axis, keepdims=keepdims))),
    ("norm1", lambda t, d, k: t.norm(1, dim=d, keepdim=k), lambda x, axis, keepdims: np.sum(
        np.abs(x), axis=axis, keepdims=keepdims)),
    ("norm3", lambda t, d, k: t.norm(3, dim=d, keepdim=k), lambda x, axis, keepdims: np.sum(
        np.abs(x) ** 3, axis=axis, keepdims=keepdims) ** (1 / 3)),
]  # fmt: skip
DIMS = [None, 0, -1, (0, 2), (-1, 1)]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS, ids=str)
@pytest.mark.parametrize("name,fn,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction_values_match_numpy(name, fn, ref, dim, keepdim):
    if name == "prod" and isinstance(dim, tuple):
        dim = dim[0]
    x = randn((2, 3, 4), seed=1, dtype=np.float32)
    out = fn(lucid.tensor(x), dim, keepdim)
    expected = ref(x.astype(np.float64), axis=dim, keepdims=keepdim)
    assert out.dtype == lucid.float32
    assert_close(out, np.asarray(expected, dtype=np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [None, 1, (0, 2)], ids=str)
@pytest.mark.parametrize("name,fn,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction_gradients_match_finite_differences(name, fn, ref, dim):
    if name == "prod" and isinstance(dim, tuple):
        dim = 2
    x = t64(randn((2, 3, 3), seed=2))
    gradcheck(lambda t: fn(t, dim, False), x)
    gradcheck(lambda t: fn(t, dim, True), x)


@given(shape=array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), data=st.data())
def test_sum_mean_any_shape_and_dim(shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdim = data.draw(st.booleans())
    x = randn(shape, seed=3, dtype=np.float32)
    t = lucid.tensor(x)
    assert_close(t.sum(dim, keepdim), np.sum(x, axis=dim, keepdims=keepdim), rtol=1e-5, atol=1e-5)
    assert_close(lucid.mean(t, dim, keepdim), np.mean(x, axis=dim, keepdims=keepdim), atol=1e-6)
    values, indices = t.max(dim, keepdim)
    assert_close(values, np.max(x, axis=dim, keepdims=keepdim))
    np.testing.assert_array_equal(indices.numpy(), np.argmax(x, axis=dim, keepdims=keepdim))


def test_zero_dim_reductions():
    t = lucid.tensor(3.5)
    assert t.sum().item() == 3.5 and t.mean().item() == 3.5 and t.amax().item() == 3.5
    assert t.sum(0).shape == () and t.argmax().item() == 0
    values, indices = t.max(0)
    assert values.item() == 3.5 and indices.item() == 0
    assert t.cumsum(0).item() == 3.5


def test_integer_and_bool_sums_are_int64():
    assert lucid.tensor([1, 2], dtype=lucid.int32).sum().dtype == lucid.int64
    assert lucid.tensor([True, True, False]).sum().item() == 2
    assert lucid.tensor([True, True]).sum().dtype == lucid.int64
    assert lucid.tensor([2, 3], dtype=lucid.int8).prod().dtype == lucid.int64
    assert lucid.tensor([1, 2, 3], dtype=lucid.int16).cumsum(0).dtype == lucid.int64
    assert lucid.tensor([1, 2], dtype=lucid.int32).sum(dtype=lucid.float64).dtype == lucid.float64
    assert lucid.tensor([1.0], dtype=lucid.float16).sum().dtype == lucid.float16


def test_mean_and_var_need_floats():
    with pytest.raises(RuntimeError, match="floating point"):
        lucid.tensor([1, 2]).mean()
    with pytest.raises(RuntimeError, match="floating point"):
        lucid.tensor([1, 2]).var()
    assert lucid.tensor([1, 2]).mean(dtype=lucid.float32).item() == pytest.approx(1.5)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.sum(3),
        lambda t: t.mean(-4),
        lambda t: t.amax((0, 5)),
        lambda t: t.max(3),
        lambda t: t.argmax(4),
        lambda t: t.cumsum(3),
        lambda t: t.var(7),
        lambda t: t.logsumexp(3),
    ],
)
def test_out_of_range_dim_raises_index_error_naming_it(call):
    with pytest.raises(IndexError, match=r"dim -?\d+ is out of range"):
        call(lucid.zeros(2, 3, 4))


def test_repeated_dim_raises():
    with pytest.raises(ValueError, match="repeats"):
        lucid.zeros(2, 3).sum((0, 0))


def test_max_of_empty_dim_raises():
    with pytest.raises(IndexError, match="non-zero size"):
        lucid.zeros(0, 3).amax(0)


def test_var_correction_and_unbiased_forms():
    x = randn((5, 4), seed=4)
    t = lucid.tensor(x)
    assert_close(t.var(0, correction=2), np.var(x, axis=0, ddof=2))
    assert_close(t.var(False), np.var(x))
    assert_close(lucid.var(t, 1, True), np.var(x, axis=1, ddof=1))
    v, m = lucid.var_mean(t, 1)
    assert_close(v, np.var(x, axis=1, ddof=1))
    assert_close(m, np.mean(x, axis=1))
    s, m = lucid.std_mean(t, 0, keepdim=True)
    assert_close(s, np.std(x, axis=0, ddof=1, keepdims=True))
    with pytest.raises(TypeError, match="either unbiased or correction"):
        t.var(0, unbiased=True, correction=1)


def test_var_gradient_with_correction():
    x = t64(randn((3, 4), seed=5))
    gradcheck(lambda t: t.var(1, correction=0), x)
    gradcheck(lambda t: t.var(correction=2), x)


def test_max_with_dim_returns_named_values_and_indices():
    x = np.array([[1.0, 5.0, 3.0], [7.0, 2.0, 7.0]], dtype=np.float32)
    out = lucid.tensor(x).max(1)
    assert out.values is out[0] and out.indices is out[1]
    np.testing.assert_array_equal(out.values.numpy(), [5.0, 7.0])
    np.testing.assert_array_equal(out.indices.numpy(), [1, 0])
    assert out.indices.dtype == lucid.int64
    mins = lucid.min(lucid.tensor(x), dim=0, keepdim=True)
    np.testing.assert_array_equal(mins.values.numpy(), [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(mins.indices.numpy(), [[0, 1, 0]])


def test_max_with_dim_sends_gradient_to_the_selected_element_only():
    x = t64([[2.0, 7.0, 7.0], [1.0, 1.0, 0.0]])
    x.max(1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_full_max_and_amax_split_gradient_among_ties():
    x = t64([[2.0, 7.0, 7.0], [1.0, 7.0, 0.0]])
    x.max().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 1 / 3, 1 / 3], [0, 1 / 3, 0]])
    x.grad = None
    x.amax(1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [0, 1, 0]])
    x.grad = None
    x.amin((0, 1)).backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0, 0], [0, 0, 1]])


def test_max_with_other_tensor_is_maximum():
    a, b = lucid.tensor([1.0, 5.0]), lucid.tensor([3.0, 2.0])
    np.testing.assert_array_equal(lucid.max(a, b).numpy(), [3.0, 5.0])
    np.testing.assert_array_equal(a.min(b).numpy(), [1.0, 2.0])


def test_max_min_full_reduction_values():
    x = randn((3, 4), seed=6)
    t = lucid.tensor(x)
    assert t.max().shape == () and t.max().item() == x.max()
    assert lucid.min(t).item() == x.min()


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
def test_argmax_argmin(dim, keepdim):
    x = randn((3, 4), seed=7)
    t = lucid.tensor(x)
    out_max, out_min = t.argmax(dim, keepdim), lucid.argmin(t, dim, keepdim)
    assert out_max.dtype == lucid.int64 and out_max.grad_fn is None
    np.testing.assert_array_equal(out_max.numpy(), np.argmax(x, axis=dim, keepdims=keepdim))
    np.testing.assert_array_equal(out_min.numpy(), np.argmin(x, axis=dim, keepdims=keepdim))


def test_logsumexp_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.5]])
    out = lucid.tensor(x).logsumexp(1).numpy()
    np.testing.assert_allclose(out, [1000.0 + np.log(2), -1000.0 + np.log1p(np.exp(-0.5))])
    assert np.isneginf(lucid.tensor([-np.inf, -np.inf]).logsumexp(0).item())


def test_prod_gradient_is_correct_with_zeros():
    x = t64([[1.5, 0.0, 3.0], [0.0, 0.0, 2.0], [1.0, 2.0, -3.0]])
    gradcheck(lambda t: t.prod(1), x)
    x.prod(1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.0, 4.5, 0.0], [0.0, 0.0, 0.0], [-6, -3, 2]])
    y = t64([0.0, 2.0, 3.0])
    y.prod().backward()
    np.testing.assert_allclose(y.grad.numpy(), [6.0, 0.0, 0.0])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_values_and_gradient(dim):
    x = randn((3, 4), seed=8)
    assert_close(lucid.tensor(x).cumsum(dim), np.cumsum(x, axis=dim))
    gradcheck(lambda t: lucid.cumsum(t, dim), t64(x))


def test_all_any():
    x = np.array([[True, False, True], [True, True, True]])
    t = lucid.tensor(x)
    assert t.all().item() is False and t.any().item() is True
    np.testing.assert_array_equal(t.all(1).numpy(), x.all(1))
    np.testing.assert_array_equal(lucid.any(t, 0, keepdim=True).numpy(), x.any(0, keepdims=True))
    np.testing.assert_array_equal(lucid.tensor([0.0, 2.0]).all().numpy(), False)


def test_norm_variants():
    x = randn((3, 4), seed=9)
    t = lucid.tensor(x)
    assert_close(t.norm(), np.linalg.norm(x))
    assert_close(t.norm("fro"), np.linalg.norm(x))
    assert_close(t.norm(float("inf"), dim=1), np.abs(x).max(1))
    assert_close(t.norm(float("-inf"), dim=0), np.abs(x).min(0))
    assert_close(t.norm(0, dim=1), (x != 0).sum(1).astype(np.float64))
    assert_close(t.norm(2, dim=(0, 1), keepdim=True), np.linalg.norm(x, keepdims=True))
    with pytest.raises(ValueError, match="p must be"):
        t.norm("nuc")


def test_norm_gradients_including_zero_norm():
    x = t64(randn((3, 4), seed=10))
    gradcheck(lambda t: t.norm(float("inf"), dim=1), x)
    gradcheck(lambda t: t.norm(1.5, dim=0), x)
    z = t64([[0.0, 0.0], [3.0, 4.0]])
    z.norm(dim=1).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [[0.0, 0.0], [0.6, 0.8]])


def test_count_nonzero():
    x = np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    t = lucid.tensor(x)
    assert t.count_nonzero().item() == 3
    np.testing.assert_array_equal(lucid.count_nonzero(t, 0).numpy(), [0, 1, 2])


def test_empty_dim_list_reduces_every_dim():
    x = randn((2, 3), seed=11)
    assert_close(lucid.tensor(x).sum([]), np.sum(x))
    assert_close(lucid.tensor(x).mean(()), np.mean(x))


def test_second_order_gradient_through_mean_and_var():
    x = t64(randn((4,), seed=12))
    (g,) = lucid.autograd.grad(x.var(), x, create_graph=True)
    (g * g).sum().backward()
    n = 4
    xn = x.detach().numpy()
    # g = 2 (x - mean) / (n - 1); d/dx sum(g^2) = 8/(n-1)^2 * (x - mean) (centering is idempotent)
    np.testing.assert_allclose(x.grad.numpy(), 8 / (n - 1) ** 2 * (xn - xn.mean()), rtol=1e-10)


def test_equal_and_allclose_give_python_bools():
    a = lucid.tensor([1.0, 2.0])
    assert lucid.equal(a, lucid.tensor([1.0, 2.0])) is True
    assert a.equal(lucid.tensor([1.0, 2.5])) is False
    assert lucid.equal(a, lucid.tensor([[1.0, 2.0]])) is False  # shapes differ
    assert lucid.allclose(a, a + 1e-7) is True
    assert a.allclose(a + 1e-3) is False


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.uint8, np.bool_])
def test_sum_prod_amax_over_dtypes(dtype):
    x = (np.random.default_rng(13).integers(0, 3, size=(3, 4))).astype(dtype)
    t = lucid.tensor(x)
    int_like = np.dtype(dtype).kind in "iub"
    acc = np.int64 if int_like else dtype
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1, dtype=acc), rtol=1e-3)
    assert t.sum().dtype == lucid._dtype.from_numpy(acc)
    np.testing.assert_allclose(t.prod(0).numpy(), x.prod(0, dtype=acc), rtol=1e-3)
    np.testing.assert_array_equal(t.amax(0).numpy(), x.max(0))
    assert t.amax().dtype == t.dtype


def test_mean_var_of_empty_or_underdetermined_slices_are_nan_without_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(lucid.zeros(0).mean().item())
        assert np.isnan(lucid.tensor([1.0]).var().item())
        np.testing.assert_array_equal(np.isnan(lucid.zeros(2, 0).mean(1).numpy()), [True, True])


def test_float16_mean_accumulates_beyond_float16_range():
    x = lucid.full((4096,), 30.0, dtype=lucid.float16)  # the float16 sum (122880) overflows
    assert x.mean().dtype == lucid.float16 and x.mean().item() == 30.0


def test_sum_and_mean_do_not_save_their_input():
    # Their gradients need only the input's shape, so a later in-place write is harmless (torch).
    x = t64([1.0, 2.0, 3.0])
    y = x * 1.0
    total = y.sum() + y.mean()
    y.add_(1.0)
    total.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 1 + 1 / 3))


# --- empty axes: PyTorch's answers (issue 15, item 4) -------------------------------------------
# The sum of nothing is 0, the product 1; mean is 0 / 0; var divides by max(n - correction, 0);
# logsumexp is log(0); softmax of an empty axis is empty; max/min/argmax have no identity and raise.
def _empty_reference(name, shape, axis):
    n = shape[axis]
    out_shape = tuple(d for i, d in enumerate(shape) if i != axis)
    assert n == 0
    value = {"sum": 0.0, "prod": 1.0, "mean": np.nan, "var": np.nan, "var_c0": np.nan,
             "std": np.nan, "logsumexp": -np.inf, "norm": 0.0, "norm1": 0.0}[name]  # fmt: skip
    return np.full(out_shape, value)


EMPTY_REDUCTIONS = {
    "sum": lambda t, d: t.sum(d),
    "prod": lambda t, d: t.prod(d),
    "mean": lambda t, d: t.mean(d),
    "var": lambda t, d: t.var(d),
    "var_c0": lambda t, d: t.var(d, correction=0),
    "std": lambda t, d: t.std(d),
    "logsumexp": lambda t, d: t.logsumexp(d),
    "norm": lambda t, d: t.norm(dim=d),
    "norm1": lambda t, d: t.norm(p=1, dim=d),
}


@pytest.mark.parametrize("name", sorted(EMPTY_REDUCTIONS))
@given(shape=array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3), data=st.data())
def test_reduction_over_an_empty_axis_gives_pytorchs_identity(name, shape, data):
    empty_axes = [i for i, d in enumerate(shape) if d == 0]
    if not empty_axes:
        shape = (*shape, 0)
        empty_axes = [len(shape) - 1]
    axis = data.draw(st.sampled_from(empty_axes))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = EMPTY_REDUCTIONS[name](lucid.zeros(*shape), axis).numpy()
    np.testing.assert_array_equal(got, _empty_reference(name, shape, axis))


def test_var_divides_by_max_of_n_minus_correction_and_zero():
    # torch: divisor = max(0, n - correction); an empty slice is NaN, never -0.0
    got = lucid.zeros(2, 0).var(1).numpy()
    assert np.isnan(got).all()
    assert lucid.tensor([1.0, 3.0]).var(correction=3).item() == np.inf
    assert np.isnan(lucid.var_mean(lucid.zeros(0), 0)[0].item())
    assert np.isnan(lucid.std_mean(lucid.zeros(3, 0), 1)[0].numpy()).all()


def test_var_gradient_with_a_nonpositive_divisor_is_inf_or_nan_not_an_exception():
    x = t64([1.0, 3.0])
    x.var(correction=3).backward()
    assert np.isinf(x.grad.numpy()).all()  # 2 / 0 * (x - mean): +-inf
    y = t64([2.0])
    y.var().backward()
    assert np.isnan(y.grad.numpy()).all()  # 2 / 0 * 0


@pytest.mark.parametrize("fn", [lucid.nn.functional.softmax, lucid.nn.functional.log_softmax])
@pytest.mark.parametrize("shape,dim", [((3, 0), 1), ((3, 0), 0), ((0, 4), 1), ((0,), 0)])
def test_softmax_of_an_empty_tensor_is_empty(fn, shape, dim):
    x = lucid.zeros(*shape, requires_grad=True)
    y = fn(x, dim=dim)
    assert tuple(y.shape) == shape and y.dtype == x.dtype
    y.sum().backward()
    assert tuple(x.grad.shape) == shape


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.amax(1),
        lambda t: t.amin(1),
        lambda t: t.max(1),
        lambda t: t.min(1),
        lambda t: t.argmax(1),
        lambda t: t.argmin(1),
        lambda t: t.norm(p=float("inf"), dim=1),
    ],
)
def test_extreme_reductions_of_an_empty_axis_raise_as_pytorch(call):
    with pytest.raises(IndexError, match="non-zero size"):
        call(lucid.zeros(3, 0))


def test_logsumexp_of_integers_and_empty_integer_slices():
    t = lucid.tensor([[1, 2], [3, 4]])
    np.testing.assert_allclose(t.logsumexp(1).numpy(), _lse(np.array([[1.0, 2], [3, 4]]), 1))
    np.testing.assert_array_equal(lucid.zeros(2, 0, dtype=lucid.int32).logsumexp(1).numpy(),
                                  [-np.inf, -np.inf])  # fmt: skip
