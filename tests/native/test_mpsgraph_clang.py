"""clang type-checks native/mpsgraph's Objective-C++ against the stub SDK, as Xcode would.

Runs in the default test run: `.ci/run` installs clang (Debian `clang-19 libc++-19-dev
libc6-dev-arm64-cross`). Without it the tests skip locally and fail when `CI` is set. The clang
pass runs in the background from the start of the run (`background_work`), one compiler at a
time, on the core the test run leaves free.
"""

import importlib.util
import os
import shutil
import sys
import tempfile
from concurrent.futures import Future
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MPSGRAPH = REPO / "native" / "mpsgraph"


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"lucid_mpsgraph_{name}", MPSGRAPH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


clang_check = load_tool("clang_check")

PRELUDE = """\
#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>
MPSGraphTensor* emit(MPSGraph* graph, MPSGraphTensor* x) {
"""

# Each snippet: the body of emit(), and the diagnostic clang must give (None: must pass).
SNIPPETS = {
    "misspelled_selector": (
        "return [graph additionWithPrimaryTensor:x secondTensor:x name:nil];",
        "no visible @interface for 'MPSGraph' declares the selector "
        "'additionWithPrimaryTensor:secondTensor:name:'",
    ),
    "wrong_argument_type": (
        "return [graph additionWithPrimaryTensor:x secondaryTensor:@1 name:nil];",
        "cannot initialize a parameter of type 'MPSGraphTensor *' with an rvalue of type "
        "'NSNumber *'",
    ),
    "unguarded_macos15_call": (
        "return [graph reciprocalSquareRootWithTensor:x name:nil];",
        "'reciprocalSquareRootWithTensor:name:' is only available on macOS 15.0 or newer",
    ),
    "guarded_macos15_call": (
        "if (@available(macOS 15.0, *)) {\n"
        "  return [graph reciprocalSquareRootWithTensor:x name:nil];\n"
        "}\n"
        "return [graph reverseSquareRootWithTensor:x name:nil];",
        None,
    ),
}


def toolchain_or_skip():
    try:
        return clang_check.find_toolchain()
    except clang_check.ToolchainMissing as missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the MPSGraph clang check, but: {missing}")
        pytest.skip(f"MPSGraph clang check needs clang: {missing} (.ci/run installs it)")


def check_sources_and_snippets(folder: Path, parallel: bool = True) -> dict:
    """One clang pass over the project's sources and the snippets (written to ``folder``); two
    compilers at a time, or one after the other."""
    toolchain = toolchain_or_skip()
    snippets = {}
    for name, (body, _) in SNIPPETS.items():
        path = folder / f"{name}.mm"
        path.write_text(PRELUDE + body + "\n}\n")
        snippets[name] = path
    sources = clang_check.project_sources(binding=clang_check.binding_checkable() is None)
    files = sources + list(snippets.values())
    if parallel:
        outcome = clang_check.check_files(toolchain, files)
    else:
        outcome = [clang_check.check_file(toolchain, path) for path in files]
    by_path = {result.source: result for result in outcome}
    return {
        "sources": [by_path[s] for s in sources if not s.name.startswith("bind_")],
        "binding": [by_path[s] for s in sources if s.name.startswith("bind_")],
        "snippets": {name: by_path[path] for name, path in snippets.items()},
    }


# The background clang pass of background_work's job (None: no job).
_background_results: Future | None = None


def background_work(items: list[pytest.Item], config: pytest.Config):
    """Called by tests/conftest.py with this module's selected tests: when one needs the clang
    pass, the job it runs in the background, one compiler at a time (the run uses one core)."""
    global _background_results
    if not any("results" in item.fixturenames for item in items):
        return None
    folder = Path(tempfile.mkdtemp(prefix="lucid-mpsgraph-snippets-"))
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(check_sources_and_snippets(folder, parallel=False))
        except BaseException as e:  # noqa: BLE001 - a skip or failure, raised again by `results`
            future.set_exception(e)

    _background_results = future
    return work


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The clang pass over the project's sources and the snippets: the background one, else one
    run now, two compilers at a time."""
    if _background_results is not None:
        return _background_results.result()
    return check_sources_and_snippets(tmp_path_factory.mktemp("mpsgraph_snippets"))


def test_the_project_has_objective_cpp_sources():
    names = {path.name for path in clang_check.project_sources()}
    assert {
        "mpsgraph_runtime.mm",
        "mpsgraph_replay.mm",
        "mpsgraph_native.h",
        "mpsgraph_program.cpp",
        "bind_mpsgraph.cpp",
    } <= names


def test_the_pybind11_binding_type_checks(results):
    why_not = clang_check.binding_checkable()
    if why_not:
        pytest.skip(f"bind_mpsgraph.cpp needs pybind11's headers: {why_not}")
    failed = [f"{r.source.name}:\n{r.output}" for r in results["binding"] if not r.ok]
    assert results["binding"] and not failed, "\n".join(failed)


def test_every_source_type_checks(results):
    failed = [f"{r.source.name}:\n{r.output}" for r in results["sources"] if not r.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", [n for n, (_, message) in SNIPPETS.items() if message])
def test_the_check_catches(results, name):
    result = results["snippets"][name]
    assert not result.ok, f"clang accepted the {name} snippet"
    assert SNIPPETS[name][1] in result.output, result.output


def test_a_guarded_macos15_call_passes(results):
    result = results["snippets"]["guarded_macos15_call"]
    assert result.ok, result.output


def test_the_command_targets_macos14_with_availability_errors(tmp_path):
    toolchain = clang_check.Toolchain("clang", tmp_path, tmp_path)
    command = clang_check.command(toolchain, tmp_path / "x.mm")
    joined = " ".join(command)
    assert "-fsyntax-only -x objective-c++" in joined
    assert "-target arm64-apple-macos14.0" in joined
    assert "-fobjc-arc" in command and "-Werror=unguarded-availability-new" in command
