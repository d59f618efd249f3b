"""docs/prim.md carries the prim op table generated from lucid.ir.prim."""

from pathlib import Path

from lucid.ir import prim as prim_ops
from lucid.tools.prim_table import markdown_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "prim.md"


def test_prim_table_in_docs_is_current():
    assert markdown_table() in DOC.read_text(), (
        "docs/prim.md is stale: regenerate its table with `python -m lucid.tools.prim_table`"
    )


def test_every_prim_op_names_an_mpsgraph_method_and_a_cpu_kernel():
    from lucid.backends.mpsgraph.selectors import EMISSIONS

    for op in prim_ops.PRIM_OPS.values():
        assert ":" in EMISSIONS[op.name][0], op.name  # one fact, in the emission table
        assert op.cpu_kernel.split(":")[0].endswith(".cpp"), op.name
        assert (DOC.parent.parent / "native" / "src" / op.cpu_kernel.split(":")[0]).exists()
