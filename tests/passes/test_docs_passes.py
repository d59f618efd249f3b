"""docs/passes.md stays true: its Python examples run, and its pass does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import lucid
from lucid.ir import import_trace, interpret, print_ir
from lucid.passes import PassManager, register_pass
from lucid.passes import registry as pass_registry
from lucid.trace import trace

DOC = Path(__file__).resolve().parents[2] / "docs" / "passes.md"


def test_tutorial_examples_run_and_the_pass_rewrites():
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", DOC.read_text(), re.S)  # any markers
    ns: dict = {}
    for block in blocks[:3]:  # the IR example, the pattern, the pass
        exec(block, ns)
    assert "lucid.matmul" in print_ir(ns["module"])
    register_pass(ns["StrengthReduce"])
    try:
        exec(blocks[3], ns)  # running it from Python
        assert set(ns["report"].passes_ms()) == {"canonicalize", "strength-reduce", "cse", "dce"}
        exec(blocks[4], ns)  # the before/after interpretation check

        a = lucid.tensor(np.arange(3, dtype=np.float32))
        m = import_trace(trace(lambda t: (t * 2).exp(), a))
        before = interpret(m, [a.numpy()])
        PassManager("strength-reduce{max-rounds=1},dce", verify_each=True).run(m)
        text = print_ir(m)
        assert "lucid.add %0, %0" in text and "lucid.mul" not in text
        np.testing.assert_allclose(interpret(m, [a.numpy()])[0], before[0], rtol=1e-6)
    finally:
        pass_registry._PASSES.pop("strength-reduce", None)
