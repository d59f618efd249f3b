"""Compile-time complexity, guarded without a clock: every stage counts the instructions it
visits (``lucid.ir.visits``); compiling a program 8x larger must cost each stage at most about
8x the visits. A stage that rescans the whole program per rewrite (as fuse-kernels once rebuilt
its use-def graph per candidate) grows its visits with the square of the size and fails here."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.ir import visits

GROWTH = 8
# Visits may grow a little faster than the program (a fixed prologue does not, so most stages
# stay under 8x); a quadratic stage would grow 64x.
SLACK = 1.25


@pytest.fixture(autouse=True)
def _compile_every_time(monkeypatch):
    # A program served from the disk cache runs no stage: nothing would be counted.
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE", raising=False)


def _chain(pairs: int, backend: str = "cpu"):
    """``lucid.compile`` inference of ``pairs`` (x * c, tanh) pairs."""
    x = lucid.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))

    def f(x):
        for _ in range(pairs):
            x = (x * 0.999).tanh()
        return x

    cf = lucid.compile(f, backend=backend)
    return lambda: cf(x), lambda: f(x)


def _adam_step(model: nn.Module, x, backend: str = "cpu"):
    opt = lucid.optim.Adam(model.parameters(), lr=1e-3)
    step = lucid.compile.fused_step(model, lambda y: (y * y).mean(), opt, backend=backend)
    return lambda: step(x), None


def _transformer(depth: int, backend: str = "cpu"):
    """``fused_step`` (Adam) of a pre-LN transformer stack, d = 16, 2 heads, GELU."""
    lucid.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        16, 2, 32, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    x = lucid.tensor(np.random.default_rng(0).standard_normal((2, 4, 16)).astype(np.float32))
    return _adam_step(nn.TransformerEncoder(layer, depth), x, backend)


# The MPSGraph emission (legalize, emit, bind), recorded and run by its numpy reference builder.
def _chain_mpsgraph(pairs: int):
    return _chain(pairs, "mpsgraph-reference")


def _transformer_mpsgraph(depth: int):
    return _transformer(depth, "mpsgraph-reference")


def _mlp(layers: int):
    """``fused_step`` (Adam) of a deep ReLU MLP."""
    lucid.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(8, 8), nn.ReLU())])
    x = lucid.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    return _adam_step(model, x)


def _visits(build, size: int):
    run, _ = build(size)
    with visits.counting() as counts:
        run()
    return counts


# (case, base size, stages that must have counted: the ones this case exercises)
CASES = [
    (_chain, 25, {"import", "canonicalize", "cse", "dce", "lower-to-prim", "prim-simplify"}),
    (
        _transformer,
        1,
        {"vjp", "ghost-grads", "lower-to-prim", "emit", "fuse-kernels", "fuse-elementwise"},
    ),
    (_mlp, 4, {"vjp", "optimizer-fusion", "lower-to-prim", "fuse-kernels", "fuse-elementwise"}),
    (_chain_mpsgraph, 25, {"prim-simplify", "mpsgraph-legalize", "mpsgraph-emit"}),
    (_transformer_mpsgraph, 1, {"vjp", "lower-to-prim", "mpsgraph-legalize", "mpsgraph-emit"}),
]


@pytest.mark.parametrize(
    ("build", "size", "stages"), CASES, ids=lambda c: getattr(c, "__name__", "")
)
def test_visits_per_instruction_stay_bounded_as_the_program_grows(build, size, stages):
    small = _visits(build, size)
    big = _visits(build, GROWTH * size)
    assert stages <= set(small), f"stages that counted nothing: {sorted(stages - set(small))}"
    grown = {s: big[s] / small[s] for s in small if small[s]}
    superlinear = {s: round(r, 1) for s, r in grown.items() if r > GROWTH * SLACK}
    assert not superlinear, f"visits grew faster than the program ({GROWTH}x): {superlinear}"


def _collections(build, size: int) -> list[int]:
    """The generation of every collection the cyclic collector ran during the first call."""
    run, _ = build(size)
    seen: list[int] = []

    def note(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    was = gc.isenabled()
    gc.enable()
    gc.callbacks.append(note)
    try:
        run()
    finally:
        gc.callbacks.remove(note)
        (gc.enable if was else gc.disable)()
    return seen


@pytest.mark.parametrize(("build", "size"), [(_chain, 25), (_transformer, 1)], ids=["chain", "tf"])
def test_collections_per_compile_stay_bounded_as_the_program_grows(build, size):
    # A whole compile is one collector pause ended by one young collection (lucid.ir._gc).
    # Left on, the collector ran once per ~700 allocations, and fully (over the whole heap)
    # whenever the heap grew by a quarter: its work grew faster than the program.
    small = _collections(build, size)
    big = _collections(build, GROWTH * size)
    assert 2 not in big, f"a full collection during the first call: {big}"
    assert len(big) <= max(len(small), 2), f"collections grew with the program: {small} -> {big}"


def test_the_check_catches_a_stage_that_rescans_per_rewrite():
    # The measure itself: a stage that walks the whole program once per instruction.
    def quadratic(n: int):
        with visits.counting() as counts:
            for _ in range(n):
                visits.count("rescan", n)
        return counts["rescan"]

    assert quadratic(GROWTH * 10) / quadratic(10) > GROWTH * SLACK


def test_counting_is_off_outside_a_block_and_nested_blocks_add_up():
    visits.count("nowhere", 5)  # no block open: nothing to record into
    with visits.counting() as outer:
        visits.count("a")
        with visits.counting() as inner:
            visits.count("a", 2)
        assert inner["a"] == 2
    assert outer["a"] == 3 and "nowhere" not in outer
