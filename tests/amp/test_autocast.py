"""lucid.autocast against PyTorch's documented op lists and torch.autocast's semantics."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.amp import _policy
from lucid.amp._policy import FP32, LOWER, NONE, OP_POLICY, PROMOTE
from lucid.ops._registry import REGISTRY

# --- PyTorch's lists, written down -------------------------------------------------------------
# CPU: https://pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior
# MPS: the AutocastMPS registrations in aten/src/ATen/autocast_mode.cpp
#      (https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/autocast_mode.cpp)
TORCH_LISTS = {
    "cpu": {
        LOWER: """conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear
            _convolution matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d
            conv_transpose3d prelu scaled_dot_product_attention _native_multi_head_attention""",
        FP32: """avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft
            cdist trace view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve
            orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d
            reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
            replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d
            hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss
            huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss
            ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits fft_fft
            fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2
            fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_matrix_rank linalg_solve
            linalg_cholesky linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv
            linalg_householder_product linalg_tensorinv linalg_tensorsolve
            fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve
            fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
            multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig
            linalg_eigh linalg_lstsq linalg_inv_ex""",
        PROMOTE: "stack cat index_copy",
    },
    "mps": {
        LOWER: """_convolution conv1d conv2d conv_tbc conv_transpose1d conv_transpose2d
            convolution _mps_convolution prelu addmm addmv addr matmul einsum mm mv linear addbmm
            baddbmm bmm chain_matmul linalg_multi_dot lstm_cell""",
        FP32: """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow
            softplus layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm
            batch_norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss
            nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
            margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
            multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
            prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum""",
        PROMOTE: """addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put tensordot
            scatter_add""",
    },
}
# Lucid op -> the aten op(s) PyTorch runs for it. A composite runs each part under its own
# policy; it counts as FP32 when every part is FP32.
ATEN_NAME = {"norm": "linalg_vector_norm"}
COMPOSITE = {
    "cpu": {"cross_entropy": ("cross_entropy_loss",)},
    "mps": {"cross_entropy": ("log_softmax", "nll_loss"), "rms_norm": ("pow", "rsqrt")},
}


def _torch_policy(device: str, aten: str) -> str:
    for pol, names in TORCH_LISTS[device].items():
        if aten in names.split():
            return pol
    return NONE


def _expected(name: str, device: str) -> str:
    parts = COMPOSITE[device].get(name)
    if parts is None:
        return _torch_policy(device, ATEN_NAME.get(name, name))
    pols = {_torch_policy(device, p) for p in parts}
    return FP32 if pols == {FP32} else NONE


def test_every_registry_op_has_exactly_one_policy_row():
    missing = sorted(set(REGISTRY) - set(OP_POLICY))
    stale = sorted(set(OP_POLICY) - set(REGISTRY))
    assert not missing, f"ops without an autocast row in lucid/amp/_policy.py: {missing}"
    assert not stale, f"autocast rows for ops that do not exist: {stale}"
    for name, row in OP_POLICY.items():
        assert len(row) == len(_policy.DEVICE_TYPES)
        assert set(row) <= {LOWER, FP32, PROMOTE, NONE}, (name, row)


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_policy_table_matches_pytorchs_lists(device):
    wrong = {
        name: (_policy.policy(name, device), _expected(name, device))
        for name in sorted(REGISTRY)
        if _policy.policy(name, device) != _expected(name, device)
    }
    assert not wrong, f"(table, PyTorch) per op: {wrong}"


# --- behaviour ---------------------------------------------------------------------------------


def _x(*shape, dtype=lucid.float32):
    return lucid.randn(*shape).to(dtype)


def test_lower_precision_ops_cast_down_and_others_follow_their_inputs():
    x, w, b = _x(4, 3), _x(5, 3), _x(5)
    with lucid.autocast("cpu"):
        assert lucid.is_autocast_enabled() and lucid.is_autocast_enabled("cpu")
        assert not lucid.is_autocast_enabled("mps")
        assert lucid.get_autocast_dtype("cpu") is lucid.bfloat16
        y = F.linear(x, w, b)
        assert y.dtype is lucid.bfloat16
        assert (x @ w.T).dtype is lucid.bfloat16
        assert F.conv2d(_x(1, 2, 5, 5), _x(3, 2, 3, 3)).dtype is lucid.bfloat16
        assert lucid.softmax(y, -1).dtype is lucid.bfloat16  # not on PyTorch's CPU list
        assert lucid.exp(y).dtype is lucid.bfloat16
        assert (y + x.sum()).dtype is lucid.bfloat16  # a 0-d float32 tensor does not promote
        assert (y + _x(4, 5)).dtype is lucid.float32  # widest input type
        assert F.cross_entropy(y, lucid.tensor([0, 1, 2, 3])).dtype is lucid.float32
        assert F.mse_loss(y, y).dtype is lucid.float32
        assert lucid.prod(y).dtype is lucid.float32
        assert F.linear(x.double(), w.double()).dtype is lucid.float64  # never cast
        assert (x.long() + 1).dtype is lucid.int64
    assert not lucid.is_autocast_enabled("cpu") and not lucid.is_autocast_enabled()
    assert F.linear(x, w, b).dtype is lucid.float32
    assert lucid.amp.autocast_key() is None
    with lucid.autocast("mps", dtype=lucid.bfloat16):
        assert lucid.amp.autocast_key() == ("mps", "bfloat16")


def test_autocast_result_equals_explicit_casts_bit_for_bit():
    x, w, b = _x(4, 3), _x(5, 3), _x(5)
    with lucid.autocast("cpu", dtype=lucid.float16):
        got = F.linear(x, w, b)
    want = F.linear(x.half(), w.half(), b.half())
    assert got.dtype is lucid.float16
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_mps_lists_keep_reductions_and_pointwise_functions_in_float32():
    h = _x(3, 4, dtype=lucid.float16)
    with lucid.autocast("mps"):
        assert lucid.get_autocast_dtype("mps") is lucid.float16
        assert F.linear(_x(2, 4), _x(3, 4)).dtype is lucid.float16
        assert lucid.einsum("ij,kj->ik", _x(2, 4), _x(3, 4)).dtype is lucid.float16
        for out in (
            lucid.exp(h),
            lucid.softmax(h, -1),
            h.sum(),
            h.cumsum(0),
            F.layer_norm(h, (4,)),
        ):
            assert out.dtype is lucid.float32
        assert h.sum(dtype=lucid.float16).dtype is lucid.float16  # an explicit dtype wins
        assert (h * 2).dtype is lucid.float16
    with lucid.autocast("metal", dtype=lucid.bfloat16):  # Lucid's name for the device
        assert F.linear(_x(2, 4), _x(3, 4)).dtype is lucid.bfloat16


def test_promote_starts_from_the_autocast_dtype():
    # PyTorch's promote policy folds the autocast dtype into the promotion.
    b = _x(2, dtype=lucid.bfloat16)
    with lucid.autocast("cpu", dtype=lucid.float16):
        assert lucid.cat([b, b]).dtype is lucid.float32
    with lucid.autocast("cpu"):
        assert lucid.cat([b, b]).dtype is lucid.bfloat16
        assert lucid.cat([b, _x(2)]).dtype is lucid.float32


def test_nesting_enabled_false_and_restoring():
    x, w = _x(2, 3), _x(4, 3)
    with lucid.autocast("cpu"):
        with lucid.autocast("cpu", enabled=False):
            assert not lucid.is_autocast_enabled("cpu")
            assert F.linear(x, w).dtype is lucid.float32
            with lucid.autocast("cpu", dtype=lucid.float16):
                assert lucid.get_autocast_dtype("cpu") is lucid.float16
                assert F.linear(x, w).dtype is lucid.float16
            assert F.linear(x, w).dtype is lucid.float32
        assert lucid.get_autocast_dtype("cpu") is lucid.bfloat16
        assert F.linear(x, w).dtype is lucid.bfloat16
        with lucid.autocast("mps", enabled=False):  # the innermost region decides
            assert F.linear(x, w).dtype is lucid.float32
        assert F.linear(x, w).dtype is lucid.bfloat16
    assert F.linear(x, w).dtype is lucid.float32
    # An exception inside still restores the state.
    with pytest.raises(ZeroDivisionError), lucid.autocast("cpu"):
        1 / 0  # noqa: B018
    assert not lucid.is_autocast_enabled()


def test_decorator_and_amp_alias():
    assert lucid.amp.autocast is lucid.autocast

    @lucid.amp.autocast("cpu")
    def forward(x, w):
        return F.linear(x, w)

    assert forward(_x(2, 3), _x(4, 3)).dtype is lucid.bfloat16
    assert forward.__name__ == "forward"
    assert not lucid.is_autocast_enabled()
    ctx = lucid.autocast("cpu", dtype=lucid.float16)
    deco = ctx(lambda: (F.linear(_x(2, 3), _x(4, 3)).dtype, lucid.is_autocast_enabled()))
    with ctx:  # the same object as context and decorator, re-entered
        assert deco() == (lucid.float16, True)
        assert lucid.is_autocast_enabled()


def test_bad_arguments():
    with pytest.raises(ValueError, match="unsupported device_type 'tpu'"):
        lucid.autocast("tpu")
    with pytest.raises(TypeError, match="device_type"):
        lucid.autocast(lucid.bfloat16)
    with pytest.warns(UserWarning, match="not supported"):
        ctx = lucid.autocast("cpu", dtype=lucid.float64)
    with ctx:
        assert not lucid.is_autocast_enabled()
    with pytest.warns(UserWarning, match="no 'cuda' device"):
        ctx = lucid.autocast("cuda")
    with ctx:
        assert not lucid.is_autocast_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lucid.autocast("cuda", enabled=False)  # nothing to warn about


def test_state_is_thread_local():
    seen = []
    with lucid.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append(F.linear(_x(2, 3), _x(4, 3)).dtype))
        t.start()
        t.join()
    assert seen == [lucid.float32]


def test_float32_weights_get_float32_gradients_through_the_casts():
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    x, target = _x(5, 3), lucid.tensor([0, 1, 0, 1, 1])
    with lucid.autocast("cpu"):
        loss = F.cross_entropy(model(x), target)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g.dtype is lucid.float32 for g in grads)
    # The same computation written with explicit casts gives the same gradients.
    twin = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    h = F.linear(x.bfloat16(), twin[0].weight.bfloat16(), twin[0].bias.bfloat16()).relu()
    out = F.linear(h, twin[2].weight.bfloat16(), twin[2].bias.bfloat16())
    F.cross_entropy(out.float(), target).backward()
    for g, p in zip(grads, twin.parameters(), strict=True):
        np.testing.assert_array_equal(g.numpy(), p.grad.numpy())


def test_backward_inside_the_region_runs_in_the_forward_types():
    model = nn.Linear(3, 2)
    x = _x(4, 3)
    with lucid.autocast("mps"):
        model(x).exp().sum().backward()  # exp's VJP would run in float32 if autocast applied
        inside = model.weight.grad.numpy().copy()
    model.zero_grad()
    with lucid.autocast("mps"):
        loss = model(x).exp().sum()
    loss.backward()
    np.testing.assert_array_equal(inside, model.weight.grad.numpy())


def test_weight_casts_are_cached_per_region_and_never_stale():
    w = nn.Parameter(_x(4, 3))
    x = _x(2, 3)
    with lucid.autocast("cpu"):
        a = F.linear(x, w)
        b = F.linear(x, w)
        assert a.grad_fn.inputs[1] is b.grad_fn.inputs[1]  # one cast of w for the region
        with lucid.no_grad():
            w.add_(1.0)
        c = F.linear(x, w)  # w changed in place: a fresh cast
        fresh = F.linear(x.bfloat16(), w.detach().bfloat16())
        np.testing.assert_array_equal(c.detach().numpy(), fresh.numpy())
        (a.float().sum() + b.float().sum()).backward()
    # Both uses deliver their gradient through the one cached cast.
    per_use = x.bfloat16().float().sum(0).bfloat16().float().numpy()
    np.testing.assert_array_equal(w.grad.numpy(), np.broadcast_to(2 * per_use, (4, 3)))
    from lucid.amp.autocast_mode import _local

    assert not _local.cache  # cleared when the outermost region ends
    with lucid.autocast("cpu", cache_enabled=False):
        a, b = F.linear(x, w), F.linear(x, w)
        assert a.grad_fn.inputs[1] is not b.grad_fn.inputs[1]


def test_tracing_records_the_casts_and_compiled_equals_eager():
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    x = _x(4, 3)

    def fn(inp):
        return F.log_softmax(model(inp), -1)

    from lucid.trace import trace

    with lucid.autocast("cpu"):
        tr = trace(fn, x)
        eager = fn(x)
    names = [op.name for op in tr.ops]
    assert names.count("cast") >= 5, names  # x, two weights, two biases
    assert eager.dtype is lucid.bfloat16
    with lucid.autocast("cpu"):
        cm = lucid.compile(model)
        got = cm(x)
    info = cm.cache_info()
    with lucid.autocast("cpu"):
        want = model(x)
    assert got.dtype is want.dtype
    np.testing.assert_allclose(
        got.detach().float().numpy(), want.detach().float().numpy(), rtol=1e-2, atol=1e-2
    )
    if info["eager_only"]:  # the compiler may still refuse half types: it says why
        assert all(str(r) for r in info["reasons"].values())


def test_compare_with_torch_autocast_when_available():
    torch = pytest.importorskip("torch")
    cases = {
        "linear": (lambda m, a, b: m.linear(a, b), 2),
        "matmul": (lambda m, a, b: m.matmul(a, b.T), 2),
        "softmax": (lambda m, a: m.softmax(a, -1), 1),
        "exp": (lambda m, a: m.exp(a), 1),
        "mse_loss": (lambda m, a, b: m.mse_loss(a, b), 2),
        "cat": (lambda m, a, b: m.cat([a, b]), 2),
    }
    torch_ns = {"linear": torch.nn.functional.linear, "mse_loss": torch.nn.functional.mse_loss}
    lucid_ns = {"linear": F.linear, "mse_loss": F.mse_loss}

    class NS:
        def __init__(self, mod, extra):
            self.mod, self.extra = mod, extra

        def __getattr__(self, k):
            return self.extra.get(k) or getattr(self.mod, k)

    for device, dt, tdt in (("cpu", lucid.bfloat16, torch.bfloat16),):
        for name, (call, n) in cases.items():
            arrays = [
                np.random.default_rng(i).standard_normal((3, 3)).astype(np.float32)
                for i in range(n)
            ]
            with lucid.autocast(device, dtype=dt):
                ours = call(NS(lucid, lucid_ns), *[lucid.tensor(a) for a in arrays]).dtype.name
            with torch.autocast(device, dtype=tdt):
                theirs = str(call(NS(torch, torch_ns), *[torch.tensor(a) for a in arrays]).dtype)
            assert theirs == f"torch.{ours}", (name, ours, theirs)


def test_a_signature_compiled_outside_autocast_is_not_reused_inside():
    model = nn.Linear(3, 2)
    cm = lucid.compile(model)
    x = _x(4, 3)
    assert cm(x).dtype is lucid.float32
    with lucid.autocast("cpu"):
        assert cm(x).dtype is model(x).dtype is lucid.bfloat16


def test_dtype_dependent_defaults_follow_the_dtype_autocast_runs_the_op_in():
    # rms_norm runs in float32 under MPS autocast: its default eps is float32's, not the half
    # input's (as PyTorch, which reads it from the cast input).
    h = (_x(2, 4, dtype=lucid.float16) * 0.0) + 0.03125
    with lucid.autocast("mps"):
        got = F.rms_norm(h, (4,))
    assert got.dtype is lucid.float32
    want = 0.03125 / np.sqrt(0.03125**2 + lucid.finfo(lucid.float32).eps)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
