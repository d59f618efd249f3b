"""The lucid dialect: generated from the registry, every op round-trips print -> parse in custom
and generic form, attributes map losslessly, verifiers give actionable messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid.ir import _xdsl as x
from lucid.ir import (
    get_op_class,
    import_trace,
    lucid_dialect,
    parse_ir,
    print_ir,
)
from lucid.ir.dialect import make_constant
from lucid.ir.types import attr_from_ir, attr_to_ir, tensor_type
from lucid.ops._registry import REGISTRY, REQUIRED
from lucid.trace import trace


def _sample_op_module(name: str) -> x.ModuleOp:
    """One op of each registry entry with made-up operand types and every attribute set (a
    format test: the module need not verify)."""
    opdef = REGISTRY[name]
    n = len(opdef.operands) + (1 if opdef.variadic else 0)
    t = tensor_type((2, None), lucid.float32)
    block = x.Block(arg_types=[t] * n)
    props = {}
    for k, default in opdef.attrs.items():
        value = 3 if default is None or default is REQUIRED else default
        a = attr_to_ir(value)
        if a is not None:
            props[k] = a
    op = get_op_class(name).create(
        operands=list(block.args), result_types=[t] * opdef.n_outputs, properties=props
    )
    block.add_ops([op, x.func.ReturnOp(*op.results)])
    fn = x.func.FuncOp("f", ([t] * n, [t] * opdef.n_outputs), x.Region(block))
    return x.ModuleOp([fn])


def test_dialect_has_one_op_per_registry_entry():
    names = {op.name for op in lucid_dialect().operations}
    assert names == {f"lucid.{n}" for n in REGISTRY} | {"lucid.constant"}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registry_op_round_trips_custom_and_generic(name):
    module = _sample_op_module(name)
    text = print_ir(module)
    assert f"lucid.{name} " in text
    assert print_ir(parse_ir(text)) == text
    generic = print_ir(module, generic=True)
    assert f'"lucid.{name}"' in generic
    assert print_ir(parse_ir(generic)) == text


_scalars = (
    st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, width=64)
    | st.text(max_size=6)
    | st.sampled_from([lucid.float32, lucid.int64, lucid.bool_, lucid.uint8, lucid.float16])
)
_attr_values = st.recursive(
    _scalars, lambda inner: st.lists(inner | st.none(), max_size=3).map(tuple), max_leaves=6
)


@given(value=_attr_values)
def test_attributes_round_trip_through_ir_and_text(value):
    a = attr_to_ir(value)
    back = attr_from_ir(a)
    assert back == value and type(back) is type(value)
    # through the printed form too
    op = get_op_class("sum").create(
        operands=[], result_types=[tensor_type((), lucid.float32)], properties={"dim": a}
    )
    parsed = parse_ir(print_ir(x.ModuleOp([op])))
    assert next(iter(parsed.ops)).lucid_attrs()["dim"] == value


def test_special_floats_round_trip():
    for v in (float("inf"), -float("inf"), 1e-300, 0.1 + 0.2):
        op = make_constant(v)
        parsed = next(iter(parse_ir(print_ir(x.ModuleOp([op]))).ops))
        assert parsed.scalar() == v


def test_constant_holds_weak_scalars_and_dense_arrays():
    assert make_constant(2).results[0].type == tensor_type((), lucid.int64)
    assert make_constant(2.5).results[0].type == tensor_type((), lucid.float32)
    assert make_constant(True).results[0].type == tensor_type((), lucid.bool_)
    arr = np.arange(6, dtype=np.float64).reshape(2, 3)
    op = make_constant(arr)
    op.verify()
    from lucid.ir.dialect import constant_value

    np.testing.assert_array_equal(constant_value(op), arr)
    assert constant_value(op).dtype == np.float64


def _module_of(fn, *inputs):
    return import_trace(trace(fn, *inputs))


def test_imported_module_verifies_and_carries_roles():
    w = lucid.tensor(np.ones((3, 4), np.float32))
    m = _module_of(lambda a: (a * w).sum(1), lucid.tensor(np.ones((3, 4), np.float32)))
    m.verify()
    text = print_ir(m)
    assert 'lucid.role = "input:0"' in text and 'lucid.role = "capture:0"' in text
    assert 'lucid.role = "output:0"' in text
    assert "lucid.sum %2 {dim = 1 : i64, keepdim = false}" in text


def test_verifier_reports_a_wrong_result_type_with_the_expected_one():
    text = """
    func.func @forward(%a: tensor<3x4xf32>) -> tensor<5xf32> {
      %s = lucid.sum %a {dim = 0 : i64, keepdim = false} : (tensor<3x4xf32>) -> tensor<5xf32>
      func.return %s : tensor<5xf32>
    }"""
    with pytest.raises(
        x.VerifyException, match=r"declared tensor<5xf32> but the op gives tensor<4xf32>"
    ):
        parse_ir(text).verify()


def test_verifier_passes_on_inference_errors_naming_the_op():
    t23 = "tensor<2x3xf32>"
    text = f"""
    func.func @forward(%a: {t23}, %b: tensor<4x3xf32>) -> {t23} {{
      %c = lucid.add %a, %b : ({t23}, tensor<4x3xf32>) -> {t23}
      func.return %c : {t23}
    }}"""
    with pytest.raises(x.VerifyException, match=r"lucid.add: .*cannot be broadcast"):
        parse_ir(text).verify()


def test_verifier_rejects_wrong_operand_count_and_unknown_attribute():
    t = "tensor<2xf32>"
    wrong_count = f"""
    func.func @forward(%a: {t}) -> {t} {{
      %c = lucid.add %a : ({t}) -> {t}
      func.return %c : {t}
    }}"""
    with pytest.raises(x.VerifyException, match=r"lucid.add takes 2 operands \(x, y\), got 1"):
        parse_ir(wrong_count).verify()


def test_parse_error_names_line_and_column():
    with pytest.raises(x.ParseError) as e:
        parse_ir("func.func @f() {\n  %0 = lucid.nosuchop : () -> tensor<f32>\n}", name="m.mlir")
    assert "m.mlir:2" in str(e.value)


def test_symbolic_dims_print_as_question_mark_and_verify():
    from lucid.trace import _tracing

    with _tracing() as tr:
        a = tr.input((None, 3))
        t = tr.finish((a * 2).sum(1))
    m = import_trace(t)
    m.verify()
    assert "tensor<?x3xf32>" in print_ir(m) and "tensor<?xf32>" in print_ir(m)


def test_generic_form_of_every_op_and_attribute_kind_parses_with_upstream_mlir_opt(mlir_opt):
    funcs = []
    for name in sorted(REGISTRY):
        fn = next(iter(_sample_op_module(name).ops))
        fn.detach()
        fn.sym_name = x.StringAttr(f"f_{name}")
        funcs.append(fn)
    # every attribute kind: special floats, None in a tuple, dtypes, strings, bools, ints
    op = get_op_class("sum").create(
        operands=[],
        result_types=[tensor_type((), lucid.uint8)],
        properties={
            "dim": attr_to_ir((float("inf"), None, lucid.uint8, "s", True, -3, 1000001.0)),
            "keepdim": attr_to_ir(False),
            "dtype": attr_to_ir(lucid.uint8),
        },
    )
    block = x.Block()
    block.add_ops([op, make_constant(float("nan")), make_constant(np.arange(3) > 0)])
    block.add_op(x.func.ReturnOp())
    funcs.append(x.func.FuncOp("attrs", ([], []), x.Region(block)))
    out = mlir_opt(print_ir(x.ModuleOp(funcs), generic=True))
    assert out.returncode == 0, out.stderr[:2000]
    assert "lucid.sum" in out.stdout


def test_equal_python_values_of_different_types_stay_distinct_attributes():
    from lucid.trace._trace import Const, Feed, Trace, TraceOp, Value

    def module_with(keepdim):
        v = Value(0, (2, 3), lucid.float32)
        out = Value(1, (2,), lucid.float32)
        tr = Trace(
            [Feed(v, "input:0")], [TraceOp("sum", [v], [out], {"dim": 1, "keepdim": keepdim})]
        )
        tr.outputs.append(("output:0", out))
        return print_ir(import_trace(tr))

    assert "keepdim = false" in module_with(False)
    assert "keepdim = 0 : i64" in module_with(0)  # not served the cached bool form
    assert Const(1) == Const(1.0)  # why the importer keys constants by type as well


def test_non_tensor_operand_is_a_verify_error():
    text = """
    func.func @f(%a: i32) -> tensor<3xf32> {
      %e = lucid.exp %a : (i32) -> tensor<3xf32>
      func.return %e : tensor<3xf32>
    }"""
    with pytest.raises(x.VerifyException, match="lucid.exp: expected a tensor type, got i32"):
        parse_ir(text).verify()


def test_numpy_scalar_attributes_map_to_their_python_values():
    assert attr_from_ir(attr_to_ir(np.int64(3))) == 3
    assert attr_from_ir(attr_to_ir((np.int32(1), np.int64(2)))) == (1, 2)
    assert attr_from_ir(attr_to_ir(np.float32(0.5))) == 0.5
    assert attr_from_ir(attr_to_ir(np.bool_(True))) is True
    with pytest.raises(TypeError, match="has no IR form"):
        attr_to_ir(object())


def test_recorded_source_locations_print_as_debug_info_and_survive_json_and_parsing():
    from lucid.trace._trace import Trace

    a = lucid.tensor(np.ones(3, np.float32))
    tr = trace(lambda t: (t * 2).exp(), a, locations=True)  # MARK-loc
    src = open(__file__).read().splitlines()
    line = next(i + 1 for i, s in enumerate(src) if s.endswith("# MARK-loc"))
    assert [op.loc for op in tr.ops] == [(__file__, line)] * 2
    back = Trace.from_json(tr.to_json())
    assert back.ops[0].loc == (__file__, line)
    text = print_ir(import_trace(back), debuginfo=True)
    assert text.count(f'loc("{__file__}":{line}:0)') == 2
    assert "loc(" not in print_ir(import_trace(back))  # off by default
    assert print_ir(parse_ir(text), debuginfo=True) == text
    assert trace(lambda t: t * 2, a).ops[0].loc is None  # not recorded unless asked
