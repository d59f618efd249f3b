"""The selector table against Apple's SDK metadata (PyObjC fwinfo) and the emission table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucid.backends.mpsgraph.selectors import (
    DESCRIPTORS,
    EMISSIONS,
    ENUMS,
    INPUT_SELECTORS,
    MACOS_FLOOR,
    MPS_DTYPES,
    SELECTORS,
    emission_macos,
    macos_key,
)
from lucid.ir.prim import PRIM_OPS

METADATA = Path("/work/shared/mpsgraph-metadata")
needs_metadata = pytest.mark.skipif(
    not (METADATA / "MetalPerformanceShadersGraph").is_dir(),
    reason=f"the SDK metadata ({METADATA}) is not on this machine",
)


def _load(framework: str) -> dict:
    path = METADATA / framework / "arm64-26.5.fwinfo"
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("//"))
    return json.loads(text)["definitions"]


def _methods(defs: dict, cls: str) -> dict[str, dict]:
    return {m["selector"]: m for m in defs["classes"][cls]["methods"]}


@needs_metadata
def test_every_selector_exists_with_its_argument_types_and_is_available_on_macos_14():
    graph = _methods(_load("MetalPerformanceShadersGraph"), "MPSGraph")
    for sel, spec in SELECTORS.items():
        assert spec.receiver == "MPSGraph"
        meta = graph.get(sel)
        assert meta is not None, f"{sel} is not an MPSGraph method"
        assert not meta["class_method"], sel
        types = [a["type_name"] for a in meta["args"]]
        assert types == [a.objc_type for a in spec.args], (sel, types)
        ret = meta["retval"]["type_name"]
        want = {"tensor": "MPSGraphTensor *", "tensors": "NSArray<MPSGraphTensor *> *"}
        assert ret == want[spec.returns], (sel, ret)
        assert spec.introduced == meta["introduced"], (sel, meta["introduced"])
        newer = macos_key(meta["introduced"]) > macos_key(MACOS_FLOOR)
        assert newer == spec.guarded, f"{sel}: introduced {meta['introduced']}, guarded wrong"


@needs_metadata
def test_descriptor_fields_and_constructors_match_the_metadata():
    defs = _load("MetalPerformanceShadersGraph")
    for name, spec in DESCRIPTORS.items():
        methods = _methods(defs, name)
        props = {p["name"]: p for p in defs["classes"][name]["properties"]}
        ctor = methods[spec.constructor]
        assert ctor["class_method"]
        assert macos_key(ctor["introduced"]) <= macos_key(MACOS_FLOOR)
        keywords = spec.constructor.split(":")[:-1]
        assert len(keywords) == len(spec.constructor_fields)
        for i, (kw, fld) in enumerate(zip(keywords, spec.constructor_fields, strict=True)):
            # descriptorWithStrideInX:strideInY:... -> the first keyword carries a prefix
            assert kw.lower().endswith(fld.lower()), (kw, fld)
            assert ctor["args"][i]["type_name"] == spec.fields[fld].objc_type
        for fld, fspec in spec.fields.items():
            assert props[fld]["type_name"] == fspec.objc_type, fld
            setter = methods[f"set{fld[0].upper()}{fld[1:]}:"]
            assert setter["introduced"] == fspec.introduced, fld
            assert macos_key(fspec.introduced) <= macos_key(MACOS_FLOOR)


@needs_metadata
def test_enum_and_dtype_values_match_the_metadata():
    enums = _load("MetalPerformanceShadersGraph")["enum"]
    for name, (owner, value) in ENUMS.items():
        assert enums[name] == {"enum": owner, "value": value}
    mps = _load("MetalPerformanceShaders")["enum"]
    for name, value in MPS_DTYPES.values():
        assert mps[name]["value"] == value


def test_the_emission_table_covers_every_prim_op_and_exactly_the_selector_table():
    assert set(EMISSIONS) == set(PRIM_OPS)
    used = set(INPUT_SELECTORS).union(*EMISSIONS.values())
    assert used == set(SELECTORS), used ^ set(SELECTORS)
    for op in EMISSIONS:
        assert macos_key(emission_macos(op)) <= macos_key(MACOS_FLOOR)


def test_the_argument_kinds_are_those_of_the_program_format():
    from lucid.backends.mpsgraph.program import ARG_KINDS

    kinds = {a.kind for s in SELECTORS.values() for a in s.args}
    assert kinds <= set(ARG_KINDS)
    for sel, spec in SELECTORS.items():
        assert sel.count(":") == spec.arity
        assert spec.args[-1].kind == "nil" or sel.startswith("constantWith"), sel


def test_docs_carry_the_current_emission_table():
    from lucid.backends.mpsgraph.selectors import emission_markdown

    doc = Path(__file__).resolve().parents[3] / "docs" / "backend-mpsgraph.md"
    assert emission_markdown() in doc.read_text(), (
        "docs/backend-mpsgraph.md is stale: regenerate its emission table with "
        "lucid.backends.mpsgraph.selectors.emission_markdown()"
    )


def test_the_emitter_and_the_reference_cover_the_tables():
    from lucid.backends.mpsgraph.emit import HANDLED_OPS
    from lucid.backends.mpsgraph.reference import IMPLEMENTED_SELECTORS

    assert HANDLED_OPS == set(PRIM_OPS) == set(EMISSIONS)
    assert IMPLEMENTED_SELECTORS == set(SELECTORS) - set(INPUT_SELECTORS)
