"""What a process's first inference compile imports: only what it runs (each module is paid for
in that first call). Checked in a fresh interpreter, since the test session imports everything."""

import json
import subprocess
import sys

import pytest

_SCRIPT = """
import json, sys
import lucid
from lucid import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
x = lucid.tensor([[1.0, 2.0, 3.0, 4.0]])
compiled = lucid.compile(model)
with lucid.no_grad():
    got = compiled(x)
    want = model(x)
assert abs(got.detach().numpy() - want.detach().numpy()).max() < 1e-5
print(json.dumps(sorted(sys.modules)))
"""

# Training-only parts of the compiler, and xDSL modules the compile path never uses.
_NOT_ON_THE_INFERENCE_PATH = (
    "lucid.compile.inference.grad",
    "lucid.passes.vjp",
    "lucid.passes.partition",
    "lucid.compile.training",
    "lucid.compile.aot",
    "xdsl.universe",
    "xdsl.transforms.common_subexpression_elimination",
)


@pytest.mark.slow  # starts a Python process
def test_an_inference_compile_imports_no_training_or_unused_xdsl_modules():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=300
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "lucid.compile.inference.module" in loaded  # the script did compile
    assert loaded.isdisjoint(_NOT_ON_THE_INFERENCE_PATH), sorted(
        loaded & set(_NOT_ON_THE_INFERENCE_PATH)
    )


@pytest.mark.slow  # starts a Python process
def test_a_grad_mode_compile_still_finds_the_grad_path():
    script = _SCRIPT.replace(".eval()", "").replace(
        "with lucid.no_grad():\n    got = compiled(x)\n    want = model(x)",
        "got = compiled(x)\nwant = model(x)\ngot.sum().backward()",
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    assert "lucid.compile.inference.grad" in json.loads(out.stdout.strip().splitlines()[-1])
