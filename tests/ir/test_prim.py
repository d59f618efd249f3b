"""The prim dialect (generated from the prim op table) and its reference interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lucid.ir import _xdsl as x
from lucid.ir import parse_ir, print_ir
from lucid.ir import prim as P
from lucid.ir.prim.dialect import (
    attr_from_prim,
    attr_to_prim,
    create_prim,
    get_prim_class,
    make_prim_context,
    prim_dialect,
    prim_type,
)
from lucid.ir.prim.interpreter import interpret_prim

_SAMPLE_ATTR = {
    "int": 3,
    "ints": (1, 2),
    "float": 0.5,
    "floats": (1.0, -math.inf),
    "bool": True,
    "dtype": "f64",
    "str": 'embedding: index {} is "out" of range',
}


def _func(arg_types, build) -> x.ModuleOp:
    block = x.Block(arg_types=arg_types)
    ops = build(list(block.args))
    ret = x.func.ReturnOp(*ops[-1].results)
    block.add_ops([*ops, ret])
    fn = x.func.FuncOp("forward", (arg_types, [r.type for r in ret.operands]), x.Region(block))
    return x.ModuleOp([fn])


def test_dialect_has_one_op_per_table_entry():
    names = {op.name for op in prim_dialect().operations}
    assert names == {f"prim.{n}" for n in (*P.PRIM_OPS, *P.COMPOSITE_OPS)}


@pytest.mark.parametrize("name", sorted((*P.PRIM_OPS, *P.COMPOSITE_OPS)))
def test_every_prim_op_round_trips_custom_and_generic(name):
    """A format test with made-up types: every attribute kind prints in a form the parser
    reads back (composite ops too)."""
    spec = P.lookup(name)
    t = prim_type((2, 3), "f32")
    n = max(len(spec.operands), 1) if spec.operands else 0
    props = {k: attr_to_prim(a.kind, _SAMPLE_ATTR[a.kind]) for k, a in spec.attrs.items()}
    module = _func(
        [t] * n,
        lambda args: [
            get_prim_class(name).create(operands=args, result_types=[t], properties=props)
        ],
    )
    ctx = make_prim_context()
    for generic in (False, True):
        text = print_ir(module, generic=generic)
        again = parse_ir(text, ctx=ctx)
        assert print_ir(again, generic=generic) == text
        op = next(iter(again.ops)).body.blocks.first.first_op
        assert op.given_attrs() == {k: _SAMPLE_ATTR[a.kind] for k, a in spec.attrs.items()}


@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**62), 2**62))
def test_attribute_values_map_losslessly(value, integer):
    got = attr_from_prim("float", attr_to_prim("float", value))
    assert got == value or (math.isnan(got) and math.isnan(value))
    assert attr_from_prim("int", attr_to_prim("int", integer)) == integer
    assert attr_from_prim("ints", attr_to_prim("ints", (integer, 1))) == (integer, 1)
    assert attr_from_prim("dtype", attr_to_prim("dtype", "bool")) == "bool"


def test_create_infers_result_types_and_leaves_defaults_out():
    t = prim_type((4, 8), "f32")
    module = _func([t], lambda a: [create_prim("reduce_sum", a, {"axes": (1,), "keepdims": False})])
    module.verify()
    op = next(iter(module.ops)).body.blocks.first.first_op
    assert op.results[0].type == prim_type((4,), "f32")
    assert set(op.properties) == {"axes"}  # keepdims=False is the default
    assert op.prim_attrs() == {"axes": (1,), "keepdims": False}


def test_create_rejects_operands_that_do_not_fit_naming_the_op():
    block = x.Block(arg_types=[prim_type((3,), "i32"), prim_type((3,), "f32")])
    with pytest.raises(P.PrimError, match=r"prim\.exp: .*i32"):
        create_prim("exp", [block.args[0]], {})
    with pytest.raises(P.PrimError, match="share one dtype"):
        create_prim("add", list(block.args), {})
    with pytest.raises(P.PrimError, match="missing attribute 'dtype'"):
        create_prim("cast", [block.args[0]], {})


def test_verifier_reports_a_wrong_result_type_and_unknown_attributes():
    t = prim_type((2, 3), "f32")
    bad = _func(
        [t],
        lambda a: [
            get_prim_class("exp").create(operands=a, result_types=[prim_type((3, 2), "f32")])
        ],
    )
    with pytest.raises(x.VerifyException, match=r"prim.exp: result 0 is declared .*3x2.*2x3"):
        bad.verify()
    odd = _func(
        [t],
        lambda a: [
            get_prim_class("exp").create(
                operands=a, result_types=[t], properties={"axis": attr_to_prim("int", 1)}
            )
        ],
    )
    with pytest.raises(x.VerifyException, match="property 'axis' is not defined by .*prim.exp"):
        odd.verify()


def _sample_module():
    t = prim_type((2, 3), "f32")

    def build(args):
        e = create_prim("exp", [args[0]], {})
        s = create_prim("reduce_sum", [e.results[0]], {"axes": (1,), "keepdims": True})
        d = create_prim("div", [e.results[0], s.results[0]], {})
        return [e, s, d]

    return _func([t], build)


def test_interpreter_runs_the_table_semantics():
    x_in = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (out,) = interpret_prim(_sample_module(), [x_in])
    want = np.exp(x_in) / np.exp(x_in).sum(axis=1, keepdims=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-6)
    (by_role,) = interpret_prim(_sample_module(), {"input:0": x_in})
    np.testing.assert_array_equal(by_role, out)


def test_interpreter_errors_are_clear():
    module = _sample_module()
    with pytest.raises(ValueError, match="takes 1 inputs, got 2"):
        interpret_prim(module, [np.zeros((2, 3)), np.zeros(1)])
    with pytest.raises(ValueError, match=r"input 0 has shape \(3,\), expected \(2, 3\)"):
        interpret_prim(module, [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match=r"no value given for the feeds \['input:0'\]"):
        interpret_prim(module, {"param:w": np.zeros(1)})


def test_interpreter_refuses_ops_outside_prim():
    from lucid._tensor import Tensor
    from lucid.ir import import_trace
    from lucid.trace import trace

    module = import_trace(trace(lambda t: t * 2, Tensor._wrap(np.ones(2, np.float32))))
    with pytest.raises(ValueError, match="not in the prim dialect; run lower-to-prim first"):
        interpret_prim(module, [np.ones(2, np.float32)])


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_reference_over_an_empty_axis_is_empty(name):
    """The native kernels return an empty result; the reference must agree, not raise (numpy's
    max over a zero-size axis has no identity). Found by the native program fuzzer."""
    from lucid.ir.prim._core import evaluate

    (out,) = evaluate(name, [np.zeros((2, 0, 4), np.float32)], {"axis": 1})
    assert out.shape == (2, 0, 4)
    (row,) = evaluate(name, [np.array([[1.0, 2.0]], np.float32)], {"axis": 1})
    want = np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()
    np.testing.assert_allclose(row[0], want if name == "softmax" else np.log(want), rtol=1e-6)
