"""The one-pass optimizer update kernels (native/src/optim.cpp): which fused chains run through
them (Adam/AdamW, RMSprop, Adagrad), and that they give the generic evaluator's and eager
Lucid's exact bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import optim
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.program import FusedNode
from lucid.compile import compile_optimizer
from lucid.ir.prim import NUMPY_DTYPES

# (optimizer, options, the kernel its update runs through)
CONFIGS = [
    (optim.Adam, dict(lr=0.01), "adam"),
    (optim.Adam, dict(lr=0.01, amsgrad=True), "adam"),
    (optim.Adam, dict(lr=0.01, maximize=True, betas=(0.8, 0.99)), "adam"),
    (optim.Adam, dict(lr=0.01, weight_decay=0.1), "adam"),
    (optim.Adam, dict(lr=0.01, weight_decay=0.1, maximize=True, amsgrad=True), "adam"),
    (optim.AdamW, dict(lr=0.01), "adam"),
    (optim.AdamW, dict(lr=0.01, weight_decay=0.05, amsgrad=True, maximize=True), "adam"),
    (optim.RMSprop, dict(lr=0.01), "rmsprop"),
    (optim.RMSprop, dict(lr=0.01, alpha=0.9, weight_decay=0.01, maximize=True), "rmsprop"),
    (optim.Adagrad, dict(lr=0.1), "adagrad"),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, maximize=True), "adagrad"),
    # Not recognized (generic evaluator), still eager's bits.
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5), ""),
]
IDS = [f"{cls.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for cls, kw, _ in CONFIGS]
# One tensor below the kernel's split threshold, one above it (two threads when the pool has
# them), one with a tail that is not a whole vector.
SHAPES = [(37,), (260, 130), (7, 11, 13)]


def _params(dtype: str, seed: int = 0) -> list[lucid.Tensor]:
    rng = np.random.default_rng(seed)
    return [lucid.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in SHAPES]


def _set_grads(params: list[lucid.Tensor], step: int, dtype: str) -> None:
    rng = np.random.default_rng(100 + step)
    for p in params:
        g = np.sin(p.numpy() * 3.0) + 0.5 * rng.standard_normal(p.shape)
        p.grad = lucid.tensor(g.astype(dtype))


def _executables(step) -> list:
    return [entry.executable for entry in step._entries.values()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("cls", "kw", "kernel"), CONFIGS, ids=IDS)
def test_compiled_update_runs_its_kernel_and_matches_eager_bits(cls, kw, kernel, dtype):
    ref, got = _params(dtype), _params(dtype)
    ref_opt, opt = cls(ref, **kw), compile_optimizer(cls(got, **kw))
    for i in range(4):
        _set_grads(ref, i, dtype)
        _set_grads(got, i, dtype)
        ref_opt.step()
        opt.step()
    kernels = {k for ex in _executables(opt.step) for k in ex.update_kernels}
    assert kernels == {kernel, ""} if kernel else kernels == {""}
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        sa, sb = opt.state[a], ref_opt.state[b]
        for key in sb:
            np.testing.assert_array_equal(sa[key].numpy(), sb[key].numpy())


# -- the chain as a hand-built program: recognition and the interpreter's bits -----------------

SCALARS = ("b1", "omb1", "b2", "omb2", "bc2", "eps", "ss", "wd", "decay")


def _chain(shape, dt, names, tensors, swap):
    """A program feeding `names` (those in `tensors` of `shape`, the rest 0-d) and an `add(op,
    *operands)` that appends a fused node (operands: feed names or earlier node indices); `swap`
    writes every product and sum with its operands the other way round."""
    program = Program()
    slot = {n: program.feed(shape if n in tensors else (), dt) for n in names}
    inputs = list(slot.values())
    nodes: list[FusedNode] = []

    def arg(x):
        return inputs.index(slot[x]) if isinstance(x, str) else len(inputs) + x

    def add(op, *xs):
        if swap and op in ("add", "mul") and len(xs) == 2:
            xs = xs[::-1]
        nodes.append(FusedNode(op, tuple(arg(x) for x in xs), dt))
        return len(nodes) - 1

    return program, inputs, nodes, add


def _adam_program(
    shape,
    dt,
    *,
    maximize=False,
    l2=False,
    decoupled=False,
    amsgrad=False,
    swap=False,
    denominator="add",
) -> tuple[Program, list[str]]:
    """Adam's chain as `adam_update` traces it, feeds named in order; `swap` writes every
    product and sum with its operands the other way round; `denominator="sub"` subtracts eps
    (another chain)."""
    names = ["p", "g", "m", "v"] + (["vmax"] if amsgrad else []) + list(SCALARS)
    program, inputs, nodes, add = _chain(shape, dt, names, ("p", "g", "m", "v", "vmax"), swap)
    g = "g"
    if maximize:
        g = add("neg", g)
    if l2:
        g = add("add", g, add("mul", "p", "wd"))
    base = add("mul", "p", "decay") if decoupled else "p"
    m = add("add", add("mul", "m", "b1"), add("mul", g, "omb1"))
    v = add("add", add("mul", "v", "b2"), add("mul", add("mul", g, g), "omb2"))
    second = add("maximum", "vmax", v) if amsgrad else v
    denom = add(denominator, add("div", add("sqrt", second), "bc2"), "eps")
    p = add("sub", base, add("mul", add("div", m, denom), "ss"))
    outs = [m, v] + ([second] if amsgrad else []) + [p]
    results = program.fused_outputs(inputs, nodes, outs)
    program.result(*results)
    for r, state in enumerate(["m", "v"] + (["vmax"] if amsgrad else []) + ["p"]):
        program.inplace_result(r, names.index(state))
    return program, names


def _rms_program(shape, dt, *, adagrad=False, maximize=False, l2=False, swap=False):
    """RMSprop's (or Adagrad's) chain as its eager update traces it; `swap` as above."""
    names = ["p", "g", "v", "b1", "omb1", "eps", "ss", "wd"]
    program, inputs, nodes, add = _chain(shape, dt, names, ("p", "g", "v"), swap)
    g = "g"
    if maximize:
        g = add("neg", g)
    if l2:
        g = add("add", g, add("mul", "p", "wd"))
    gg = add("mul", g, g)
    acc = (
        add("add", "v", gg)
        if adagrad
        else add("add", add("mul", "v", "b1"), add("mul", gg, "omb1"))
    )
    denom = add("add", add("sqrt", acc), "eps")
    p = add("sub", "p", add("mul", add("div", g, denom), "ss"))
    program.result(*program.fused_outputs(inputs, nodes, [acc, p]))
    program.inplace_result(0, names.index("v"))
    program.inplace_result(1, names.index("p"))
    return program, names


@settings(max_examples=10, deadline=None)
@given(
    adagrad=st.booleans(),
    maximize=st.booleans(),
    l2=st.booleans(),
    dt=st.sampled_from(["f32", "f64"]),
    swap=st.booleans(),
    shape=st.sampled_from([(3,), (17, 3), (40000,)]),
    seed=st.integers(0, 2**16),
)
def test_rms_chains_match_the_interpreter_bits(adagrad, maximize, l2, dt, swap, shape, seed):
    program, names = _rms_program(shape, dt, adagrad=adagrad, maximize=maximize, l2=l2, swap=swap)
    ex = _compile(program)
    assert ex.update_kernels == ["adagrad" if adagrad else "rmsprop"]
    feeds = _feeds(names, shape, dt, seed)
    feeds[names.index("v")].flat[:2] = [np.nan, np.inf]
    want = program.interpret([f.copy() for f in feeds])
    got = ex.run(feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert got[0] is feeds[names.index("v")] and got[1] is feeds[names.index("p")]


def _feeds(names, shape, dt, seed) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    dt = NUMPY_DTYPES[dt]
    values = {"b1": 0.9, "omb1": 0.1, "b2": 0.999, "omb2": 1e-3, "bc2": 0.05, "eps": 1e-8}
    values |= {"ss": 0.02, "wd": 0.01, "decay": 0.999}
    out = []
    for n in names:
        if n in values:
            out.append(np.array(values[n], dt))
        elif n in ("v", "vmax"):
            out.append(np.abs(rng.standard_normal(shape)).astype(dt) * 0.01)
        else:
            out.append(rng.standard_normal(shape).astype(dt))
    return out


def _compile(program: Program):
    return CPUBackend(cache=False).compile(program)


FORMS = [
    dict(),
    dict(amsgrad=True),
    dict(maximize=True, l2=True),
    dict(decoupled=True, amsgrad=True, maximize=True),
]


@settings(max_examples=12, deadline=None)
@given(
    form=st.sampled_from(FORMS),
    dt=st.sampled_from(["f32", "f64"]),
    swap=st.booleans(),
    shape=st.sampled_from([(2,), (9,), (33, 5), (40000,)]),
    seed=st.integers(0, 2**16),
)
def test_recognized_chain_matches_the_interpreter_bits(form, dt, swap, shape, seed):
    program, names = _adam_program(shape, dt, swap=swap, **form)
    ex = _compile(program)
    assert ex.update_kernels == ["adam"]
    feeds = _feeds(names, shape, dt, seed)
    # NaN and infinities in the state follow the generic evaluator's rules (max propagates NaN).
    feeds[names.index("v")].flat[:2] = [np.nan, np.inf]
    if "vmax" in names:
        feeds[names.index("vmax")].flat[-1] = np.nan
    want = program.interpret([f.copy() for f in feeds])
    got = ex.run(feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # In place: each result is its state feed's own array.
    states = ["m", "v"] + (["vmax"] if "vmax" in names else []) + ["p"]
    for r, state in zip(got, states, strict=True):
        assert r is feeds[names.index(state)]


def test_other_chains_stay_with_the_generic_evaluator():
    # x - eps instead of x + eps in the denominator: not Adam's chain.
    shape, dt = (50,), "f32"
    program, names = _adam_program(shape, dt, denominator="sub")
    ex = _compile(program)
    assert ex.update_kernels == [""]
    feeds = _feeds(names, shape, dt, 0)
    want = program.interpret([f.copy() for f in feeds])
    for a, b in zip(ex.run(feeds), want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_broadcast_state_is_not_recognized():
    # A moment of another shape (broadcast) is not a per-element update the kernel can take.
    program = Program()
    p, g = program.feed((4, 6), "f32"), program.feed((4, 6), "f32")
    m = program.feed((6,), "f32")
    b1 = program.feed((), "f32")
    nodes = [FusedNode("mul", (2, 3), "f32"), FusedNode("add", (4, 1), "f32")]
    nodes.append(FusedNode("sub", (0, 5), "f32"))
    program.result(*program.fused_outputs([p, g, m, b1], nodes, (2,)))
    assert _compile(program).update_kernels == [""]


def test_outputs_overlapping_other_inputs_fall_back_exactly():
    # The same array fed as the moment and as the gradient: the runtime stages the in-place
    # results; the answer is the interpreter's whatever path runs.
    shape, dt = (3000,), "f32"
    program, names = _adam_program(shape, dt)
    ex = _compile(program)
    feeds = _feeds(names, shape, dt, 5)
    feeds[names.index("g")] = feeds[names.index("m")]
    want = program.interpret([f.copy() for f in feeds])
    for a, b in zip(ex.run(feeds), want, strict=True):
        np.testing.assert_array_equal(a, b)
