"""sort, argsort, topk and multinomial: values against numpy's stable sort (hypothesis over
shapes, dims and ties), PyTorch's NaN rule, gradients against finite differences, the draws'
law, bad input, and compiled == eager (no graph break)."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import lucid
from lucid.testing import gradcheck


def _ref_order(x, axis, descending):
    """Stable order by numpy, descending written as an ascending sort of a reversed key."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    # -x is not usable (ints, NaN); sort by (value desc, position asc) with lexsort per row.
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape, np.int64)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        keys = sorted(
            range(len(row)),
            key=lambda i: (
                (0 if np.isnan(row[i]) else 1, -row[i] if not np.isnan(row[i]) else 0, i)
                if row.dtype.kind == "f"
                else (-int(row[i]), i)
            ),
        )
        out[idx] = keys
    return np.moveaxis(out, -1, axis)


def _tied_floats(shape):
    return arrays(
        np.float64,
        shape,
        elements=st.sampled_from([0.0, -1.5, 2.0, 3.0, np.nan, np.inf, -np.inf]),
    )


@settings(max_examples=40, deadline=None)
@given(data=st.data(), descending=st.booleans())
def test_sort_matches_a_stable_reference_with_ties_and_nan(data, descending):
    shape = data.draw(array_shapes(min_dims=1, max_dims=3, max_side=5))
    x = data.draw(_tied_floats(shape))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    values, indices = lucid.sort(lucid.tensor(x), dim=dim, descending=descending)
    want = _ref_order(x, dim % len(shape), descending)
    np.testing.assert_array_equal(indices.numpy(), want)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, want, dim))
    np.testing.assert_array_equal(
        lucid.argsort(lucid.tensor(x), dim, descending=descending).numpy(), want
    )


def test_nan_sorts_as_largest_as_pytorch():
    x = lucid.tensor([1.0, float("nan"), -2.0, float("inf")])
    assert x.sort().indices.tolist() == [2, 0, 3, 1]
    assert x.sort(descending=True).indices.tolist() == [1, 3, 0, 2]
    assert x.topk(1).indices.tolist() == [1]
    assert x.topk(2, largest=False).indices.tolist() == [2, 0]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), largest=st.booleans())
def test_topk_is_the_first_k_of_the_stable_sort(data, largest):
    shape = data.draw(array_shapes(min_dims=1, max_dims=3, max_side=5))
    x = data.draw(arrays(np.int64, shape, elements=st.integers(-2, 2)))
    dim = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.integers(0, shape[dim]))
    values, indices = lucid.tensor(x).topk(k, dim=dim, largest=largest)
    want = np.take(_ref_order(x, dim, largest), np.arange(k), axis=dim)
    np.testing.assert_array_equal(indices.numpy(), want)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, want, dim))
    assert values.dtype is lucid.int64 and indices.dtype is lucid.int64


def test_results_are_named_tuples_and_msort_sorts_dim_0():
    x = lucid.tensor([[3, 1], [2, 5]])
    out = lucid.topk(x, 1, dim=0)
    assert out.values.tolist() == [[3, 5]] and out.indices.tolist() == [[0, 1]]
    assert lucid.msort(x).tolist() == [[2, 1], [3, 5]]
    assert x.sort(0, stable=True).values.tolist() == [[2, 1], [3, 5]]


@pytest.mark.parametrize("descending", [False, True])
def test_sort_values_gradient_scatters_back_through_the_indices(descending):
    x = lucid.tensor(np.random.default_rng(0).standard_normal((3, 5)), requires_grad=True)
    w = lucid.tensor(np.arange(15.0).reshape(3, 5))
    gradcheck(lambda t: (t.sort(dim=1, descending=descending).values * w).sum(), x)
    gradcheck(lambda t: (t.sort(dim=0, descending=descending).values * w).sum(), x)


@pytest.mark.parametrize("largest", [False, True])
def test_topk_values_gradient(largest):
    x = lucid.tensor(np.random.default_rng(1).standard_normal((2, 4, 3)), requires_grad=True)
    w = lucid.tensor(np.random.default_rng(2).standard_normal((2, 2, 3)))
    gradcheck(lambda t: (t.topk(2, dim=1, largest=largest).values * w).sum(), x)
    v, _ = x.topk(2, dim=1, largest=largest)
    v.sum().backward()
    # Exactly k ones per row of the sorted dim, at the chosen positions.
    assert x.grad.numpy().sum(axis=1).tolist() == [[2.0] * 3] * 2


def test_bad_arguments_raise_clear_errors():
    x = lucid.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="topk: k=4 is out of range"):
        x.topk(4)
    with pytest.raises(ValueError, match="out of range"):
        x.topk(-1)
    with pytest.raises(IndexError, match="sort: dim 1 is out of range"):
        x.sort(dim=1)
    with pytest.raises(TypeError, match="k must be an int"):
        x.topk(1.5)


# --- multinomial


def _freq(samples, n):
    counts = np.bincount(np.asarray(samples).ravel(), minlength=n)
    return counts / counts.sum()


def test_multinomial_with_replacement_follows_the_weights():
    lucid.manual_seed(3)
    weights = np.array([0.1, 0.0, 0.6, 0.3, 2.0])  # unnormalised, one impossible category
    draws = lucid.multinomial(lucid.tensor(weights), 20000, replacement=True).numpy()
    assert draws.shape == (20000,) and draws.dtype == np.int64
    freq = _freq(draws, 5)
    assert freq[1] == 0
    # 20000 draws: the standard error of a frequency is below 0.004.
    np.testing.assert_allclose(freq, weights / weights.sum(), atol=0.015)


def test_multinomial_without_replacement_draws_distinct_categories_in_law():
    lucid.manual_seed(4)
    weights = lucid.tensor([[1.0, 2.0, 0.0, 7.0]] * 4000)
    draws = weights.multinomial(2).numpy()
    assert draws.shape == (4000, 2)
    assert np.all(draws[:, 0] != draws[:, 1]) and not np.any(draws == 2)
    # The first draw is categorical in the weights; P(second = 0 | first = 3) = 1/3.
    np.testing.assert_allclose(_freq(draws[:, 0], 4), [0.1, 0.2, 0.0, 0.7], atol=0.025)
    after3 = draws[draws[:, 0] == 3, 1]
    assert abs(np.mean(after3 == 0) - 1 / 3) < 0.04
    # Drawing every non-zero category: a permutation of them.
    full = lucid.multinomial(lucid.tensor([0.2, 0.5, 0.3]), 3).numpy()
    assert sorted(full.tolist()) == [0, 1, 2]


def test_multinomial_reproduces_under_manual_seed_and_a_generator():
    p = lucid.tensor([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]])
    lucid.manual_seed(11)
    a = lucid.multinomial(p, 5, True).numpy()
    lucid.manual_seed(11)
    b = lucid.multinomial(p, 5, True).numpy()
    np.testing.assert_array_equal(a, b)
    g1, g2 = lucid.Generator().manual_seed(5), lucid.Generator().manual_seed(5)
    np.testing.assert_array_equal(
        lucid.multinomial(p, 2, generator=g1).numpy(), lucid.multinomial(p, 2, generator=g2).numpy()
    )


@pytest.mark.parametrize(
    "probs,n,repl,match",
    [
        ([0.5, -0.1], 1, True, "finite and non-negative"),
        ([0.5, float("nan")], 1, True, "finite and non-negative"),
        ([0.0, 0.0], 1, True, "sums to 0"),
        ([0.5, 0.0, 0.5], 3, False, "only 2 non-zero"),
        ([0.5, 0.5], 3, False, "without replacement from 2 categories"),
        ([0.5, 0.5], 0, True, "num_samples must be a positive int"),
    ],
)
def test_multinomial_rejects_bad_distributions(probs, n, repl, match):
    with pytest.raises(ValueError, match=match):
        lucid.multinomial(lucid.tensor(probs), n, replacement=repl)


def test_multinomial_rejects_integer_and_3d_input():
    with pytest.raises(TypeError, match="floating point"):
        lucid.multinomial(lucid.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="1-d or 2-d"):
        lucid.multinomial(lucid.zeros(2, 2, 2), 1)


# --- compiled == eager


def _sample_next(logits, k):
    """A GPT sampling step: top-k filter, softmax, draw."""
    v, _ = lucid.topk(logits, k)
    logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
    probs = lucid.softmax(logits, dim=-1)
    return lucid.multinomial(probs, 1), lucid.sort(logits, descending=True).indices


@pytest.mark.parametrize("dtype", [lucid.float32, lucid.float64])
def test_sampling_step_compiled_equals_eager_without_graph_break(dtype):
    logits = lucid.tensor(np.random.default_rng(5).standard_normal((3, 11)), dtype=dtype)
    step = lucid.compile(lambda t: _sample_next(t, 4), strict=True)
    for seed in (0, 1, 2):
        lucid.manual_seed(seed)
        want = _sample_next(logits, 4)
        lucid.manual_seed(seed)
        got = step(logits)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_multinomial_without_replacement_compiled_equals_eager():
    p = lucid.tensor(np.random.default_rng(6).random((4, 9)))
    fn = lucid.compile(lambda t: lucid.multinomial(t, 5), strict=True)
    lucid.manual_seed(8)
    want = lucid.multinomial(p, 5)
    lucid.manual_seed(8)
    np.testing.assert_array_equal(fn(p).numpy(), want.numpy())


def test_compiled_topk_gradient_equals_eager():
    x = np.random.default_rng(7).standard_normal((2, 6))

    def loss(t):
        v, _ = t.topk(3)
        return (v * v).sum()

    ref = lucid.tensor(x, requires_grad=True)
    loss(ref).backward()
    got = lucid.tensor(x, requires_grad=True)
    lucid.compile(loss, strict=True)(got).backward()
    np.testing.assert_allclose(got.grad.numpy(), ref.grad.numpy(), rtol=1e-12)


def test_draw_counts_are_not_all_the_same_category():
    # Guards against a sampler that always returns the argmax.
    lucid.manual_seed(0)
    c = collections.Counter(lucid.multinomial(lucid.tensor([0.5, 0.5]), 200, True).tolist())
    assert c[0] > 50 and c[1] > 50


def test_top_k_over_a_large_vocabulary_compiles_through_prim_argsort():
    # GPT-2's vocabulary: one native sort per row, exactly eager's indices (ties included).
    logits = lucid.tensor(np.round(np.random.default_rng(9).standard_normal((2, 50257)), 2))
    fn = lucid.compile(lambda t: lucid.topk(t, 50), strict=True)
    (v, i), (ev, ei) = fn(logits), lucid.topk(logits, 50)
    np.testing.assert_array_equal(i.numpy(), ei.numpy())
    np.testing.assert_array_equal(v.numpy(), ev.numpy())


def test_a_single_draw_without_replacement_follows_the_weights():
    # num_samples=1 takes the largest p / Exp(1) key directly (no sort), as PyTorch.
    lucid.manual_seed(12)
    draws = lucid.multinomial(lucid.tensor([[0.5, 0.0, 1.5, 3.0]] * 8000), 1).numpy()
    assert draws.shape == (8000, 1)
    np.testing.assert_allclose(_freq(draws, 4), [0.1, 0.0, 0.3, 0.6], atol=0.02)
