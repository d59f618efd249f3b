"""Stage 2: the ``lucid`` dialect (generated from the op registry), Trace import, printing and
parsing, and the reference interpreter. xDSL is reached only through ``lucid.ir._xdsl``.

The names below are imported on first use (PEP 562), so importing a submodule that needs no
IR (``lucid.ir._gc``, used by a compile that a disk-cache hit ends early) loads no xDSL.
"""

from lucid._lazy import lazy_attributes

_HOMES = {
    "ConstantOp": "lucid.ir.dialect",
    "LucidOp": "lucid.ir.dialect",
    "get_op_class": "lucid.ir.dialect",
    "lucid_dialect": "lucid.ir.dialect",
    "feed_roles": "lucid.ir.importer",
    "forward_func": "lucid.ir.importer",
    "import_trace": "lucid.ir.importer",
    "result_roles": "lucid.ir.importer",
    "interpret": "lucid.ir.interpreter",
    "make_context": "lucid.ir.text",
    "parse_ir": "lucid.ir.text",
    "print_ir": "lucid.ir.text",
}
__getattr__ = lazy_attributes(__name__, _HOMES)
__all__ = sorted(_HOMES)
