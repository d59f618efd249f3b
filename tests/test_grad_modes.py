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


def test_switches_nest_and_each_restores_the_mode_it_found():
    with lucid.no_grad():
        with lucid.enable_grad():
            assert lucid.is_grad_enabled()
            with lucid.set_grad_enabled(False):
                assert not lucid.is_grad_enabled()
                with lucid.inference_mode():
                    assert lucid.is_inference_mode_enabled() and not lucid.is_grad_enabled()
                assert not lucid.is_inference_mode_enabled() and not lucid.is_grad_enabled()
            assert lucid.is_grad_enabled()
            with lucid.no_grad():
                assert not lucid.is_grad_enabled()
            assert lucid.is_grad_enabled()
        assert not lucid.is_grad_enabled()
    assert lucid.is_grad_enabled() and not lucid.is_inference_mode_enabled()


@pytest.mark.parametrize(
    "switch",
    [
        lucid.no_grad,
        lucid.enable_grad,
        lambda: lucid.set_grad_enabled(True),
        lambda: lucid.set_grad_enabled(False),
        lucid.inference_mode,
        lambda: lucid.inference_mode(False),
    ],
)
@pytest.mark.parametrize("outer_grad", [True, False])
def test_exception_through_nested_switches_restores_every_level(switch, outer_grad):
    with lucid.inference_mode(not outer_grad):
        with pytest.raises(ValueError):
            with switch():
                with lucid.no_grad(), lucid.enable_grad():
                    raise ValueError("inner")
        assert lucid.is_grad_enabled() is outer_grad
        assert lucid.is_inference_mode_enabled() is not outer_grad
    assert lucid.is_grad_enabled() and not lucid.is_inference_mode_enabled()


def test_shared_instance_reentered_restores_each_level():
    ng, eg = lucid.no_grad(), lucid.enable_grad()
    with ng:
        with eg:
            with ng:
                assert not lucid.is_grad_enabled()
                with eg:
                    assert lucid.is_grad_enabled()
                assert not lucid.is_grad_enabled()
            assert lucid.is_grad_enabled()  # the inner exit restored eg's mode, not the outer's
        assert not lucid.is_grad_enabled()
    assert lucid.is_grad_enabled()
    with pytest.raises(KeyError), ng:  # the instance stays usable after an exception
        with ng:
            raise KeyError
    assert lucid.is_grad_enabled()
    with ng:
        assert not lucid.is_grad_enabled()
    assert lucid.is_grad_enabled()


def test_recursive_decorated_function_restores_the_callers_mode():
    @lucid.no_grad
    def depth(n):
        assert not lucid.is_grad_enabled()
        if n == 0:
            return 0
        with lucid.enable_grad():
            inner = depth(n - 1)
            assert lucid.is_grad_enabled()
        return inner + 1

    assert depth(3) == 3 and lucid.is_grad_enabled()
    with lucid.no_grad():
        assert depth(2) == 2 and not lucid.is_grad_enabled()


def test_set_grad_enabled_decorates_generators_and_functions_under_its_mode():
    @lucid.set_grad_enabled(False)
    def gen():
        yield lucid.is_grad_enabled()
        yield lucid.is_grad_enabled()

    @lucid.set_grad_enabled(True)
    def on():
        return lucid.is_grad_enabled()

    assert lucid.is_grad_enabled()
    assert list(gen()) == [False, False] and lucid.is_grad_enabled()
    with lucid.no_grad():
        assert on() is True and not lucid.is_grad_enabled()


def test_a_thread_inside_no_grad_leaves_the_main_thread_recording():
    entered, release = threading.Event(), threading.Event()
    seen = []

    def worker():
        with lucid.no_grad():
            seen.append(lucid.is_grad_enabled())
            entered.set()
            release.wait(10)
        seen.append(lucid.is_grad_enabled())

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert entered.wait(10)
        # the worker is inside its no_grad block now
        assert lucid.is_grad_enabled()
        assert (_x() * 2).requires_grad
    finally:
        release.set()
        t.join(10)
    assert seen == [False, True]


def test_gradients_are_recorded_after_leaving_no_grad():
    x = lucid.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with lucid.no_grad():
        detached = x * 5
    with pytest.raises(ValueError):
        with lucid.no_grad():
            raise ValueError
    y = (x * x).sum() + detached.sum()
    y.backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
