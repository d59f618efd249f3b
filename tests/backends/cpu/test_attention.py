"""Fused attention (fuse-kernels' ``attention`` and ``attention_grad``): the fused programs match
the unfused ones (prim interpreter and native), eager Lucid, and float64 finite differences for
the gradient; one and two threads give bit-identical results; masked attention and attention
whose weights are read elsewhere keep an unfused forward (a masked gradient folds); malformed
instructions raise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid import _native
from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)
from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites import fuse_kernels

TOL = {"f32": (2e-5, 2e-6), "f64": (1e-12, 1e-13)}


pytestmark = pytest.mark.usefixtures("fixed_threads")


def _run_at_threads(p: Program, feeds, fuse=True, threads=(1, 2)) -> list[list[np.ndarray]]:
    outs = []
    for n in threads:
        set_num_threads(n)
        ex = CPUBackend(fuse=fuse, cache=False).compile(p)
        outs.append(ex.run([f.copy() for f in feeds]))
    return outs


def _check(p: Program, feeds, dtype: str, scale: float = 1.0) -> None:
    """Fused native at 1 and 2 threads (bit-identical) against the prim interpreter and the
    unfused native program."""
    rtol, atol = (t * scale for t in TOL[dtype])
    one, two = _run_at_threads(p, feeds)
    want = p.interpret([f.copy() for f in feeds])
    (unfused,) = _run_at_threads(p, feeds, fuse=False, threads=(2,))
    for a, b, w, u in zip(one, two, want, unfused, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
        np.testing.assert_allclose(a, u, rtol=rtol, atol=atol)


def _attention_program(b, h, lq, lk, d, dv, dtype, scale, axis):
    p = Program()
    q, k, v = (
        p.feed((b, h, lq, d), dtype),
        p.feed((b, h, lk, d), dtype),
        p.feed((b, h, lk, dv), dtype),
    )
    s = p.op("matmul", q, k, transpose_a=False, transpose_b=True)
    s = p.op("mul", s, p.op("constant", shape=(), dtype=dtype, value=(scale,)))
    w = p.op("softmax", s, axis=axis)
    p.result(p.op("matmul", w, v, transpose_a=False, transpose_b=False))
    return p


def _feeds(p: Program, seed: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for s in p.feeds:
        a = p.slots[s]
        out.append((rng.standard_normal(a.shape) * scale).astype(a.dtype.replace("f", "float")))
    return out


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    lq=st.sampled_from([1, 2, 5, 8, 13]),
    lk=st.sampled_from([1, 3, 7, 16]),
    d=st.integers(1, 9),
    dv=st.integers(1, 9),
    dtype=st.sampled_from(["f32", "f64"]),
    scale=st.sampled_from([0.125, 1.0, -0.7]),
    axis=st.sampled_from([-1, 3]),
    seed=st.integers(0, 2**16),
)
def test_dense_attention_folds_and_matches_unfused(b, h, lq, lk, d, dv, dtype, scale, axis, seed):
    p = _attention_program(b, h, lq, lk, d, dv, dtype, scale, axis)
    ops = [i.op for i in fuse_kernels(p).instrs]
    assert "attention" in ops and "softmax" not in ops and "matmul" not in ops
    # Inputs scaled by 2: rounding error grows with |V| and the scores, so does the tolerance.
    _check(p, _feeds(p, seed, scale=2.0), dtype, scale=2.0)


def test_many_query_blocks_and_wide_scores_match():
    # 300 keys: the kernel takes 54 query rows per block, so 300 queries run in 6 blocks.
    p = _attention_program(1, 2, 300, 300, 4, 3, "f32", 0.5, -1)
    _check(p, _feeds(p, 3), "f32", scale=5.0)


def _view_attention_program(b, h, lq, lk, d, dv, alpha, order=(0, 1), weights=False):
    """An ``attention`` instruction over head views of [B, L, W] slots, as fuse-kernels emits
    for a multi-head projection: q from one slot, k and v side by side in another (columns in
    ``order``), the output in a [B, Lq, H*Dv] slot, and with ``weights`` P [B, H, Lq, Lk] as a
    second output."""
    p = Program()
    widths = (h * d, h * d, h * dv)
    q_slot = p.feed((b, lq, widths[0] + 3), "f32")  # 3 extra columns: the view does not fill it
    kv_cols = [sum(widths[1:][j] for j in range(2) if order[j] < order[i]) for i in (0, 1)]
    kv_slot = p.feed((b, lk, widths[1] + widths[2]), "f32")
    out = p.new_slot((b, lq, h * dv), "f32")
    attrs = {
        "alpha": alpha,
        "q_view": [h, d, 3],
        "k_view": [h, d, kv_cols[0]],
        "v_view": [h, dv, kv_cols[1]],
        "out_view": [h, dv],
    }
    outs = (out, p.new_slot((b, h, lq, lk), "f32")) if weights else (out,)
    p.instrs.append(Instr("attention", (q_slot, kv_slot, kv_slot), outs, attrs))
    for o in outs:
        p.result(o)
    return p


def _float64_attention(p: Program, feeds) -> tuple[np.ndarray, np.ndarray]:
    """(softmax(alpha Q Kᵀ) V, the weights) in float64 for _view_attention_program."""
    (ins,) = p.instrs
    attrs = ins.attrs

    def heads(x, view):
        h, dim, col0 = view
        x = x[..., col0 : col0 + h * dim].astype(np.float64)
        return x.reshape(*x.shape[:2], h, dim).transpose(0, 2, 1, 3)

    q = heads(feeds[0], attrs["q_view"])
    k, v = heads(feeds[1], attrs["k_view"]), heads(feeds[1], attrs["v_view"])
    s = q @ k.transpose(0, 1, 3, 2) * attrs["alpha"]
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    out = w @ v
    return out.transpose(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1), w


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    lq=st.sampled_from([1, 5, 6, 7, 13, 64, 65, 97, 100]),
    lk=st.sampled_from([1, 7, 8, 9, 16, 17, 63, 64, 70]),
    d=st.sampled_from([8, 12, 16, 31, 32, 40, 64]),
    dv=st.sampled_from([8, 9, 16, 24, 32, 33, 64]),
    order=st.sampled_from([(0, 1), (1, 0)]),
    scale=st.sampled_from([0.3, 3.0]),
    weights=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_head_view_attention_matches_reference_at_head_dims_and_lengths(
    b, h, lq, lk, d, dv, order, scale, weights, seed
):
    # Lengths and head dims that are and are not multiples of the kernel's 6-row and 8- and
    # 16-column tiles, more than one 96-row query block; scale 3 pushes most weights below
    # exp's flush to zero.
    p = _view_attention_program(b, h, lq, lk, d, dv, 1.0 / np.sqrt(d), order, weights)
    feeds = _feeds(p, seed, scale=scale)
    one, two = _run_at_threads(p, feeds)
    for a, b2 in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b2)
    want_out, want_weights = _float64_attention(p, feeds)
    # A score's float32 rounding grows with its size (scale^2) and reaches the output through
    # exp, times a value row (scale).
    atol = 2e-6 * max(1.0, scale) ** 3
    np.testing.assert_allclose(one[0], want_out, rtol=2e-5, atol=atol)
    if weights:
        np.testing.assert_allclose(one[1], want_weights, rtol=2e-5, atol=atol / scale)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_attention_over_no_keys_is_zero(dtype):
    # An empty softmax row: P V is an empty sum, 0 (as the unfused program computes it).
    p = _attention_program(2, 2, 7, 0, 4, 9, dtype, 0.5, -1)
    feeds = _feeds(p, 0)
    one, two = _run_at_threads(p, feeds)
    (unfused,) = _run_at_threads(p, feeds, fuse=False, threads=(2,))
    assert "attention" in [i.op for i in fuse_kernels(p).instrs]
    np.testing.assert_array_equal(one[0], np.zeros((2, 2, 7, 9)))
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[0], unfused[0])


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nan_inputs_reach_the_rows_they_touch(where):
    # A NaN score makes its softmax row NaN (as the softmax kernel does); a NaN value row reaches
    # every output of its head through P V. Other heads and rows stay finite.
    b, h, length, d = 2, 2, 13, 8
    p = _view_attention_program(b, h, length, length, d, d, 0.5)
    q, kv = _feeds(p, 4)
    e = h * d
    if where == "query":
        q[1, 5, 3 + d + 2] = np.nan  # batch 1, row 5, head 1
    elif where == "key":
        kv[1, 7, d + 2] = np.nan  # batch 1, key 7, head 1: every row of that head
    else:
        kv[1, 7, e + d + 2] = np.nan  # batch 1, value row 7, head 1
    one, two = _run_at_threads(p, [q, kv])
    np.testing.assert_array_equal(one[0], two[0])
    got = one[0].reshape(b, length, h, d)
    want = p.interpret([q, kv])[0].reshape(b, length, h, d)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("length", [4, 13])
def test_weights_read_elsewhere_become_the_second_output(dtype, length):
    p = _attention_program(2, 2, length, length, 3, 5, dtype, 0.5, -1)
    weights = p.instrs[-1].inputs[0]
    p.results.append(weights)  # the weights are a result as well
    fused = fuse_kernels(p)
    (att,) = [i for i in fused.instrs if i.op == "attention"]
    assert "softmax" not in [i.op for i in fused.instrs] and att.outputs[1] == weights
    _check(p, _feeds(p, 0, scale=2.0), dtype)


def test_weights_read_before_the_product_or_masked_scores_stay_unfused():
    p = _attention_program(2, 2, 4, 4, 3, 3, "f32", 0.5, -1)
    pv = p.instrs.pop()
    total = p.op("reduce_sum", pv.inputs[0], axes=(3,), keepdims=False)  # read before P V
    p.instrs.append(pv)
    p.results.append(total)
    ops = [i.op for i in fuse_kernels(p).instrs]
    assert "attention" not in ops and "softmax" in ops
    _check(p, _feeds(p, 0), "f32")
    q = Program()
    a, k, v = (q.feed((1, 2, 4, 3)) for _ in range(3))
    m = q.feed((4, 4))
    s = q.op("matmul", a, k, transpose_a=False, transpose_b=True)
    w = q.op("softmax", q.op("add", s, m), axis=-1)
    q.result(q.op("matmul", w, v, transpose_a=False, transpose_b=False))
    ops = [i.op for i in fuse_kernels(q).instrs]
    assert "attention" not in ops and "softmax" in ops
    _check(q, _feeds(q, 1), "f32")


# -- through lucid.compile: multi-head self-attention (head views of one QKV projection) ------


def _mha(embed, heads, dtype=lucid.float32, seed=0):
    lucid.manual_seed(seed)
    return nn.MultiheadAttention(embed, heads, batch_first=True).to(dtype)


class SelfAttention(nn.Module):
    def __init__(self, embed, heads, need_weights=False, mask=None):
        super().__init__()
        self.attn = _mha(embed, heads)
        self.need_weights, self.mask = need_weights, mask

    def forward(self, x):
        out, w = self.attn(x, x, x, need_weights=self.need_weights, attn_mask=self.mask)
        return out if w is None else out + w.sum()


@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 3),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([1, 2, 5, 8]),
    length=st.sampled_from([1, 2, 7, 16]),
    seed=st.integers(0, 2**16),
)
def test_compiled_self_attention_matches_eager(b, heads, head_dim, length, seed):
    model = SelfAttention(heads * head_dim, heads).eval()
    x = lucid.tensor(np.random.default_rng(seed).standard_normal((b, length, heads * head_dim)))
    x = x.float()
    cm = lucid.compile(model)
    with lucid.no_grad():
        want = model(x).numpy()
        got = cm(x).numpy()
        ops = {r["op"] for r in cm.profile(x, repeats=1)}
    assert "attention" in ops and "softmax" not in ops
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_attention_with_weights_or_masks_stays_unfused_and_correct():
    x = lucid.tensor(np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32))
    causal = lucid.tensor(np.triu(np.full((5, 5), -np.inf, dtype=np.float32), 1))
    for model in (SelfAttention(8, 2, need_weights=True), SelfAttention(8, 2, mask=causal)):
        model.eval()
        cm = lucid.compile(model)
        with lucid.no_grad():
            want = model(x).numpy()
            got = cm(x).numpy()
            ops = {r["op"] for r in cm.profile(x, repeats=1)}
        assert "attention" not in ops and "softmax" in ops
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _loss(out, target):
    return ((out - target) ** 2).mean()


def _step_gradients(model, x, t) -> tuple[dict, set]:
    """The gradients a fused SGD step (lr = 1) applies, and the ops of its program."""
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    step = lucid.compile.fused_step(model, _loss, lucid.optim.SGD(model.parameters(), lr=1.0))
    ops = {r["op"] for r in step.profile(x, t, repeats=1)}
    step(x, t)
    return {n: before[n] - p.numpy() for n, p in model.named_parameters()}, ops


@settings(max_examples=6, deadline=None)
@given(
    b=st.integers(1, 2),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([1, 3, 4]),
    length=st.sampled_from([1, 3, 6]),
    seed=st.integers(0, 2**16),
)
def test_float64_step_gradients_match_eager_and_finite_differences(
    b, heads, head_dim, length, seed
):
    embed = heads * head_dim
    rng = np.random.default_rng(seed)
    x = lucid.tensor(rng.standard_normal((b, length, embed)))
    t = lucid.tensor(rng.standard_normal((b, length, embed)))
    model = SelfAttention(embed, heads)
    model.attn.to(lucid.float64)
    ref = SelfAttention(embed, heads)
    ref.attn.to(lucid.float64)
    ref.load_state_dict(model.state_dict())
    _loss(ref(x), t).backward()
    grads, ops = _step_gradients(model, x, t)
    assert "attention_grad" in ops
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-9, atol=1e-12)
    # Central differences of the eager float64 loss along a random direction per parameter.
    eps = 1e-6
    for name, p in ref.named_parameters():
        direction = rng.standard_normal(p.shape)
        base = p.numpy().copy()
        values = []
        for sign in (1.0, -1.0):
            with lucid.no_grad():
                p.copy_(lucid.tensor(base + sign * eps * direction))
                values.append(float(_loss(ref(x), t).item()))
        with lucid.no_grad():
            p.copy_(lucid.tensor(base))
        numeric = (values[0] - values[1]) / (2 * eps)
        analytic = float((grads[name] * direction).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), name


@pytest.mark.parametrize("mask", ["additive", "causal", "is_causal"])
def test_masked_attention_gradient_folds_and_matches_eager(mask):
    # A mask tensor's scores stay unfused; the gradient reads only P, so it folds. is_causal
    # alone is the attention composite's causal form, forward and gradient.
    rng = np.random.default_rng(2)
    x = lucid.tensor(rng.standard_normal((2, 5, 6)))
    t = lucid.tensor(rng.standard_normal((2, 5, 6)))
    attn_mask = {
        "additive": lucid.tensor(rng.standard_normal((5, 5))),
        "causal": lucid.tensor(np.triu(np.full((5, 5), -np.inf), 1)),
        "is_causal": None,
    }[mask]

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = _mha(6, 2, lucid.float64)

        def forward(self, x):
            out, _ = self.attn(
                x, x, x, need_weights=False, attn_mask=attn_mask, is_causal=mask == "is_causal"
            )
            return out

    model, ref = Masked(), Masked()
    ref.load_state_dict(model.state_dict())
    _loss(ref(x), t).backward()
    grads, ops = _step_gradients(model, x, t)
    assert "attention_grad" in ops
    if mask == "is_causal":  # the causal composite: its weights come from the forward kernel
        assert "attention" in ops and "softmax" not in ops
    else:
        assert "softmax" in ops
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_encoder_layer_programs_fold_attention():
    # Workload D's block at a small size: both programs keep their attention in one kernel.
    lucid.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((3, 9, 16)).astype(np.float32))
    t = lucid.tensor(rng.standard_normal((3, 9, 16)).astype(np.float32))
    layer.eval()
    cm = lucid.compile(layer)
    with lucid.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), layer(x).numpy(), rtol=1e-5, atol=1e-5)
        assert "attention" in {r["op"] for r in cm.profile(x, repeats=1)}
    layer.train()
    ref = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
    ref.load_state_dict(layer.state_dict())
    _loss(ref(x), t).backward()
    grads, ops = _step_gradients(layer, x, t)
    # The training forward too: the weights the gradient reads are attention's second output.
    assert {"attention", "attention_grad"} <= ops and "softmax" not in ops
    for name, p in ref.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(grads[name], want, rtol=2e-3, atol=2e-6 * np.abs(want).max())


def test_causal_encoder_layer_programs_run_the_causal_kernels():
    # Workload F's block at a small size (is_causal, no mask tensor): the forward is one causal
    # attention kernel, and the training step takes the gradient's weights from it.
    lucid.manual_seed(1)

    def layer_of():
        return nn.TransformerEncoderLayer(
            16, 2, 32, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )

    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer_of()

        def forward(self, x):
            return self.layer(x, is_causal=True)

    model, ref = Causal(), Causal()
    ref.load_state_dict(model.state_dict())
    rng = np.random.default_rng(1)
    x = lucid.tensor(rng.standard_normal((3, 9, 16)).astype(np.float32))
    t = lucid.tensor(rng.standard_normal((3, 9, 16)).astype(np.float32))
    model.eval()
    cm = lucid.compile(model)
    with lucid.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
        ops = {r["op"] for r in cm.profile(x, repeats=1)}
    assert "attention" in ops and not {"softmax", "select"} & ops
    model.train()
    _loss(ref(x), t).backward()
    grads, ops = _step_gradients(model, x, t)
    assert {"attention", "attention_grad"} <= ops and not {"softmax", "select", "le"} & ops
    for name, p in ref.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(grads[name], want, rtol=2e-3, atol=2e-6 * np.abs(want).max())


# -- the attention_grad instruction itself: thread counts, query blocks, bad attributes -------


def _grad_program(b, h, length, d, dtype="f32", order=(0, 1, 2)):
    e = h * d
    p = Program()
    qkv, d_out = p.feed((b, length, 3 * e), dtype), p.feed((b, length, e), dtype)
    probs = p.feed((b, h, length, length), dtype)
    cols = [order.index(i) * e for i in range(3)]
    attrs = {
        "alpha": 0.3,
        "q_view": [h, d, 0],
        "k_view": [h, d, e],
        "v_view": [h, d, 2 * e],
        "d_out_view": [h, d, 0],
        "grad_cols": cols,
        "grad_width": [3 * e],
    }
    # The fused form fuse-kernels writes (one output), so not built through Program.op.
    grad = p.new_slot((b, length, 3 * e), dtype)
    p.instrs.append(Instr("attention_grad", (d_out, qkv, qkv, qkv, probs), (grad,), attrs))
    p.result(grad)
    return p


@pytest.mark.parametrize(
    "b,h,length,d,order",
    [(2, 3, 5, 4, (0, 1, 2)), (1, 2, 300, 3, (2, 0, 1)), (3, 1, 1, 2, (1, 2, 0))],
)
def test_attention_grad_is_thread_count_independent_and_matches_reference(b, h, length, d, order):
    p = _grad_program(b, h, length, d, order=order)
    feeds = _feeds(p, 7)
    feeds[2] = np.exp(feeds[2]) / np.exp(feeds[2]).sum(axis=-1, keepdims=True)  # weights
    one, two = _run_at_threads(p, feeds)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_allclose(one[0], p.interpret(feeds)[0], rtol=5e-5, atol=5e-5)


def _float64_attention_grad(p: Program, feeds) -> np.ndarray:
    """attention_grad of _grad_program in float64: dQ, dK, dV at their grad_cols."""
    (ins,) = p.instrs
    attrs = ins.attrs
    qkv, d_out, probs = (f.astype(np.float64) for f in feeds)

    def heads(x, view):
        h, dim, col0 = view
        x = x[..., col0 : col0 + h * dim]
        return x.reshape(*x.shape[:2], h, dim).transpose(0, 2, 1, 3)

    q, k, v = (heads(qkv, attrs[n]) for n in ("q_view", "k_view", "v_view"))
    d_o = heads(d_out, attrs["d_out_view"])
    dp = d_o @ v.transpose(0, 1, 3, 2)
    ds = probs * (dp - (dp * probs).sum(axis=-1, keepdims=True))
    grads = (ds @ k * attrs["alpha"], ds.transpose(0, 1, 3, 2) @ q * attrs["alpha"])
    grads += (probs.transpose(0, 1, 3, 2) @ d_o,)
    out = np.zeros(qkv.shape)
    for col0, g in zip(attrs["grad_cols"], grads, strict=True):
        merged = g.transpose(0, 2, 1, 3).reshape(*qkv.shape[:2], -1)
        out[..., col0 : col0 + merged.shape[2]] = merged
    return out


@settings(max_examples=20, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    length=st.sampled_from([1, 5, 6, 7, 13, 64, 65, 130]),
    d=st.sampled_from([8, 12, 16, 31, 32, 40, 64]),
    order=st.sampled_from([(0, 1, 2), (2, 0, 1)]),
    seed=st.integers(0, 2**16),
)
def test_attention_grad_matches_float64_at_head_dims_and_lengths(b, h, length, d, order, seed):
    # Head dims that are and are not multiples of the 8-column vectors, lengths around the
    # 6-row tiles and past one query block (130 rows: 126 per block).
    p = _grad_program(b, h, length, d, order=order)
    feeds = _feeds(p, seed)
    feeds[2] = np.exp(feeds[2]) / np.exp(feeds[2]).sum(axis=-1, keepdims=True)  # weights
    one, two = _run_at_threads(p, feeds)
    np.testing.assert_array_equal(one[0], two[0])
    want = _float64_attention_grad(p, feeds)
    np.testing.assert_allclose(one[0], want, rtol=1e-4, atol=3e-6 * max(1.0, np.abs(want).max()))


def test_malformed_attention_instructions_raise():
    p = _grad_program(1, 2, 4, 3)
    p.instrs[-1].attrs["grad_cols"] = [0, 6, 6]  # dk and dv overlap, a column left unwritten
    with pytest.raises(ValueError, match="grad_cols"):
        CPUBackend(cache=False).compile(p)
    p = _attention_program(1, 2, 4, 4, 3, 3, "f32", 1.0, -1)
    fused = fuse_kernels(p)
    (att,) = [i for i in fused.instrs if i.op == "attention"]
    att.attrs["q_view"] = [2, 3, 0]  # a head view of a dense [B, H, L, D] operand
    with pytest.raises(ValueError, match="q_view"):
        _native.compile(fused.describe(), False)
    att.attrs.pop("q_view")
    extra = [fused.new_slot((1, 2, 4, 4), "f32") for _ in range(2)]
    att.outputs = (*att.outputs, *extra)  # a third output
    with pytest.raises(ValueError, match="1 or 2 outputs"):
        _native.compile(fused.describe(), False)
