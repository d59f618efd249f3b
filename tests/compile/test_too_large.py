"""A value too large to allocate: MemoryError naming the op and the size, in strict and
non-strict mode, no-grad and grad mode (before: the backend's ValueError under strict, numpy's
or the runtime's bare MemoryError otherwise)."""

from __future__ import annotations

import pytest

import lucid
import lucid.nn as nn


class Outer(nn.Module):
    def forward(self, x):
        return (x.reshape(-1, 1) * x.reshape(1, -1)).sum()


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_a_value_over_the_runtime_limit_is_a_memory_error_naming_op_and_size(strict, grad):
    x = lucid.ones(2**21, requires_grad=grad)  # the outer product: 2^42 elements, 16 TiB
    cm = lucid.compile(Outer(), backend="cpu", strict=strict)
    with lucid.set_grad_enabled(grad):
        with pytest.raises(MemoryError, match=r"mul makes a 2097152x2097152 float32 .*16 TiB"):
            cm(x)
    assert not cm.cache_info()["eager_only"]  # nothing fell back


def test_a_run_out_of_memory_names_the_largest_value(monkeypatch):
    cm = lucid.compile(Outer(), backend="cpu")
    x = lucid.ones(64)
    with lucid.no_grad():
        cm(x)
        (entry,) = cm._entries.values()

        def bad_alloc(args, kwargs):
            raise MemoryError("std::bad_alloc")  # what the runtime raises

        monkeypatch.setattr(entry, "hit", bad_alloc)
        with pytest.raises(MemoryError, match=r"std::bad_alloc.*mul makes a 64x64 float32"):
            cm(x)


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(lucid.ones(1, 2**21))

    def forward(self, x):
        return x * self.w


@pytest.mark.parametrize("grad", [False, True])
def test_a_symbolic_batch_counts_at_its_real_size(monkeypatch, grad):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    cm = lucid.compile(Wide(), backend="cpu", dynamic=True, strict=True)
    with lucid.set_grad_enabled(grad):
        for batch in (2, 3):  # one symbolic-batch entry serves both
            cm(lucid.ones(batch, 1))
        assert len(cm.cache_info()["keys"]) == 1 and not cm.cache_info()["not_symbolic"]
        x = lucid.ones(2**20, 1)  # x * w at this batch: 2^41 elements, 8 TiB
        with pytest.raises(MemoryError, match=r"mul makes a 1048576x2097152 float32 .*8 TiB"):
            cm(x)
