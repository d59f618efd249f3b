"""lucid.sparse: COO construction, densifying, products with dense matrices (values, gradients
to the dense operand and the values, compiled equal to eager), torch parity when installed."""

import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck

RNG = np.random.default_rng(5)
# Repeated (0, 1) entry: COO allows it, and both densifying and products must add them up.
INDICES = np.array([[0, 1, 1, 2, 0, 3], [1, 0, 2, 2, 1, 0]])


def _dense_of(values, size=(4, 3)):
    out = np.zeros(size)
    np.add.at(out, tuple(INDICES), values)
    return out


def test_to_dense_adds_repeated_indices_and_coalesce_merges_them():
    values = RNG.standard_normal(6)
    s = lucid.sparse_coo_tensor(INDICES, values, (4, 3))
    assert s.is_sparse and s.shape == (4, 3) and s._nnz() == 6 and not s.is_coalesced()
    np.testing.assert_allclose(s.to_dense().numpy(), _dense_of(values))
    c = s.coalesce()
    assert c.is_coalesced() and c._nnz() == 5
    np.testing.assert_array_equal(c.indices().numpy(), [[0, 1, 1, 2, 3], [1, 0, 2, 2, 0]])
    np.testing.assert_allclose(c.values().numpy()[0], values[0] + values[4])
    with pytest.raises(RuntimeError, match="coalesce"):
        s.indices()


def test_dense_round_trip_and_inferred_size():
    d = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    s = lucid.tensor(d).to_sparse()
    assert s.is_coalesced() and s._nnz() == 3 and not lucid.tensor(d).is_sparse
    np.testing.assert_array_equal(s.to_dense().numpy(), d)
    assert lucid.sparse_coo_tensor([[0, 2], [1, 4]], [1.0, 2.0]).shape == (3, 5)
    legacy = lucid.sparse.FloatTensor(lucid.tensor(INDICES), lucid.tensor(np.ones(6)), (4, 3))
    assert legacy.dtype == lucid.float32


def test_products_match_the_dense_product():
    values = RNG.standard_normal(6)
    s = lucid.sparse_coo_tensor(INDICES, values, (4, 3), dtype=lucid.float64)
    d = RNG.standard_normal((3, 5))
    want = _dense_of(values) @ d
    for got in (lucid.sparse.mm(s, lucid.tensor(d)), lucid.spmm(s, lucid.tensor(d)),
                lucid.mm(s, lucid.tensor(d)), s @ lucid.tensor(d)):  # fmt: skip
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    e = RNG.standard_normal((2, 4))
    np.testing.assert_allclose(
        lucid.mm(lucid.tensor(e), s).numpy(), e @ _dense_of(values), atol=1e-12
    )


def test_gradients_reach_dense_operand_and_values():
    values = lucid.tensor(RNG.standard_normal(6), requires_grad=True)
    dense = lucid.tensor(RNG.standard_normal((3, 2)), requires_grad=True)
    gradcheck(
        lambda v, d: lucid.sparse.mm(lucid.sparse_coo_tensor(INDICES, v, (4, 3)), d).tanh().sum(),
        values,
        dense,
    )


def test_bad_input_is_a_clear_error():
    with pytest.raises(IndexError, match="out of range"):
        lucid.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,))
    with pytest.raises(ValueError, match=r"\(ndim, nnz\)"):
        lucid.sparse_coo_tensor([[0, 1]], [1.0], (3,))
    s = lucid.sparse_coo_tensor(INDICES, np.ones(6), (4, 3))
    with pytest.raises(ValueError, match="cannot be multiplied"):
        lucid.sparse.mm(s, lucid.zeros(4, 2))
    with pytest.raises(TypeError, match="sparse @ sparse"):
        lucid.sparse.mm(s, s.t())


class GraphConvolution(lucid.nn.Module):
    """The layer of Kipf & Welling's pygcn, as written for torch."""

    def __init__(self, n_in, n_out, adj):
        super().__init__()
        self.weight = lucid.nn.Parameter(lucid.randn(n_in, n_out, dtype=lucid.float64))
        self.adj = adj

    def forward(self, x):
        return lucid.spmm(self.adj, lucid.mm(x, self.weight))


def test_graph_convolution_compiled_equals_eager():
    adj = lucid.sparse_coo_tensor(INDICES, RNG.uniform(size=6), (4, 3), dtype=lucid.float64)
    layer = GraphConvolution(5, 2, adj)
    x = lucid.randn(3, 5, dtype=lucid.float64)
    compiled = lucid.compile(layer, strict=True)
    np.testing.assert_allclose(compiled(x).detach().numpy(), layer(x).detach().numpy(), atol=1e-12)
    layer(x).square().sum().backward()
    want = layer.weight.grad.numpy().copy()
    layer.zero_grad()
    compiled(x).square().sum().backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), want, atol=1e-10)


def test_torch_parity():
    torch = pytest.importorskip("torch")
    values, d = RNG.standard_normal(6), RNG.standard_normal((3, 4))
    s = lucid.sparse_coo_tensor(INDICES, values, (4, 3))
    ts = torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(values), (4, 3))
    x, t = lucid.tensor(d, requires_grad=True), torch.tensor(d, requires_grad=True)
    out, ref = lucid.spmm(s, x), torch.spmm(ts, t)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    out.square().sum().backward()
    ref.square().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-12)
    c, tc = s.coalesce(), ts.coalesce()
    np.testing.assert_array_equal(c.indices().numpy(), tc.indices().numpy())
    np.testing.assert_allclose(c.values().numpy(), tc.values().numpy(), atol=1e-12)
