"""The selector tables agree: Python's (what the emitter may call), the native replay's (what
native/mpsgraph handles, read from clang's AST of the .mm), and Apple's SDK metadata.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from lucid.backends.mpsgraph.selectors import (
    DESCRIPTORS,
    ENUMS,
    MACOS_FLOOR,
    MPS_DTYPES,
    SELECTORS,
    macos_key,
)

REPO = Path(__file__).resolve().parents[2]
MPSGRAPH = REPO / "native" / "mpsgraph"
METADATA = Path(
    os.environ.get("LUCID_MPSGRAPH_METADATA", REPO.parent / "shared" / "mpsgraph-metadata")
)


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"lucid_mpsgraph_{name}", MPSGRAPH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


clang_check = load_tool("clang_check")
stubgen = load_tool("stubgen")


@pytest.fixture(scope="module")
def native():
    """The replay file's tables, from clang's AST (which also type-checks the file)."""
    try:
        toolchain = clang_check.find_toolchain()
    except clang_check.ToolchainMissing as missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the MPSGraph table check, but: {missing}")
        pytest.skip(f"the native table check needs clang: {missing} (.ci/run installs it)")
    return clang_check.tables(toolchain, MPSGRAPH / "mpsgraph_replay.mm")


@pytest.fixture(scope="module")
def sdk():
    path = METADATA / stubgen.METADATA_PATHS["MetalPerformanceShadersGraph"]
    if not path.exists():
        pytest.skip(f"SDK metadata not found at {METADATA} (set LUCID_MPSGRAPH_METADATA)")
    return stubgen.load_fwinfo(path)["classes"]


def sdk_method(sdk, cls: str, selector: str, class_method: bool = False) -> dict:
    for method in sdk[cls]["methods"]:
        if method["selector"] == selector and method["class_method"] == class_method:
            return method
    raise AssertionError(f"{'+' if class_method else '-'}[{cls} {selector}] is not in the SDK")


# ---- Python's table against the SDK ------------------------------------------------------------


@pytest.mark.parametrize("selector", sorted(SELECTORS))
def test_selector_exists_in_the_sdk_with_its_arity_types_and_version(sdk, selector):
    spec = SELECTORS[selector]
    method = sdk_method(sdk, spec.receiver, selector)
    assert len(method["args"]) == spec.arity == selector.count(":")
    for arg, want in zip(method["args"], spec.args, strict=True):
        assert arg["type_name"] == want.objc_type, (selector, arg["name"])
    returned = method["retval"]["type_name"]
    assert (
        returned
        == {"tensor": "MPSGraphTensor *", "tensors": "NSArray<MPSGraphTensor *> *"}[spec.returns]
    )
    introduced = method.get("introduced", "11.0")
    assert spec.introduced == introduced
    # Available at the deployment target, or marked guarded (the native side then needs
    # @available, which the clang check enforces).
    assert macos_key(introduced) <= macos_key(MACOS_FLOOR) or spec.guarded


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_descriptor_fields_and_constructor_exist_in_the_sdk(sdk, name):
    spec = DESCRIPTORS[name]
    constructor = sdk_method(sdk, name, spec.constructor, class_method=True)
    keywords = spec.constructor.split(":")[:-1]
    assert keywords[0].startswith("descriptorWith")
    assert [keywords[0][len("descriptorWith") :].lower(), *[k.lower() for k in keywords[1:]]] == [
        f.lower() for f in spec.constructor_fields
    ]
    assert len(constructor["args"]) == len(spec.constructor_fields)
    for field, field_spec in spec.fields.items():
        setter = sdk_method(sdk, name, f"set{field[0].upper()}{field[1:]}:")
        assert setter["args"][0]["type_name"] == field_spec.objc_type, field
        assert macos_key(setter.get("introduced", "11.0")) <= macos_key(MACOS_FLOOR)


# ---- the native replay table against Python's ---------------------------------------------------


def test_the_replay_table_handles_exactly_the_selector_table(native):
    replayed = [key for key, _ in native["kReplayTable"].entries()]
    assert len(replayed) == len(set(replayed)), "a selector appears twice in the replay table"
    assert set(replayed) - set(SELECTORS) == set(), "replayed but not in SELECTORS"
    assert set(SELECTORS) - set(replayed) == set(), "in SELECTORS but not replayed"


def test_each_replay_entry_sends_its_own_selector_to_the_graph(native):
    for key, sends in native["kReplayTable"].entries():
        to_graph = [selector for selector, receiver in sends if receiver == "MPSGraph *"]
        if SELECTORS[key].guarded:
            assert key in to_graph, key  # plus its fallback for older systems
        else:
            assert to_graph == [key], (key, sends)


# The replay's argument accessors (CallArgs in mpsgraph_replay.mm): the recorded kind each one
# decodes and the Objective-C type it returns (None: checked by clang, e.g. the enum type).
ACCESSORS = {
    "tensor": ("tensor", "MPSGraphTensor *"),
    "tensors": ("tensors", "NSArray<MPSGraphTensor *> *"),
    "integer": ("int", "NSInteger"),
    "uinteger": ("int", "NSUInteger"),
    "uint32": ("int", "uint32_t"),
    "real": ("double", "double"),
    "real_float": ("double", "float"),
    "flag": ("bool", "BOOL"),
    "shape": ("shape", "MPSShape *"),
    "ints": ("ints", "NSArray<NSNumber *> *"),
    "dtype": ("dtype", "MPSDataType"),
    "enumeration": ("enum", None),
    "data": ("constant", "NSData *"),
    "name": ("nil", "NSString *"),
    "convolution2d": ("descriptor", "MPSGraphConvolution2DOpDescriptor *"),
    "pooling2d": ("descriptor", "MPSGraphPooling2DOpDescriptor *"),
}


def test_each_replay_entry_decodes_the_recorded_kinds(native):
    """Argument i of each entry is read with the accessor for SELECTORS' kind and C type of i."""
    entries = native["kReplayTable"].entry_calls()
    assert len(entries) == len(SELECTORS)
    for key, calls in entries:
        spec = SELECTORS[key]
        by_index = {index: accessor for accessor, index in calls if accessor in ACCESSORS}
        assert sorted(by_index) == list(range(spec.arity)), (key, calls)
        for index, want in enumerate(spec.args):
            kind, objc_type = ACCESSORS[by_index[index]]
            assert kind == want.kind, (key, index, by_index[index], want)
            assert objc_type in (None, want.objc_type), (key, index, by_index[index], want)


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_descriptor_tables_match(native, name):
    spec = DESCRIPTORS[name]
    short = name.removeprefix("MPSGraph").removesuffix("OpDescriptor")
    fields = native[f"k{short}Fields"].entries()
    assert {field for field, _ in fields} == set(spec.fields)
    for field, sends in fields:
        assert sends == [(f"set{field[0].upper()}{field[1:]}:", f"{name} *")], field
    assert native[f"k{short}ConstructorFields"].strings() == list(spec.constructor_fields)
    constructor = native[f"k{short}Constructor"]
    assert constructor.sends() == [(spec.constructor, name)]
    assert constructor.strings() == list(spec.constructor_fields)


def test_enum_and_dtype_names_are_known_natively(native):
    pairs = native["kEnumConstants"].strings()
    native_enums = dict(zip(pairs[0::2], pairs[1::2], strict=True))
    for constant, (enum_type, _) in ENUMS.items():
        assert native_enums.get(constant) == enum_type, constant
    native_dtypes = set(native["kDataTypes"].strings())
    assert {name for name, _ in MPS_DTYPES.values()} <= native_dtypes


def test_the_ast_reader_sees_a_mismatched_entry(tmp_path):
    """The table check would notice an entry whose message differs from its key."""
    try:
        toolchain = clang_check.find_toolchain()
    except clang_check.ToolchainMissing as missing:
        pytest.skip(f"needs clang: {missing}")
    source = tmp_path / "table.mm"
    source.write_text(
        "#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>\n"
        "using Fn = MPSGraphTensor* (*)(MPSGraph*, MPSGraphTensor*);\n"
        "struct Entry { const char* selector; Fn fn; };\n"
        "namespace lucid {\n"
        "const Entry kTable[] = {\n"
        '  {"sinWithTensor:name:", [](MPSGraph* g, MPSGraphTensor* x) {\n'
        "     return [g cosWithTensor:x name:nil]; }},\n"
        "};\n"
        "}  // namespace lucid\n"
        "const Entry* use() { return lucid::kTable; }\n"
    )
    entries = clang_check.tables(toolchain, source)["kTable"].entries()
    assert entries == [("sinWithTensor:name:", [("cosWithTensor:name:", "MPSGraph *")])]
