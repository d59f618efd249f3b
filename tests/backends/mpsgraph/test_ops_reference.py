"""Every registry op through the MPSGraph emission and the reference builder, against eager.

The samples are those of ``tests/passes/test_lower_to_prim_ops.py`` (random shapes, values and
attributes per op): trace -> import -> lower-to-prim -> mpsgraph-legalize -> emit -> reference run.
A sample with a float64 value must be refused by the legalization with a reason naming float64.
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.backends.mpsgraph.legalize import MPSGraphUnsupported
from lucid.ir import print_ir
from lucid.ir.prim_interpreter import interpret_prim
from lucid.passes.lower_to_prim import lower_module

_spec = importlib.util.spec_from_file_location(
    "lower_to_prim_samples_mps",
    pathlib.Path(__file__).parents[2] / "passes" / "test_lower_to_prim_ops.py",
)
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

CASES = samples.CASES
BACKEND = MPSGraphReferenceBackend()


def _has_f64(module) -> bool:
    return "xf64>" in print_ir(module) or "tensor<f64>" in print_ir(module)


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_op_through_mpsgraph_reference_matches_eager(name, i):
    rng = np.random.default_rng(1000 + i + sum(map(ord, name)))
    operands, attrs = samples.SAMPLES[name][i](rng)
    module, arrays, eager = samples.build(name, operands, attrs)
    lower_module(module)
    reference = interpret_prim(module, arrays)
    try:
        executable = BACKEND.compile(module, inplace_updates=False)
    except MPSGraphUnsupported as e:
        # Refused only for a float64 value somewhere in the lowered module (MPSGraph has none).
        assert "float64" in e.reason and _has_f64(module), e
        return
    got = executable.run([np.array(a) for a in arrays])
    assert len(got) == len(eager)
    for k, (g, ref, want) in enumerate(zip(got, reference, eager, strict=True)):
        samples.assert_same(g, ref, f"{name} output {k}: mpsgraph-reference vs prim interpreter")
        samples.assert_same(g, want, f"{name} output {k}: mpsgraph-reference vs eager")
