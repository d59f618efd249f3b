"""The documented command for the real-device tests (run_macos_tests.py): it finds a test for
every item of issue 24 that needs the device, and a test that aborts its process is reported as
crashed without stopping the run."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

_spec = importlib.util.spec_from_file_location(
    "mpsgraph_run_macos_tests", pathlib.Path(__file__).with_name("run_macos_tests.py")
)
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def test_every_device_item_has_a_test():
    source = runner.MODULE.read_text()
    items = {int(n) for n in re.findall(r"^def test_(\d+)_", source, re.MULTILINE)}
    assert set(range(1, 16)) <= items, sorted(items)  # 15: half precision


@pytest.mark.slow  # a pytest collection in a child process (about 15 s here)
def test_the_device_module_collects_here_with_a_half_test_per_op_and_type():
    # The one-command run starts from pytest's collection: it must work off the Mac too.
    ids = runner.collect("test_15")
    ops = {
        re.sub(r"\d+$", "", i.split("[")[1].rstrip("]").split("-")[1])
        for i in ids
        if "half_op_on_the_device" in i
    }
    assert {"add", "matmul", "softmax", "conv2d", "reduce_sum", "cast"} <= ops, sorted(ops)
    assert any("copy_free" in i and "bf16" in i for i in ids)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_a_crashing_test_is_reported(tmp_path):
    crash = tmp_path / "test_crash.py"
    crash.write_text("import os\n\ndef test_abort():\n    os.abort()\n")
    kind, detail = runner.outcome(f"{crash}::test_abort")
    assert kind == "crashed" and detail.startswith("signal 6"), (kind, detail)


def test_the_macos_workflow_builds_on_hosted_and_runs_the_device_on_self_hosted():
    text = (runner.REPO / ".github" / "workflows" / "macos.yml").read_text()
    build, device = text.split("\n  device:\n")
    assert "runs-on: macos-14" in build and 'MACOSX_DEPLOYMENT_TARGET: "14.0"' in build
    assert "self-hosted" in device and "matrix:" in device
    assert "macos-14" in device and "macos-15" in device
    assert "tests/backends/mpsgraph/run_macos_tests.py" in device
    assert "python -m lucid.backends.mpsgraph.selfcheck" in device
    # Every repository path the workflow names exists.
    for path in re.findall(r"(?:tests|lucid|native)/[\w/.*-]+", text):
        if "*" not in path:
            assert (runner.REPO / path).exists(), path
