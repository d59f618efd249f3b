"""``erase_block_args``: unused block arguments erased in one pass (``Block.erase_arg`` per
argument renumbered the rest each time: quadratic over a deep model's per-parameter feeds)."""

from __future__ import annotations

import pytest

from lucid.ir import _xdsl as x


def _block(n: int) -> x.Block:
    return x.Block(arg_types=[x.TensorType(x.f32, [i + 1]) for i in range(n)])


def test_the_kept_arguments_are_renumbered_in_order():
    block = _block(6)
    keep = [block.args[i] for i in (0, 2, 5)]
    x.erase_block_args(block, [block.args[i] for i in (4, 1, 3)])
    assert list(block.args) == keep
    assert [a.index for a in block.args] == [0, 1, 2]
    assert [a.type.get_shape() for a in block.args] == [(1,), (3,), (6,)]
    # xDSL's own edits still work on the result
    block.erase_arg(block.args[1])
    assert [a.type.get_shape() for a in block.args] == [(1,), (6,)]


def test_a_used_argument_or_one_of_another_block_is_refused():
    block = _block(2)
    user = x.func.ReturnOp(block.args[1])
    block.add_op(user)
    with pytest.raises(ValueError, match="still used"):
        x.erase_block_args(block, [block.args[1]])
    with pytest.raises(ValueError, match="another block"):
        x.erase_block_args(block, [_block(1).args[0]])
    assert len(block.args) == 2  # nothing erased


def test_every_other_argument_of_thousands():
    block = _block(3000)
    args = list(block.args)
    x.erase_block_args(block, args[::2])
    assert [a.index for a in block.args] == list(range(1500))
    assert list(block.args) == args[1::2]
