"""The *_with_indices pooling spellings, max_unpool1d/2d/3d, affine_grid and linear_cross_entropy
against torch.nn.functional: values, indices and float64 gradients (skipped without torch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", exc_type=ImportError)
TF = torch.nn.functional

import lucid  # noqa: E402
import lucid.nn.functional as F  # noqa: E402
from lucid.testing import assert_close  # noqa: E402

rng = np.random.default_rng(7)


def pair(a, grad=True):
    if a.dtype.kind in "iu":
        return lucid.tensor(a), torch.tensor(a)
    return (
        lucid.tensor(a, dtype=lucid.float64, requires_grad=grad),
        torch.tensor(a, dtype=torch.float64, requires_grad=grad),
    )


def same_outputs_and_gradients(lucid_fn, torch_fn, *arrays):
    """Every output equal (indices exactly); the float inputs' gradients of a random weighting
    of the first output equal."""
    pairs = [pair(a) for a in arrays]
    got, want = lucid_fn(*(p[0] for p in pairs)), torch_fn(*(p[1] for p in pairs))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert tuple(g.shape) == tuple(w.shape)
        if w.dtype == torch.int64:
            assert g.dtype == lucid.int64
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        else:
            assert_close(g.detach(), w.detach().numpy(), rtol=1e-10, atol=1e-12)
    floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    cot = rng.standard_normal(tuple(want[0].shape))
    lg = lucid.autograd.grad(
        got[0], [pairs[i][0] for i in floats], lucid.tensor(cot), allow_unused=True
    )
    tg = torch.autograd.grad(
        want[0], [pairs[i][1] for i in floats], torch.tensor(cot), allow_unused=True
    )
    for a, b in zip(lg, tg, strict=True):
        if a is None or b is None:  # unused on one side: the other's gradient is zero
            assert all(t is None or not t.numpy().any() for t in (a, b))
        else:
            assert_close(a, b.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "name,shape,args",
    [
        ("max_pool1d_with_indices", (2, 3, 9), (3, 2, 1)),
        ("max_pool2d_with_indices", (2, 2, 7, 6), ((3, 2), (2, 1), (1, 0))),
        ("max_pool3d_with_indices", (1, 2, 5, 6, 4), (3, 2, 1)),
        ("max_pool3d_with_indices", (2, 4, 4, 6), ((2, 3, 2), (1, 3, 2))),
        ("adaptive_max_pool1d_with_indices", (2, 3, 10), (4,)),
        ("adaptive_max_pool2d_with_indices", (2, 2, 7, 5), ((3, 2),)),
        ("adaptive_max_pool2d_with_indices", (3, 6, 6), ((4, None),)),
        ("adaptive_max_pool3d_with_indices", (1, 2, 5, 4, 6), ((2, 3, 4),)),
    ],
)
def test_pooling_with_indices_matches_torch(name, shape, args):
    same_outputs_and_gradients(
        lambda x: getattr(F, name)(x, *args),
        lambda x: getattr(TF, name)(x, *args),
        rng.standard_normal(shape),
    )


def test_max_pool_ties_pick_torchs_index():
    x = np.zeros((1, 1, 4, 4))  # every window is one tie: torch reports its first element
    got = F.adaptive_max_pool2d(lucid.tensor(x), 2, return_indices=True)[1]
    want = TF.adaptive_max_pool2d(torch.tensor(x), 2, return_indices=True)[1]
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    cube = np.zeros((1, 1, 4, 4, 4))
    got = F.max_pool3d(lucid.tensor(cube), 2, return_indices=True)[1]
    want = TF.max_pool3d(torch.tensor(cube), 2, return_indices=True)[1]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize(
    "dims,shape,kernel,stride,padding,output_size",
    [
        (1, (2, 3, 9), 3, 2, 1, None),
        (1, (3, 8), 2, None, 0, (9,)),
        (2, (2, 2, 7, 6), (3, 2), (2, 1), (1, 0), None),
        (2, (2, 2, 6, 6), 2, None, 0, (2, 2, 7, 7)),
        (3, (1, 2, 4, 6, 6), 2, 2, 0, None),
        (3, (1, 2, 5, 6, 5), 3, 2, 1, (5, 6, 5)),
        (3, (2, 4, 5, 6), 2, None, 0, (4, 5, 6)),
    ],
)
def test_max_unpool_inverts_torchs_max_pool(dims, shape, kernel, stride, padding, output_size):
    pool = getattr(TF, f"max_pool{dims}d")
    _, indices = pool(torch.tensor(rng.standard_normal(shape)), kernel, stride, padding,
                      return_indices=True)  # fmt: skip
    values = rng.standard_normal(tuple(indices.shape))
    same_outputs_and_gradients(
        lambda v, i: getattr(F, f"max_unpool{dims}d")(v, i, kernel, stride, padding, output_size),
        lambda v, i: getattr(TF, f"max_unpool{dims}d")(v, i, kernel, stride, padding, output_size),
        values,
        indices.numpy(),
    )


def test_max_unpool_refuses_bad_indices_clearly():
    with pytest.raises(IndexError, match="out of bounds"):
        F.max_unpool1d(lucid.ones(1, 1, 2), lucid.tensor([[[0, 9]]]), 2)
    with pytest.raises(ValueError, match="indices"):
        F.max_unpool2d(lucid.ones(1, 1, 2, 2), lucid.tensor([[[0, 1]]]), 2)
    with pytest.raises(ValueError, match="output_size needs 3 or 5 sizes"):
        F.max_unpool3d(lucid.ones(1, 1, 2, 2, 2), lucid.zeros(1, 1, 2, 2, 2).long(), 2,
                       output_size=(1, 4, 4, 4))  # fmt: skip


@pytest.mark.filterwarnings("ignore:Since version 1.3.0")
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2), (1, 1, 1, 3)])
def test_affine_grid_matches_torch(size, align_corners):
    dims = len(size) - 2
    theta = rng.standard_normal((size[0], dims, dims + 1))
    same_outputs_and_gradients(
        lambda t: F.affine_grid(t, size, align_corners=align_corners),
        lambda t: TF.affine_grid(t, size, align_corners=align_corners),
        theta,
    )


def test_affine_grid_refuses_a_mismatched_theta():
    with pytest.raises(ValueError, match="theta must have shape"):
        F.affine_grid(lucid.zeros(2, 3, 4), (2, 1, 4, 4))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"reduction": "sum", "label_smoothing": 0.1}, {"ignore_index": 2, "bias": True}],
)
def test_linear_cross_entropy_matches_torch(kwargs):
    kwargs = dict(kwargs)
    bias = kwargs.pop("bias", False)
    x, w, b = rng.standard_normal((6, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    target = rng.integers(0, 5, 6)

    def run(f, lib):
        return lambda x, w, b, t: f(x, w, t, linear_bias=b if bias else None, **kwargs)

    same_outputs_and_gradients(
        run(F.linear_cross_entropy, lucid), run(TF.linear_cross_entropy, torch), x, w, b, target
    )


def test_linear_cross_entropy_refuses_unsupported_shapes():
    with pytest.raises(ValueError, match="1-d or 2-d input"):
        F.linear_cross_entropy(lucid.ones(2, 3, 4), lucid.ones(5, 4), lucid.zeros(2, 3).long())


@pytest.mark.parametrize(
    "name,shape",
    [
        ("AdaptiveMaxPool1d", (2, 7)),
        ("AdaptiveMaxPool2d", (1, 2, 5, 7)),
        ("AdaptiveMaxPool3d", (2, 3, 4, 5)),
        ("MaxPool3d", (1, 2, 6, 7, 6)),
    ],
)
def test_max_pool_modules_return_torchs_indices(name, shape):
    x = rng.standard_normal(shape)
    got = getattr(lucid.nn, name)(3, return_indices=True)(lucid.tensor(x))
    want = getattr(torch.nn, name)(3, return_indices=True)(torch.tensor(x))
    assert_close(got[0], want[0].numpy())
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())


def test_they_compile_without_a_fallback_and_match_eager():
    def fn(x, theta):
        values, indices = F.adaptive_max_pool2d(x, (2, 3), return_indices=True)
        unpooled = F.max_unpool2d(values, indices, 2, output_size=x.shape)
        folded = F.fold(F.unfold(x, 2), (4, 6), 2) * x
        grid = F.affine_grid(theta, (2, 3, 4, 5))
        sampled = F.grid_sample(x, grid * 0.9 + 0.01)
        total = unpooled.sum() + grid.sum() + (values * 2).sum() + folded.sum()
        return total + sampled.sum()

    compiled = lucid.compile(fn)
    x = lucid.randn(2, 3, 4, 6, dtype=lucid.float64)
    theta = lucid.randn(2, 2, 3, dtype=lucid.float64)
    assert_close(compiled(x, theta), fn(x, theta).numpy())
    assert not compiled.cache_info()["reasons"]


@pytest.mark.parametrize(
    "batch,output_size,kernel,dilation,padding,stride",
    [
        ((2,), (5, 6), (2, 3), 1, 0, 1),
        ((1,), (7, 6), 3, (2, 1), (1, 2), (2, 1)),
        ((), (4, 4), 2, 1, 0, 2),
    ],
)
def test_fold_matches_torch(batch, output_size, kernel, dilation, padding, stride):
    unfolded = TF.unfold(
        torch.zeros(*batch, 3, *output_size) if batch else torch.zeros(1, 3, *output_size),
        kernel, dilation, padding, stride,
    )  # fmt: skip
    shape = tuple(unfolded.shape) if batch else tuple(unfolded.shape[1:])
    same_outputs_and_gradients(
        lambda x: F.fold(x, output_size, kernel, dilation, padding, stride),
        lambda x: TF.fold(x, output_size, kernel, dilation, padding, stride),
        rng.standard_normal(shape),
    )
    got = lucid.nn.Fold(output_size, kernel, dilation, padding, stride)(
        lucid.tensor(np.ones(shape))
    )
    want = torch.nn.Fold(output_size, kernel, dilation, padding, stride)(torch.ones(shape))
    assert_close(got, want.numpy())


def test_fold_refuses_blocks_that_do_not_tile():
    with pytest.raises(ValueError, match="do not tile"):
        F.fold(lucid.ones(1, 4, 5), (3, 3), 2)
    with pytest.raises(ValueError, match="divisible"):
        F.fold(lucid.ones(1, 5, 4), (3, 3), 2)


@pytest.mark.parametrize("dims,shape", [(1, (2, 3, 8)), (2, (1, 2, 6, 4)), (3, (2, 4, 6, 4))])
def test_max_unpool_modules_invert_max_pool_as_torch(dims, shape):
    x = rng.standard_normal(shape)
    pool = getattr(torch.nn, f"MaxPool{dims}d")(2, return_indices=True)
    values, indices = pool(torch.tensor(x))
    size = shape[-dims:]
    want = getattr(torch.nn, f"MaxUnpool{dims}d")(2)(values, indices, output_size=size)
    got = getattr(lucid.nn, f"MaxUnpool{dims}d")(2)(
        lucid.tensor(values.numpy()), lucid.tensor(indices.numpy()), output_size=size
    )
    assert_close(got, want.numpy())
    lucid_values, lucid_indices = getattr(lucid.nn, f"MaxPool{dims}d")(2, return_indices=True)(
        lucid.tensor(x)
    )
    round_trip = getattr(lucid.nn, f"MaxUnpool{dims}d")(2)(lucid_values, lucid_indices)
    assert_close(round_trip, want.numpy())


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch(mode, padding_mode, align_corners):
    x = rng.standard_normal((2, 3, 4, 5))
    # Points inside, on and beyond the border; none exactly on a pixel or half-pixel, where
    # floor and round have a kink.
    grid = rng.uniform(-1.3, 1.3, (2, 3, 6, 2)) + 0.0123
    same_outputs_and_gradients(
        lambda a, g: F.grid_sample(a, g, mode, padding_mode, align_corners),
        lambda a, g: TF.grid_sample(a, g, mode, padding_mode, align_corners),
        x,
        grid,
    )


def test_grid_sample_of_an_identity_affine_grid_is_the_input():
    x = lucid.randn(1, 2, 3, 4, dtype=lucid.float64)
    theta = lucid.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=lucid.float64)
    grid = F.affine_grid(theta, (1, 2, 3, 4), align_corners=False)
    assert_close(F.grid_sample(x, grid, align_corners=False), x.numpy())


def test_grid_sample_refuses_what_it_does_not_do():
    with pytest.raises(ValueError, match="mode"):
        F.grid_sample(lucid.ones(1, 1, 2, 2), lucid.zeros(1, 1, 1, 2), mode="bicubic")
    with pytest.raises(ValueError, match="padding_mode"):
        F.grid_sample(lucid.ones(1, 1, 2, 2), lucid.zeros(1, 1, 1, 2), padding_mode="reflection")
    with pytest.raises(ValueError, match="grid_sample: expected"):
        F.grid_sample(lucid.ones(1, 1, 2, 2, 2), lucid.zeros(1, 1, 1, 1, 3))


@pytest.mark.parametrize(
    "shape,weight_shape,kwargs",
    [
        ((2, 4, 5, 6, 4), (6, 2, 2, 3, 2), {"stride": (1, 2, 1), "padding": 1, "groups": 2}),
        ((3, 6, 5, 7), (2, 3, 3, 2, 2), {"dilation": (1, 2, 1)}),
        ((1, 2, 4, 4, 4), (3, 2, 3, 3, 2), {"padding": "same", "dilation": 2}),
        ((1, 2, 4, 5, 4), (3, 2, 2, 2, 2), {"padding": "valid", "stride": 2}),
    ],
)
def test_conv3d_matches_torch(shape, weight_shape, kwargs):
    same_outputs_and_gradients(
        lambda x, w, b: F.conv3d(x, w, b, **kwargs),
        lambda x, w, b: TF.conv3d(x, w, b, **kwargs),
        rng.standard_normal(shape),
        rng.standard_normal(weight_shape),
        rng.standard_normal(weight_shape[0]),
    )


def test_conv3d_module_matches_torch_and_refuses_bad_channels():
    model = lucid.nn.Conv3d(2, 4, (2, 3, 2), stride=(2, 1, 1), padding=(1, 0, 1), bias=True)
    reference = torch.nn.Conv3d(2, 4, (2, 3, 2), stride=(2, 1, 1), padding=(1, 0, 1))
    model.double()
    with torch.no_grad():
        reference.double()
        reference.weight.copy_(torch.tensor(model.weight.numpy()))
        reference.bias.copy_(torch.tensor(model.bias.numpy()))
    x = rng.standard_normal((2, 2, 5, 6, 4))
    assert_close(model(lucid.tensor(x)).detach(), reference(torch.tensor(x)).detach().numpy())
    with pytest.raises(ValueError, match="input channels"):
        F.conv3d(lucid.ones(1, 3, 4, 4, 4), lucid.ones(2, 2, 2, 2, 2))


def test_conv3d_compiles_with_eager_gradients(compiled_matches_eager):
    model = lucid.nn.Conv3d(2, 3, 2, padding=1, groups=1).double()
    compiled_matches_eager(model, lucid.randn(2, 2, 3, 4, 3, dtype=lucid.float64))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("layout", ["2d", "offsets", "last_offset"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_matches_torch(mode, layout, padding_idx):
    weight = rng.standard_normal((6, 3))
    # Repeated indices (ties for max), an empty bag, a bag of padding only.
    flat = np.array([1, 4, 1, 2, 2, 5, 0, 3, 3])
    if layout == "2d":
        indices, offsets, last = flat.reshape(3, 3), None, False
    else:
        last = layout == "last_offset"
        starts = [0, 3, 3, 5, 7] + ([9] if last else [])
        indices, offsets = flat, np.array(starts)

    def run(lib, f):
        def call(w, *extra):
            i = lib.tensor(indices)
            o = None if offsets is None else lib.tensor(offsets)
            return f(i, w, o, mode=mode, include_last_offset=last, padding_idx=padding_idx)

        return call

    same_outputs_and_gradients(run(lucid, F.embedding_bag), run(torch, TF.embedding_bag), weight)


def test_embedding_bag_per_sample_weights_and_module_match_torch():
    weight = rng.standard_normal((5, 4))
    indices, offsets = np.array([0, 2, 4, 1, 3]), np.array([0, 2])
    psw = rng.standard_normal(5)
    same_outputs_and_gradients(
        lambda w, p: F.embedding_bag(lucid.tensor(indices), w, lucid.tensor(offsets), mode="sum",
                                     per_sample_weights=p),
        lambda w, p: TF.embedding_bag(torch.tensor(indices), w, torch.tensor(offsets), mode="sum",
                                      per_sample_weights=p),
        weight,
        psw,
    )  # fmt: skip
    bag = lucid.nn.EmbeddingBag.from_pretrained(lucid.tensor(weight), mode="max")
    reference = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(weight), mode="max")
    got = bag(lucid.tensor(indices), lucid.tensor(offsets))
    assert_close(got, reference(torch.tensor(indices), torch.tensor(offsets)).numpy())
    with pytest.raises(ValueError, match="per_sample_weights needs mode='sum'"):
        F.embedding_bag(lucid.tensor(indices), lucid.tensor(weight), lucid.tensor(offsets),
                        per_sample_weights=lucid.tensor(psw))  # fmt: skip
    with pytest.raises(ValueError, match="offsets must be None"):
        F.embedding_bag(lucid.tensor([[0, 1]]), lucid.tensor(weight), lucid.tensor([0]))


def test_embedding_bag_compiles_with_eager_gradients():
    bag = lucid.nn.EmbeddingBag(6, 3, mode="mean", padding_idx=0).double()
    indices, offsets = lucid.tensor([1, 4, 0, 2, 5]), lucid.tensor([0, 2, 2])
    compiled = lucid.compile(bag)
    assert_close(compiled(indices, offsets), bag(indices, offsets).detach().numpy())
    assert not compiled.cache_info()["reasons"]
    compiled(indices, offsets).square().sum().backward()
    compiled_grad = bag.weight.grad.numpy().copy()
    bag.zero_grad()
    bag(indices, offsets).square().sum().backward()
    assert_close(compiled_grad, bag.weight.grad.numpy())


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6])
def test_cross_map_lrn2d_matches_torch_and_finite_differences(size):
    # torch's legacy backward fails for several sizes, so gradients are checked against float64
    # finite differences instead.
    from lucid.testing import gradcheck

    x = rng.standard_normal((2, 5, 3, 2))
    got = lucid.nn.CrossMapLRN2d(size, 0.1, 0.75, 2.0)(lucid.tensor(x))
    want = torch.nn.CrossMapLRN2d(size, 0.1, 0.75, 2.0)(torch.tensor(x))
    assert_close(got, want.numpy())
    layer = lucid.nn.CrossMapLRN2d(size, 0.1, 0.75, 2.0)
    gradcheck(lambda t: layer(t).sin().sum(), lucid.tensor(x, requires_grad=True))
    with pytest.raises(ValueError, match="4D"):
        layer(lucid.ones(2, 3, 4))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_loss_module_matches_torch(bias):
    loss = lucid.nn.LinearCrossEntropyLoss(4, 5, bias=bias, label_smoothing=0.05).double()
    reference = torch.nn.LinearCrossEntropyLoss(4, 5, bias=bias, label_smoothing=0.05).double()
    with torch.no_grad():
        reference.linear.weight.copy_(torch.tensor(loss.linear.weight.numpy()))
        if bias:
            reference.linear.bias.copy_(torch.tensor(loss.linear.bias.numpy()))
    x, target = rng.standard_normal((6, 4)), rng.integers(0, 5, 6)
    got = loss(lucid.tensor(x), lucid.tensor(target))
    want = reference(torch.tensor(x), torch.tensor(target))
    assert_close(got.detach(), want.detach().numpy())
    got.backward()
    want.backward()
    assert_close(loss.linear.weight.grad, reference.linear.weight.grad.numpy())
    assert sorted(dict(loss.named_parameters())) == sorted(dict(reference.named_parameters()))
    with pytest.raises(ValueError, match="out_features"):
        lucid.nn.LinearCrossEntropyLoss(4, 5, out_features=(2,))


@pytest.mark.parametrize(
    "shape,weight_shape,kwargs",
    [
        ((2, 4, 3, 4, 3), (4, 3, 2, 3, 2),
         {"stride": (2, 1, 3), "padding": (1, 0, 1), "output_padding": (1, 0, 2)}),
        ((1, 4, 2, 3, 2), (4, 1, 3, 2, 2), {"groups": 2, "dilation": (2, 1, 1), "padding": 1}),
        ((4, 3, 3, 2), (4, 2, 2, 2, 2), {"stride": 2}),
        ((1, 2, 5, 5, 5), (2, 2, 2, 2, 2), {"padding": 2}),
    ],
)  # fmt: skip
def test_conv_transpose3d_matches_torch(shape, weight_shape, kwargs):
    groups = kwargs.get("groups", 1)
    same_outputs_and_gradients(
        lambda x, w, b: F.conv_transpose3d(x, w, b, **kwargs),
        lambda x, w, b: TF.conv_transpose3d(x, w, b, **kwargs),
        rng.standard_normal(shape),
        rng.standard_normal(weight_shape),
        rng.standard_normal(weight_shape[1] * groups),
    )


def test_conv_transpose3d_module_matches_torch():
    layer = lucid.nn.ConvTranspose3d(2, 4, (2, 3, 2), stride=2, padding=(0, 1, 1)).double()
    reference = torch.nn.ConvTranspose3d(2, 4, (2, 3, 2), stride=2, padding=(0, 1, 1)).double()
    with torch.no_grad():
        reference.weight.copy_(torch.tensor(layer.weight.numpy()))
        reference.bias.copy_(torch.tensor(layer.bias.numpy()))
    x = rng.standard_normal((2, 2, 3, 3, 2))
    got = layer(lucid.tensor(x), output_size=(7, 6, 3))
    want = reference(torch.tensor(x), output_size=(7, 6, 3))
    assert_close(got.detach(), want.detach().numpy())
    with pytest.raises(ValueError, match="output_padding"):
        F.conv_transpose3d(lucid.ones(1, 2, 2, 2, 2), lucid.ones(2, 1, 2, 2, 2), output_padding=1)


def test_conv_transpose3d_compiles_with_eager_gradients(compiled_matches_eager):
    layer = lucid.nn.ConvTranspose3d(2, 3, 2, stride=2, padding=1, output_padding=1).double()
    compiled_matches_eager(layer, lucid.randn(2, 2, 3, 2, 3, dtype=lucid.float64))
