"""The program builder, fuse-elementwise, buffer planning and result placement."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lucid import _native
from lucid.backends.cpu import CPUBackend, FusedNode, Program
from lucid.backends.cpu.fuse_elementwise import fuse_elementwise
from lucid.backends.cpu.program import FUSED
from lucid.ir.prim import PrimError

CHAIN_UNARY = ["neg", "abs", "tanh", "sigmoid", "relu", "square", "sin"]
CHAIN_BINARY = ["add", "sub", "mul", "maximum", "minimum"]


@settings(max_examples=25)
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=1, max_dims=3, max_side=5),
    steps=st.lists(
        st.tuples(st.sampled_from(CHAIN_UNARY + CHAIN_BINARY), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_fused_chains_match_unfused_and_reference(shapes, steps, seed):
    rng = np.random.default_rng(seed)
    p = Program()
    inputs = [p.feed(s) for s in shapes.input_shapes]
    value = p.op("add", inputs[0], inputs[1])
    for op, which in steps:
        value = p.op(op, value, inputs[which]) if op in CHAIN_BINARY else p.op(op, value)
    value = p.op("cast", p.op("gt", value, inputs[2]), dtype="f32")
    p.result(value)
    fused = fuse_elementwise(p)
    assert sum(i.op == FUSED for i in fused.instrs) >= 1
    feeds = [rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes]
    fused_out = CPUBackend(fuse=True, cache=False).compile(p).run(feeds)[0]
    plain_out = CPUBackend(fuse=False, cache=False).compile(p).run(feeds)[0]
    np.testing.assert_array_equal(fused_out, plain_out)
    # the comparison at the end makes tiny rounding differences flip a few elements at most
    assert np.mean(fused_out != p.interpret(feeds)[0]) < 0.05


def test_fusion_stops_at_shared_values_results_and_shape_changes():
    p = Program()
    x, b = p.feed((4, 8)), p.feed((8,))
    shared = p.op("exp", x)  # used twice: not in the chain, merged by the second sweep
    y = p.op("add", p.op("mul", shared, shared), b)
    s = p.op("reduce_sum", y, axes=[1], keepdims=True)  # not elementwise
    z = p.op("tanh", p.op("sub", y, s))
    p.result(z, y)  # y is a result read by reduce_sum before z's group: stays apart
    fused = fuse_elementwise(p)
    ops = [i.op for i in fused.instrs]
    assert ops == [FUSED, "reduce_sum", FUSED]
    assert [n.op for n in fused.instrs[0].nodes] == ["exp", "mul", "add"]
    assert fused.instrs[0].outputs == (y,)
    feeds = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in ((4, 8), (8,))]
    out = CPUBackend(cache=False).compile(p).run(feeds)
    for got, want in zip(out, p.interpret(feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _adam_like(p: Program):
    g, m, v, w, lr = p.feed((6, 5)), p.feed((6, 5)), p.feed((6, 5)), p.feed((6, 5)), p.feed(())
    m2 = p.op("add", p.op("mul", m, lr), g)
    v2 = p.op("add", v, p.op("square", g))
    w2 = p.op("sub", w, p.op("div", m2, p.op("add", p.op("sqrt", v2), lr)))
    return (m2, v2, w2)


def test_producers_needed_elsewhere_merge_into_their_consumer_with_several_outputs():
    p = Program()
    outs = _adam_like(p)
    p.result(*outs)
    for r, f in enumerate((1, 2, 3)):
        p.inplace_result(r, f)
    fused = fuse_elementwise(p)
    (ins,) = fused.instrs
    assert ins.op == FUSED and set(ins.outputs) == set(outs)
    ex = CPUBackend(cache=False).compile(p)
    assert ex.direct_inplace_results == [0, 1, 2]
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal((6, 5)).astype(np.float32) for _ in range(4)]
    feeds[2] = np.abs(feeds[2])
    feeds.append(np.array(0.5, np.float32))
    ref = [f.copy() for f in feeds]
    results = ex.run(feeds)
    p.interpret(ref)
    for k in (1, 2, 3):
        assert any(r is feeds[k] for r in results)
        np.testing.assert_allclose(feeds[k], ref[k], rtol=1e-6, atol=1e-6)


def test_a_value_read_between_producer_and_consumer_is_not_merged():
    p = Program()
    x = p.feed((6, 5))
    m2 = p.op("exp", x)
    total = p.op("reduce_sum", m2, axes=[0, 1])  # reads m2 before its consumer below
    w2 = p.op("mul", m2, total)
    p.result(w2, m2)
    fused = fuse_elementwise(p)
    assert [i.op for i in fused.instrs] == ["exp", "reduce_sum", "mul"]
    feeds = [np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)]
    got = CPUBackend(cache=False).compile(p).run(feeds)
    for a, b in zip(got, p.interpret(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_multi_output_fused_instructions_are_validated():
    p = Program()
    x, y = p.feed((3, 4)), p.feed((4,))
    nodes = [FusedNode("exp", (0,), "f32"), FusedNode("add", (2, 1), "f32")]
    a, b = p.fused_outputs([x, y], nodes, [0, 1])
    p.result(a, b)
    np.testing.assert_allclose(
        CPUBackend(cache=False)
        .compile(p)
        .run([np.ones((3, 4), np.float32), np.ones(4, np.float32)])[1],
        np.full((3, 4), np.e + 1, np.float32),
        rtol=1e-6,
    )
    q = Program()
    u, w = q.feed((3, 4)), q.feed((4,))
    with pytest.raises(PrimError, match="different shapes"):
        q.fused_outputs(
            [u, w], [FusedNode("exp", (1,), "f32"), FusedNode("add", (0, 2), "f32")], [0, 1]
        )
    desc = p.describe()
    desc["instrs"][0][3]["sub_outputs"] = [0, 5]
    with pytest.raises(ValueError, match="sub_outputs entry 5 is not a node"):
        _native.validate(desc)
    desc["instrs"][0][3]["sub_outputs"] = [1]
    with pytest.raises(ValueError, match="2 output slot.*1 sub_outputs"):
        _native.validate(desc)


def test_buffer_planning_reuses_dead_intermediates_without_overlap():
    p = Program()
    x = p.feed((64, 64))
    values = [x]
    for k in range(12):
        values.append(p.op("matmul", values[-1], x) if k % 2 else p.op("tanh", values[-1]))
    p.result(values[-1])
    ex = CPUBackend(fuse=False, cache=False).compile(p)
    assert ex.arena_bytes <= ex.unplanned_bytes // 4
    offsets = ex.arena_offsets
    nbytes = 64 * 64 * 4
    for k, ins in enumerate(p.instrs):
        # A matmul's output never overlaps its inputs; an elementwise op may write exactly over
        # the dying input it reads at the same element, but never partly over one.
        out = ins.outputs[0]
        for s in ins.inputs:
            if offsets[s] >= 0 and offsets[out] >= 0:
                same = offsets[s] == offsets[out] and ins.op == "tanh"
                assert same or abs(offsets[s] - offsets[out]) >= nbytes, (k, s, out)
    assert any(
        offsets[i.inputs[0]] == offsets[i.outputs[0]] >= 0 for i in p.instrs if i.op == "tanh"
    )
    feed = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32) / 8
    np.testing.assert_allclose(ex.run([feed])[0], p.interpret([feed])[0], rtol=1e-4, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 9))
def test_elementwise_outputs_written_over_dying_inputs_match_the_interpreter(seed, n):
    # Chains of same-shape elementwise ops (some read twice, some broadcast), unfused so every
    # op may take over its input's buffer, with a value kept alive past its consumer.
    rng = np.random.default_rng(seed)
    p = Program()
    x, b = p.feed((32, 40)), p.feed((40,))
    values, keep = [x], None
    for k in range(n):
        op = rng.choice(["tanh", "add", "mul", "neg"])
        v = values[-1]
        if op == "tanh" or op == "neg":
            v = p.op(str(op), v)
        elif op == "add":
            v = p.op("add", v, b)
        else:
            v = p.op("mul", v, values[-1])
        values.append(v)
        if k == n // 2:
            keep = v
    p.result(p.op("add", values[-1], keep))
    feeds = [
        rng.standard_normal((32, 40)).astype(np.float32),
        rng.standard_normal(40).astype(np.float32),
    ]
    for fuse in (False, True):
        got = CPUBackend(fuse=fuse, cache=False).compile(p).run([f.copy() for f in feeds])[0]
        np.testing.assert_allclose(got, p.interpret(feeds)[0], rtol=1e-4, atol=1e-5)


def test_results_that_are_feeds_constants_or_repeated_are_copied():
    p = Program()
    x = p.feed((3,))
    c = p.op("constant", shape=(3,), dtype="f32", value=[1.0, 2.0, 3.0])
    y = p.op("add", x, c)
    p.result(y, x, c, y)
    x_in = np.array([10.0, 20.0, 30.0], np.float32)
    y1, x1, c1, y2 = CPUBackend(cache=False).compile(p).run([x_in])
    np.testing.assert_array_equal(y1, [11, 22, 33])
    np.testing.assert_array_equal(y2, y1)
    assert y1 is not y2 and x1 is not x_in
    np.testing.assert_array_equal(x1, x_in)
    np.testing.assert_array_equal(c1, [1, 2, 3])


def test_inplace_results_write_into_the_feed_after_everything_read_it():
    # An SGD step: w <- w - lr * g, and the loss still reads the old w.
    p = Program()
    w, g, lr = p.feed((4,)), p.feed((4,)), p.feed(())
    new_w = p.op("sub", w, p.op("mul", lr, g))
    old_sum = p.op("reduce_sum", w, axes=[0])
    p.result(new_w, old_sum)
    p.inplace_result(0, 0)
    ex = CPUBackend(cache=False).compile(p)
    weights = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    grads = np.ones(4, np.float32)
    updated, total = ex.run([weights, grads, np.array(0.5, np.float32)])
    assert updated is weights
    np.testing.assert_array_equal(weights, [0.5, 1.5, 2.5, 3.5])
    assert total == pytest.approx(10.0)
    ref_w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    p.interpret([ref_w, grads, np.array(0.5, np.float32)])
    np.testing.assert_array_equal(ref_w, weights)


def _sgd_program(read_w_after: bool = False, gather_after: bool = False) -> Program:
    p = Program()
    w, g, lr = p.feed((4,)), p.feed((4,)), p.feed(())
    idx = p.feed((2,), "i64")
    new_w = p.fused([g, lr, w], [FusedNode("mul", (0, 1), "f32"), FusedNode("sub", (2, 3), "f32")])
    outs = [new_w]
    if read_w_after:
        outs.append(p.op("reduce_sum", w, axes=[0]))
    if gather_after:
        outs.append(p.op("gather", g, idx, axis=0))
    p.result(*outs)
    p.inplace_result(0, 0)
    return p


def test_inplace_results_go_straight_into_the_feed_only_when_nothing_can_tell():
    direct = CPUBackend(cache=False).compile(_sgd_program())
    assert direct.direct_inplace_results == [0]
    # The old w is read after the update, or a later index check could fail the run: copy after.
    for p in (_sgd_program(read_w_after=True), _sgd_program(gather_after=True)):
        assert CPUBackend(cache=False).compile(p).direct_inplace_results == []


def test_direct_inplace_update_matches_the_interpreter():
    p = _sgd_program()
    ex = CPUBackend(cache=False).compile(p)
    w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    feeds = [w, np.arange(4, dtype=np.float32), np.array(0.5, np.float32), np.zeros(2, np.int64)]
    ref = [f.copy() for f in feeds]
    (out,) = ex.run(feeds)
    assert out is w
    p.interpret(ref)
    np.testing.assert_array_equal(w, ref[0])


def test_direct_inplace_update_when_the_feeds_share_memory():
    # w and g are the same array: the update must still read g's old values everywhere.
    ex = CPUBackend(cache=False).compile(_sgd_program())
    w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    ex.run([w, w, np.array(0.5, np.float32), np.zeros(2, np.int64)])
    np.testing.assert_array_equal(w, [0.5, 1.0, 1.5, 2.0])


def test_a_failing_run_leaves_inplace_feeds_intact():
    ex = CPUBackend(cache=False).compile(_sgd_program(gather_after=True))
    w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    with pytest.raises(IndexError, match="out of range"):
        ex.run([w, np.ones(4, np.float32), np.array(0.5, np.float32), np.array([0, 9])])
    np.testing.assert_array_equal(w, [1.0, 2.0, 3.0, 4.0])


def test_gemm_weight_update_runs_in_the_weight_buffer_and_matches_the_interpreter():
    # w <- w - lr * (g^T @ x): the accumulate GEMM writes straight into w.
    p = Program()
    w, g, x, lr = p.feed((3, 5)), p.feed((4, 3)), p.feed((4, 5)), p.feed(())
    new_w = p.op("matmul_accumulate", g, x, w, p.op("neg", lr), transpose_a=True)
    p.result(new_w)
    p.inplace_result(0, 0)
    ex = CPUBackend(cache=False).compile(p)
    assert ex.direct_inplace_results == [0]
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (4, 3), (4, 5))]
    feeds.append(np.array(0.1, np.float32))
    ref = [f.copy() for f in feeds]
    (out,) = ex.run(feeds)
    assert out is feeds[0]
    p.interpret(ref)
    np.testing.assert_allclose(feeds[0], ref[0], rtol=1e-5, atol=1e-6)


def test_gemm_accumulating_into_a_feed_it_also_multiplies_is_copied_after():
    p = Program()
    w, lr = p.feed((3, 3)), p.feed(())
    p.result(p.op("matmul_accumulate", w, w, w, lr))
    p.inplace_result(0, 0)
    ex = CPUBackend(cache=False).compile(p)
    assert ex.direct_inplace_results == []
    w0 = np.arange(9, dtype=np.float32).reshape(3, 3)
    w = w0.copy()
    ex.run([w, np.array(0.5, np.float32)])
    np.testing.assert_allclose(w, w0 + 0.5 * (w0 @ w0))


def test_builder_rejects_bad_programs_early_with_the_op_name():
    p = Program()
    x = p.feed((2, 3))
    with pytest.raises(PrimError, match="prim.matmul"):
        p.op("matmul", x, x)
    with pytest.raises(PrimError, match="unknown prim op"):
        p.op("nope", x)
    with pytest.raises(PrimError, match="missing attribute 'axes'"):
        p.op("reduce_sum", x)
    with pytest.raises(PrimError, match="slot 7"):
        p.op("exp", 7)
    with pytest.raises(PrimError, match="dtype bool but exp gives f32"):
        p.fused([x], [FusedNode("exp", (0,), "bool")])

    # The arity and half-operand errors are the prim table's, word for word.
    with pytest.raises(PrimError, match=r"prim.exp: takes 1 operand\(s\), got 2"):
        p.op("exp", x, x)
    h = p.feed((2, 3), "f16")
    with pytest.raises(PrimError, match="exp does not take f16 operands"):
        p.op("exp", h)


def test_instructions_share_one_aval_per_shape_and_dtype_and_match_the_rule():
    p = Program()
    x = p.feed((2, 3))
    a, b = p.op("exp", x), p.op("tanh", x)
    s = p.op("reduce_sum", a, axes=(1,))
    c = p.op("cast", s, dtype="f64")
    assert p.slots[a] is p.slots[b] is p.slots[x]
    assert (p.slots[s].shape, p.slots[s].dtype) == ((2,), "f32")
    assert (p.slots[c].shape, p.slots[c].dtype) == ((2,), "f64")
    assert p.instrs[-2].attrs == {"axes": (1,), "keepdims": False}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("instrs", 1, 1), [0, "a"], "instruction 1 inputs must hold ints"),
        (("instrs", 0, 2), 5, "instruction 0 outputs must be a list of ints"),
        (("instrs", 1, 1), [2**40], "instruction 1 inputs: slot 1099511627776 out of range"),
        (("slots", 2, 0), [2, "x"], "slot 2 shape must hold ints"),
        (("feeds",), ["a"], "feeds must hold ints"),
        (("results",), [2**70], "results: 1180591620717411303424 does not fit in 64 bits"),
    ],
)
def test_malformed_descriptions_name_the_place(path, value, message):
    # The native parser spells a place out only when something there is wrong.
    p = Program()
    x = p.feed((2,))
    p.result(p.op("tanh", p.op("exp", x)))
    desc = p.describe()
    desc["instrs"] = [list(i) for i in desc["instrs"]]
    desc["slots"] = [list(s) for s in desc["slots"]]
    target = desc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError) as info:
        _native.validate(desc)
    assert message in str(info.value)


def test_dump_is_readable():
    p = Program()
    x = p.feed((2,))
    p.result(p.op("exp", x))
    text = p.dump()
    assert "%1: f32[2] = exp(%0)" in text and "return %1" in text
    assert "exp(%0)" in CPUBackend(cache=False).compile(p).dump()


def test_backend_reports_every_prim_and_composite_op_as_supported():
    from lucid.ir import prim as prim_ops

    every = frozenset(prim_ops.PRIM_OPS) | frozenset(prim_ops.COMPOSITE_OPS)
    assert CPUBackend().supported_ops() == every


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(3, 40))
def test_random_graphs_of_shared_values_fuse_to_the_same_values(seed, size):
    # Values read several times, results among them and reductions in between: the second sweep
    # merges several producers into one consumer (its nodes numbered once, at the end).
    rng = np.random.default_rng(seed)
    p = Program()
    full = [p.feed((3, 4)), p.feed((3, 4))]
    row = p.feed((4,))
    for _ in range(size):
        pick = full[int(rng.integers(len(full)))]
        kind = int(rng.integers(6))
        if kind < 2:
            full.append(p.op(CHAIN_UNARY[int(rng.integers(len(CHAIN_UNARY)))], pick))
        elif kind < 5:
            other = row if kind == 4 else full[int(rng.integers(len(full)))]
            full.append(p.op(CHAIN_BINARY[int(rng.integers(len(CHAIN_BINARY)))], pick, other))
        else:
            full.append(p.op("add", pick, p.op("reduce_sum", pick, axes=[1], keepdims=True)))
    chosen = rng.choice(len(full) - 2, size=min(3, len(full) - 2), replace=False) + 2
    p.result(full[-1], *(full[int(i)] for i in chosen))
    feeds = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (3, 4), (4,))]
    fused = fuse_elementwise(p)
    assert len(fused.instrs) <= len(p.instrs)
    for got, want in zip(fused.interpret(feeds), p.interpret(feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _compiled_programs(monkeypatch, build_and_run):
    """The fused programs the CPU backend hands to the native compile while ``build_and_run``
    runs."""
    from lucid.backends.cpu import backend as cpu_backend

    programs = []
    original = cpu_backend.CPUBackend._fused

    def recording(self, program):
        fused = original(self, program)
        programs.append(fused)
        return fused

    monkeypatch.setattr(cpu_backend.CPUBackend, "_fused", recording)
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE", raising=False)
    build_and_run()
    return programs


def _transformer_training_step():
    """Compile and run one fused training step of a small transformer layer (attention, layer
    norms, GELU-free FFN, Adam's multi-output fused updates)."""
    import lucid
    import lucid.nn as nn

    lucid.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    opt = lucid.optim.Adam(layer.parameters(), lr=1e-3)
    step = lucid.compile.fused_step(layer, lambda y: (y * y).mean(), opt, backend="cpu")
    step(lucid.randn(2, 4, 16))


def test_the_program_handed_over_in_place_parses_as_its_description(monkeypatch):
    # describe(copy=False) hands the native compile the Avals and Instrs themselves; it must
    # read them exactly as the plain description (what export_program writes): fused nodes
    # with several outputs, layer norm epsilons, attention and gemm attributes.
    programs = _compiled_programs(monkeypatch, _transformer_training_step)
    assert programs
    fused = [i for p in programs for i in p.instrs if i.op == FUSED]
    assert any(i.out_nodes is not None for i in fused), "no multi-output fused instruction"
    assert any("epsilon" in n.attrs for i in fused for n in i.nodes) or any(
        "epsilon" in i.attrs for p in programs for i in p.instrs
    )
    for p in programs:
        shared, plain = p.describe(copy=False), p.describe()
        assert shared["instrs"] is p.instrs and shared["slots"] is p.slots
        assert _native.dump_program(shared) == _native.dump_program(plain)
        assert _native.structural_hash(shared) == _native.structural_hash(plain)


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda p: p.instrs.append(object()), "must be (opcode, inputs, outputs, attrs) or an"),
        (lambda p: p.slots.__setitem__(0, 3), "slot 0 must be (shape, dtype) or an Aval"),
        (
            lambda p: p.instrs.__setitem__(
                0, FusedInstrWith(FusedNode("exp", (0,), "f32"), dtype=5)
            ),
            "a node's op and dtype must be strings",
        ),
        (
            lambda p: p.instrs.__setitem__(0, FusedInstrWith(object())),
            "must be a FusedNode",
        ),
    ],
    ids=["not an instruction", "not a slot", "node dtype", "not a node"],
)
def test_a_malformed_program_handed_over_in_place_raises_value_error(break_it, message):
    p = Program()
    x = p.feed((3,))
    p.result(p.fused([x], [FusedNode("exp", (0,), "f32"), FusedNode("neg", (1,), "f32")]))
    break_it(p)
    with pytest.raises(ValueError, match=re.escape(message)):
        _native.compile(p.describe(copy=False), False)


class FusedInstrWith:
    """A fused instruction whose one node is ``node`` (its dtype replaced when given)."""

    def __init__(self, node, dtype=None):
        self.op, self.inputs, self.outputs, self.attrs, self.out_nodes = (
            "fused",
            (0,),
            (1,),
            {},
            None,
        )
        if dtype is not None:
            node = type("Node", (), {"op": node.op, "args": node.args, "dtype": dtype, "attrs": {}})
        self.nodes = (node,)


def test_instructions_without_attributes_share_one_dict_that_compiles_leave_empty(monkeypatch):
    # Program.append gives every attribute-less instruction one shared dict; a rewrite that
    # edited an instruction's attributes in place would change every other instruction's.
    from lucid.backends.cpu import program as program_module

    p = Program()
    x = p.feed((3,))
    p.result(p.op("tanh", p.op("exp", x)))
    assert p.instrs[0].attrs is p.instrs[1].attrs is program_module._NO_ATTRS

    assert _compiled_programs(monkeypatch, _transformer_training_step)
    assert program_module._NO_ATTRS == {}
