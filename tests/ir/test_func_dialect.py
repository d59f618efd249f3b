"""Lucid's ``func`` dialect (``lucid.ir.func``) and hand-written ``lucid.constant`` form: the same
text, both forms, as xDSL 0.75's ``func`` dialect and assembly format gave (so saved IR and
``--print-ir-after-all`` output are unchanged), and the same Python interface."""

from __future__ import annotations

import pytest
from xdsl.context import Context
from xdsl.dialects import builtin as xdsl_builtin
from xdsl.dialects import func as xdsl_func
from xdsl.ir import Attribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    traits_def,
    var_result_def,
)
from xdsl.traits import ConstantLike, Pure

from lucid.ir import _xdsl as x
from lucid.ir import func as lucid_func
from lucid.ir import make_context, parse_ir, print_ir


@irdl_op_definition
class _DeclarativeConstant(IRDLOperation):
    """``lucid.constant`` as it was defined before, with xDSL's assembly format."""

    name = "lucid.constant"
    value = opt_prop_def(Attribute)
    res = var_result_def(xdsl_builtin.TensorType)
    traits = traits_def(Pure(), ConstantLike())
    assembly_format = "$value attr-dict `->` type($res)"


def _xdsl_context() -> Context:
    ctx = Context(allow_unregistered=True)
    ctx.load_dialect(xdsl_builtin.Builtin)
    ctx.load_dialect(xdsl_func.Func)
    ctx.load_op(_DeclarativeConstant)
    return ctx


# A compiled forward, as its custom form is saved in AOT files and shown by --print-ir-*: roles
# on arguments and results, weak scalar and dense constants. The format contract, verbatim.
_FORWARD = (
    "builtin.module {\n"
    '  func.func @forward(%0: tensor<4x3xf32> {lucid.role = "input:0"}, %1: tensor<2x3xf32> '
    '{lucid.role = "param:weight"}) -> (tensor<4x2xf32> {lucid.role = "output:0"}) {\n'
    "    %2 = lucid.constant 5.000000e-01 : f64 -> tensor<f32>\n"
    "    %3 = lucid.constant 1 : i64 -> tensor<i64>\n"
    "    %4 = lucid.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32> -> tensor<2xf32>\n"
    "    %5 = lucid.constant true -> tensor<i1>\n"
    '    %6 = "test.op"(%0, %1, %2) : (tensor<4x3xf32>, tensor<2x3xf32>, tensor<f32>) -> '
    "tensor<4x2xf32>\n"
    "    func.return %6 : tensor<4x2xf32>\n"
    "  }\n"
    "}\n"
)

_CASES = [
    _FORWARD,
    # several results, no roles, an empty function, a private declaration, extra attributes
    """builtin.module {
  func.func @two(%a : tensor<3xf32>, %b : tensor<3xi64>) -> (tensor<3xf32>, tensor<3xi64>) {
    func.return %a, %b : tensor<3xf32>, tensor<3xi64>
  }
  func.func @nothing() {
    func.return
  }
  func.func private @external(tensor<2xf32>) -> tensor<2xf32>
  func.func @marked(%x : tensor<f32>) -> tensor<f32> attributes {lucid.note = "kept"} {
    func.return {lucid.tag} %x : tensor<f32>
  }
  func.func @caller(%x : tensor<2xf32>) -> tensor<2xf32> {
    %y = func.call @external(%x) : (tensor<2xf32>) -> tensor<2xf32>
    %z = func.call @external(%y) {lucid.tag} : (tensor<2xf32>) -> tensor<2xf32>
    func.call @nothing() : () -> ()
    func.return %z : tensor<2xf32>
  }
}
""",
]


def _lucid_print(text: str, generic: bool) -> str:
    ctx = make_context()
    ctx.allow_unregistered = True
    return print_ir(parse_ir(text, ctx=ctx), generic=generic)


def _xdsl_print(text: str, generic: bool) -> str:
    return print_ir(parse_ir(text, ctx=_xdsl_context()), generic=generic)


@pytest.mark.parametrize("case", range(len(_CASES)))
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_func_ops_print_and_parse_as_xdsls_func_dialect_did(case, generic):
    text = _CASES[case]
    want = _xdsl_print(text, generic)
    got = _lucid_print(text, generic)
    assert got == want
    assert _lucid_print(got, generic) == got  # and the printed text parses back to itself


def test_the_custom_form_is_the_contract():
    assert _lucid_print(_FORWARD, generic=False) == _FORWARD


def test_parsed_ops_are_lucids_and_keep_the_python_interface():
    module = parse_ir(_CASES[1], ctx=make_context())
    funcs = [op for op in module.ops if isinstance(op, lucid_func.FuncOp)]
    assert [f.sym_name.data for f in funcs] == ["two", "nothing", "external", "marked", "caller"]
    two, _, external, marked, caller = funcs
    assert not isinstance(two, xdsl_func.FuncOp)
    assert external.is_declaration and external.sym_visibility.data == "private"
    assert [a.type for a in two.args] == list(two.function_type.inputs.data)
    assert isinstance(two.get_return_op(), lucid_func.ReturnOp)
    assert marked.attributes["lucid.note"] == x.StringAttr("kept")
    call = next(iter(caller.body.ops))
    assert isinstance(call, lucid_func.CallOp) and call.callee.string_value() == "external"
    module.verify()

    two.body.block.insert_arg(x.TensorType(x.f32, [3]), 2)
    two.update_function_type()
    assert len(two.function_type.inputs) == 3


def test_the_builders_make_what_xdsls_did():
    t = x.TensorType(x.f32, [2])
    for mod in (lucid_func, xdsl_func):
        fn = mod.FuncOp("f", ([t], [t]))
        fn.body.block.add_op(mod.ReturnOp(fn.args[0]))
        call = mod.CallOp("f", [fn.args[0]], [t])
        assert call.callee == x.SymbolRefAttr("f")
    assert print_ir(lucid_func.FuncOp.external("g", [t], [])) == print_ir(
        xdsl_func.FuncOp.external("g", [t], [])
    )


def test_verifiers_refuse_what_xdsls_refused_and_name_the_mismatch():
    t, u = x.TensorType(x.f32, [2]), x.TensorType(x.f32, [3])
    fn = lucid_func.FuncOp("f", ([t], [u]))
    fn.body.block.add_op(lucid_func.ReturnOp(fn.args[0]))
    with pytest.raises(
        x.VerifyException,
        match=(
            r"func.return of @f: result types: expected \(tensor<3xf32>\), got \(tensor<2xf32>\)"
        ),
    ):
        fn.verify()
    bad_call = """builtin.module {
  func.func private @g(tensor<2xf32>) -> tensor<2xf32>
  func.func @f(%x : tensor<3xf32>) -> tensor<2xf32> {
    %y = func.call @g(%x) : (tensor<3xf32>) -> tensor<2xf32>
    func.return %y : tensor<2xf32>
  }
}
"""
    with pytest.raises(
        x.VerifyException,
        match=(r"func.call @g: operand types: expected \(tensor<2xf32>\), got \(tensor<3xf32>\)"),
    ):
        parse_ir(bad_call).verify()


def test_the_adapter_names_lucids_func_dialect():
    assert x.func is lucid_func
    assert make_context().get_optional_op("func.func") is lucid_func.FuncOp
