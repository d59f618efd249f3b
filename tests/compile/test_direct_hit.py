"""The direct cache hit: a plain entry (positional tensor inputs, bound parameters and buffers,
every result an output) is served by the backend's one-call binding (``entry.hit``). The guards
around it must decide exactly as before: a changed shape, dtype, ``requires_grad``, training mode
or parameter identity misses or recompiles; in-place and replaced parameter values are seen."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile.inference import checked
from lucid.compile.inference.module import CompiledModule
from lucid.compile.signature import cache_key


class Tiny(nn.Module):
    """Workload E: relu(x @ W + b)."""

    def __init__(self, n: int = 16):
        super().__init__()
        self.W = nn.Parameter(lucid.randn(n, n) * 0.25)
        self.b = nn.Parameter(lucid.zeros(n))

    def forward(self, x):
        return F.relu(x @ self.W + self.b)


class TwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, y):
        h = self.lin(x)
        return h.relu(), (h * y).sum(1)


def randn(*shape, seed=0, dtype=np.float32):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def only_entry(cm):
    (entry,) = cm._entries.values()
    return entry


def direct(entry) -> bool:
    return getattr(entry, "direct", None) is not None


@pytest.fixture
def tiny():
    lucid.manual_seed(0)
    return Tiny()


def test_hits_are_direct_fresh_tensors_equal_to_eager(tiny):
    cm = lucid.compile(tiny)
    x = randn(8, 16)
    with lucid.no_grad():
        outs = [cm(x) for _ in range(4)]
        want = tiny(x).numpy()
    assert direct(only_entry(cm))
    for out in outs:
        assert type(out) is lucid.Tensor and not out.requires_grad and out.grad_fn is None
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    assert len({id(o._data) for o in outs}) == 4
    info = cm.cache_info()
    assert info["entries"] == 1 and info["n_calls"][info["keys"][0]] == 4
    row = cm.timing()[0]
    assert row["n_hits"] == 3 and row["last_run_ms"] > 0


def test_shape_dtype_and_grad_changes_miss(tiny):
    cm = lucid.compile(tiny)
    with lucid.no_grad():
        cm(randn(8, 16))
        cm(randn(3, 16))  # another batch: another entry
        assert cm.cache_info()["entries"] == 2
        out64 = cm(randn(8, 16, dtype=np.float64))  # another dtype: never the f32 executable
        assert out64.dtype == lucid.float64 or cm.cache_info()["eager_only"]
        np.testing.assert_allclose(
            out64.numpy(), tiny(randn(8, 16, dtype=np.float64)).numpy(), rtol=1e-5, atol=1e-6
        )
    x = randn(8, 16)
    y = cm(x)  # grad mode: a grad entry, whose outputs carry a backward
    assert y.requires_grad and y.grad_fn is not None
    y.sum().backward()
    assert tiny.W.grad is not None
    keys = cm.cache_info()["keys"] + cm.cache_info()["eager_only"]
    assert len(set(keys)) == len(keys) >= 3


def test_requires_grad_input_under_no_grad_hits_its_own_key(tiny):
    cm = lucid.compile(tiny)
    with lucid.no_grad():
        cm(randn(8, 16))
        cm(randn(8, 16).requires_grad_(True))
    assert cm.cache_info()["entries"] == 2


def test_training_mode_is_part_of_the_key():
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5))
    cm = lucid.compile(model)
    x = randn(4, 6)
    with lucid.no_grad():
        model.eval()
        a = cm(x)
        np.testing.assert_allclose(a.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
        model.train()
        b = cm(x)  # dropout on: a different executable, not the eval one
        assert (b.numpy() == 0).any() and not np.allclose(a.numpy(), b.numpy())
        model.eval()
        np.testing.assert_allclose(cm(x).numpy(), a.numpy(), rtol=1e-6)
    assert cm.cache_info()["entries"] == 2


def test_parameter_values_are_read_on_every_hit(tiny):
    cm = lucid.compile(tiny)
    x = randn(8, 16)
    with lucid.no_grad():
        cm(x)
        tiny.b._data[:] = 1.0  # in place
        np.testing.assert_allclose(cm(x).numpy(), tiny(x).numpy(), rtol=1e-5, atol=1e-6)
        tiny.W.data = randn(16, 16, seed=3)  # a new array of the same shape
        np.testing.assert_allclose(cm(x).numpy(), tiny(x).numpy(), rtol=1e-5, atol=1e-6)
    assert cm.cache_info()["entries"] == 1


def test_replaced_or_reshaped_parameters_recompile(tiny):
    cm = lucid.compile(tiny)
    x = randn(8, 16)
    with lucid.no_grad():
        cm(x)
        tiny.b = nn.Parameter(lucid.ones(16))  # a new object: the bound one is stale
        np.testing.assert_allclose(cm(x).numpy(), tiny(x).numpy(), rtol=1e-5, atol=1e-6)
        tiny.W.data = randn(16, 16, seed=1)[:, :16]
        tiny.b.data = lucid.ones(16) * 2
        np.testing.assert_allclose(cm(x).numpy(), tiny(x).numpy(), rtol=1e-5, atol=1e-6)
        # A parameter of another dtype behind the wrapper's back: the direct call refuses the
        # feed and the call recompiles for it.
        tiny.W.data = lucid.tensor(tiny.W.numpy().astype(np.float64))
        tiny.b.data = lucid.tensor(tiny.b.numpy().astype(np.float64))
        got = cm(randn(8, 16, dtype=np.float64))
        np.testing.assert_allclose(
            got.numpy(), tiny(randn(8, 16, dtype=np.float64)).numpy(), rtol=1e-5, atol=1e-6
        )


def test_non_contiguous_and_byte_swapped_inputs_give_the_eager_result(tiny):
    cm = lucid.compile(tiny)
    with lucid.no_grad():
        cm(randn(8, 16))
        wide = randn(8, 32)
        view = lucid.Tensor._wrap(wide._data[:, ::2])
        np.testing.assert_allclose(cm(view).numpy(), tiny(view).numpy(), rtol=1e-5, atol=1e-6)
        swapped = lucid.Tensor._wrap(randn(8, 16)._data.astype(">f4"))
        want = tiny(lucid.Tensor._wrap(swapped._data.astype("<f4"))).numpy()
        try:
            got = cm(swapped).numpy()
        except (TypeError, ValueError, KeyError):
            return  # refused with an error, as before: never a wrong result
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tuple_outputs_are_rebuilt():
    lucid.manual_seed(0)
    model = TwoOut()
    cm = lucid.compile(model)
    x, y = randn(5, 4), randn(5, 3, seed=1)
    with lucid.no_grad():
        for _ in range(2):
            a, s = cm(x, y)
        ea, es = model(x, y)
    assert direct(only_entry(cm))
    np.testing.assert_allclose(a.numpy(), ea.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), es.numpy(), rtol=1e-5, atol=1e-6)


def test_entries_that_return_an_input_or_update_buffers_are_not_direct():
    class Pass(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x), x

    cm = lucid.compile(Pass())
    x = randn(2, 3)
    with lucid.no_grad():
        _, same = cm(x)
        _, same = cm(x)
    assert same is x and not direct(only_entry(cm))

    bn = nn.BatchNorm1d(3)
    cm = lucid.compile(bn)
    with lucid.no_grad():
        cm(randn(4, 3))
        before = bn.running_mean.numpy().copy()
        cm(randn(4, 3, seed=2))
    assert not direct(only_entry(cm))
    assert not np.allclose(before, bn.running_mean.numpy())  # the update is still written back
    bn.eval()
    with lucid.no_grad():
        x = randn(4, 3)
        np.testing.assert_allclose(cm(x).numpy(), bn(x).numpy(), rtol=1e-5, atol=1e-6)
    assert sum(direct(e) for e in cm._entries.values()) == 1


def test_check_always_still_checks_every_hit(tiny, monkeypatch):
    calls = []
    checked = CompiledModule._checked

    def counting(self, *a):
        calls.append(1)
        return checked(self, *a)

    monkeypatch.setattr(CompiledModule, "_checked", counting)
    cm = lucid.compile(tiny, check="always")
    with lucid.no_grad():
        for _ in range(3):
            cm(randn(8, 16))
    assert len(calls) == 3


def test_auto_mode_times_both_paths_then_serves_directly(tiny):
    cm = lucid.compile(tiny, mode="auto")
    x = randn(8, 16)
    with lucid.no_grad():
        for _ in range(2 * checked.AUTO_TRIALS + 3):
            np.testing.assert_allclose(cm(x).numpy(), tiny(x).numpy(), rtol=1e-5, atol=1e-6)
    decision = cm.cache_info()["auto"]
    (record,) = decision.values()
    assert record["decision"] in ("compiled", "eager")
    if record["decision"] == "compiled":
        assert direct(only_entry(cm))


@pytest.mark.parametrize("grad_enabled", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_the_hit_path_key_is_the_key(grad_enabled, mode):
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 2))
    cm = lucid.compile(model)
    model.train(mode != "eval")
    if mode == "mixed":
        model[1].eval()
    with lucid.no_grad():
        cm(randn(3, 4))  # the parameter list and modes are read
    d = cm.__dict__
    training = cm._bound.modes()
    calls = [
        (randn(3, 4),),
        (randn(5, 4, dtype=np.float64),),
        (randn(3, 4).requires_grad_(True),),
        (randn(3, 4), randn(2)),
        (),
    ]

    # What the hit path computes (no re-read of parameters or modes) is what ``_key`` computes.
    def hit_key(args, kwargs):
        return cache_key(args, kwargs, d["_params"], training, d["_fingerprint"])

    with lucid.set_grad_enabled(grad_enabled):
        for args in calls:
            assert hit_key(args, {}) == cm._key(args, {})
        model[0].weight.requires_grad_(False)
        model[2].weight.requires_grad_(False)
        assert hit_key(calls[0], {}) == cm._key(calls[0], {})
        others = [(nn.Parameter(lucid.ones(3, 4)),), (randn(3, 4), 2), ([randn(3, 4)],)]
        for args in others:
            assert hit_key(args, {}) == cm._key(args, {})
        assert hit_key(calls[0], {"scale": 2.0}) == cm._key(calls[0], {"scale": 2.0})
        # A Parameter argument keys like a plain tensor of its shape, dtype and requires_grad.
        p = nn.Parameter(lucid.ones(3, 4))
        plain = lucid.ones(3, 4).requires_grad_(True)
        assert hit_key((p,), {}) == hit_key((plain,), {})


def test_argument_errors_of_the_direct_call_are_those_of_a_bound_method():
    lucid.manual_seed(0)
    cm = lucid.compile(Tiny())
    x = randn(8, 16)
    with lucid.no_grad():
        want = cm(x).numpy()
        call = only_entry(cm).direct
        # Keyword and other forms go through the bound __call__ (same result, same checks).
        np.testing.assert_allclose(call(args=(x,), kwargs=None).numpy(), want)
        with pytest.raises(TypeError):
            call([x], {})
        with pytest.raises(TypeError):
            call()
