"""``x[mask] = value`` with a one-element value is a select (``masked_fill``): the same values,
gradients, versions and errors as the general ``index_put`` path through ``nonzero``, and it
compiles without a graph break (strict)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import lucid
from lucid.ops._registry import DATA_DEPENDENT, REGISTRY
from lucid.testing import gradcheck
from lucid.trace import GraphBreak, trace


def _layouts(shape):
    """(index builder from a mask, mask dims) for every placement of one mask among full
    slices and an ellipsis."""
    out = []
    nd = len(shape)
    for start in range(nd):
        for stop in range(start, nd + 1):
            lead = (slice(None),) * start
            out.append((lambda m, lead=lead: (*lead, m), start, stop))
            tail = (slice(None),) * (nd - stop)
            out.append((lambda m, tail=tail: (..., m, *tail), start, stop))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_mask_assignment_equals_numpy_and_the_general_path(data):
    shape = data.draw(array_shapes(min_dims=1, max_dims=3, max_side=4))
    build, start, stop = data.draw(st.sampled_from(_layouts(shape)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    mask = rng.random(shape[start:stop]) < 0.5
    value = data.draw(
        st.sampled_from([-np.inf, 2.5, 0, True, "t0", "t1", "t11", "f32"]), label="value"
    )
    lucid_value = {
        "t0": lucid.tensor(7.0, dtype=lucid.float64),
        "t1": lucid.tensor([7.0], dtype=lucid.float64),
        "t11": lucid.tensor([[-3.0]], dtype=lucid.float64),
        "f32": lucid.tensor(1.25),
    }.get(value, value)
    np_value = lucid_value.numpy() if isinstance(lucid_value, lucid.Tensor) else lucid_value
    idx = build(lucid.tensor(mask))
    want = x.copy()
    want[build(mask)] = np_value.reshape(()) if isinstance(np_value, np.ndarray) else np_value
    t = lucid.tensor(x)
    version = t._version_count
    t[idx] = lucid_value
    np.testing.assert_array_equal(t.numpy(), want)
    assert t._version_count == version + 1
    if stop > start:  # index_put refuses a 0-d False mask (it selects nothing)
        general = lucid.tensor(x).index_put(idx, lucid_value)
        np.testing.assert_array_equal(general.numpy(), want)


def test_mask_assignment_records_a_select_not_nonzero():
    def fn(x):
        y = x * 1.0
        y[x > 0] = 0.0
        y[..., lucid.tensor([True, False, True])] = lucid.tensor([5.0])
        return y

    names = [op.name for op in trace(fn, lucid.zeros(2, 3)).ops]
    assert "nonzero" not in names and "index_put" not in names
    assert names.count("masked_fill") == 2


def test_a_mask_with_a_multi_element_value_still_goes_through_nonzero():
    def fn(x):
        y = x * 1.0
        y[lucid.tensor([True, False])] = lucid.tensor([1.0, 2.0, 3.0])
        return y

    x = lucid.zeros(2, 3)
    assert fn(x).tolist() == [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]
    assert DATA_DEPENDENT in REGISTRY["nonzero"].props
    with pytest.raises(GraphBreak, match="nonzero"):
        trace(fn, x)


def test_mask_assignment_gradients_reach_the_tensor_and_the_value():
    mask = lucid.tensor([[True, False, True], [False, False, True]])

    def f(t, v):
        y = t * 1.0
        y[mask] = v
        return y * y

    x = lucid.tensor(np.random.default_rng(0).standard_normal((2, 3)), requires_grad=True)
    gradcheck(f, x, lucid.tensor(0.7, dtype=lucid.float64, requires_grad=True))
    gradcheck(f, x, lucid.tensor([0.7], dtype=lucid.float64, requires_grad=True))
    row = lucid.tensor([False, True])

    def g(t, v):
        y = t * 1.0
        y[row] = v
        return y.sum() * 2.0

    gradcheck(g, x, lucid.tensor(1.5, dtype=lucid.float64, requires_grad=True))


def test_mask_assignment_keeps_the_general_paths_errors():
    x = lucid.zeros(2, 3)
    with pytest.raises(IndexError, match="does not match the shape"):
        x[lucid.tensor([True, False, True])] = 1.0
    with pytest.raises(IndexError, match="too many indices"):
        x[:, :, lucid.tensor([True])] = 1.0
    leaf = lucid.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        leaf[lucid.tensor([True, False, True])] = 1.0
    ints = lucid.tensor([1, 2, 3])
    ints[ints > 1] = 2.7  # cast to the tensor's dtype, as index_put
    assert ints.tolist() == [1, 2, 2] and ints.dtype is lucid.int64


def _top_k_filter(logits, k):
    """The top-k filter of a GPT sampling loop, as written for PyTorch."""
    v, _ = lucid.topk(logits, k)
    logits = logits.clone()
    logits[logits < v[:, [-1]]] = -float("inf")
    return lucid.softmax(logits, dim=-1)


@pytest.mark.parametrize("dtype", [lucid.float32, lucid.float64])
def test_top_k_filter_compiles_without_graph_break_and_equals_eager(dtype):
    fn = lucid.compile(lambda t: _top_k_filter(t, 3), strict=True)
    for seed in range(3):
        logits = lucid.tensor(np.random.default_rng(seed).standard_normal((2, 9)), dtype=dtype)
        got, want = fn(logits).numpy(), _top_k_filter(logits, 3).numpy()
        np.testing.assert_array_equal(got == 0, want == 0)  # the filtered places, exactly
        assert np.count_nonzero(want, axis=1).tolist() == [3, 3]
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype is lucid.float32 else 1e-13)


def test_gpt_sampling_loop_compiled_equals_eager():
    weight = lucid.tensor(np.random.default_rng(1).standard_normal((6, 6)))

    def step(idx_onehot):
        logits = idx_onehot @ weight
        probs = _top_k_filter(logits, 2)
        return lucid.multinomial(probs, 1)

    def run(fn):
        lucid.manual_seed(0)
        tok, tokens = lucid.tensor([[0], [3]]), []
        for _ in range(5):
            tok = fn(lucid.nn.functional.one_hot(tok[:, 0], 6).type(lucid.float64))
            tokens.append(tok.tolist())
        return tokens

    eager_tokens = run(step)
    assert run(lucid.compile(step, strict=True)) == eager_tokens
    assert len({t[0][0] for t in eager_tokens}) > 1  # the loop really samples


def test_mask_assignment_in_place_on_a_compiled_input_is_written_back():
    def fn(x):
        x[x < 0] = 0.0
        return x.sum()

    a = np.random.default_rng(2).standard_normal((3, 4))
    eager_x, comp_x = lucid.tensor(a), lucid.tensor(a)
    want = fn(eager_x)
    got = lucid.compile(fn, strict=True)(comp_x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(comp_x.numpy(), eager_x.numpy())
