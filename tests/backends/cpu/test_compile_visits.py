"""The CPU backend's compile stages stay linear in the program, guarded without a clock: the
visits each stage counts (``lucid.ir.visits``) per instruction must not grow with the program
(tests/passes/test_compile_complexity.py does the same for the transformer, the chain and the
MLP; here the compile-scaling benchmark's LSTM unrolled in ``forward``, whose recurrent weight
is read once per step, and its ResNet). And ``Graph.each``, through which every fuse-kernels
rewrite walks the program, meets the instructions a whole-list walk would meet while the
rewrite edits the list."""

from __future__ import annotations

import os
import random
import sys
from contextlib import nullcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid.backends.cpu.program import Instr, Program
from lucid.backends.cpu.rewrites.match import Graph
from lucid.ir import visits

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
sys.path.insert(0, BENCH)

import scaling_models as SM  # noqa: E402

BACKEND_STAGES = ("emit", "fuse-kernels", "fuse-elementwise")
GROWTH = 8
SLACK = 1.25  # as tests/passes/test_compile_complexity.py: a quadratic stage grows 64x


@pytest.fixture(autouse=True)
def _compile_every_time(monkeypatch):
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE", raising=False)


def _scaling_model(name: str, size: int):
    """The compile-scaling benchmark's ``name`` model of ``size`` and its input."""
    return SM.lucid_model(name, size), lucid.tensor(SM.input_array(name, size))


def _backend_visits(name: str, size: int, train: bool):
    model, x = _scaling_model(name, size)
    if train:
        opt = lucid.optim.Adam(model.parameters(), lr=1e-3)
        run = lucid.compile.fused_step(model, lambda y: (y * y).mean(), opt, backend="cpu")
    else:
        model.eval()
        run = lucid.compile(model, backend="cpu")
    with visits.counting() as counts, nullcontext() if train else lucid.no_grad():
        run(x)
    return {s: counts[s] for s in BACKEND_STAGES}


@pytest.mark.parametrize(
    ("name", "size", "train"),
    [
        ("lstm", 3, True),
        ("lstm", 3, False),
        ("resnet", 1, True),
        pytest.param("transformer", 2, True, marks=pytest.mark.slow),
    ],
    ids=["lstm-train", "lstm-infer", "resnet-train", "transformer-train"],
)
def test_backend_visits_per_instruction_stay_bounded_as_the_program_grows(name, size, train):
    small = _backend_visits(name, size, train)
    big = _backend_visits(name, GROWTH * size, train)
    assert all(small.values()), f"a backend stage counted nothing: {small}"
    grown = {s: round(big[s] / small[s], 1) for s in BACKEND_STAGES}
    assert all(r <= GROWTH * SLACK for r in grown.values()), f"grew faster than 8x: {grown}"


def _edit_walk(instrs: list[Instr | None], ops: tuple[str, ...], reverse: bool, seed: int, walk):
    """Walk ``instrs`` with ``walk`` and at every instruction met, edit the list as a rewrite
    might (a position before or after this one gets a new instruction or none), the edits
    drawn from ``seed`` in the order met: the positions met, in order."""
    rng = random.Random(seed)
    met = []
    for k, ins in walk():
        met.append((k, ins.op))
        for _ in range(rng.randrange(3)):
            p = rng.randrange(len(instrs))
            new = None if rng.random() < 0.3 else Instr(rng.choice("abc"), (), (1000 + p,), {})
            yield p, new
    yield None, met


def _run(program_ops: list[str], ops, reverse: bool, seed: int, use_graph: bool):
    instrs: list[Instr | None] = [Instr(op, (), (k,), {}) for k, op in enumerate(program_ops)]
    program = Program()
    graph = Graph(program, instrs)

    def whole_list():
        order = reversed(range(len(instrs))) if reverse else range(len(instrs))
        for k in order:
            ins = instrs[k]
            if ins is not None and ins.op in ops:
                yield k, ins

    walk = (lambda: graph.each(*ops, reverse=reverse)) if use_graph else whole_list
    for p, new in _edit_walk(instrs, ops, reverse, seed, walk):
        if p is None:
            return new, [None if i is None else i.op for i in instrs]
        graph.set(p, new)
    raise AssertionError("unreachable")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("abc"), min_size=1, max_size=30),
    st.sampled_from([("a",), ("a", "b"), ("c", "a")]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_each_meets_what_a_whole_list_walk_meets_while_the_list_is_edited(
    program_ops, ops, reverse, seed
):
    assert _run(program_ops, ops, reverse, seed, True) == _run(
        program_ops, ops, reverse, seed, False
    )


def test_each_counts_the_instructions_of_its_opcodes_not_the_program():
    instrs: list[Instr | None] = [Instr("tanh", (), (k,), {}) for k in range(1000)]
    instrs[500] = Instr("mul", (), (500,), {})
    graph = Graph(Program(), instrs)
    with visits.counting() as counts:
        assert [k for k, _ in graph.each("mul")] == [500]
    assert counts["fuse-kernels"] == 1


def test_only_reader_asks_the_use_count_before_building_the_readers():
    # Slot 0 is read by every instruction: the use count says "not one reader" at once, with no
    # readers table built (a walk of the program) nor a sorted list of its 1000 readers.
    instrs: list[Instr | None] = [Instr("exp", (0,), (k + 1,), {}) for k in range(1000)]
    graph = Graph(Program(), instrs)
    with visits.counting() as counts:
        assert graph.only_reader(0, "exp") is None
        assert graph.only_reader(1000, "exp") is None  # read by nothing
    assert counts["fuse-kernels"] == 0
    instrs.append(Instr("tanh", (1000,), (1001,), {}))
    graph = Graph(Program(), instrs)
    assert graph.only_reader(1000, "tanh") == (1000, instrs[1000])
    assert graph.only_reader(1000, "exp") is None


def test_a_program_without_attention_or_pads_is_walked_once_by_fuse_kernels(monkeypatch):
    # A ResNet's training step has no attention, no pads and one product; its optimizer is
    # thousands of muls and adds. fuse-kernels builds its tables (one walk), the gemm folds
    # visit the muls and adds, and nothing else: no readers table (a second whole walk, which
    # fold_attention built before matching the pattern) and no producer asked per operand.
    import lucid.backends.cpu.rewrites as rewrites

    sizes = []
    original = rewrites.fuse_kernels

    def recording(program):
        sizes.append(len(program.instrs))
        return original(program)

    monkeypatch.setattr(rewrites, "fuse_kernels", recording)
    model, x = _scaling_model("resnet", 4)
    opt = lucid.optim.Adam(model.parameters(), lr=1e-3)
    step = lucid.compile.fused_step(model, lambda y: (y * y).mean(), opt, backend="cpu")
    with visits.counting() as counts:
        step(x)
    (n,) = sizes
    assert counts["fuse-kernels"] <= 2 * n, (counts["fuse-kernels"], n)


def test_fold_padded_sums_skips_a_program_with_fewer_than_two_pads():
    from lucid.backends.cpu.rewrites.attention import fold_padded_sums
    from lucid.ir.prim import Aval

    program = Program()
    program.slots = [Aval((4,), "f32") for _ in range(1001)]
    instrs: list[Instr | None] = [Instr("add", (k, k), (k + 1,), {}) for k in range(1000)]
    graph = Graph(program, instrs)
    with visits.counting() as counts:
        fold_padded_sums(graph)
    assert counts["fuse-kernels"] == 0
