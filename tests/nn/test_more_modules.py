"""More torch.nn modules and functions (issue 26, "beyond the list"): activations, losses,
distances, Bilinear, ChannelShuffle; numpy formulas and finite-difference gradients, and torch
parity (values and gradients) when torch is installed."""

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.testing import gradcheck

RNG = np.random.default_rng(126)


def _t(a, requires_grad=False):
    return lucid.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def test_activation_formulas():
    a = np.array([-4.0, -1.0, -0.3, 0.0, 0.3, 1.0, 4.0])
    x = _t(a)
    np.testing.assert_allclose(nn.Hardshrink(0.5)(x).numpy(), np.where(np.abs(a) > 0.5, a, 0))
    soft = np.where(a > 0.5, a - 0.5, np.where(a < -0.5, a + 0.5, 0))
    np.testing.assert_allclose(nn.Softshrink(0.5)(x).numpy(), soft)
    np.testing.assert_allclose(nn.Hardswish()(x).numpy(), a * np.clip(a / 6 + 0.5, 0, 1))
    np.testing.assert_allclose(nn.LogSigmoid()(x).numpy(), -np.log1p(np.exp(-a)))
    np.testing.assert_allclose(nn.Softsign()(x).numpy(), a / (1 + np.abs(a)))
    np.testing.assert_allclose(nn.Threshold(0.2, -7.0)(x).numpy(), np.where(a > 0.2, a, -7.0))
    np.testing.assert_allclose(
        nn.CELU(2.0)(x).numpy(), np.maximum(a, 0) + np.minimum(0, 2 * (np.exp(a / 2) - 1))
    )
    prelu = nn.PReLU(3).double()
    with lucid.no_grad():
        prelu.weight.copy_(_t([0.1, 0.2, 0.3]))
    img = RNG.standard_normal((2, 3, 4))
    want = np.where(img >= 0, img, np.array([0.1, 0.2, 0.3])[:, None] * img)
    np.testing.assert_allclose(prelu(_t(img)).detach().numpy(), want)
    np.testing.assert_allclose(nn.Softmax2d()(_t(img)).numpy().sum(0), np.ones((3, 4)))
    with pytest.raises(ValueError, match="one per channel"):
        nn.PReLU(2)(_t(img))


def test_loss_formulas():
    x1, x2 = RNG.standard_normal(6), RNG.standard_normal(6)
    y = np.array([1, -1, 1, 1, -1, -1.0])
    np.testing.assert_allclose(
        nn.MarginRankingLoss(0.3)(_t(x1), _t(x2), _t(y)).item(),
        np.maximum(0, -y * (x1 - x2) + 0.3).mean(),
    )
    np.testing.assert_allclose(
        nn.SoftMarginLoss(reduction="sum")(_t(x1), _t(y)).item(), np.log1p(np.exp(-y * x1)).sum()
    )
    np.testing.assert_allclose(
        nn.HingeEmbeddingLoss(0.5)(_t(x1), _t(y)).item(),
        np.where(y == 1, x1, np.maximum(0, 0.5 - x1)).mean(),
    )
    a, p, n = (RNG.standard_normal((4, 5)) for _ in range(3))
    d = lambda u, v: np.sqrt(((u - v + 1e-6) ** 2).sum(-1))  # noqa: E731
    np.testing.assert_allclose(
        nn.TripletMarginLoss(margin=2.0)(_t(a), _t(p), _t(n)).item(),
        np.maximum(d(a, p) - d(a, n) + 2.0, 0).mean(),
    )
    np.testing.assert_allclose(nn.PairwiseDistance()(_t(a), _t(p)).numpy(), d(a, p))
    rate, k = RNG.standard_normal(5), RNG.integers(0, 5, 5).astype(float)
    np.testing.assert_allclose(
        nn.PoissonNLLLoss()(_t(rate), _t(k)).item(), (np.exp(rate) - k * rate).mean()
    )
    mu, var = RNG.standard_normal(5), RNG.uniform(0.5, 2, 5)
    np.testing.assert_allclose(
        nn.GaussianNLLLoss()(_t(mu), _t(k), _t(var)).item(),
        (0.5 * (np.log(var) + (mu - k) ** 2 / var)).mean(),
    )
    logits, labels = RNG.standard_normal((3, 4)), RNG.integers(0, 2, (3, 4)).astype(float)
    sig = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(
        nn.MultiLabelSoftMarginLoss()(_t(logits), _t(labels)).item(),
        -(labels * np.log(sig) + (1 - labels) * np.log(1 - sig)).mean(-1).mean(),
    )
    with pytest.raises(ValueError, match="negative"):
        F.gaussian_nll_loss(_t(mu), _t(k), _t(-var))


def test_gradients_by_finite_differences():
    x = _t(RNG.standard_normal((2, 3, 2)), requires_grad=True)
    w = _t([0.1, 0.2, 0.3], requires_grad=True)
    gradcheck(lambda x, w: F.prelu(x, w).sum(), x, w)
    a, p, n = (_t(RNG.standard_normal((3, 4)), requires_grad=True) for _ in range(3))
    gradcheck(lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=True), a, p, n)
    gradcheck(lambda a, p: F.cosine_embedding_loss(a, p, _t([1, -1, 1])), a, p)
    var = _t(RNG.uniform(0.5, 2, (3, 1)), requires_grad=True)
    gradcheck(lambda a, v: F.gaussian_nll_loss(a, p.detach(), v, full=True), a, var)
    gradcheck(lambda x: F.softshrink(x * 3, 0.4).sum(), a)


def test_bilinear_and_channel_shuffle():
    layer = nn.Bilinear(3, 4, 2).double()
    x1, x2 = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 4))
    want = np.einsum("ni,oij,nj->no", x1, layer.weight.detach().numpy(), x2)
    np.testing.assert_allclose(
        layer(_t(x1), _t(x2)).detach().numpy(), want + layer.bias.detach().numpy()
    )
    x = lucid.arange(6.0).reshape(1, 6, 1, 1)
    assert nn.ChannelShuffle(2)(x).reshape(-1).tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    with pytest.raises(ValueError, match="divisible"):
        nn.ChannelShuffle(4)(x)


def _same_values_and_gradients(ours, theirs, ours_in, theirs_in, rtol):
    """Outputs equal; the input (and parameter) gradients of a random output weighting too."""
    import torch

    out, ref = ours(*ours_in), theirs(*theirs_in)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    weights = RNG.standard_normal(tuple(ref.shape))
    (out * lucid.tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    for o, r in zip(ours_in, theirs_in, strict=True):
        if r.grad is not None:
            np.testing.assert_allclose(o.grad.numpy(), r.grad.numpy(), rtol=rtol, atol=1e-12)
    for (name, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters(),
                                  strict=True):  # fmt: skip
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=rtol, err_msg=name)


MODULE_CASES = [
    ("CELU", (0.7,), 1), ("SELU", (), 1), ("GLU", (), 1), ("Hardsigmoid", (), 1),
    ("Hardswish", (), 1), ("Hardshrink", (0.3,), 1), ("Softshrink", (0.3,), 1),
    ("LogSigmoid", (), 1), ("Softsign", (), 1), ("Tanhshrink", (), 1),
    ("Threshold", (0.1, 2.0), 1), ("Softmin", (1,), 1), ("Softmax2d", (), 1), ("PReLU", (4,), 1),
    ("CosineSimilarity", (), 2), ("PairwiseDistance", (), 2),
    ("KLDivLoss", (None, None, "batchmean"), 2),
    ("SoftMarginLoss", (), 2), ("HingeEmbeddingLoss", (), 2), ("PoissonNLLLoss", (), 2),
    ("MultiLabelSoftMarginLoss", (), 2), ("MarginRankingLoss", (0.2,), 3),
    ("CosineEmbeddingLoss", (0.1,), 3), ("TripletMarginLoss", (), 3),
    ("GaussianNLLLoss", (), 3), ("Bilinear", (4, 4, 3), 2), ("ChannelShuffle", (2,), 1),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "n_inputs"), MODULE_CASES)
def test_torch_parity_values_and_gradients(name, args, n_inputs):
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args).double(), getattr(torch.nn, name)(*args).double()
    theirs.load_state_dict(
        {k: torch.from_numpy(np.array(v.detach().numpy())) for k, v in ours.state_dict().items()}
    )
    arrays = [RNG.standard_normal((3, 4, 2, 2)) for _ in range(n_inputs)]
    if name in ("KLDivLoss",):
        arrays[1] = np.abs(arrays[1])
    if name in ("SoftMarginLoss", "HingeEmbeddingLoss", "MarginRankingLoss",
                "CosineEmbeddingLoss"):  # fmt: skip
        arrays[-1] = np.sign(arrays[-1])
    if name == "CosineEmbeddingLoss":
        arrays = [a.reshape(3, -1) for a in arrays[:2]] + [np.sign(RNG.standard_normal(3))]
    if name in ("PoissonNLLLoss", "MultiLabelSoftMarginLoss"):
        arrays[1] = RNG.integers(0, 2, arrays[1].shape).astype(float)
    if name == "GaussianNLLLoss":
        arrays[2] = np.abs(arrays[2]) + 0.1
    if name == "Bilinear":
        arrays = [a.reshape(-1, 4) for a in arrays]
    # Targets take no gradient (torch refuses one for several losses).
    targets = {"TripletMarginLoss": (), "GaussianNLLLoss": (1,),
               "MarginRankingLoss": (2,), "CosineEmbeddingLoss": (2,)}.get(
        name, (1,) if name.endswith("Loss") else ()
    )  # fmt: skip
    wants_grad = [i not in targets for i in range(len(arrays))]
    ours_in = [lucid.tensor(a, requires_grad=g) for a, g in zip(arrays, wants_grad, strict=True)]
    theirs_in = [torch.tensor(a, requires_grad=g) for a, g in zip(arrays, wants_grad, strict=True)]
    # rtol 1e-7: torch's CELU and Hardsigmoid backward kernels use float32 constants (off by
    # ~5e-9 from the exact derivative in float64); Lucid's are exact.
    _same_values_and_gradients(ours, theirs, ours_in, theirs_in, rtol=1e-7)


def test_pooling_unfold_and_norm_formulas():
    x = RNG.standard_normal((2, 3, 5, 7))
    got = nn.AdaptiveMaxPool2d((2, 3))(_t(x)).numpy()
    # torch's windows: [floor(i * n / out), ceil((i + 1) * n / out)).
    rows, cols = [(0, 3), (2, 5)], [(0, 3), (2, 5), (4, 7)]
    want = np.array([[x[..., a:b, c:d].max((-2, -1)) for c, d in cols] for a, b in rows])
    np.testing.assert_allclose(got, want.transpose(2, 3, 0, 1))
    cols_ = nn.Unfold(2, stride=(1, 2))(_t(x)).numpy()  # (2, 3*2*2, 4*3)
    assert cols_.shape == (2, 12, 12)
    block = x[:, :, 1:3, 2:4].reshape(2, 12)  # output position (1, 1) -> column 1 * 3 + 1
    np.testing.assert_allclose(cols_[:, :, 4], block)
    lrn = nn.LocalResponseNorm(3, alpha=0.3, beta=0.5, k=2.0)(_t(x)).numpy()
    sq = np.pad(x**2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    np.testing.assert_allclose(lrn, x / (2.0 + 0.1 * window) ** 0.5)
    lp = nn.LPPool2d(2, 2)(_t(np.abs(x[..., :4, :6]))).numpy()
    want_lp = np.sqrt((x[..., :4, :6] ** 2).reshape(2, 3, 2, 2, 3, 2).sum((3, 5)))
    np.testing.assert_allclose(lp, want_lp)
    logits, target = RNG.standard_normal((4, 5)), np.array([0, 3, 1, 4])
    margins = np.maximum(0, 1 - logits[np.arange(4), target][:, None] + logits)
    margins[np.arange(4), target] = 0
    np.testing.assert_allclose(
        nn.MultiMarginLoss()(_t(logits), lucid.tensor(target)).item(), (margins.sum(1) / 5).mean()
    )


EXTRA_CASES = [
    ("AdaptiveMaxPool1d", (3,), [(2, 3, 7)]),
    ("AdaptiveMaxPool2d", ((2, None),), [(2, 3, 5, 4)]),
    ("LPPool1d", (3, 2), [(2, 3, 6)]),
    ("LPPool2d", (2, (2, 3), 1), [(2, 3, 5, 6)]),
    ("LocalResponseNorm", (4, 0.2, 0.6, 1.5), [(2, 6, 3, 3)]),
    ("Unfold", ((2, 3), 1, 1, (2, 1)), [(2, 3, 5, 6)]),
    ("BatchNorm3d", (3,), [(2, 3, 2, 2, 2)]),
    ("ConvTranspose1d", (4, 6, 3, 2, 1, 1), [(2, 4, 5)]),
    ("TripletMarginWithDistanceLoss", (), [(3, 4), (3, 4), (3, 4)]),
    ("MultiMarginLoss", (2, 0.5), [(4, 5)]),
    ("AvgPool3d", ((2, 3, 2), (1, 2, 2), 1), [(2, 3, 5, 6, 7)]),
    ("MaxPool3d", ((3, 2, 2), 1, (1, 1, 0)), [(2, 3, 5, 6, 7)]),
    ("LPPool3d", (2, 2), [(1, 2, 4, 4, 4)]),
]


@pytest.mark.parametrize(("name", "args", "shapes"), EXTRA_CASES)
def test_torch_parity_of_pooling_norm_and_conv_layers(name, args, shapes):
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args).double(), getattr(torch.nn, name)(*args).double()
    theirs.load_state_dict(
        {k: torch.from_numpy(np.array(v.detach().numpy())) for k, v in ours.state_dict().items()}
    )
    arrays = [RNG.standard_normal(s) for s in shapes]
    if name.startswith("LPPool"):
        arrays = [np.abs(a) + 0.1 for a in arrays]
    ours_in = [lucid.tensor(a, requires_grad=True) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    if name == "MultiMarginLoss":
        target = RNG.integers(0, 5, 4)
        ours_in.append(lucid.tensor(target))
        theirs_in.append(torch.tensor(target))
    _same_values_and_gradients(ours, theirs, ours_in, theirs_in, rtol=1e-8)


def test_new_layers_compile_as_eager(compiled_matches_eager):
    lucid.manual_seed(0)
    model = nn.Sequential(
        nn.ConvTranspose1d(3, 4, 3, stride=2),
        nn.Unflatten(1, (2, 2)),
        nn.LocalResponseNorm(2),
        nn.AdaptiveMaxPool2d((2, 3)),
        nn.PReLU(2),
        nn.Hardswish(),
        nn.Unfold(2),
    ).double()
    # rtol 1e-7: compiled Hardswish's backward differs from eager by ~1e-8 relative in float64
    # (the hardsigmoid slope 1/6 loses precision in the compiled path; not these layers).
    compiled_matches_eager(model, lucid.randn(2, 3, 5, dtype=lucid.float64), rtol=1e-7)


def test_alpha_dropout_rrelu_gumbel_and_inplace_spellings():
    lucid.manual_seed(3)
    x = lucid.randn(100000, dtype=lucid.float64)
    dropped = nn.AlphaDropout(0.3).train()(x)
    # Standard normal in, standard normal moments out (what alpha dropout is for).
    assert abs(dropped.mean().item()) < 0.02 and abs(dropped.std().item() - 1) < 0.02
    assert lucid.equal(nn.AlphaDropout(0.3).eval()(x), x)
    channels = nn.FeatureAlphaDropout(0.5).train()(lucid.randn(4, 6, 3, dtype=lucid.float64))
    spread = channels.numpy().std(-1)
    assert (np.isclose(spread, 0) | (spread > 1e-3)).all()  # dropped channels are constant
    slopes = nn.RReLU(0.1, 0.3).train()(-lucid.ones(1000, dtype=lucid.float64)).numpy()
    assert (slopes <= -0.1).all() and (slopes >= -0.3).all() and slopes.std() > 0.03
    assert nn.RReLU(0.1, 0.3).eval()(-lucid.ones(2)).tolist() == pytest.approx([-0.2, -0.2])
    sample = F.gumbel_softmax(lucid.randn(8, 5), tau=0.5, hard=True)
    assert sample.sum(-1).tolist() == [1.0] * 8 and set(np.unique(sample.numpy())) <= {0.0, 1.0}
    z = _t([-1.0, 2.0])
    assert F.relu_(z) is z and z.tolist() == [0.0, 2.0]
    a = RNG.standard_normal((5, 3))
    i, j = np.triu_indices(5, 1)
    np.testing.assert_allclose(F.pdist(_t(a)).numpy(), np.linalg.norm(a[i] - a[j], axis=1))
    x3 = RNG.standard_normal((2, 3, 4, 5, 6))
    np.testing.assert_allclose(
        nn.AdaptiveAvgPool3d((2, 1, 3))(_t(x3)).numpy()[..., 0, 0, 0],
        x3[:, :, :2, :, :2].mean((2, 3, 4)),
    )
    scores, target = RNG.standard_normal((2, 4)), np.array([[2, 0, -1, 3], [1, -1, 0, 0]])
    want = []
    for s, t in zip(scores, target, strict=True):
        listed = list(t[: list(t).index(-1)] if -1 in t else t)
        others = [k for k in range(4) if k not in listed]
        want.append(sum(max(0, 1 - s[j] + s[k]) for j in listed for k in others) / 4)
    np.testing.assert_allclose(
        nn.MultiLabelMarginLoss(reduction="none")(_t(scores), lucid.tensor(target)).numpy(), want
    )


@pytest.mark.parametrize(
    ("name", "args", "shapes"),
    [("AdaptiveAvgPool3d", ((2, None, 3),), [(2, 3, 4, 5, 6)]),
     ("AdaptiveMaxPool3d", (2,), [(1, 2, 5, 4, 3)]),
     ("RReLU", (0.2, 0.4), [(3, 4)])],
)  # fmt: skip
def test_torch_parity_3d_pooling_and_rrelu(name, args, shapes):
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, name)(*args).eval(), getattr(torch.nn, name)(*args).eval()
    arrays = [RNG.standard_normal(s) for s in shapes]
    ours_in = [lucid.tensor(a, requires_grad=True) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = ours(*ours_in), theirs(*theirs_in)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    out.square().sum().backward()
    ref.square().sum().backward()
    np.testing.assert_allclose(ours_in[0].grad.numpy(), theirs_in[0].grad.numpy(), rtol=1e-10)


def test_torch_parity_multilabel_margin_and_pdist():
    torch = pytest.importorskip("torch")
    tnf = torch.nn.functional
    scores = RNG.standard_normal((3, 5))
    target = np.array([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 1, 2, 3, 4]])
    ours, theirs = _t(scores, True), torch.tensor(scores, requires_grad=True)
    out = F.multilabel_margin_loss(ours, lucid.tensor(target))
    ref = tnf.multilabel_margin_loss(theirs, torch.tensor(target))
    np.testing.assert_allclose(out.item(), ref.item(), rtol=1e-12)
    out.backward()
    ref.backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12, atol=1e-15)
    rows = RNG.standard_normal((6, 3))
    np.testing.assert_allclose(F.pdist(_t(rows), 3).numpy(),
                               tnf.pdist(torch.tensor(rows), 3).numpy(), rtol=1e-12)  # fmt: skip


def test_3d_pooling_formulas_and_compiled(compiled_matches_eager):
    x = RNG.standard_normal((2, 3, 4, 6, 2))
    blocks = x.reshape(2, 3, 2, 2, 3, 2, 1, 2)
    np.testing.assert_allclose(nn.AvgPool3d(2)(_t(x)).numpy(), blocks.mean((3, 5, 7)))
    np.testing.assert_allclose(nn.MaxPool3d(2)(_t(x)).numpy(), blocks.max((3, 5, 7)))
    exclude = nn.AvgPool3d(3, 1, 1, count_include_pad=False)(_t(np.ones((1, 1, 3, 3, 3))))
    np.testing.assert_allclose(exclude.numpy(), np.ones((1, 1, 3, 3, 3)))
    with pytest.raises(ValueError, match="ceil_mode"):
        nn.MaxPool3d(2, ceil_mode=True)(_t(x))
    lucid.manual_seed(1)
    layers = [nn.Conv2d(2, 4, 1), nn.Unflatten(1, (2, 2)), nn.MaxPool3d(2), nn.AvgPool3d(1),
              nn.Flatten(), nn.Linear(2 * 1 * 2 * 2, 3)]  # fmt: skip
    model = nn.Sequential(*layers).double()
    compiled_matches_eager(model, lucid.randn(2, 2, 4, 4, dtype=lucid.float64))
