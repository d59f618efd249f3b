"""lucid.nn.functional against torch.nn.functional, values and gradients (skipped without torch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", exc_type=ImportError)
TF = torch.nn.functional

import lucid  # noqa: E402
import lucid.nn.functional as F  # noqa: E402
from lucid.testing import assert_close  # noqa: E402

rng = np.random.default_rng(0)


def normal(*shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def both(a, grad=True):
    """The same float64 data as a lucid and a torch tensor."""
    if a.dtype.kind in "iub":
        return lucid.tensor(a), torch.tensor(a)
    return (
        lucid.tensor(a, dtype=lucid.float64, requires_grad=grad),
        torch.tensor(a, dtype=torch.float64, requires_grad=grad),
    )


def check(lucid_fn, torch_fn, *arrays, rtol=1e-7, atol=1e-9, grad=True, const=()):
    """Equal outputs, and equal gradients of sum(out * cotangent) for every float input but the
    positions in ``const`` (class weights, which torch refuses to differentiate)."""
    pairs = [both(a, grad and i not in const) for i, a in enumerate(arrays)]
    lo = lucid_fn(*(p[0] for p in pairs))
    to = torch_fn(*(p[1] for p in pairs))
    lo0 = lo[0] if isinstance(lo, tuple) else lo
    to0 = to[0] if isinstance(to, tuple) else to
    assert_close(lo0.detach(), to0.detach().numpy(), rtol=rtol, atol=atol)
    if not grad:
        return
    cot = normal(*to0.shape)
    floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f" and i not in const]
    lg = lucid.autograd.grad(
        lo0,
        [pairs[i][0] for i in floats],
        lucid.tensor(cot, dtype=lucid.float64),
        allow_unused=True,
    )
    tg = torch.autograd.grad(
        to0, [pairs[i][1] for i in floats], torch.tensor(cot), allow_unused=True
    )
    for a, b in zip(lg, tg, strict=True):
        if b is None:
            assert a is None or np.all(a.numpy() == 0)
        else:
            assert_close(a, b.numpy(), rtol=rtol * 100, atol=atol * 100)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("relu", {}),
        ("relu6", {}),
        ("leaky_relu", {"negative_slope": 0.2}),
        ("elu", {"alpha": 0.7}),
        ("gelu", {}),
        ("gelu", {"approximate": "tanh"}),
        ("silu", {}),
        ("mish", {}),
        ("softplus", {"beta": 2.0, "threshold": 5.0}),
        ("hardtanh", {"min_val": -0.3, "max_val": 0.8}),
        ("softmax", {"dim": 1}),
        ("log_softmax", {"dim": 0}),
        ("softmin", {"dim": 1}),
        ("logsigmoid", {}),
        ("hardsigmoid", {}),
        ("hardswish", {}),
        ("selu", {}),
        ("celu", {"alpha": 0.6}),
        ("softsign", {}),
        ("tanhshrink", {}),
        ("threshold", {"threshold": 0.4, "value": -1.5}),
        ("glu", {"dim": 0}),
    ],
)
def test_activations(name, kwargs):
    x = normal(4, 5, scale=3)
    check(lambda t: getattr(F, name)(t, **kwargs), lambda t: getattr(TF, name)(t, **kwargs), x)


def test_linear_and_bilinear():
    check(F.linear, TF.linear, normal(2, 3, 4), normal(5, 4), normal(5))
    check(F.bilinear, TF.bilinear, normal(2, 3), normal(2, 4), normal(5, 3, 4), normal(5))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stride": 2, "padding": 1},
        {"padding": "same", "dilation": 2},
        {"stride": (2, 1), "padding": (0, 2), "dilation": (1, 2), "groups": 2},
    ],
)
def test_conv2d(kwargs):
    check(
        lambda *a: F.conv2d(*a, **kwargs),
        lambda *a: TF.conv2d(*a, **kwargs),
        normal(2, 4, 7, 6),
        normal(6, 4 // kwargs.get("groups", 1), 3, 2),
        normal(6),
    )


def test_conv1d():
    kw = {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}
    check(
        lambda *a: F.conv1d(*a, **kw),
        lambda *a: TF.conv1d(*a, **kw),
        normal(2, 4, 9),
        normal(4, 2, 3),
        normal(4),
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": (2, 3), "stride": 1, "dilation": (2, 1)},
    ],
)
def test_max_pool2d(kwargs):
    x = rng.permutation(2 * 3 * 7 * 8).reshape(2, 3, 7, 8) * 0.1
    check(lambda t: F.max_pool2d(t, **kwargs), lambda t: TF.max_pool2d(t, **kwargs), x)
    lv, li = F.max_pool2d(lucid.tensor(x), **kwargs, return_indices=True)
    tv, ti = TF.max_pool2d(torch.tensor(x), **kwargs, return_indices=True)
    np.testing.assert_array_equal(li.numpy(), ti.numpy())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {
            "kernel_size": 3,
            "stride": 2,
            "padding": 1,
            "ceil_mode": True,
            "count_include_pad": False,
        },
        {"kernel_size": 2, "divisor_override": 3},
    ],
)
def test_avg_pool2d(kwargs):
    check(
        lambda t: F.avg_pool2d(t, **kwargs),
        lambda t: TF.avg_pool2d(t, **kwargs),
        normal(2, 3, 7, 8),
    )


@pytest.mark.parametrize("size", [1, (3, 2), (5, None), (7, 8)])
def test_adaptive_avg_pool2d(size):
    check(
        lambda t: F.adaptive_avg_pool2d(t, size),
        lambda t: TF.adaptive_avg_pool2d(t, size),
        normal(2, 3, 7, 8),
    )


def test_pool1d():
    x = normal(2, 3, 9)
    check(lambda t: F.max_pool1d(t, 3, 2, 1), lambda t: TF.max_pool1d(t, 3, 2, 1), x)
    check(lambda t: F.avg_pool1d(t, 3, 2, 1), lambda t: TF.avg_pool1d(t, 3, 2, 1), x)
    check(lambda t: F.adaptive_avg_pool1d(t, 4), lambda t: TF.adaptive_avg_pool1d(t, 4), x)


def test_norms():
    x = normal(4, 3, 5)
    check(
        lambda *a: F.layer_norm(a[0], (3, 5), *a[1:]),
        lambda *a: TF.layer_norm(a[0], (3, 5), *a[1:]),
        x,
        normal(3, 5),
        normal(3, 5),
    )
    check(
        lambda *a: F.group_norm(a[0], 3, *a[1:]),
        lambda *a: TF.group_norm(a[0], 3, *a[1:]),
        x,
        normal(3),
        normal(3),
    )
    check(lambda a, w: F.rms_norm(a, (5,), w), lambda a, w: TF.rms_norm(a, (5,), w), x, normal(5))
    check(F.instance_norm, TF.instance_norm, x)
    check(F.normalize, TF.normalize, x)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_and_running_stats(training):
    x, w, b = normal(4, 3, 5), normal(3), normal(3)
    rm, rv = rng.uniform(-1, 1, 3), rng.uniform(0.5, 2, 3)
    lrm, lrv = lucid.tensor(rm, dtype=lucid.float64), lucid.tensor(rv, dtype=lucid.float64)
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    check(
        lambda *a: F.batch_norm(a[0], lrm, lrv, a[1], a[2], training, 0.2, 1e-3),
        lambda *a: TF.batch_norm(a[0], trm, trv, a[1], a[2], training, 0.2, 1e-3),
        x,
        w,
        b,
    )
    assert_close(lrm, trm.numpy(), rtol=1e-12)
    assert_close(lrv, trv.numpy(), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_and_nll(reduction):
    x = normal(5, 4, 3)
    t = np.array([[0, 3, 1], [2, -100, 1], [3, 3, 0], [1, 0, 2], [-100, 2, 2]])
    w = rng.uniform(0.5, 2, 4)
    for ls in (0.0, 0.25):
        check(
            lambda a, b, c, s=ls: F.cross_entropy(a, b, c, reduction=reduction, label_smoothing=s),
            lambda a, b, c, s=ls: TF.cross_entropy(a, b, c, reduction=reduction, label_smoothing=s),
            x,
            t,
            w,
            const=(2,),
        )
    p = rng.uniform(size=(5, 4, 3))
    check(
        lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=0.1),
        lambda a, b: TF.cross_entropy(a, b, reduction=reduction, label_smoothing=0.1),
        x,
        p,
    )
    check(
        lambda a, b, c: F.nll_loss(a, b, c, reduction=reduction, ignore_index=1),
        lambda a, b, c: TF.nll_loss(a, b, c, reduction=reduction, ignore_index=1),
        x,
        np.where(t < 0, 1, t),
        w,
        const=(2,),
    )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses(reduction):
    x, y = normal(3, 4), normal(3, 4)
    for name, kw in [
        ("mse_loss", {}),
        ("l1_loss", {}),
        ("smooth_l1_loss", {"beta": 0.6}),
        ("huber_loss", {"delta": 0.8}),
    ]:
        check(
            lambda a, b, n=name, k=kw: getattr(F, n)(a, b, reduction=reduction, **k),
            lambda a, b, n=name, k=kw: getattr(TF, n)(a, b, reduction=reduction, **k),
            x,
            y,
        )
    p, q = rng.uniform(0.05, 0.95, (3, 4)), rng.uniform(size=(3, 4))
    check(
        lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction),
        lambda a, b, c: TF.binary_cross_entropy(a, b, c, reduction=reduction),
        p,
        q,
        rng.uniform(0.5, 2, (4,)),
        const=(2,),
    )
    check(
        lambda a, b, c: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=c),
        lambda a, b, c: TF.binary_cross_entropy_with_logits(
            a, b, reduction=reduction, pos_weight=c
        ),
        x * 3,
        q,
        rng.uniform(0.5, 2, (4,)),
        const=(2,),
    )


@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "causal"])
def test_scaled_dot_product_attention(mask_kind):
    q, k, v = normal(2, 2, 3, 4), normal(2, 2, 5, 4), normal(2, 2, 5, 3)
    kw_l: dict = {}
    kw_t: dict = {}
    if mask_kind == "bool":
        m = rng.uniform(size=(3, 5)) > 0.3
        m[:, 0] = True
        kw_l["attn_mask"], kw_t["attn_mask"] = lucid.tensor(m), torch.tensor(m)
    elif mask_kind == "float":
        m = normal(2, 1, 3, 5)
        kw_l["attn_mask"], kw_t["attn_mask"] = lucid.tensor(m), torch.tensor(m)
    elif mask_kind == "causal":
        q = normal(2, 2, 5, 4)
        kw_l["is_causal"] = kw_t["is_causal"] = True
    check(
        lambda *a: F.scaled_dot_product_attention(*a, **kw_l),
        lambda *a: TF.scaled_dot_product_attention(*a, **kw_t),
        q,
        k,
        v,
    )


def test_embedding_and_one_hot():
    idx = np.array([[0, 2, 4], [4, 1, 2]])
    check(
        lambda i, w: F.embedding(i, w, padding_idx=2),
        lambda i, w: TF.embedding(i, w, padding_idx=2),
        idx,
        normal(5, 3),
    )
    np.testing.assert_array_equal(
        F.one_hot(lucid.tensor(idx)).numpy(), TF.one_hot(torch.tensor(idx)).numpy()
    )


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_matches_torch_module(bidirectional):
    torch.manual_seed(0)
    module = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=bidirectional, batch_first=True)
    module = module.double()
    x = normal(2, 5, 3)
    tout, (th, tc) = module(torch.tensor(x))
    params = [lucid.tensor(p.detach().numpy()) for p in module._flat_weights]
    lout, (lh, lc) = F.lstm(
        lucid.tensor(x), None, params, 2, batch_first=True, bidirectional=bidirectional
    )
    assert_close(lout, tout.detach().numpy(), rtol=1e-10)
    assert_close(lh, th.detach().numpy(), rtol=1e-10)
    assert_close(lc, tc.detach().numpy(), rtol=1e-10)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
def test_kl_div_and_cosine_similarity():
    logq = TF.log_softmax(torch.tensor(normal(3, 4)), 1).numpy()
    p = TF.softmax(torch.tensor(normal(3, 4)), 1).numpy()
    p[1, 2] = 0.0
    for reduction in ("none", "mean", "sum", "batchmean"):
        check(
            lambda a, b, r=reduction: F.kl_div(a, b, reduction=r),
            lambda a, b, r=reduction: TF.kl_div(a, b, reduction=r),
            logq,
            p,
            const=(1,),
        )
    check(
        lambda a, b: F.kl_div(a, b, reduction="sum", log_target=True),
        lambda a, b: TF.kl_div(a, b, reduction="sum", log_target=True),
        logq,
        np.log(p + 0.1),
    )
    check(F.cosine_similarity, TF.cosine_similarity, normal(3, 4), normal(1, 4))
