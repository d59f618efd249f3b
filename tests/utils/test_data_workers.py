"""DataLoader with worker processes (num_workers > 0), against torch.utils.data's documented
semantics: order, seeding, worker_init_fn, get_worker_info, iterable sharding, prefetching,
persistent workers, timeout, errors naming the worker and the indices, dead workers, and no
process left behind.

Each test starts worker processes: the default run keeps one (three workers' batches in order),
the rest are marked slow (``.ci/run`` runs them after the main suite)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import time

import numpy as np
import pytest

import lucid
from lucid.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method"
)


def _tensor_dataset(n=10):
    return TensorDataset(lucid.arange(n * 3.0).reshape(n, 3), lucid.arange(n))


class Probe(Dataset):
    """Each sample reports who loaded it and what its random streams gave."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {
            "index": i,
            "worker": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "pid": os.getpid(),
            "random": random.random(),
            "lucid": float(lucid.rand(1)),
            "numpy": float(np.random.rand()),
        }


@pytest.fixture(autouse=True)
def _no_leaked_workers():
    yield
    # A re-raised worker error's traceback references the iterator in a cycle (as in torch, the
    # iterator stays usable after an error); collecting it shuts the workers down.
    gc.collect()
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not multiprocessing.active_children(), "a DataLoader left worker processes behind"


@pytest.mark.parametrize("num_workers", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_batches_equal_the_single_process_loader_in_order(num_workers):
    ds = _tensor_dataset()
    want = list(DataLoader(ds, batch_size=3))
    got = list(DataLoader(ds, batch_size=3, num_workers=num_workers, prefetch_factor=1))
    assert len(got) == len(want) == 4
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert lucid.equal(gx, wx) and lucid.equal(gy, wy)
    unbatched = list(DataLoader(ds, batch_size=None, num_workers=num_workers))
    assert [int(y) for _, y in unbatched] == list(range(10))


@pytest.mark.slow
def test_workers_run_in_other_processes_with_torch_seeding():
    gen = lucid.Generator().manual_seed(5)
    batches = list(DataLoader(Probe(), batch_size=2, num_workers=2, generator=gen))
    rows = [
        {k: (v.tolist() if isinstance(v, lucid.Tensor) else v)[j] for k, v in b.items()}
        for b in batches
        for j in range(2)
    ]
    assert [r["index"] for r in rows] == list(range(8))
    # Round-robin task assignment: batch k goes to worker k % num_workers.
    assert [r["worker"] for r in rows] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert {r["num_workers"] for r in rows} == {2}
    assert os.getpid() not in {r["pid"] for r in rows}
    seeds = {r["worker"]: r["seed"] for r in rows}
    assert seeds[1] == seeds[0] + 1
    # The same generator state gives the same base seed, hence the same streams in workers.
    again = list(DataLoader(Probe(), batch_size=2, num_workers=2,
                            generator=lucid.Generator().manual_seed(5)))  # fmt: skip
    for stream in ("random", "lucid", "numpy"):
        assert again[0][stream].tolist() == batches[0][stream].tolist()
        # Different workers draw different streams.
        assert batches[0][stream].tolist() != batches[1][stream].tolist()
    assert again[0]["seed"].tolist() == batches[0]["seed"].tolist()
    other = list(DataLoader(Probe(), batch_size=2, num_workers=2))
    assert other[0]["seed"].tolist() != batches[0]["seed"].tolist()
    assert get_worker_info() is None


class InitProbe(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return os.environ.get("LUCID_TEST_WORKER_TAG", "unset")


def _tag_worker(worker_id):
    os.environ["LUCID_TEST_WORKER_TAG"] = f"worker-{worker_id}-{get_worker_info().id}"


@pytest.mark.slow
def test_worker_init_fn_runs_in_each_worker_before_loading():
    loader = DataLoader(InitProbe(), batch_size=2, num_workers=2, worker_init_fn=_tag_worker)
    assert list(loader) == [["worker-0-0"] * 2, ["worker-1-1"] * 2]
    assert "LUCID_TEST_WORKER_TAG" not in os.environ


class ShardedStream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        return iter(range(info.id, self.n, info.num_workers))


@pytest.mark.slow
def test_iterable_dataset_shards_by_worker_info_and_interleaves_like_torch():
    batches = [b.tolist() for b in DataLoader(ShardedStream(10), batch_size=2, num_workers=2)]
    assert batches == [[0, 2], [1, 3], [4, 6], [5, 7], [8], [9]]
    dropped = DataLoader(ShardedStream(10), batch_size=2, num_workers=2, drop_last=True)
    assert [b.tolist() for b in dropped] == [[0, 2], [1, 3], [4, 6], [5, 7]]


class Failing(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 4:
            raise ValueError(f"sample {i} is corrupt")
        return i


@pytest.mark.slow
def test_worker_errors_are_reraised_naming_worker_and_indices():
    loader = DataLoader(Failing(), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(ValueError, match=r"worker process 0 while loading indices \[4, 5\]") as e:
        next(it)
    assert "sample 4 is corrupt" in str(e.value)
    del it


def _fail_init(worker_id):
    raise OSError(f"no dataset shard for worker {worker_id}")


@pytest.mark.slow
def test_worker_init_fn_errors_are_reraised():
    with pytest.raises(OSError, match="in worker_init_fn"):
        list(DataLoader(Failing(), batch_size=2, num_workers=1, worker_init_fn=_fail_init))


class Slow(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(1.2 if i == 2 else 0)
        return i


@pytest.mark.slow
def test_timeout_raises_and_stops_the_workers():
    loader = DataLoader(Slow(), batch_size=2, num_workers=1, timeout=0.3)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"timed out after 0.3 seconds"):
        next(it)
    del it


class Dying(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            os._exit(3)
        return i


@pytest.mark.slow
def test_a_dead_worker_is_an_error_not_a_hang():
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"
    ):
        list(DataLoader(Dying(), batch_size=2, num_workers=1))


@pytest.mark.slow
def test_persistent_workers_serve_every_epoch_with_the_same_processes():
    loader = DataLoader(
        _tensor_dataset(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    pids, epochs = [], []
    for _ in range(3):
        it = iter(loader)
        pids.append([w.pid for w in it._workers])
        epochs.append(sorted(i for _, y in it for i in y.tolist()))
    assert pids[0] == pids[1] == pids[2]
    assert epochs == [list(range(10))] * 3
    # An epoch abandoned half-way does not leak its batches into the next one.
    it = iter(loader)
    next(it)
    assert sorted(i for _, y in iter(loader) for i in y.tolist()) == list(range(10))
    assert multiprocessing.active_children()
    del it, loader


@pytest.mark.slow
def test_in_order_false_still_delivers_every_batch_once():
    loader = DataLoader(_tensor_dataset(), batch_size=2, num_workers=2, in_order=False)
    assert sorted(i for _, y in loader for i in y.tolist()) == list(range(10))


@pytest.mark.slow
def test_abandoned_iterator_shuts_its_workers_down():
    it = iter(DataLoader(_tensor_dataset(), batch_size=2, num_workers=2))
    next(it)
    workers = list(it._workers)
    assert all(w.is_alive() for w in workers)
    del it
    assert not any(w.is_alive() for w in workers)


@pytest.mark.slow
def test_explicit_context_and_len():
    loader = DataLoader(_tensor_dataset(), batch_size=3, num_workers=2,
                        multiprocessing_context="fork")  # fmt: skip
    it = iter(loader)
    assert len(it) == 4
    assert len(list(it)) == 4
