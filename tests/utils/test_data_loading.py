"""lucid.utils.data against torch.utils.data's documented behaviour (and torch itself when
installed): datasets, the DataLoader's batching, shuffling, collation and errors, random_split."""

from __future__ import annotations

import collections
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    default_collate,
    random_split,
)


def _dataset(n=10):
    x = lucid.arange(n * 3, dtype=lucid.float32).reshape(n, 3)
    y = lucid.arange(n)
    return TensorDataset(x, y), x, y


class ListDataset(Dataset):
    """A map-style dataset with no batch shortcut: samples are fetched one by one."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


# --- datasets ------------------------------------------------------------------------------------
def test_tensor_dataset():
    ds, x, y = _dataset(4)
    assert len(ds) == 4
    xi, yi = ds[2]
    np.testing.assert_array_equal(xi.numpy(), [6.0, 7.0, 8.0])
    assert yi.item() == 2
    with pytest.raises(ValueError, match=r"Size mismatch between tensors: first dimensions are"):
        TensorDataset(lucid.zeros(3, 2), lucid.zeros(4))
    with pytest.raises(TypeError, match="not a Tensor"):
        TensorDataset(np.zeros(3))
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorDataset()


def test_subset_and_concat():
    ds, x, _ = _dataset(5)
    sub = Subset(ds, [4, 0])
    assert len(sub) == 2 and sub[0][1].item() == 4 and sub[1][1].item() == 0
    cat = ds + ListDataset(["a", "b"])
    assert isinstance(cat, ConcatDataset) and len(cat) == 7
    assert cat[5] == "a" and cat[-1] == "b" and cat[4][1].item() == 4
    with pytest.raises(IndexError):
        cat[7]
    with pytest.raises(ValueError, match="should not exceed dataset length"):
        cat[-8]
    with pytest.raises(TypeError, match="IterableDataset"):
        ConcatDataset([CountStream(3)])


# --- batching ------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 13), batch_size=st.integers(1, 5), drop_last=st.booleans())
def test_sequential_batches_and_len(n, batch_size, drop_last):
    ds, x, y = _dataset(n)
    loader = DataLoader(ds, batch_size=batch_size, drop_last=drop_last)
    batches = list(loader)
    full, rest = divmod(n, batch_size)
    want = full + (1 if rest and not drop_last else 0)
    assert len(batches) == len(loader) == want
    start = 0
    for bx, by in batches:
        stop = start + bx.shape[0]
        np.testing.assert_array_equal(bx.numpy(), x.numpy()[start:stop])
        np.testing.assert_array_equal(by.numpy(), y.numpy()[start:stop])
        assert bx.dtype == lucid.float32 and by.dtype == lucid.int64
        start = stop
    assert start == (n if not drop_last else full * batch_size)


def test_batch_shortcut_equals_stacking_samples():
    ds, x, y = _dataset(11)
    samples = ListDataset([ds[i] for i in range(11)])
    lucid.manual_seed(3)
    fast = list(DataLoader(ds, batch_size=4, shuffle=True))
    lucid.manual_seed(3)
    slow = list(DataLoader(samples, batch_size=4, shuffle=True))
    assert len(fast) == len(slow) == 3
    for (fx, fy), (sx, sy) in zip(fast, slow, strict=True):
        assert isinstance(sx, lucid.Tensor)  # a list of tuples collates to a list of tensors
        assert fx.dtype == sx.dtype and fy.dtype == sy.dtype
        np.testing.assert_array_equal(fx.numpy(), sx.numpy())
        np.testing.assert_array_equal(fy.numpy(), sy.numpy())
    # the batch is a copy: writing to it leaves the dataset alone
    fast[0][0].zero_()
    assert x.numpy().sum() == sum(range(33))


def test_batch_size_none_yields_samples_unbatched():
    items = [np.array([1.0, 2.0]), {"k": np.int32(3)}, "text"]
    got = list(DataLoader(ListDataset(items), batch_size=None))
    assert isinstance(got[0], lucid.Tensor) and got[0].dtype == lucid.float64
    assert isinstance(got[1]["k"], lucid.Tensor) and got[1]["k"].dtype == lucid.int32
    assert got[2] == "text"
    assert len(DataLoader(ListDataset(items), batch_size=None)) == 3


# --- shuffling -----------------------------------------------------------------------------------
def _order(loader):
    return [int(v) for _, y in loader for v in y.tolist()]


def test_shuffle_is_a_new_permutation_each_epoch_and_seeded():
    ds, _, _ = _dataset(20)
    lucid.manual_seed(0)
    loader = DataLoader(ds, batch_size=6, shuffle=True)
    e1, e2 = _order(loader), _order(loader)
    assert sorted(e1) == sorted(e2) == list(range(20))
    assert e1 != e2 and e1 != list(range(20))
    lucid.manual_seed(0)
    assert _order(loader) == e1 and _order(loader) == e2  # manual_seed reproduces the run
    # the documented source: one randperm of the global stream per epoch
    lucid.manual_seed(0)
    assert e1 == lucid.randperm(20).tolist()


def test_shuffle_with_generator_is_independent_of_global_state():
    ds, _, _ = _dataset(15)
    g = lucid.Generator().manual_seed(42)
    lucid.manual_seed(1)
    first = _order(DataLoader(ds, batch_size=4, shuffle=True, generator=g))
    global_state = lucid.get_rng_state().tolist()
    assert global_state == [1, 0]  # the global stream was not touched
    lucid.manual_seed(99)
    again = _order(DataLoader(ds, batch_size=4, shuffle=True, generator=g.manual_seed(42)))
    assert first == again
    lucid.manual_seed(42)
    assert first == lucid.randperm(15).tolist()  # same stream as the global one from that seed


def test_generator_state():
    g = lucid.Generator()
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    state = g.get_state()
    a = RandomSampler(range(10), generator=g)
    first = list(a)
    g.set_state(state)
    assert list(a) == first
    assert list(a) != first  # next epoch, next draw
    with pytest.raises(TypeError, match="int seed"):
        g.manual_seed(1.5)
    with pytest.raises(ValueError, match="shape"):
        g.set_state(lucid.zeros(3, dtype=lucid.int64))
    with pytest.raises(TypeError, match="lucid.Generator"):
        DataLoader(_dataset()[0], shuffle=True, generator=np.random.default_rng(0))
    assert isinstance(g.seed(), int) and g.device == "cpu"


def test_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    g = lucid.Generator().manual_seed(0)
    with_rep = list(RandomSampler(range(3), replacement=True, num_samples=200, generator=g))
    assert len(with_rep) == 200 and set(with_rep) == {0, 1, 2}
    over = list(RandomSampler(range(4), num_samples=10, generator=g))
    assert sorted(over[:4]) == [0, 1, 2, 3] and sorted(over[4:8]) == [0, 1, 2, 3]
    sub = list(SubsetRandomSampler([10, 20, 30], generator=g))
    assert sorted(sub) == [10, 20, 30]
    assert list(BatchSampler(range(5), 2, drop_last=False)) == [[0, 1], [2, 3], [4]]
    assert len(BatchSampler(range(5), 2, drop_last=True)) == 2
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        BatchSampler(range(3), 0, False)


def test_custom_sampler_batch_sampler_and_collate_fn():
    ds, _, _ = _dataset(6)
    loader = DataLoader(ds, batch_size=2, sampler=[5, 4, 3, 2, 1, 0])
    assert _order(loader) == [5, 4, 3, 2, 1, 0]
    loader = DataLoader(ds, batch_sampler=[[0, 5], [1]])
    assert _order(loader) == [0, 5, 1] and len(loader) == 2
    loader = DataLoader(ds, batch_size=3, collate_fn=lambda samples: len(samples))
    assert list(loader) == [3, 3]


# --- collation -----------------------------------------------------------------------------------
Point = collections.namedtuple("Point", "x y")


def test_default_collate_types():
    out = default_collate([1.5, 2.5])
    assert out.dtype == lucid.float64 and out.tolist() == [1.5, 2.5]
    assert default_collate([1, 2]).dtype == lucid.int64
    assert default_collate([True, False]).dtype == lucid.bool_
    assert default_collate(["a", "b"]) == ["a", "b"]
    arr = default_collate([np.zeros(2, np.float32), np.ones(2, np.float32)])
    assert arr.dtype == lucid.float32 and arr.shape == (2, 2)
    assert default_collate([np.float64(1.0), np.float64(2.0)]).dtype == lucid.float64
    d = default_collate([{"x": lucid.zeros(2), "y": 1}, {"x": lucid.ones(2), "y": 2}])
    assert set(d) == {"x", "y"} and d["x"].shape == (2, 2) and d["y"].tolist() == [1, 2]
    od = default_collate([collections.OrderedDict(a=1), collections.OrderedDict(a=2)])
    assert type(od) is collections.OrderedDict
    t = default_collate([(lucid.zeros(3), 0), (lucid.ones(3), 1)])
    assert isinstance(t, list) and t[0].shape == (2, 3) and t[1].tolist() == [0, 1]
    nt = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(nt, Point) and nt.x.tolist() == [1, 3] and nt.y.dtype == lucid.float64
    nested = default_collate([[{"a": (1, "s")}], [{"a": (2, "t")}]])
    assert nested[0]["a"][0].tolist() == [1, 2] and nested[0]["a"][1] == ["s", "t"]


def test_default_collate_errors():
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="batch must contain tensors, numpy arrays"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="dtype <U1"):
        default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(TypeError, match="non-empty list"):
        default_collate([])


def test_dict_samples_through_loader():
    items = [{"img": np.full((2, 2), i, np.float32), "label": i, "name": f"n{i}"} for i in range(5)]
    batches = list(DataLoader(ListDataset(items), batch_size=2))
    assert [b["label"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[0]["img"].shape == (2, 2, 2) and batches[2]["name"] == ["n4"]


# --- iterable datasets ---------------------------------------------------------------------------
class CountStream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class EndlessStream(IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            yield i
            i += 1


class ShardedStream(IterableDataset):
    """The torch idiom for splitting a stream across workers; in the main process the worker
    info is None and the whole stream is read."""

    def __iter__(self):
        info = lucid.utils.data.get_worker_info()
        start = 0 if info is None else info.id
        return iter(range(start, 6))


def test_iterable_dataset():
    assert [b.tolist() for b in DataLoader(ShardedStream(), batch_size=4)] == [[0, 1, 2, 3], [4, 5]]
    loader = DataLoader(CountStream(7), batch_size=3)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]] and len(loader) == 3
    loader = DataLoader(CountStream(7), batch_size=3, drop_last=True)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]] and len(loader) == 2
    it = iter(DataLoader(EndlessStream(), batch_size=2))
    assert next(it).tolist() == [0, 1] and next(it).tolist() == [2, 3]
    with pytest.raises(TypeError, match="has no __len__"):
        len(DataLoader(EndlessStream(), batch_size=2))
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(CountStream(3), shuffle=True)


# --- unsupported and invalid options --------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": 2, "prefetch_factor": 0}, ValueError, "prefetch_factor option should"),
        ({"num_workers": 2, "multiprocessing_context": "nope"}, ValueError, "valid start method"),
        ({"num_workers": -1}, ValueError, "non-negative"),
        ({"prefetch_factor": 2}, ValueError, "prefetch_factor"),
        ({"persistent_workers": True}, ValueError, "persistent_workers option needs"),
        ({"multiprocessing_context": "spawn"}, ValueError, "multiprocessing_context"),
        ({"shuffle": True, "sampler": [0]}, ValueError, "mutually exclusive with shuffle"),
        ({"batch_sampler": [[0]], "batch_size": 2}, ValueError, "batch_sampler option is"),
        ({"batch_size": None, "drop_last": True}, ValueError, "mutually exclusive with drop_last"),
        ({"batch_size": 0}, ValueError, "batch_size should be a positive integer"),
        ({"timeout": -1}, ValueError, "timeout"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataLoader(_dataset()[0], **kwargs)


def test_pin_memory_warns_and_still_loads():
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(_dataset(4)[0], batch_size=2, pin_memory=True)
    assert len(list(loader)) == 2


def test_not_a_dataset():
    with pytest.raises(TypeError, match="map-style dataset"):
        DataLoader(42)


# --- random_split --------------------------------------------------------------------------------
def _torch_fraction_lengths(n, fractions):
    """torch.utils.data.random_split's documented rule: floor each, remainder round-robin."""
    lengths = [math.floor(n * f) for f in fractions]
    for i in range(n - sum(lengths)):
        lengths[i % len(lengths)] += 1
    return lengths


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    fractions=st.sampled_from([[0.8, 0.2], [0.3, 0.3, 0.4], [0.5, 0.5], [1 / 3] * 3, [0.1] * 10]),
    seed=st.integers(0, 1000),
)
def test_random_split_fractions(n, fractions, seed):
    ds = ListDataset(list(range(n)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty splits warn, as torch
        parts = random_split(ds, fractions, generator=lucid.Generator().manual_seed(seed))
    assert [len(p) for p in parts] == _torch_fraction_lengths(n, fractions)
    seen = [p[i] for p in parts for i in range(len(p))]
    assert sorted(seen) == list(range(n))
    # as torch: one randperm of the whole dataset, cut in order
    assert seen == _perm(n, seed)


def _perm(n, seed):
    lucid_state = lucid.get_rng_state()
    lucid.manual_seed(seed)
    perm = lucid.randperm(n).tolist()
    lucid.set_rng_state(lucid_state)
    return perm


def test_random_split_lengths_global_stream_and_errors():
    ds = ListDataset(list(range(10)))
    lucid.manual_seed(5)
    a, b = random_split(ds, [7, 3])
    lucid.manual_seed(5)
    a2, b2 = random_split(ds, [7, 3])
    assert a.indices == a2.indices and b.indices == b2.indices and len(a) == 7
    assert sorted(a.indices + b.indices) == list(range(10))
    with pytest.raises(ValueError, match=r"Sum of input lengths \(9\) does not equal"):
        random_split(ds, [5, 4])
    with pytest.raises(ValueError, match="Fraction at index 0 is not between 0 and 1"):
        random_split(ds, [1.5, -0.5])
    with pytest.raises(ValueError, match="non-negative ints or fractions"):
        random_split(ds, [0.5, 9.5])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        random_split(ListDataset([1]), [0.5, 0.5])


def test_split_subsets_load_through_dataloader():
    ds, x, y = _dataset(12)
    train, val = random_split(ds, [0.75, 0.25], generator=lucid.Generator().manual_seed(0))
    got = [int(v) for _, yb in DataLoader(val, batch_size=2) for v in yb.tolist()]
    assert got == list(val.indices)


# --- a training loop -----------------------------------------------------------------------------
def test_training_loop_with_dataloader_learns():
    lucid.manual_seed(0)
    x = lucid.randn(64, 4)
    w = lucid.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ w
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)
    model = nn.Linear(4, 1)
    opt = lucid.optim.SGD(model.parameters(), lr=0.1)
    first = None
    for _ in range(30):
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            first = loss.item() if first is None else first
    assert loss.item() < 1e-3 * first


# --- torch itself, when installed -----------------------------------------------------------------
def test_collate_and_split_lengths_match_torch():
    pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate
    from torch.utils.data import random_split as torch_split

    batch = [{"a": (1, 2.5, True), "s": "x"}, {"a": (3, 4.5, False), "s": "y"}]
    ours, theirs = default_collate(batch), torch_collate(batch)
    assert type(ours["a"]) is type(theirs["a"]) and ours["s"] == theirs["s"]
    for o, t in zip(ours["a"], theirs["a"], strict=True):
        assert o.dtype.name == str(t.dtype).removeprefix("torch.") and o.tolist() == t.tolist()
    for n in range(1, 30):
        for fr in ([0.8, 0.2], [0.3, 0.3, 0.4], [0.1] * 10):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_parts = torch_split(range(n), fr)
                o_parts = random_split(ListDataset(list(range(n))), fr)
            assert [len(p) for p in o_parts] == [len(p) for p in t_parts]
