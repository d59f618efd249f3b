"""The ``func`` dialect of Lucid's IR: ``func.func``, ``func.return`` and ``func.call``, with
MLIR's op names, properties and text, so saved and printed IR reads the same as with xDSL's own
``func`` dialect and parses with either.

Defined here instead of imported from ``xdsl.dialects.func``: that module brings xDSL's parser,
declarative assembly format and pattern rewriter along (about 30 ms of a process's first
compile) for textual forms a compile never prints. The ops' text is written out here;
``func.func``'s signature goes through xDSL's function printing and parsing helpers, loaded on
first print or parse. The adapter exposes this module as ``lucid.ir._xdsl.func``.
"""

from __future__ import annotations

from collections.abc import Sequence

from lucid.ir import _xdsl as x

__all__ = ["CallOp", "Func", "FuncOp", "ReturnOp"]

# Properties printed in a function's signature, never in its ``attributes {...}`` dictionary.
_SIGNATURE_PROPERTIES = ("sym_name", "function_type", "sym_visibility")


def _function_type(
    signature: x.FunctionType | tuple[Sequence[x.Attribute], Sequence[x.Attribute]],
) -> x.FunctionType:
    if isinstance(signature, x.FunctionType):
        return signature
    inputs, outputs = signature
    return x.FunctionType.from_lists(list(inputs), list(outputs))


def _mismatch(what: str, expected: Sequence[x.Attribute], given: Sequence[x.Attribute]) -> str:
    show = ", ".join
    return f"{what}: expected ({show(map(str, expected))}), got ({show(map(str, given))})"


@x.irdl_op_definition
class FuncOp(x.IRDLOperation):
    """A function: one region whose entry block's arguments are the inputs, ended by
    ``func.return``; an empty region declares an external function. For example, the identity
    on a tensor type ``t``: ``fn = FuncOp("f", ([t], [t]))`` then
    ``fn.body.block.add_op(ReturnOp(fn.args[0]))``."""

    name = "func.func"

    body = x.region_def()
    sym_name = x.prop_def(x.SymbolNameConstraint())
    function_type = x.prop_def(x.FunctionType)
    sym_visibility = x.opt_prop_def(x.StringAttr)
    arg_attrs = x.opt_prop_def(x.ArrayAttr[x.DictionaryAttr])
    res_attrs = x.opt_prop_def(x.ArrayAttr[x.DictionaryAttr])

    traits = x.traits_def(x.IsolatedFromAbove(), x.SymbolOpInterface())

    def __init__(
        self,
        name: str,
        function_type: x.FunctionType | tuple[Sequence[x.Attribute], Sequence[x.Attribute]],
        region: x.Region | None = None,
        visibility: x.StringAttr | str | None = None,
        *,
        arg_attrs: x.ArrayAttr | None = None,
        res_attrs: x.ArrayAttr | None = None,
    ):
        signature = _function_type(function_type)
        if region is None:  # a definition: an entry block taking the inputs
            region = x.Region(x.Block(arg_types=signature.inputs))
        properties = {
            "sym_name": x.StringAttr(name),
            "function_type": signature,
            "sym_visibility": x.StringAttr(visibility)
            if isinstance(visibility, str)
            else visibility,
            "arg_attrs": arg_attrs,
            "res_attrs": res_attrs,
        }
        super().__init__(properties=properties, regions=[region])

    @staticmethod
    def external(
        name: str, input_types: Sequence[x.Attribute], return_types: Sequence[x.Attribute]
    ) -> FuncOp:
        """A private declaration of a function defined elsewhere (no body)."""
        return FuncOp(name, (input_types, return_types), x.Region(), "private")

    @property
    def is_declaration(self) -> bool:
        return not self.body.blocks

    @property
    def args(self) -> tuple[x.BlockArgument, ...]:
        """The entry block's arguments (the function's inputs)."""
        if self.is_declaration:
            raise ValueError(f"@{self.sym_name.data} is a declaration: it has no arguments")
        return self.body.blocks.first.args

    def get_return_op(self) -> ReturnOp | None:
        """The ``func.return`` ending the last block, if any."""
        last = self.body.blocks.last
        op = last.last_op if last is not None else None
        return op if isinstance(op, ReturnOp) else None

    def update_function_type(self) -> None:
        """Make ``function_type`` match the body again, after a pass changed the entry block's
        arguments or the returned values."""
        ret = self.get_return_op()
        outputs = ret.operand_types if ret is not None else self.function_type.outputs.data
        self.properties["function_type"] = x.FunctionType.from_lists(
            [a.type for a in self.args], list(outputs)
        )

    def verify_(self) -> None:
        if self.is_declaration:
            return
        inputs = self.function_type.inputs.data
        arg_types = tuple(self.body.blocks.first.arg_types)
        if inputs != arg_types:
            raise x.VerifyException(
                _mismatch(f"@{self.sym_name.data}: entry block arguments", inputs, arg_types)
            )

    def print(self, printer: x.Printer) -> None:
        if self.sym_visibility is not None:
            printer.print_string(" " + self.sym_visibility.data)
        x.print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            arg_attrs=self.arg_attrs,
            res_attrs=self.res_attrs,
            reserved_attr_names=(*_SIGNATURE_PROPERTIES, "arg_attrs"),
        )

    @classmethod
    def parse(cls, parser: x.Parser) -> FuncOp:
        visibility = parser.parse_optional_visibility_keyword()
        name, inputs, outputs, region, extra, arg_attrs, res_attrs = x.parse_func_op_like(
            parser, reserved_attr_names=_SIGNATURE_PROPERTIES
        )
        fn = cls(
            name,
            (inputs, outputs),
            region,
            visibility,
            arg_attrs=arg_attrs,
            res_attrs=res_attrs,
        )
        if extra is not None:
            fn.attributes.update(extra.data)
        return fn


def _print_operands_and_types(printer: x.Printer, operands: Sequence[x.SSAValue]) -> None:
    """`` %a, %b : t1, t2`` (nothing without operands)."""
    if operands:
        printer.print_string(" ")
        printer.print_list(operands, printer.print_operand)
        printer.print_string(" : ")
        printer.print_list([v.type for v in operands], printer.print_attribute)


@x.irdl_op_definition
class ReturnOp(x.IRDLOperation):
    """Ends a function, returning its operands: ``func.return {attrs} %a, %b : t1, t2``."""

    name = "func.return"
    arguments = x.var_operand_def()

    traits = x.traits_def(x.HasParent(FuncOp), x.IsTerminator(), x.ReturnLike())

    def __init__(self, *values: x.SSAValue | x.Operation):
        super().__init__(operands=[values])

    def verify_(self) -> None:
        fn = self.parent_op()
        if not isinstance(fn, FuncOp):
            return  # HasParent reports it
        expected, given = fn.function_type.outputs.data, self.arguments.types
        if expected != given:
            raise x.VerifyException(
                _mismatch(f"func.return of @{fn.sym_name.data}: result types", expected, given)
            )

    def print(self, printer: x.Printer) -> None:
        printer.print_op_attributes(self.attributes)
        _print_operands_and_types(printer, self.arguments)

    @classmethod
    def parse(cls, parser: x.Parser) -> ReturnOp:
        attributes = parser.parse_optional_attr_dict()
        at = parser.pos
        names = parser.parse_optional_undelimited_comma_separated_list(
            parser.parse_optional_unresolved_operand, parser.parse_unresolved_operand
        )
        operands = []
        if names is not None:
            parser.parse_punctuation(":")
            types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
            operands = parser.resolve_operands(names, types, at)
        return cls.create(operands=operands, attributes=attributes)


@x.irdl_op_definition
class CallOp(x.IRDLOperation):
    """A call of a function of the module:
    ``func.call @callee(%a, %b) {attrs} : (t1, t2) -> (r1)``. Lucid's own graphs never call
    (each is one function); hand-written IR may."""

    name = "func.call"
    arguments = x.var_operand_def()
    callee = x.prop_def(x.FlatSymbolRefAttrConstr)
    res = x.var_result_def()

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

    def verify_(self) -> None:
        name = self.callee.string_value()
        target = x.SymbolTable.lookup_symbol(self, self.callee)
        if not isinstance(target, FuncOp):
            raise x.VerifyException(f"func.call: @{name} is not a function of the module")
        for what, expected, given in (
            ("operand types", target.function_type.inputs.data, self.arguments.types),
            ("result types", target.function_type.outputs.data, tuple(self.result_types)),
        ):
            if expected != given:
                raise x.VerifyException(_mismatch(f"func.call @{name}: {what}", expected, given))

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
        at = parser.pos
        names = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, parser.parse_unresolved_operand
        )
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        signature = parser.parse_function_type()
        return cls.create(
            operands=parser.resolve_operands(names, signature.inputs.data, at),
            result_types=list(signature.outputs.data),
            properties={"callee": callee},
            attributes=attributes,
        )


Func = x.Dialect("func", [FuncOp, CallOp, ReturnOp], [])
