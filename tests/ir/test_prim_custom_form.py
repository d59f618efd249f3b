"""The prim ops' hand-written custom form: the text the dialect documents, parsed back."""

from lucid.ir import _xdsl as x
from lucid.ir import parse_ir, print_ir
from lucid.ir.prim.dialect import create_prim, get_prim_class, make_prim_context, prim_type


def _module_with(op_of_args, arg_types):
    block = x.Block(arg_types=arg_types)
    op = op_of_args(block.args)
    ret = x.func.ReturnOp(*op.results)
    block.add_ops([op, ret])
    fn = x.func.FuncOp("forward", (arg_types, [r.type for r in op.results]), x.Region(block))
    return x.ModuleOp([fn])


def test_reduce_sum_prints_the_documented_custom_form():
    module = _module_with(
        lambda args: create_prim("reduce_sum", [args[0]], {"axes": (1,)}),
        [prim_type((4, 8), "f32")],
    )
    text = print_ir(module)
    assert "prim.reduce_sum %0 {axes = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4xf32>" in (
        text.replace("%arg0", "%0")
    )
    assert print_ir(parse_ir(text, ctx=make_prim_context())) == text


def test_prim_op_classes_define_no_declarative_assembly_format():
    # Parsing a declarative format per generated class is what the hand-written form avoids.
    cls = get_prim_class("add")
    assert cls.get_irdl_definition().assembly_format is None
