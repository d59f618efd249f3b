"""scaled_dot_product_attention, embedding, one_hot: numpy references and gradients."""

import math

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0, requires_grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=requires_grad)


def arr(t):
    return t.detach().numpy()


def ref_attention(q, k, v, mask=None, is_causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if is_causal:
        length, size = s.shape[-2:]
        s = np.where(np.arange(size)[None, :] <= np.arange(length)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_values_and_gradients(is_causal, scale):
    q, k, v = f64(2, 3, 4, seed=1), f64(2, 5, 4, seed=2), f64(2, 5, 3, seed=3)
    got = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    expected = ref_attention(arr(q), arr(k), arr(v), is_causal=is_causal, scale=scale)
    assert_close(got, expected, rtol=1e-10, atol=1e-12)
    gradcheck(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=is_causal, scale=scale),
        q,
        k,
        v,
    )


def test_attention_boolean_and_additive_masks_with_broadcast_heads():
    q, k, v = f64(2, 2, 3, 4, seed=1), f64(2, 2, 3, 4, seed=2), f64(2, 2, 3, 4, seed=3)
    keep = np.array([[True, False, True], [True, True, False], [False, True, True]])
    bool_mask = lucid.tensor(keep)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)
    assert_close(got, ref_attention(arr(q), arr(k), arr(v), mask=keep), rtol=1e-10)
    additive = np.random.default_rng(4).standard_normal((2, 1, 3, 3))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=lucid.tensor(additive))
    assert_close(got, ref_attention(arr(q), arr(k), arr(v), mask=additive), rtol=1e-10)
    gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=bool_mask), q, k, v)


def test_attention_key_value_broadcast_over_query_heads():
    q, k, v = f64(2, 3, 2, 4, seed=1), f64(2, 1, 5, 4, seed=2), f64(2, 1, 5, 3, seed=3)
    got = F.scaled_dot_product_attention(q, k, v)
    assert got.shape == (2, 3, 2, 3)
    assert_close(got, ref_attention(arr(q), arr(k), arr(v)), rtol=1e-10)
    gradcheck(F.scaled_dot_product_attention, q, k, v)


def test_attention_with_dropout_one_drops_everything_and_zero_keeps_all():
    q, k, v = f64(1, 2, 4), f64(1, 3, 4, seed=1), f64(1, 3, 2, seed=2)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert np.all(arr(out) == 0)
    ref = ref_attention(arr(q), arr(k), arr(v), is_causal=True)
    assert_close(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True), ref)


@pytest.mark.parametrize("kind", ["bool", "float", "causal"])
def test_attention_dropout_path_applies_masks_like_the_fused_op(kind):
    q, k, v = f64(2, 3, 4, seed=1), f64(2, 3, 4, seed=2), f64(2, 3, 2, seed=3)
    kw = {"is_causal": True} if kind == "causal" else {}
    if kind == "bool":
        kw["attn_mask"] = lucid.tensor(np.array([[1, 0, 1], [1, 1, 0], [0, 0, 1]], bool))
    elif kind == "float":
        kw["attn_mask"] = lucid.tensor(np.random.default_rng(5).standard_normal((3, 3)))
    # a vanishing dropout probability takes the composite path and keeps (almost) everything
    composite = F.scaled_dot_product_attention(q, k, v, dropout_p=1e-12, **kw)
    assert_close(composite, F.scaled_dot_product_attention(q, k, v, **kw), rtol=1e-9)


def test_attention_rejects_bad_shapes_and_mask_combinations():
    q, k, v = f64(2, 3, 4), f64(2, 5, 4), f64(2, 5, 3)
    with pytest.raises(ValueError, match="embedding dim 4 does not match key's 2"):
        F.scaled_dot_product_attention(q, f64(2, 5, 2), v)
    with pytest.raises(ValueError, match="key has 5 positions but value has 4"):
        F.scaled_dot_product_attention(q, k, f64(2, 4, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=lucid.tensor(np.ones((3, 4), bool)))
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=lucid.tensor(np.ones((3, 5), bool)), is_causal=True
        )


# --- embedding / one_hot


def test_embedding_lookup_and_gradient_skips_padding_row():
    w = f64(5, 3)
    idx = lucid.tensor(np.array([[0, 2, 2], [4, 1, 0]]))
    out = F.embedding(idx, w, padding_idx=2)
    assert_close(out, arr(w)[np.array([[0, 2, 2], [4, 1, 0]])])
    cot = np.random.default_rng(1).standard_normal((2, 3, 3))
    out.backward(lucid.tensor(cot, dtype=lucid.float64))
    expected = np.zeros((5, 3))
    np.add.at(expected, np.array([0, 2, 2, 4, 1, 0]), cot.reshape(-1, 3))
    expected[2] = 0
    assert_close(w.grad, expected, rtol=1e-12)


def test_embedding_gradcheck_negative_padding_idx_and_scale_grad_by_freq():
    w = f64(4, 2)
    idx = lucid.tensor(np.array([3, 1, 1, 0]))
    gradcheck(lambda t: F.embedding(idx, t), w)
    # padding_idx=-1 is row 3: looked up as usual, but it receives no gradient
    F.embedding(idx, w, padding_idx=-1).sum().backward()
    assert_close(w.grad, np.array([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]))
    w.grad = None
    out = F.embedding(idx, w, scale_grad_by_freq=True)
    out.sum().backward()
    # index 1 appears twice: its summed gradient is divided by its count
    assert_close(w.grad, np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))


def test_embedding_double_backward():
    w = f64(4, 2)
    idx = lucid.tensor(np.array([3, 1, 1]))

    def grad_w(t):
        (g,) = lucid.autograd.grad(
            (F.embedding(idx, t, padding_idx=1) ** 3).sum(), t, create_graph=True
        )
        return g

    gradcheck(grad_w, w)


def test_embedding_max_norm_renormalises_looked_up_rows_in_place():
    w = lucid.tensor(np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]]))
    F.embedding(lucid.tensor(np.array([0, 1])), w, max_norm=1.0)
    norms = np.linalg.norm(arr(w), axis=1)
    assert_close(norms[:2], np.array([1.0, 0.5]), rtol=1e-5)
    assert norms[2] == pytest.approx(10.0)


def test_embedding_rejects_bad_indices():
    w = f64(3, 2)
    with pytest.raises(IndexError, match="index 3 is out of range for 3 embeddings"):
        F.embedding(lucid.tensor(np.array([0, 3])), w)
    with pytest.raises(TypeError, match="integer"):
        F.embedding(lucid.tensor(np.array([0.0])), w)
    with pytest.raises(ValueError, match="padding_idx"):
        F.embedding(lucid.tensor(np.array([0])), w, padding_idx=3)


def test_one_hot_values_and_inferred_class_count():
    x = lucid.tensor(np.array([[0, 2], [1, 2]]))
    out = F.one_hot(x)
    assert out.dtype is lucid.int64
    np.testing.assert_array_equal(out.numpy(), np.eye(3, dtype=np.int64)[x.numpy()])
    assert F.one_hot(x, num_classes=5).shape == (2, 2, 5)
    # A class value outside [0, num_classes) is an IndexError, as embedding's and the losses'
    # (compiled code raises the same error through prim.check_index).
    with pytest.raises(IndexError, match="class value 2 is out of bounds for 2 classes"):
        F.one_hot(x, num_classes=2)
    with pytest.raises(IndexError, match="class value -1 is out of bounds for 3 classes"):
        F.one_hot(lucid.tensor(np.array([-1, 0])), 3)


@pytest.mark.parametrize("is_causal", [False, True])
def test_no_keys_attend_to_nothing_and_give_zeros(is_causal):
    # softmax over an empty key axis weighs nothing: PyTorch returns zeros, gradients empty/zero
    q = lucid.randn(2, 3, 4, requires_grad=True)
    k = lucid.randn(2, 0, 4, requires_grad=True)
    v = lucid.randn(2, 0, 5, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, 5) and not out.detach().numpy().any()
    out.sum().backward()
    assert q.grad.shape == (2, 3, 4) and not q.grad.numpy().any()
    assert k.grad.shape == (2, 0, 4) and v.grad.shape == (2, 0, 5)
    compiled = lucid.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c))
    with lucid.no_grad():
        got = compiled(q.detach(), k.detach(), v.detach())
    assert got.shape == (2, 3, 5) and not got.numpy().any()
