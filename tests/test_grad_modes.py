"""Grad-mode switches as torch documents them: no_grad / enable_grad (context managers and
decorators, bare or called), inference_mode (bool mode, bare decorator) and set_grad_enabled
(effective at once as a plain call)."""

import threading

import pytest

import lucid


def _x():
    return lucid.ones(3, requires_grad=True)


@pytest.mark.parametrize("bare", [True, False])
def test_no_grad_decorator_bare_and_called(bare):
    def double(x):
        """Doc kept."""
        return x * 2

    decorated = lucid.no_grad(double) if bare else lucid.no_grad()(double)
    assert decorated.__name__ == "double" and decorated.__doc__ == "Doc kept."
    assert not decorated(_x()).requires_grad
    assert lucid.is_grad_enabled()  # restored after the call
    assert (double(_x())).requires_grad


def test_no_grad_decorator_syntax_bare():
    @lucid.no_grad
    def f(x):
        return x * 2, lucid.is_grad_enabled()

    y, enabled = f(_x())
    assert not enabled and not y.requires_grad and y.grad_fn is None


def test_enable_grad_inside_no_grad_and_as_bare_decorator():
    @lucid.enable_grad
    def f(x):
        return x * 2

    with lucid.no_grad():
        assert f(_x()).requires_grad
        with lucid.enable_grad():
            assert (_x() * 2).requires_grad
        assert not (_x() * 2).requires_grad


def test_restores_mode_after_exception():
    @lucid.no_grad
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        boom()
    assert lucid.is_grad_enabled()
    with pytest.raises(ValueError), lucid.inference_mode():
        raise ValueError
    assert lucid.is_grad_enabled() and not lucid.is_inference_mode_enabled()


def test_same_switch_nested_and_reused():
    ng = lucid.no_grad()
    with ng:
        with ng:
            assert not lucid.is_grad_enabled()
        assert not lucid.is_grad_enabled()
    assert lucid.is_grad_enabled()


def test_decorated_generator_runs_each_resumption_under_the_mode():
    @lucid.no_grad
    def gen():
        for _ in range(2):
            yield lucid.is_grad_enabled()

    it = gen()
    assert next(it) is False
    assert lucid.is_grad_enabled()  # between resumptions the caller's mode holds
    assert next(it) is False
    with pytest.raises(StopIteration):
        next(it)


def test_inference_mode_forms():
    x = _x()
    with lucid.inference_mode():
        assert lucid.is_inference_mode_enabled() and not lucid.is_grad_enabled()
        assert not (x * 2).requires_grad
        with lucid.inference_mode(False):
            # torch: inference_mode(False) turns inference off and gradients on
            assert not lucid.is_inference_mode_enabled() and lucid.is_grad_enabled()
            assert (x * 2).requires_grad
        assert lucid.is_inference_mode_enabled()
    assert not lucid.is_inference_mode_enabled() and lucid.is_grad_enabled()

    @lucid.inference_mode
    def bare(x):
        return x * 2, lucid.is_inference_mode_enabled()

    @lucid.inference_mode()
    def called(x):
        return x * 2, lucid.is_inference_mode_enabled()

    for fn in (bare, called):
        y, flag = fn(x)
        assert flag and not y.requires_grad
    assert lucid.autograd.inference_mode is lucid.inference_mode


def test_inference_mode_rejects_non_bool():
    with pytest.raises(TypeError, match="mode must be a bool"):
        lucid.inference_mode(3)
    with pytest.raises(TypeError, match="no arguments"):
        lucid.no_grad(3)


def test_set_grad_enabled_takes_effect_at_once_and_as_context():
    try:
        lucid.set_grad_enabled(False)
        assert not lucid.is_grad_enabled()
    finally:
        lucid.set_grad_enabled(True)
    assert lucid.is_grad_enabled()
    with lucid.set_grad_enabled(False):
        assert not (_x() * 2).requires_grad
    assert lucid.is_grad_enabled()

    @lucid.set_grad_enabled(False)
    def f(x):
        return x * 2

    assert lucid.is_grad_enabled()  # decorating does not change the mode
    assert not f(_x()).requires_grad
    with pytest.raises(TypeError, match="mode must be a bool"):
        lucid.set_grad_enabled("no")


def test_modes_are_per_thread():
    seen = []
    with lucid.no_grad():
        t = threading.Thread(target=lambda: seen.append(lucid.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]
