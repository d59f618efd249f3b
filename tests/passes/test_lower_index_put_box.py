"""index_put through a box (the gradient of basic slicing) lowers to pad + add/select, with no
position constants: the transformer backward used to build one constant per slice of qkv."""

import numpy as np
import pytest

import lucid
from lucid._dispatch import apply
from lucid.ir import import_trace, interpret
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace


def lowered(fn, *xs):
    module = import_trace(trace(fn, *xs))
    before = interpret(module, [x.numpy() for x in xs])
    PassManager("lower-to-prim").run(module)
    return module, before


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize(
    "index",
    [
        (("slice", None, None, None), ("slice", 128, 256, None)),
        (("int", 3), ("slice", -100, None, None)),
        (("slice", 2, 5, 1), ("new",), ("int", -1)),
    ],
)
def test_box_index_put_matches_and_has_no_big_constants(accumulate, index):
    x = lucid.randn(64, 384)
    from lucid.ops.indexing import _index_shape

    values = lucid.randn(*_index_shape((64, 384), [], index))
    module, before = lowered(
        lambda a, v: apply("index_put", a, v, [], index=index, accumulate=accumulate), x, values
    )
    text = str(module)
    assert "prim.pad" in text and "prim.scatter_add" not in text
    (after,) = interpret_prim(module, [x.numpy(), values.numpy()])
    np.testing.assert_allclose(after, before[0], rtol=1e-6)
    sizes = [
        int(np.prod(op.results[0].type.get_shape()))
        for op in module.walk()
        if op.name == "prim.constant"
    ]
    assert max(sizes, default=0) <= 1
