"""Creation factories: shapes in every spelling, dtype defaults and overrides, devices,
requires_grad, and the *_like registry ops."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid


@pytest.mark.parametrize(
    "factory,value",
    [(lucid.zeros, 0.0), (lucid.ones, 1.0), (lucid.empty, None)],
    ids=["zeros", "ones", "empty"],
)
def test_shape_spellings_and_default_dtype(factory, value):
    for t in (factory(2, 3), factory((2, 3)), factory([2, 3]), factory(size=(2, 3))):
        assert t.shape == (2, 3) and t.dtype == lucid.float32
        if value is not None:
            np.testing.assert_array_equal(t.numpy(), np.full((2, 3), value))
    assert factory().shape == ()
    assert factory(0, 4).shape == (0, 4)


@given(st.sampled_from(["float16", "float64", "int32", "int64", "bool", "uint8"]))
def test_dtype_override_by_name_and_object(name):
    t = lucid.ones(2, dtype=name)
    assert t.dtype == lucid._dtype.from_name(name)
    assert (
        lucid.zeros(2, dtype=getattr(lucid, "bool_" if name == "bool" else name)).dtype == t.dtype
    )


def test_bad_shapes_and_dtypes_raise():
    with pytest.raises(ValueError, match="negative dimension -1"):
        lucid.zeros(2, -1)
    with pytest.raises(TypeError, match="integers"):
        lucid.ones(2.5)
    with pytest.raises(TypeError, match="unknown dtype"):
        lucid.zeros(2, dtype="complex99")
    assert lucid.zeros(2, dtype=lucid.bfloat16).dtype is lucid.bfloat16  # real through ml_dtypes


def test_device_is_validated():
    assert lucid.zeros(2, device="cpu").device == "cpu"
    assert lucid.arange(3, device=lucid.device("cpu")).device == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        lucid.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match="metal"):
        lucid.zeros(2, device="metal")


def test_requires_grad_flag():
    t = lucid.zeros(3, requires_grad=True)
    assert t.requires_grad and t.is_leaf
    with pytest.raises(RuntimeError, match="floating point"):
        lucid.zeros(3, dtype=lucid.int64, requires_grad=True)


def test_full_infers_dtype_from_value():
    assert lucid.full((2,), 3).dtype == lucid.int64
    assert lucid.full((2,), 3.5).dtype == lucid.float32
    assert lucid.full((2,), True).dtype == lucid.bool_
    assert lucid.full((2,), 3, dtype=lucid.float64).dtype == lucid.float64
    np.testing.assert_array_equal(lucid.full([2, 2], 7).numpy(), np.full((2, 2), 7))
    np.testing.assert_array_equal(lucid.full((2,), lucid.tensor(1.5)).numpy(), [1.5, 1.5])


@pytest.mark.parametrize(
    "args,expected,dtype",
    [
        ((5,), np.arange(5), lucid.int64),
        ((2, 8, 3), np.arange(2, 8, 3), lucid.int64),
        ((5, 0, -2), np.arange(5, 0, -2), lucid.int64),
        ((0, 1, 0.25), np.arange(0, 1, 0.25), lucid.float32),
        ((1.5,), np.arange(1.5), lucid.float32),
        ((-1, 1, 0.3), np.arange(-1, 1, 0.3), lucid.float32),
        ((3, 3), np.arange(3, 3), lucid.int64),
    ],
)
def test_arange(args, expected, dtype):
    t = lucid.arange(*args)
    assert t.dtype == dtype
    np.testing.assert_allclose(t.numpy(), expected.astype(dtype.numpy), rtol=1e-6)


def test_arange_bad_steps_raise():
    with pytest.raises(ValueError, match="step must be nonzero"):
        lucid.arange(0, 5, 0)
    with pytest.raises(ValueError, match="inconsistent with step sign"):
        lucid.arange(0, 5, -1)
    assert lucid.arange(5, dtype=lucid.float64).dtype == lucid.float64


@pytest.mark.parametrize(
    "start,end,steps", [(0, 1, 5), (-2.5, 3, 7), (1, 1, 3), (0, 10, 1), (0, 1, 0)]
)
def test_linspace(start, end, steps):
    t = lucid.linspace(start, end, steps)
    assert t.dtype == lucid.float32 and t.shape == (steps,)
    np.testing.assert_allclose(t.numpy(), np.linspace(start, end, steps), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="non-negative"):
        lucid.linspace(0, 1, -1)


def test_eye():
    np.testing.assert_array_equal(lucid.eye(3).numpy(), np.eye(3))
    np.testing.assert_array_equal(lucid.eye(2, 4, dtype=lucid.int64).numpy(), np.eye(2, 4))
    assert lucid.eye(2).dtype == lucid.float32
    with pytest.raises(ValueError, match="non-negative"):
        lucid.eye(-1)


def test_like_factories_follow_input_shape_and_dtype():
    x = lucid.tensor(np.arange(6, dtype=np.float64).reshape(2, 3))
    for fn, value in ((lucid.zeros_like, 0), (lucid.ones_like, 1), (lucid.empty_like, None)):
        out = fn(x)
        assert out.shape == (2, 3) and out.dtype == lucid.float64
        if value is not None:
            np.testing.assert_array_equal(out.numpy(), np.full((2, 3), value))
        assert fn(x, dtype=lucid.int32).dtype == lucid.int32
    out = lucid.full_like(x, 2.5)
    assert out.dtype == lucid.float64
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2.5))
    assert lucid.full_like(lucid.tensor([1, 2]), 3.7).numpy().tolist() == [3, 3]


def test_like_factories_do_not_track_gradients_unless_asked():
    x = lucid.tensor([1.0, 2.0], requires_grad=True)
    out = lucid.zeros_like(x)
    assert not out.requires_grad and out.grad_fn is None
    assert lucid.ones_like(x, requires_grad=True).requires_grad
    with pytest.raises(TypeError, match="expected a Tensor"):
        lucid.zeros_like([1, 2])


def test_new_factories_keep_dtype():
    x = lucid.tensor([1.0], dtype=lucid.float64)
    assert x.new_zeros(2, 2).dtype == lucid.float64 and x.new_zeros(2, 2).shape == (2, 2)
    assert x.new_ones((3,)).numpy().tolist() == [1.0, 1.0, 1.0]
    assert x.new_full((2,), 4).numpy().tolist() == [4.0, 4.0]
