"""Walks the op registry: every op has each part, or an explicit, reasoned mark."""

import inspect

import pytest

import lucid  # noqa: F401
from lucid.ops import REGISTRY
from lucid.tools.coverage import markdown, vjp_status


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_has_kernel_inference_and_gradient_decision(name):
    op = REGISTRY[name]
    assert callable(op.kernel) and callable(op.infer)
    assert vjp_status(op) != "MISSING", (
        f"op {name!r} has no VJP rule, is not a grad sink, and gives no reason in "
        "unsupported['vjp']"
    )
    params = inspect.signature(op.kernel).parameters
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for attr in op.attrs:
        assert has_var_kw or attr in params, f"{name}: kernel does not take attribute {attr!r}"


def test_coverage_table_lists_every_op():
    text = markdown()
    for name in REGISTRY:
        assert f"| {name} |" in text


def test_docs_ops_md_is_current():
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ops.md"
    assert path.read_text() == markdown(), (
        "docs/ops.md is stale: regenerate it with `python -m lucid.tools.coverage > docs/ops.md`"
    )
