"""Golden recorded programs for a few small graphs (the exact MPSGraph calls the native side
replays). Regenerate after an intended change with::

    LUCID_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/backends/mpsgraph/test_golden.py

and review the diff of tests/backends/mpsgraph/golden/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import lucid.nn.functional as F
from lucid._tensor import Tensor
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend, dump_program
from lucid.backends.mpsgraph.program import validate
from lucid.backends.mpsgraph.symbolic import symbolic_dims
from lucid.ir import import_trace
from lucid.passes import PassManager
from lucid.trace import trace

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("LUCID_REGEN_GOLDEN") == "1"


def _lowered(fn, *shapes_dtypes):
    arrays = [np.zeros(s, d) for s, d in shapes_dtypes]
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("canonicalize,cse,dce,lower-to-prim,prim-simplify").run(module)
    return module


def _linear_relu(x, w, b):
    return F.relu(F.linear(x, w, b))


def _conv_pool(x, w):
    return F.max_pool2d(F.conv2d(x, w, stride=(2, 1), padding=1), 2)


def _embedding(idx, table):
    return F.embedding(idx, table).sum(-1)


def _programs() -> dict[str, dict]:
    backend = MPSGraphReferenceBackend()
    f32, i64 = np.float32, np.int64
    out = {
        "linear_relu": _lowered(_linear_relu, ((2, 3), f32), ((4, 3), f32), ((4,), f32)),
        "conv_pool": _lowered(_conv_pool, ((1, 2, 6, 5), f32), ((3, 2, 3, 3), f32)),
        "embedding": _lowered(_embedding, ((3,), i64), ((5, 2), f32)),
    }
    programs = {name: backend.record(m)[0] for name, m in out.items()}
    a = _lowered(_linear_relu, ((2, 3), f32), ((4, 3), f32), ((4,), f32))
    b = _lowered(_linear_relu, ((5, 3), f32), ((4, 3), f32), ((4,), f32))
    programs["linear_relu_symbolic"] = backend.record(a, symbolic=symbolic_dims(a, b))[0]
    return programs


NAMES = ["conv_pool", "embedding", "linear_relu", "linear_relu_symbolic"]


@pytest.fixture(scope="module")
def programs() -> dict[str, dict]:
    return _programs()


def test_the_golden_names_are_the_programs(programs):
    assert sorted(programs) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_recorded_program_matches_its_golden(name, programs):
    program = programs[name]
    path = GOLDEN / f"{name}.json"
    text = json.dumps(program, indent=1, sort_keys=True) + "\n"
    if REGEN:
        path.write_text(text)
        (GOLDEN / f"{name}.txt").write_text(dump_program(program))
    golden = json.loads(path.read_text())
    validate(golden)
    assert program == golden, f"{name}: the emitted program changed\n{dump_program(program)}"
    assert (GOLDEN / f"{name}.txt").read_text() == dump_program(program)


def test_the_goldens_say_what_they_should(programs):
    conv = next(
        c for c in programs["conv_pool"]["calls"] if c["selector"].startswith("convolution2D")
    )
    fields = conv["args"][2]["fields"]
    # stride (2, 1) as (height, width): X is the width axis, Y the height axis
    assert (fields["strideInY"], fields["strideInX"]) == (2, 1)
    assert fields["dataLayout"].endswith("NCHW") and fields["weightsLayout"].endswith("OIHW")
    assert programs["embedding"]["checks"], "an embedding lookup carries its range check"
    assert programs["linear_relu_symbolic"]["placeholders"][0]["shape"] == [-1, 3]
    assert programs["linear_relu"]["placeholders"][0]["shape"] == [2, 3]
