"""Shape ops: values against numpy, gradients against finite differences, clear errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lucid
from lucid.testing import assert_close, gradcheck

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3)


def rand(*shape, seed=0, grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=grad)


def arr(x):
    return x.detach().numpy()


# --- reshape family ---------------------------------------------------------------------------


def test_reshape_and_view_with_minus_one():
    x = rand(2, 3, 4)
    assert_close(x.reshape(4, -1), arr(x).reshape(4, -1))
    assert_close(x.view((-1,)), arr(x).reshape(-1))
    assert_close(lucid.reshape(x, [3, 8]), arr(x).reshape(3, 8))
    gradcheck(lambda t: t.reshape(6, 4), x)


def test_reshape_errors():
    x = rand(2, 3)
    with pytest.raises(ValueError, match="cannot reshape"):
        x.reshape(4, 2)
    with pytest.raises(ValueError, match="only one dimension can be -1"):
        x.reshape(-1, -1)
    with pytest.raises(ValueError, match="invalid size"):
        x.reshape(-2, -3)


@given(shape=shapes, data=st.data())
def test_flatten_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    n = max(len(shape), 1)
    start = data.draw(st.integers(-n, n - 1))
    end = data.draw(st.integers(-n, n - 1))
    if len(shape) and start % n > end % n:
        with pytest.raises(ValueError, match="start_dim"):
            x.flatten(start, end)
        return
    out = lucid.flatten(x, start, end)
    if not shape:
        assert out.shape == (1,)
        return
    s, e = start % n, end % n
    expected = arr(x).reshape(*shape[:s], -1, *shape[e + 1 :])
    assert_close(out, expected)


def test_flatten_gradient_and_select():
    x = rand(2, 3, 4)
    gradcheck(lambda t: t.flatten(1), x)
    assert_close(x.select(1, -1), arr(x)[:, -1])
    assert_close(lucid.select(x, -1, 2), arr(x)[..., 2])
    gradcheck(lambda t: t.select(2, 1), x)
    with pytest.raises(IndexError, match="out of bounds"):
        x.select(1, 3)


def test_unflatten():
    x = rand(2, 12)
    assert_close(x.unflatten(1, (3, -1)), arr(x).reshape(2, 3, 4))
    assert_close(lucid.unflatten(x, -1, (2, 2, 3)), arr(x).reshape(2, 2, 2, 3))
    gradcheck(lambda t: t.unflatten(1, (4, 3)), x)
    with pytest.raises(ValueError, match="cannot reshape"):
        x.unflatten(1, (5, 2))


@given(shape=shapes, data=st.data())
def test_squeeze_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    assert_close(x.squeeze(), np.squeeze(arr(x)))
    if shape:
        d = data.draw(st.integers(-len(shape), len(shape) - 1))
        # torch: squeezing a dim whose size is not 1 leaves the tensor unchanged
        expected = np.squeeze(arr(x), d) if shape[d] == 1 else arr(x)
        assert_close(lucid.squeeze(x, d), expected)


def test_squeeze_tuple_of_dims_and_errors():
    x = rand(1, 3, 1, 2)
    assert lucid.squeeze(x, (0, 2)).shape == (3, 2)
    assert x.squeeze((0, 1)).shape == (3, 1, 2)
    gradcheck(lambda t: t.squeeze(-2), x)
    with pytest.raises(IndexError, match="dim 4 is out of range"):
        x.squeeze(4)
    assert rand().squeeze(0).shape == ()


@given(shape=shapes, data=st.data())
def test_unsqueeze_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    d = data.draw(st.integers(-len(shape) - 1, len(shape)))
    assert_close(x.unsqueeze(d), np.expand_dims(arr(x), d))


def test_unsqueeze_error_and_gradient():
    x = rand(2, 3)
    gradcheck(lambda t: t.unsqueeze(1), x)
    with pytest.raises(IndexError, match="dim 3 is out of range"):
        x.unsqueeze(3)


# --- expand -------------------------------------------------------------------------------------


def test_expand_family():
    x = rand(3, 1)
    assert_close(x.expand(2, 3, 4), np.broadcast_to(arr(x), (2, 3, 4)))
    assert_close(x.expand(-1, 5), np.broadcast_to(arr(x), (3, 5)))
    assert_close(lucid.broadcast_to(x, (2, 3, 2)), np.broadcast_to(arr(x), (2, 3, 2)))
    assert_close(x.expand_as(rand(3, 4)), np.broadcast_to(arr(x), (3, 4)))
    gradcheck(lambda t: t.expand(2, 3, 4), x)
    with pytest.raises(ValueError, match="must match"):
        x.expand(4, 4)


# --- permute family -----------------------------------------------------------------------------


@given(shape=shapes, data=st.data())
def test_permute_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    perm = data.draw(st.permutations(range(len(shape))))
    # negative dims name the same axes
    dims = [d - len(shape) if data.draw(st.booleans()) else d for d in perm]
    assert_close(x.permute(*dims), np.transpose(arr(x), perm))
    assert_close(lucid.permute(x, dims), np.transpose(arr(x), perm))


def test_permute_gradient_and_errors():
    x = rand(2, 3, 4)
    gradcheck(lambda t: t.permute(2, 0, 1), x)
    with pytest.raises(ValueError, match="not a permutation"):
        x.permute(0, 0, 1)
    with pytest.raises(ValueError, match="not a permutation"):
        x.permute(0, 1)
    with pytest.raises(IndexError, match="out of range"):
        x.permute(0, 1, 3)


@given(shape=nonscalar_shapes, data=st.data())
def test_transpose_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    n = len(shape)
    a, b = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    expected = np.swapaxes(arr(x), a, b)
    assert_close(x.transpose(a, b), expected)
    assert_close(lucid.swapaxes(x, a, b), expected)


def test_transpose_t_T_mT():
    x = rand(2, 3, 4)
    gradcheck(lambda t: t.transpose(0, -1), x)
    assert_close(x.T, np.transpose(arr(x)))
    assert_close(x.mT, np.swapaxes(arr(x), -1, -2))
    gradcheck(lambda t: t.mT, x)
    m = rand(2, 3)
    assert_close(m.t(), arr(m).T)
    assert_close(lucid.t(rand(3)), arr(rand(3)))
    assert rand().transpose(0, -1).shape == ()
    with pytest.raises(ValueError, match="<= 2 dims"):
        x.t()
    with pytest.raises(ValueError, match="at least 2 dims"):
        _ = rand(3).mT
    with pytest.raises(IndexError, match="out of range"):
        x.transpose(0, 3)


def test_movedim():
    x = rand(2, 3, 4, grad=False)
    assert_close(x.movedim(0, -1), np.moveaxis(arr(x), 0, -1))
    assert_close(lucid.movedim(x, (0, 1), (2, 0)), np.moveaxis(arr(x), (0, 1), (2, 0)))


# --- cat / stack / split ------------------------------------------------------------------------


@given(shape=nonscalar_shapes, data=st.data())
def test_cat_matches_numpy(shape, data):
    n = len(shape)
    d = data.draw(st.integers(-n, n - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    parts = []
    for i, s in enumerate(sizes):
        sh = list(shape)
        sh[d] = s
        parts.append(rand(*sh, seed=i, grad=False))
    assert_close(lucid.cat(parts, d), np.concatenate([arr(p) for p in parts], axis=d))


def test_cat_gradient_and_promotion():
    a, b = rand(2, 3), rand(2, 1, seed=1)
    gradcheck(lambda x, y: lucid.cat([x, y], dim=1), a, b)
    gradcheck(lambda x, y: lucid.concat((y, x, y), -1), a, b)
    ints = lucid.tensor([[1, 2]])
    out = lucid.cat([ints, lucid.tensor([[0.5, 1.5]])])
    assert out.dtype is lucid.float32
    assert_close(out, np.array([[1, 2], [0.5, 1.5]], dtype=np.float32))


def test_cat_errors_name_dim_and_shapes():
    with pytest.raises(ValueError, match=r"in dim 1 for tensor 1 \(shapes \(2, 3\) and \(2, 4\)\)"):
        lucid.cat([rand(2, 3), rand(2, 4)])
    with pytest.raises(ValueError, match="tensor 1 has 1 dims"):
        lucid.cat([rand(2, 3), rand(3)])
    with pytest.raises(ValueError, match="zero-dimensional"):
        lucid.cat([rand(), rand()])
    with pytest.raises(ValueError, match="non-empty"):
        lucid.cat([])
    with pytest.raises(TypeError, match="list or tuple"):
        lucid.cat(rand(2))


@given(shape=shapes, data=st.data(), k=st.integers(1, 3))
def test_stack_matches_numpy(shape, data, k):
    d = data.draw(st.integers(-len(shape) - 1, len(shape)))
    parts = [rand(*shape, seed=i, grad=False) for i in range(k)]
    assert_close(lucid.stack(parts, d), np.stack([arr(p) for p in parts], axis=d))


def test_stack_gradient_and_error():
    gradcheck(lambda a, b: lucid.stack([a, b], 1), rand(2, 3), rand(2, 3, seed=1))
    with pytest.raises(ValueError, match=r"tensor 1 has \(3, 2\)"):
        lucid.stack([rand(2, 3), rand(3, 2)])


@given(n=st.integers(0, 7), size=st.integers(1, 4))
def test_split_by_size_matches_torch_rule(n, size):
    x = rand(n, 2, grad=False)
    pieces = x.split(size)
    expected = [arr(x)[i : i + size] for i in range(0, n, size)] or [arr(x)]
    assert len(pieces) == len(expected)
    for p, e in zip(pieces, expected, strict=True):
        assert_close(p, e)


def test_split_sections_chunk_unbind():
    x = rand(2, 6)
    a, b, c = lucid.split(x, [1, 3, 2], dim=1)
    assert_close(b, arr(x)[:, 1:4])
    assert_close(c, arr(x)[:, 4:])
    gradcheck(lambda t: t.split([1, 3, 2], -1)[1], x)
    gradcheck(lambda t: t.split(4, 1)[1] * 2.0, x)
    with pytest.raises(ValueError, match="add up to 6"):
        x.split([1, 2], dim=1)
    # torch.chunk: ceil-sized pieces, possibly fewer than asked
    assert [p.shape for p in x.chunk(4, dim=1)] == [(2, 2), (2, 2), (2, 2)]
    assert [p.shape for p in lucid.chunk(x, 2)] == [(1, 6), (1, 6)]
    rows = x.unbind(0)
    assert len(rows) == 2 and rows[1].shape == (6,)
    assert_close(lucid.unbind(x, -1)[5], arr(x)[:, 5])
    gradcheck(lambda t: t.unbind(1)[2], x)
    assert [r.shape for r in x] == [(6,), (6,)]  # iteration goes through unbind
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        x.chunk(0)


def test_narrow():
    x = rand(4, 5)
    assert_close(x.narrow(1, 1, 3), arr(x)[:, 1:4])
    assert_close(lucid.narrow(x, 0, -2, 2), arr(x)[2:4])
    gradcheck(lambda t: t.narrow(1, 2, 2), x)
    with pytest.raises(IndexError, match="out of range"):
        x.narrow(1, 3, 3)


# --- tile / repeat ------------------------------------------------------------------------------


@given(shape=shapes, data=st.data())
def test_repeat_and_tile_match_numpy(shape, data):
    x = rand(*shape, grad=False)
    extra = data.draw(st.integers(0, 2))
    reps = data.draw(
        st.lists(st.integers(0, 3), min_size=len(shape) + extra, max_size=len(shape) + extra)
    )
    assert_close(x.repeat(*reps), np.tile(arr(x), reps))
    short = data.draw(st.lists(st.integers(1, 3), max_size=len(shape) + 1))
    assert_close(lucid.tile(x, short), np.tile(arr(x), short))


def test_repeat_gradient_and_error():
    x = rand(2, 3)
    gradcheck(lambda t: t.repeat(2, 1, 3), x)
    gradcheck(lambda t: t.tile((2,)), x)
    with pytest.raises(ValueError, match="can not be smaller"):
        x.repeat(2)


# --- pad ----------------------------------------------------------------------------------------


def test_constant_pad_matches_numpy_and_crops_with_negative_amounts():
    x = rand(2, 3, 4)
    out = lucid.pad(x, (1, 2, 0, 1), value=1.5)
    expected = np.pad(arr(x), [(0, 0), (0, 1), (1, 2)], constant_values=1.5)
    assert_close(out, expected)
    assert_close(lucid.pad(x, (-1, 1)), np.pad(arr(x)[..., 1:], [(0, 0), (0, 0), (0, 1)]))
    gradcheck(lambda t: lucid.pad(t, (1, 2, 2, 0)), x)
    gradcheck(lambda t: lucid.pad(t, (-1, 1, 0, -2)), x)


@pytest.mark.parametrize(
    ("mode", "np_mode"), [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")]
)
def test_reflect_replicate_circular_pad(mode, np_mode):
    x = rand(2, 3, 4)
    out = lucid.pad(x, (2, 3, 1, 2), mode=mode)
    assert_close(out, np.pad(arr(x), [(0, 0), (1, 2), (2, 3)], mode=np_mode))
    gradcheck(lambda t: lucid.pad(t, (2, 1, 2, 1), mode=mode), x)


def test_pad_errors():
    x = rand(2, 3)
    with pytest.raises(ValueError, match="even length"):
        lucid.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match="at most 2"):
        lucid.pad(x, (3, 0), mode="reflect")
    with pytest.raises(ValueError, match="unknown mode"):
        lucid.pad(x, (1, 1), mode="mirror")
    with pytest.raises(ValueError, match="negative"):
        lucid.pad(x, (-4, 0))


# --- tril / triu / flip / roll ------------------------------------------------------------------


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_tril_triu(k):
    x = rand(2, 3, 4)
    assert_close(x.tril(k), np.tril(arr(x), k))
    assert_close(lucid.triu(x, k), np.triu(arr(x), k))
    gradcheck(lambda t: t.tril(k), x)
    gradcheck(lambda t: t.triu(k), x)


def test_tril_needs_a_matrix():
    with pytest.raises(ValueError, match="at least 2 dims"):
        rand(3).tril()


@given(shape=nonscalar_shapes, data=st.data())
def test_flip_matches_numpy(shape, data):
    x = rand(*shape, grad=False)
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1))
    assert_close(x.flip(dims), np.flip(arr(x), dims))
    assert_close(lucid.flip(x, *[d - len(shape) for d in dims]), np.flip(arr(x), dims))


def test_flip_gradient_and_errors():
    x = rand(2, 3)
    gradcheck(lambda t: t.flip(0, 1), x)
    with pytest.raises(ValueError, match="repeats"):
        x.flip(0, 0)


def test_roll():
    x = rand(3, 4)
    assert_close(x.roll(1, 0), np.roll(arr(x), 1, 0))
    assert_close(lucid.roll(x, (2, -1), (1, 0)), np.roll(arr(x), (2, -1), (1, 0)))
    assert_close(x.roll(5), np.roll(arr(x), 5))
    gradcheck(lambda t: t.roll((1, 2), (0, 1)), x)
    gradcheck(lambda t: t.roll(3), x)
    with pytest.raises(ValueError, match="same length"):
        x.roll((1, 2), 0)


# --- views and version counters -----------------------------------------------------------------


def test_inplace_write_through_a_view_is_seen_by_autograd():
    x = rand(2, 3)
    y = x * 1.0
    z = y.exp()  # saves its output
    v = z.view(-1)
    v.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.sum().backward()


def test_shape_inference_keeps_a_symbolic_batch_dim():
    from lucid.trace import _tracing

    with _tracing() as tracer:
        x = tracer.input((None, 3, 4))
        assert x.flatten(1).shape == (None, 12)
        assert x.reshape(-1, 12).shape == (None, 12)
        assert x.view(x.shape[0], -1).shape == (None, 12)
        assert x.permute(0, 2, 1).shape == (None, 4, 3)
        assert lucid.cat([x, x], 1).shape == (None, 6, 4)
        assert lucid.stack([x, x], 1).shape == (None, 2, 3, 4)
        assert x.unsqueeze(1).squeeze().shape == (None, 3, 4)
        assert x.split(2, -1)[1].shape == (None, 3, 2)
        assert lucid.pad(x, (1, 1)).shape == (None, 3, 6)
        with pytest.raises(ValueError, match="symbolic dims must be kept"):
            x.reshape(12, 2, -1)


@given(batch=st.integers(1, 4))
def test_symbolic_trace_of_shape_ops_runs_at_any_batch_size(batch):
    from lucid.ir import import_trace, interpret
    from lucid.trace import _tracing

    def fn(x):
        y = x.flatten(1).reshape(x.shape[0], -1, 2).repeat(1, 2, 1)
        return y.view(-1, 12).expand(x.shape[0], 12) + lucid.cat([x, x], 1).reshape(-1, 12)

    with _tracing() as tracer:
        tr = tracer.finish(fn(tracer.input((None, 3, 2), lucid.float64)))
    data = np.random.default_rng(batch).standard_normal((batch, 3, 2))
    got = interpret(import_trace(tr), [data])[0]
    np.testing.assert_allclose(got, fn(lucid.tensor(data)).numpy())


@pytest.mark.parametrize(
    "make_view",
    [
        lambda t: t.expand(2, 2, 3),
        lambda t: t.transpose(0, 1),
        lambda t: t.split(1, 0)[0],
        lambda t: t.unbind(1)[0],
        lambda t: t.flatten(),
    ],
)
def test_inplace_write_to_base_is_seen_by_nodes_that_saved_a_view(make_view):
    w = rand(2, 3, seed=1)
    x = rand(2, 3, grad=False)
    v = make_view(x)
    z = v * w.sum()  # saves v to compute w's gradient
    x.add_(1.0)  # the view's values changed under z's node
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.sum().backward()


def test_cat_gradient_along_a_symbolic_dim_slices_from_both_ends():
    from lucid.ir import import_trace, interpret
    from lucid.ops._registry import REGISTRY, VJPContext
    from lucid.trace import _tracing

    with _tracing() as tracer:
        a, b, c = tracer.input((2, 3)), tracer.input((None, 3)), tracer.input((1, 3))
        out = lucid.cat([a, b, c])
        g = tracer.input((None, 3))
        ctx = VJPContext(([a, b, c],), [out], {"dim": 0}, (True, True, True))
        (grads,) = REGISTRY["cat"].vjp(ctx, g)
        # a slice of a symbolic dim has a symbolic size (its bounds may be clamped)
        assert [t.shape for t in grads] == [(None, 3)] * 3
        tr = tracer.finish(grads)
    for n in (1, 4):
        data = [np.zeros((2, 3)), np.zeros((n, 3)), np.zeros((1, 3))]
        gval = np.arange((n + 3) * 3, dtype=np.float32).reshape(n + 3, 3)
        got = interpret(import_trace(tr), [*data, gval])
        np.testing.assert_array_equal(got[0], gval[:2])
        np.testing.assert_array_equal(got[1], gval[2 : 2 + n])
        np.testing.assert_array_equal(got[2], gval[2 + n :])
