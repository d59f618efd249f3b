"""A CompiledModule is an nn.Module (issue 14, item 6) and keeps its cache across train(),
eval() and to() when nothing changes (item 5), never serving a stale executable."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile import CompiledModule


def _block():
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh())


def _pair(seed=0):
    """An eager Sequential(block, head) and the same with the block compiled (same weights)."""
    lucid.manual_seed(seed)
    block, head = _block(), nn.Linear(6, 3)
    eager = nn.Sequential(block, head)
    lucid.manual_seed(seed)
    cblock, chead = _block(), nn.Linear(6, 3)
    cm = lucid.compile(cblock)
    mixed = nn.Sequential(cm, chead)
    return eager, mixed, cm


def _n_compiles(cm):
    return sum(1 for _ in cm.timing())


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a.detach().numpy()), np.asarray(b.detach().numpy()), **kw)


# --- item 5: train() / eval() / to() ----------------------------------------------------------


def test_train_every_epoch_does_not_recompile_and_each_mode_matches_eager():
    eager, mixed, cm = _pair()
    opt_e = lucid.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = lucid.optim.SGD(mixed.parameters(), lr=0.1)
    x, y = lucid.randn(8, 4), lucid.randn(8, 3)
    compiled_after_first_epoch = None
    for epoch in range(3):
        for model in (eager, mixed):
            model.train()
        for _ in range(2):
            for model, opt in ((eager, opt_e), (mixed, opt_c)):
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
        for p_e, p_c in zip(eager.parameters(), mixed.parameters(), strict=True):
            _close(p_e, p_c, rtol=1e-5, atol=1e-6)
        for model in (eager, mixed):
            model.eval()
        with lucid.no_grad():
            # BatchNorm: running statistics in eval, batch statistics in train.
            _close(mixed(x), eager(x), rtol=1e-5, atol=1e-6)
        cm.eval()  # directly on the wrapper too: still nothing dropped
        if epoch == 0:
            compiled_after_first_epoch = [(r["key"], r["compile_ms"]) for r in cm.timing()]
    assert [(r["key"], r["compile_ms"]) for r in cm.timing()] == compiled_after_first_epoch
    keys = cm.cache_info()["keys"]
    assert len(keys) == 2 and {k[2] for k in keys} == {True, False}  # one per mode
    assert cm.training is False and cm._orig_mod.training is False


def test_to_float64_recompiles_and_gives_float64_results():
    lucid.manual_seed(0)
    model = _block().eval()
    cm = lucid.compile(model)
    x = lucid.randn(5, 4)
    with lucid.no_grad():
        cm(x)
        assert cm.to(lucid.float32) is cm and cm.to("cpu") is cm and cm.float() is cm
        assert cm.cache_info()["entries"] == 1  # nothing changed: kept
        cm.to(lucid.float64)
        assert cm.cache_info()["entries"] == 0  # the dtype changed: dropped
        x64 = x.double()
        out = cm(x64)
        assert out.dtype == lucid.float64
        np.testing.assert_allclose(out.numpy(), model(x64).numpy(), rtol=1e-12, atol=1e-12)
        (key,) = cm.cache_info()["keys"]
        assert np.dtype("float64") in key[4]
        cm.double()
        assert cm.cache_info()["entries"] == 1


def test_a_parent_casting_the_wrapper_never_serves_a_stale_executable():
    eager, mixed, cm = _pair()
    x = lucid.randn(3, 4)
    with lucid.no_grad():
        mixed(x)
        mixed.double()  # Module.to on the parent: the wrapper's to() is not called
        eager.double()
        out = mixed(x.double())
        assert out.dtype == lucid.float64
        _close(out, eager(x.double()), rtol=1e-12, atol=1e-12)


def test_load_state_dict_keeps_the_cache_and_serves_the_new_weights():
    lucid.manual_seed(0)
    model = nn.Linear(4, 2)
    cm = lucid.compile(model)
    x = lucid.randn(3, 4)
    with lucid.no_grad():
        cm(x)
        other = nn.Linear(4, 2)
        cm.load_state_dict(other.state_dict())
        _close(cm(x), other(x), rtol=1e-6)
        assert cm.cache_info()["entries"] == 1 and _n_compiles(cm) == 1
        # PyTorch's compiled-checkpoint names load too.
        third = nn.Linear(4, 2)
        cm.load_state_dict({"_orig_mod." + k: v for k, v in third.state_dict().items()})
        _close(cm(x), third(x), rtol=1e-6)
        # assign=True replaces the tensors: the next call notices and recompiles.
        fourth = nn.Linear(4, 2)
        cm.load_state_dict(fourth.state_dict(), assign=True)
        _close(cm(x), fourth(x), rtol=1e-6)


# --- item 6: an nn.Module ---------------------------------------------------------------------


def test_a_compiled_block_inside_sequential_trains_like_eager():
    eager, mixed, cm = _pair()
    assert isinstance(cm, nn.Module)
    x, y = lucid.randn(8, 4), lucid.randn(8, 3)
    loss_e = F.mse_loss(eager(x), y)
    loss_c = F.mse_loss(mixed(x), y)
    _close(loss_c, loss_e, rtol=1e-6)
    loss_e.backward()
    loss_c.backward()
    for (n_e, p_e), (n_c, p_c) in zip(
        eager.named_parameters(), mixed.named_parameters(), strict=True
    ):
        assert n_e == n_c
        _close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6)
    assert cm.cache_info()["entries"] == 1  # the block ran compiled (its own API still works)
    assert "linear" in cm.ir(stage="imported") and cm.timing()[0]["passes_ms"]


def test_module_surface_names_and_state_dict_are_the_eager_models():
    eager, mixed, cm = _pair()
    block = cm._orig_mod
    # The wrapper takes the block's place: the block's children, names and tensors.
    assert cm.model is block and list(cm.children()) == list(block.children())
    assert list(cm.named_children()) == list(block.named_children())
    assert list(mixed.children())[0] is cm
    assert [n for n, _ in mixed.named_parameters()] == [n for n, _ in eager.named_parameters()]
    assert [n for n, _ in mixed.named_buffers()] == [n for n, _ in eager.named_buffers()]
    assert list(mixed.state_dict()) == list(eager.state_dict())
    assert list(cm.state_dict()) == list(block.state_dict())
    assert [n for n, _ in mixed.named_modules()] == [n for n, _ in eager.named_modules()]
    assert mixed.get_submodule("0") is cm
    assert mixed.get_submodule("0.0") is block[0] and cm.get_submodule("1") is block[1]
    assert mixed.get_parameter("0.0.weight") is block[0].weight
    # A checkpoint of the eager model loads into the mixed one and back.
    lucid.manual_seed(5)
    fresh = nn.Sequential(_block(), nn.Linear(6, 3))
    mixed.load_state_dict(fresh.state_dict())
    for (_, a), (_, b) in zip(mixed.state_dict().items(), fresh.state_dict().items(), strict=True):
        _close(a, b, rtol=0)
    eager.load_state_dict(mixed.state_dict())
    x = lucid.randn(4, 4)
    with lucid.no_grad():
        _close(mixed(x), eager(x), rtol=1e-5, atol=1e-6)


def test_apply_zero_grad_and_train_eval_propagate():
    eager, mixed, cm = _pair()
    seen = []

    def init(m):
        seen.append(type(m).__name__)
        if isinstance(m, nn.Linear):
            m.weight.data.fill_(0.5)

    mixed.apply(init)
    assert {"Linear", "BatchNorm1d", "CompiledModule"} <= set(seen)
    assert seen.count("Sequential") == 2  # the wrapped block itself, and the parent
    assert float(cm._orig_mod[0].weight.sum().item()) == pytest.approx(0.5 * 24)
    mixed.eval()
    assert all(not m.training for m in mixed.modules()) and cm.training is False
    mixed.train()
    assert all(m.training for m in cm._orig_mod.modules()) and cm.training is True
    cm.training = False  # the flag mirrors the wrapped model's
    assert cm._orig_mod.training is False
    x = lucid.randn(3, 4)
    mixed(x).sum().backward()
    assert cm._orig_mod[0].weight.grad is not None
    mixed.zero_grad()
    assert cm._orig_mod[0].weight.grad is None


def test_nested_compile_and_optimizer_over_the_parent():
    eager, mixed, cm = _pair()
    outer = lucid.compile(mixed)
    x = lucid.randn(4, 4)
    with lucid.no_grad():
        _close(outer(x), eager(x), rtol=1e-5, atol=1e-6)
    assert outer.cache_info()["entries"] == 1
    assert [n for n, _ in outer.named_parameters()] == [n for n, _ in eager.named_parameters()]
    assert len(list(outer.parameters())) == len(list(eager.parameters())) == 6


def test_forward_hooks_on_the_wrapper_run_around_the_compiled_call():
    lucid.manual_seed(0)
    model = nn.Linear(4, 2)
    cm = lucid.compile(model)
    x = lucid.randn(3, 4)
    calls = []
    pre = cm.register_forward_pre_hook(lambda m, args: calls.append("pre") or (args[0] * 2,))
    post = cm.register_forward_hook(lambda m, args, out: out + 1.0)
    assert isinstance(cm, CompiledModule)
    with lucid.no_grad():
        want = model(x * 2) + 1.0
        _close(cm(x), want, rtol=1e-6)
        _close(cm(x), want, rtol=1e-6)  # a hit
        assert calls == ["pre", "pre"] and cm.cache_info()["entries"] == 1
        pre.remove()
        post.remove()
        _close(cm(x), model(x), rtol=1e-6)


def test_a_compiled_function_is_a_module_without_parameters():
    def f(x):
        return x.exp()

    cm = lucid.compile(f)
    assert isinstance(cm, nn.Module) and list(cm.parameters()) == [] and cm.state_dict() == {}
    seq = nn.Sequential(cm, nn.Linear(3, 2))
    assert len(list(seq.parameters())) == 2
    with lucid.no_grad():
        assert seq(lucid.randn(2, 3)).shape == (2, 2)
    with pytest.raises(TypeError, match="to: the compiled function is not an nn.Module"):
        cm.to(lucid.float64)
    cm.train()  # harmless: a function has no mode
    assert cm.training is False
