"""The ``func`` dialect (``func.func``, ``func.return``, ``func.call``), Lucid's own copy of
xDSL 0.75's ``xdsl.dialects.func``: same op names, properties, traits, verifiers, Python
interface and text, so saved and printed IR is unchanged and parses either way.

Why a copy: importing xDSL's module costs a process's first ``lucid.compile`` about 30 ms, for
its custom forms (``xdsl.dialects.utils`` pulls in the parser, the declarative assembly format and
the pattern rewriter), which compiling never uses. Here the custom forms are written by hand, and
``func.func``'s reuses xDSL's printer and parser helpers, imported on first print or parse.
It is reached as ``lucid.ir._xdsl.func`` (``x.func.FuncOp``), where xDSL's module used to be.
"""

from __future__ import annotations

from collections.abc import Sequence

from lucid.ir import _xdsl as x

__all__ = ["CallOp", "Func", "FuncOp", "ReturnOp"]

_FUNC_RESERVED = ("sym_name", "function_type", "sym_visibility")


class FuncOpCallableInterface(x.CallableOpInterface):
    @classmethod
    def get_callable_region(cls, op: x.Operation) -> x.Region:
        assert isinstance(op, FuncOp)
        return op.body

    @classmethod
    def get_argument_types(cls, op: x.Operation) -> tuple[x.Attribute, ...]:
        assert isinstance(op, FuncOp)
        return op.function_type.inputs.data

    @classmethod
    def get_result_types(cls, op: x.Operation) -> tuple[x.Attribute, ...]:
        assert isinstance(op, FuncOp)
        return op.function_type.outputs.data


class CallOpSymbolUserOpInterface(x.SymbolUserOpInterface):
    def verify(self, op: x.Operation) -> None:
        assert isinstance(op, CallOp)
        found_callee = x.SymbolTable.lookup_symbol(op, op.callee)
        if not found_callee:
            raise x.VerifyException(f"'{op.callee}' could not be found in symbol table")
        if not isinstance(found_callee, FuncOp):
            raise x.VerifyException(f"'{op.callee}' does not reference a valid function")
        if len(found_callee.function_type.inputs) != len(op.arguments):
            raise x.VerifyException("incorrect number of operands for callee")
        if len(found_callee.function_type.outputs) != len(op.result_types):
            raise x.VerifyException("incorrect number of results for callee")
        operand_types = (arg.type for arg in op.arguments)
        for idx, (found, given) in enumerate(
            zip(found_callee.function_type.inputs, operand_types, strict=False)
        ):
            if found != given:
                raise x.VerifyException(
                    f"operand type mismatch: expected operand type {found}, "
                    f"but provided {given} for operand number {idx}"
                )
        for idx, (found, given) in enumerate(
            zip(found_callee.function_type.outputs, op.result_types, strict=False)
        ):
            if found != given:
                raise x.VerifyException(
                    f"result type mismatch: expected result type {found}, but "
                    f"provided {given} for result number {idx}"
                )


@x.irdl_op_definition
class FuncOp(x.IRDLOperation):
    name = "func.func"

    body = x.region_def()
    sym_name = x.prop_def(x.SymbolNameConstraint())
    function_type = x.prop_def(x.FunctionType)
    sym_visibility = x.opt_prop_def(x.StringAttr)
    arg_attrs = x.opt_prop_def(x.ArrayAttr[x.DictionaryAttr])
    res_attrs = x.opt_prop_def(x.ArrayAttr[x.DictionaryAttr])

    traits = x.traits_def(x.IsolatedFromAbove(), x.SymbolOpInterface(), FuncOpCallableInterface())

    def __init__(
        self,
        name: str,
        function_type: x.FunctionType | tuple[Sequence[x.Attribute], Sequence[x.Attribute]],
        region: x.Region | type[x.Region.DEFAULT] = x.Region.DEFAULT,
        visibility: x.StringAttr | str | None = None,
        *,
        arg_attrs: x.ArrayAttr | None = None,
        res_attrs: x.ArrayAttr | None = None,
    ):
        if isinstance(visibility, str):
            visibility = x.StringAttr(visibility)
        if isinstance(function_type, tuple):
            inputs, outputs = function_type
            function_type = x.FunctionType.from_lists(inputs, outputs)
        if not isinstance(region, x.Region):
            region = x.Region(x.Block(arg_types=function_type.inputs))
        properties = {
            "sym_name": x.StringAttr(name),
            "function_type": function_type,
            "sym_visibility": visibility,
            "arg_attrs": arg_attrs,
            "res_attrs": res_attrs,
        }
        super().__init__(properties=properties, regions=[region])

    def verify_(self) -> None:
        if len(self.body.blocks) == 0:  # an external function
            return
        entry_block = self.body.blocks.first
        assert entry_block is not None
        if self.function_type.inputs.data != tuple(entry_block.arg_types):
            raise x.VerifyException(
                "Expected entry block arguments to have the same types as the function input types"
            )

    @classmethod
    def parse(cls, parser: x.Parser) -> FuncOp:
        visibility = parser.parse_optional_visibility_keyword()
        name, input_types, return_types, region, extra_attrs, arg_attrs, res_attrs = (
            x.parse_func_op_like(parser, reserved_attr_names=_FUNC_RESERVED)
        )
        func = FuncOp(
            name=name,
            function_type=(input_types, return_types),
            region=region,
            visibility=visibility,
            arg_attrs=arg_attrs,
            res_attrs=res_attrs,
        )
        if extra_attrs is not None:
            func.attributes |= extra_attrs.data
        return func

    def print(self, printer: x.Printer) -> None:
        if self.sym_visibility:
            printer.print_string(" ")
            printer.print_string(self.sym_visibility.data)
        x.print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            arg_attrs=self.arg_attrs,
            res_attrs=self.res_attrs,
            reserved_attr_names=(*_FUNC_RESERVED, "arg_attrs"),
        )

    @staticmethod
    def external(
        name: str, input_types: Sequence[x.Attribute], return_types: Sequence[x.Attribute]
    ) -> FuncOp:
        return FuncOp(
            name=name,
            function_type=(input_types, return_types),
            region=x.Region(),
            visibility="private",
        )

    @staticmethod
    def from_region(
        name: str,
        input_types: Sequence[x.Attribute],
        return_types: Sequence[x.Attribute],
        region: x.Region | type[x.Region.DEFAULT] = x.Region.DEFAULT,
        visibility: x.StringAttr | str | None = None,
    ) -> FuncOp:
        return FuncOp(
            name=name,
            function_type=(input_types, return_types),
            region=region,
            visibility=visibility,
        )

    def replace_argument_type(self, arg, new_type: x.Attribute, rewriter) -> None:
        """Give argument ``arg`` (an index or the BlockArgument) the type ``new_type``, and
        update ``function_type``."""
        if isinstance(arg, int):
            block = self.body.blocks.first
            assert block is not None
            try:
                arg = block.args[arg]
            except IndexError:
                raise IndexError(f"Block {block} does not have argument #{arg}") from None
        if arg not in self.args:
            raise ValueError(f"Arg {arg} does not belong to this function")
        rewriter.replace_value_with_new_type(arg, new_type)
        self.update_function_type()

    def update_function_type(self) -> None:
        """Set ``function_type`` from the block arguments' types and the return's operands."""
        assert not self.is_declaration, (
            "update_function_type does not work with function declarations!"
        )
        return_op = self.get_return_op()
        return_type = self.function_type.outputs.data
        if return_op is not None:
            return_type = return_op.operand_types
        self.properties["function_type"] = x.FunctionType.from_lists(
            [arg.type for arg in self.args], return_type
        )

    def get_return_op(self) -> ReturnOp | None:
        """The ``func.return`` ending the body, or None."""
        if self.is_declaration:
            return None
        if (last_block := self.body.blocks.last) is None:
            return None
        ret_op = last_block.last_op
        if not isinstance(ret_op, ReturnOp):
            return None
        return ret_op

    @property
    def args(self) -> tuple:
        """The entry block's arguments."""
        assert not self.is_declaration, "Function declarations don't have BlockArguments!"
        block = self.body.blocks.first
        assert block is not None
        return block.args

    @property
    def is_declaration(self) -> bool:
        """Whether this is an external declaration (an empty body)."""
        return not self.body.blocks


@x.irdl_op_definition
class CallOp(x.IRDLOperation):
    name = "func.call"
    arguments = x.var_operand_def()
    callee = x.prop_def(x.FlatSymbolRefAttrConstr)
    res = x.var_result_def()

    traits = x.traits_def(CallOpSymbolUserOpInterface())

    def __init__(
        self,
        callee: str | x.StringAttr | x.SymbolRefAttr,
        arguments: Sequence[x.SSAValue | x.Operation],
        return_types: Sequence[x.Attribute],
    ):
        super().__init__(
            operands=[arguments],
            result_types=[return_types],
            properties={"callee": x.SymbolRefAttr.get(callee)},
        )

    # The text of xDSL's assembly format
    # "$callee `(` $arguments `)` attr-dict `:` functional-type($arguments, $res)".
    def print(self, printer: x.Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.callee)
        printer.print_string("(")
        printer.print_list(self.arguments, printer.print_operand)
        printer.print_string(")")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_function_type(self.arguments.types, self.result_types)

    @classmethod
    def parse(cls, parser: x.Parser) -> CallOp:
        callee = parser.parse_attribute()
        pos = parser.pos
        unresolved = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_unresolved_operand
        )
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ftype = parser.parse_function_type()
        operands = parser.resolve_operands(unresolved, ftype.inputs.data, pos)
        return cls.create(
            operands=operands,
            result_types=list(ftype.outputs.data),
            properties={"callee": callee},
            attributes=attrs,
        )


@x.irdl_op_definition
class ReturnOp(x.IRDLOperation):
    name = "func.return"
    arguments = x.var_operand_def()

    traits = x.traits_def(x.HasParent(FuncOp), x.IsTerminator(), x.ReturnLike())

    def __init__(self, *return_vals: x.SSAValue | x.Operation):
        super().__init__(operands=[return_vals])

    def verify_(self) -> None:
        func_op = self.parent_op()
        assert isinstance(func_op, FuncOp)
        function_return_types = func_op.function_type.outputs.data
        return_types = self.arguments.types
        if function_return_types != return_types:
            raise x.VerifyException(
                "Expected arguments to have the same types as the function output "
                f"types: expected {func_op.function_type.outputs}, "
                f"got {x.ArrayAttr(return_types)}"
            )

    # The text of xDSL's assembly format "attr-dict ($arguments^ `:` type($arguments))?".
    def print(self, printer: x.Printer) -> None:
        printer.print_op_attributes(self.attributes)
        if self.arguments:
            printer.print_string(" ")
            printer.print_list(self.arguments, printer.print_operand)
            printer.print_string(" : ")
            printer.print_list(self.arguments.types, printer.print_attribute)

    @classmethod
    def parse(cls, parser: x.Parser) -> ReturnOp:
        attrs = parser.parse_optional_attr_dict()
        operands = []
        pos = parser.pos
        unresolved = parser.parse_optional_undelimited_comma_separated_list(
            parser.parse_optional_unresolved_operand, parser.parse_unresolved_operand
        )
        if unresolved is not None:
            parser.parse_punctuation(":")
            types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
            operands = parser.resolve_operands(unresolved, types, pos)
        return cls.create(operands=operands, attributes=attrs)


Func = x.Dialect("func", [FuncOp, CallOp, ReturnOp], [])
