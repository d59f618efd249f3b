"""PyTorch's legacy constructors: ``lucid.Tensor(*sizes)``, ``lucid.FloatTensor``, ..."""

import numpy as np
import pytest

import lucid


def test_tensor_of_sizes_is_float32_of_that_shape():
    assert lucid.Tensor(3, 4).shape == (3, 4)
    five = lucid.Tensor(5)
    assert five.shape == (5,) and five.dtype == lucid.float32
    empty = lucid.Tensor()
    assert empty.shape == (0,) and empty.dtype == lucid.float32
    with pytest.raises(ValueError, match="negative dimension"):
        lucid.Tensor(2, -1)


def test_tensor_of_data_is_float32_and_of_a_tensor_an_alias():
    t = lucid.Tensor([1, 2])
    assert t.dtype == lucid.float32 and t.tolist() == [1.0, 2.0]
    assert lucid.Tensor(np.array([1, 2], dtype=np.int64)).dtype == lucid.float32
    ints = lucid.tensor([1, 2])
    alias = lucid.Tensor(ints)
    assert alias.dtype == lucid.int64
    alias.add_(1)
    assert ints.tolist() == [2, 3]
    with pytest.raises(TypeError, match="sizes"):
        lucid.Tensor(ints, 3)


def test_typed_constructors_and_isinstance():
    assert lucid.FloatTensor([1, 2]).dtype == lucid.float32
    longs = lucid.LongTensor([1.7, 2.0])
    assert longs.dtype == lucid.int64 and longs.tolist() == [1, 2]
    assert lucid.LongTensor(3).shape == (3,)
    assert lucid.DoubleTensor(2, 2).dtype == lucid.float64
    assert lucid.BoolTensor([1, 0]).tolist() == [True, False]
    assert isinstance(lucid.zeros(2), lucid.FloatTensor)
    assert not isinstance(lucid.zeros(2, dtype=lucid.int64), lucid.FloatTensor)
    with pytest.raises(TypeError, match="expects a lucid.float32 tensor"):
        lucid.FloatTensor(lucid.tensor([1, 2]))


def test_type_names_and_casts_by_legacy_class():
    x = lucid.zeros(2)
    assert x.type() == "lucid.FloatTensor"
    assert x.type(lucid.LongTensor).dtype == lucid.int64
    assert x.type("torch.DoubleTensor").dtype == lucid.float64
