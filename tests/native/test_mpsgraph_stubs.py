"""The committed MPSGraph stub headers are what the generator makes from the SDK metadata."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MPSGRAPH = REPO / "native" / "mpsgraph"
# In CI the shared folder sits beside the checkout.
METADATA = Path(
    os.environ.get("LUCID_MPSGRAPH_METADATA", REPO.parent / "shared" / "mpsgraph-metadata")
)


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"lucid_mpsgraph_{name}", MPSGRAPH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


stubgen = load_tool("stubgen")
needs_metadata = pytest.mark.skipif(
    not (METADATA / "MetalPerformanceShadersGraph").is_dir(),
    reason=f"SDK metadata not found at {METADATA} (set LUCID_MPSGRAPH_METADATA)",
)


@pytest.fixture(scope="module")
def generated():
    return stubgen.generate(METADATA)


@needs_metadata
def test_committed_stubs_match_the_generator(generated):
    problems = stubgen.differences(generated, stubgen.DEFAULT_OUT)
    assert not problems, (
        "stale stubs; run `python native/mpsgraph/stubgen.py` and commit: " + ", ".join(problems)
    )


@needs_metadata
def test_differences_reports_a_changed_header(generated, tmp_path):
    stubgen.write(generated, tmp_path)
    assert stubgen.differences(generated, tmp_path) == []
    header = tmp_path / "MetalPerformanceShadersGraph" / "MetalPerformanceShadersGraph.h"
    header.write_text(header.read_text().replace("additionWithPrimaryTensor", "additionWith"))
    (tmp_path / "stray.h").write_text("")
    assert stubgen.differences(generated, tmp_path) == [
        "stale: MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h",
        "extra: stray.h",
    ]


@needs_metadata
def test_every_mpsgraph_method_is_declared_with_its_availability(generated):
    header = generated["MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h"]
    data = stubgen.load_fwinfo(METADATA / stubgen.METADATA_PATHS["MetalPerformanceShadersGraph"])
    methods = data["classes"]["MPSGraph"]["methods"]
    assert len(methods) > 350
    for method in methods:
        first_keyword = method["selector"].split(":")[0]
        assert f"){first_keyword}" in header, method["selector"]
    assert (
        "- (MPSGraphTensor *)reciprocalSquareRootWithTensor:(MPSGraphTensor *)arg0 "
        "name:(NSString *)arg1 __attribute__((availability(macos,introduced=15.0)));"
    ) in header
    assert "__attribute__((availability(macos,introduced=11.0,deprecated=15.0)))" in header
