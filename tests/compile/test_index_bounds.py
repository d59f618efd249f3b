"""Values read as indices, compiled vs eager (issue 15, item 2).

Every op that reads tensor values as indices raises eager's ``IndexError`` (same message, naming
the user's op) compiled too, through ``prim.check_index``: no wrapped negative (the loss of class
C-1, the last embedding row), no ``prim.gather`` message, no eager fallback, and no state changed
(parameters, optimizer state, BatchNorm buffers). Where PyTorch wraps negatives (``x[idx]``,
``index_put``, ``index_fill``) compiled code wraps them too and matches eager's values.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compiled_step, fused_step, make_step

X = lucid.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
LOGITS = lucid.tensor(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
WEIGHT = lucid.tensor(np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32))


def _set(i):
    y = X.clone()
    y[i] = -1.0
    return y


def _accumulate(i):
    return X.index_put((i,), lucid.ones(2, 3), accumulate=True)


def _column(i):
    return i.reshape(2, 1).expand(2, 3)


# name -> (call on a 2-element int64 index, bad values, eager's message for each, or None where a
# value is valid). Each op's own rule: PyTorch's.
OPS = {
    "gather": (
        lambda i: lucid.gather(X, 0, _column(i)),
        {-1: "gather: index -1 is out of bounds for dim 0 with size 4",
         4: "gather: index 4 is out of bounds for dim 0 with size 4"},
    ),
    "take_along_dim": (
        lambda i: lucid.take_along_dim(X, i.reshape(2, 1), 0),
        {-1: "gather: index -1 is out of bounds for dim 0 with size 4"},
    ),
    "scatter": (
        lambda i: lucid.scatter(lucid.zeros(4, 3), 0, _column(i), lucid.ones(2, 3)),
        {-2: "scatter: index -2 is out of bounds for dim 0 with size 4",
         9: "scatter: index 9 is out of bounds for dim 0 with size 4"},
    ),
    "scatter_add": (
        lambda i: lucid.scatter_add(lucid.zeros(4, 3), 0, _column(i), lucid.ones(2, 3)),
        {-1: "scatter_add: index -1 is out of bounds for dim 0 with size 4"},
    ),
    "index_select": (
        lambda i: lucid.index_select(X, 1, i),
        {-1: "index_select: index -1 is out of bounds for dim 1 with size 3",
         3: "index_select: index 3 is out of bounds for dim 1 with size 3"},
    ),
    "index_add": (
        lambda i: lucid.index_add(X, 0, i, lucid.ones(2, 3)),
        {-1: "index_add: index -1 is out of bounds for dim 0 with size 4"},
    ),
    "index_copy": (
        lambda i: lucid.index_copy(X, 0, i, lucid.ones(2, 3)),
        {-4: "index_copy: index -4 is out of bounds for dim 0 with size 4"},
    ),
    "index_fill": (
        lambda i: lucid.index_fill(X, 0, i, 7.0),
        {-1: None, -5: "index_fill: index -5 is out of bounds for dim 0 with size 4",
         4: "index_fill: index 4 is out of bounds for dim 0 with size 4"},
    ),
    "getitem": (
        lambda i: X[i],
        {-4: None, -5: "index: index -5 is out of bounds for dim 0 with size 4",
         4: "index: index 4 is out of bounds for dim 0 with size 4"},
    ),
    "getitem_dim1": (
        lambda i: X[1:, i],
        {-3: None, 3: "index: index 3 is out of bounds for dim 1 with size 3"},
    ),
    "getitem_two_tensors": (
        lambda i: X[i, lucid.tensor([0, 2])],
        {-1: None, 6: "index: index 6 is out of bounds for dim 0 with size 4"},
    ),
    "setitem": (
        _set,
        {-1: None, -7: "index_put: index -7 is out of bounds for dim 0 with size 4"},
    ),
    "index_put_accumulate": (
        _accumulate,
        {-2: None, 4: "index_put: index 4 is out of bounds for dim 0 with size 4"},
    ),
    "embedding": (
        lambda i: F.embedding(i, WEIGHT),
        {-1: "embedding: index -1 is out of range for 5 embeddings",
         5: "embedding: index 5 is out of range for 5 embeddings"},
    ),
    "one_hot": (
        lambda i: F.one_hot(i, 4),
        {-1: "one_hot: class value -1 is out of bounds for 4 classes",
         4: "one_hot: class value 4 is out of bounds for 4 classes"},
    ),
    "cross_entropy": (
        lambda i: F.cross_entropy(LOGITS, i),
        {-1: "cross_entropy: target -1 is out of bounds for 4 classes",
         4: "cross_entropy: target 4 is out of bounds for 4 classes"},
    ),
    "cross_entropy_weighted_smoothed": (
        lambda i: F.cross_entropy(
            LOGITS, i, weight=lucid.tensor([1.0, 2.0, 0.5, 1.0]), label_smoothing=0.1
        ),
        {-3: "cross_entropy: target -3 is out of bounds for 4 classes"},
    ),
    "cross_entropy_ignore_minus_one": (
        lambda i: F.cross_entropy(LOGITS, i, ignore_index=-1),
        {-1: None, -2: "cross_entropy: target -2 is out of bounds for 4 classes"},
    ),
    "nll_loss": (
        lambda i: F.nll_loss(F.log_softmax(LOGITS, 1), i, reduction="sum"),
        {-1: "nll_loss: target -1 is out of bounds for 4 classes",
         100: "nll_loss: target 100 is out of bounds for 4 classes"},
    ),
}  # fmt: skip
CASES = [(name, bad) for name, (_, bads) in OPS.items() for bad in bads]


def _outcome(fn, idx):
    try:
        return "ok", fn(idx).numpy()
    except IndexError as e:
        return "IndexError", str(e)


@pytest.mark.parametrize("name,bad", CASES, ids=[f"{n}[{b}]" for n, b in CASES])
def test_compiled_raises_eager_index_error_or_matches_eager_values(name, bad):
    fn, bads = OPS[name]
    idx = lucid.tensor([1, bad])
    eager = _outcome(fn, idx)
    want = bads[bad]
    if want is None:
        assert eager[0] == "ok"
    else:
        assert eager == ("IndexError", want)
    compiled = lucid.compile(fn, strict=True)  # strict: a compile failure is not an eager run
    got = _outcome(compiled, idx)
    assert got[0] == eager[0]
    if got[0] == "ok":
        np.testing.assert_allclose(got[1], eager[1], rtol=1e-6)
    else:
        assert got[1] == eager[1]
    # The same executable still serves valid indices afterwards (the error was not a miss).
    good = lucid.tensor([1, 0])
    np.testing.assert_allclose(compiled(good).numpy(), fn(good).numpy(), rtol=1e-6)
    assert compiled.cache_info()["entries"] == 1


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-9, 9), min_size=1, max_size=6),
    name=st.sampled_from(["gather", "getitem", "index_select", "embedding", "cross_entropy"]),
)
def test_random_indices_compiled_equal_eager(values, name):
    calls = {
        "gather": lambda i: lucid.gather(X.reshape(-1), 0, i),
        "getitem": lambda i: X[:, i],
        "index_select": lambda i: lucid.index_select(X, 0, i),
        "embedding": lambda i: F.embedding(i, WEIGHT),
        "cross_entropy": lambda i: F.cross_entropy(LOGITS[:1].expand(len(values), 4), i),
    }
    fn = calls[name]
    idx = lucid.tensor(values)
    kind, want = _outcome(fn, idx)
    got_kind, got = _outcome(lucid.compile(fn, strict=True), idx)
    assert got_kind == kind
    if kind == "ok":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        assert got == want


def test_embedding_gradient_compiled_raises_for_negative_ids():
    emb = nn.Embedding(5, 3)
    ids = lucid.tensor([[0, -1]])
    with pytest.raises(IndexError, match=r"^embedding: index -1 is out of range for 5 embeddings$"):
        emb(ids)
    compiled = lucid.compile(emb, strict=True)
    with pytest.raises(IndexError, match=r"^embedding: index -1 is out of range for 5 embeddings$"):
        compiled(ids)  # a forward and backward graph (the weight requires grad)
    out = compiled(lucid.tensor([[0, 4]]))
    out.sum().backward()
    np.testing.assert_array_equal(emb.weight.grad.numpy()[[0, 4]], np.ones((2, 3)))


# --- training steps: the error, and every piece of state left as it was ----------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


def _state(model, opt):
    params = [p.numpy().copy() for p in model.parameters()]
    buffers = [b.numpy().copy() for b in model.buffers()]
    slots = [
        {k: (v.numpy().copy() if hasattr(v, "numpy") else v) for k, v in s.items()}
        for s in opt.state.values()
    ]
    return params, buffers, slots


def _assert_same_state(before, after):
    for a_list, b_list in zip(before[:2], after[:2], strict=True):
        assert len(a_list) == len(b_list)
        for a, b in zip(a_list, b_list, strict=True):
            np.testing.assert_array_equal(a, b)
    assert len(before[2]) == len(after[2])
    for a, b in zip(before[2], after[2], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return lucid.tensor(rng.standard_normal((8, 6)).astype(np.float32))


BAD_LABELS = lucid.tensor([0, 1, 2, 3, -1, 0, 1, 2])
GOOD_LABELS = lucid.tensor([0, 1, 2, 3, 3, 0, 1, 2])
CE_MESSAGE = r"^cross_entropy: target -1 is out of bounds for 4 classes$"


@pytest.mark.parametrize("first_call_bad", [True, False])
def test_fused_step_raises_and_leaves_parameters_optimizer_and_buffers_intact(first_call_bad):
    lucid.manual_seed(0)
    model = _Net()
    # SGD with momentum: optimizer state, and no Adam-normalized noise (fc.bias before BatchNorm
    # has a zero gradient up to rounding) in the comparison with eager below.
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = fused_step(model, F.cross_entropy, opt)
    if not first_call_bad:
        step(_batch(1), GOOD_LABELS)  # the optimizer state exists and the entry is warm
    before = _state(model, opt)
    with pytest.raises(IndexError, match=CE_MESSAGE):
        step(_batch(), BAD_LABELS)
    _assert_same_state(before, _state(model, opt))
    # and a following good step is exactly eager's step from that state
    twin = _Net()
    twin.load_state_dict(model.state_dict())
    twin_opt = optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    if not first_call_bad:
        twin_opt.load_state_dict(opt.state_dict())
    loss = step(_batch(2), GOOD_LABELS)
    twin_opt.zero_grad()
    want = F.cross_entropy(twin(_batch(2)), GOOD_LABELS)
    want.backward()
    twin_opt.step()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_make_step_and_compiled_step_raise_and_leave_state_intact():
    lucid.manual_seed(0)
    model = _Net()
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = _state(model, opt)
    step = make_step(model, F.cross_entropy)
    with pytest.raises(IndexError, match=CE_MESSAGE):
        step(_batch(), BAD_LABELS)
    with pytest.raises(IndexError, match=CE_MESSAGE):
        compiled_step(model, _batch(), F.cross_entropy, BAD_LABELS)
    _assert_same_state(before, _state(model, opt))
    assert all(p.grad is None for p in model.parameters())
    loss = step(_batch(), GOOD_LABELS)
    np.testing.assert_allclose(
        loss.item(), F.cross_entropy(model(_batch()), GOOD_LABELS).item(), rtol=1e-5
    )


def test_compiled_model_with_nll_loss_in_train_mode_raises_and_keeps_bn_buffers():
    lucid.manual_seed(0)
    model = _Net()

    def loss_of(x, y):
        return F.nll_loss(F.log_softmax(model(x), 1), y)

    before = [b.numpy().copy() for b in model.buffers()]
    compiled = lucid.compile(loss_of, strict=True)
    with pytest.raises(IndexError, match=r"^nll_loss: target -1 is out of bounds for 4 classes$"):
        compiled(_batch(), BAD_LABELS)
    for a, b in zip(before, model.buffers(), strict=True):
        np.testing.assert_array_equal(a, b.numpy())
