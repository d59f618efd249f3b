"""Differential mutation fuzzer of native program descriptions (issues 15 and 22).

Seeds are the descriptions ``lucid._native.compile`` receives when small real models are compiled
(inference, training steps, a CNN, an embedding model, math and mixed-dtype functions). A case
is one seed with a few random mutations: for half the cases anything goes (opcodes, attributes,
slots, shapes, dtypes, feeds, results, in-place pairs, fused expressions and ``sub_outputs``,
huge and negative integers), for the other half gentle ones that mostly keep the program valid
(attribute values, an elementwise op for another of its kind, an interposed elementwise
instruction). Mutation is often followed by *repair*: the declared output slots are set to what
the validator says the op gives, so mutated geometry reaches the kernels too. Each case is
validated, compiled and, when small enough, run on random feeds (one case in three with NaN,
infinities, signed zeros and subnormals). The only acceptable outcomes are a result or a Python
exception of the documented kinds, and every run must agree with the numpy reference interpreter
(``Program.interpret``: the prim table's reference semantics), instruction by instruction on the
native values of each instruction's inputs: same shapes and dtypes, integers and booleans equal,
floats within a loose tolerance with NaN and infinities at the same places
(``check_against_reference``, ``compare_with_reference``).

Cases are deterministic functions of (seed number, case index), so a batch runs in a child
process (``python -m tests.native.program_fuzz SEEDS_FILE SEED START COUNT``) that prints the
index of each case before trying it: when the child crashes or hangs, the parent rebuilds the
offending case from the last index printed.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

INTERESTING_INTS = [
    0,
    1,
    2,
    3,
    4,
    7,
    -1,
    -2,
    -3,
    2**31 - 1,
    2**31,
    2**32,
    2**32 + 1,
    2**40,
    2**40 + 1,
    2**62,
    2**62 + 1,
    2**63 - 1,
    -(2**63),
]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan")]
DTYPES = ["f32", "f64", "i32", "i64", "bool"]
# Outcomes a case may have besides a result (run-time index checks raise IndexError).
EXPECTED_ERRORS = (ValueError, TypeError, IndexError, MemoryError, OverflowError)
# Only programs this small are run (bytes of scratch + results + feeds; work units).
RUN_MAX_BYTES = 64 << 20
RUN_MAX_WORK = 1 << 26
CHILD_MEMORY_LIMIT = 3 << 30  # address space of a child process


# ---- seeds ---------------------------------------------------------------------------------------


def collect_seed_programs() -> list[dict[str, Any]]:
    """The program descriptions compiled for a few small models (inference and training)."""
    import lucid
    import lucid.nn as nn
    import lucid.nn.functional as F
    from lucid import _native
    from lucid.backends.cpu.program import plain_description

    seen: list[dict[str, Any]] = []
    real_compile = _native.compile

    def recording_compile(desc, *args, **kwargs):
        # The backend hands over its program's own objects: kept as the plain description.
        seen.append(copy.deepcopy(plain_description(desc)))
        return real_compile(desc, *args, **kwargs)

    _native.compile = recording_compile
    try:
        lucid.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        x = lucid.randn(4, 6)
        lucid.compile(mlp)(x)
        labels = lucid.tensor(np.array([0, 2, 1, 1]))
        lucid.compile.fused_step(mlp, F.cross_entropy, lucid.optim.Adam(mlp.parameters()))(
            x, labels
        )

        cnn = nn.Sequential(
            nn.Conv2d(1, 2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2, 2, 3, groups=2, dilation=1),
            nn.AvgPool2d(2, count_include_pad=False, padding=1),
            nn.Flatten(),
            nn.Linear(8, 3),
        )
        images = lucid.randn(2, 1, 8, 8)
        lucid.compile(cnn)(images)
        lucid.compile.fused_step(cnn, F.cross_entropy, lucid.optim.SGD(cnn.parameters(), lr=0.1))(
            images, lucid.tensor(np.array([0, 2]))
        )

        class Tokens(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(10, 4)
                self.norm = nn.LayerNorm(4)

            def forward(self, ids):
                h = self.norm(self.embed(ids))
                return F.log_softmax(h.sum(dim=1), dim=-1).cumsum(dim=-1)

        lucid.compile(Tokens())(lucid.tensor(np.array([[1, 2, 3], [4, 5, 9]])))

        # BatchNorm statistics, dropout's random numbers, plain SGD (matmul_accumulate).
        regularized = nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3)
        )
        lucid.compile.fused_step(
            regularized, F.cross_entropy, lucid.optim.SGD(regularized.parameters(), lr=0.1)
        )(x, labels)

        @lucid.compile
        def attention(q, k, v):
            scores = F.scaled_dot_product_attention(q, k, v)
            return scores.var(dim=-1), scores.argmax(dim=-1), lucid.where(q > 0, q, -q)

        attention(lucid.randn(2, 3, 4), lucid.randn(2, 3, 4), lucid.randn(2, 3, 4))
        _more_seed_models()
    finally:
        _native.compile = real_compile
    if len(seen) < 4:
        raise RuntimeError(f"expected at least 4 seed programs, recorded {len(seen)}")
    return seen


def _more_seed_models() -> None:
    """Programs for the ops the models above leave out (so the differential check reaches
    them): unary and binary math, comparisons and logic, reductions, sorting, float64 and
    int32, strided and dilated convolutions, the max-pool gradient, GELU and layer norm
    training, fused attention and its gradient."""
    import lucid
    import lucid.nn as nn
    import lucid.nn.functional as F

    @lucid.compile
    def math(x, y):
        a = lucid.maximum(x.abs().sqrt(), y.exp().log1p()) - lucid.minimum(x.sin(), y.cos())
        b = x.tanh() * y.sigmoid() + x.erf() - y.expm1() / (x.square() + 1) + x.tan()
        c = lucid.floor(x * 3) + lucid.ceil(y) - lucid.round(x * y) + x.sign() + y.reciprocal()
        c = c + x.abs().rsqrt() + y.abs().log() + x.relu() + lucid.pow(y.abs(), x)
        d = lucid.where(lucid.isnan(a) | lucid.isinf(b), c, lucid.remainder(a, y) + b // x)
        e = lucid.logical_xor(x > y, lucid.logical_not(x <= 0)) & (y < 1) | (x == y)
        return (
            d, e, d.max(dim=1), d.min(dim=0), x.prod(dim=1), d.argmin(dim=1),
            lucid.isfinite(c), x.var(dim=1), x.argsort(dim=1, descending=True),
        )  # fmt: skip

    x, y = lucid.randn(3, 5), lucid.randn(3, 5)
    math(x, y)

    @lucid.compile
    def mixed(x64, i32):
        return (
            (x64 * 2).sum(dim=0), (i32 * 3 + 1) // 2, i32 % 3, x64.cumsum(dim=1),
            x64.float(), i32.long(), x64.permute(1, 0) + 1, x64.max(dim=0), i32.max(dim=1),
        )  # fmt: skip

    mixed(
        lucid.tensor(np.arange(12.0).reshape(3, 4)),
        lucid.tensor(np.arange(12, dtype=np.int32).reshape(3, 4) - 5),
    )

    lucid.manual_seed(1)
    cnn = nn.Sequential(
        nn.Conv2d(1, 2, 3, stride=2, padding=1),
        nn.MaxPool2d(2, stride=1),
        nn.Conv2d(2, 2, 3, dilation=2, padding=2),
        nn.Flatten(),
        nn.Linear(18, 6),
        nn.LayerNorm(6),
        nn.GELU(),
        nn.Linear(6, 3),
    )
    images, labels = lucid.randn(2, 1, 7, 7), lucid.tensor(np.array([0, 2]))
    lucid.compile(cnn)(images)
    lucid.compile.fused_step(cnn, F.cross_entropy, lucid.optim.SGD(cnn.parameters(), lr=0.1))(
        images, labels
    )

    # Shapes large enough for Lucid's float32 GEMM (sgemm_chosen), the direct convolution's
    # register tiles and vector loops with their tails.
    wide = nn.Sequential(nn.Linear(128, 72), nn.ReLU(), nn.Linear(72, 24), nn.GELU())
    batch = lucid.randn(40, 128)
    lucid.compile(wide)(batch)
    lucid.compile.fused_step(wide, F.mse_loss, lucid.optim.SGD(wide.parameters(), lr=0.1))(
        batch, lucid.randn(40, 24)
    )
    convnet = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
    lucid.compile(convnet)(lucid.randn(2, 3, 18, 18))

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attention(x, x, x)[0]

    model, tokens = SelfAttention(), lucid.randn(2, 4, 8)
    lucid.compile(model)(tokens)
    lucid.compile.fused_step(model, F.mse_loss, lucid.optim.Adam(model.parameters()))(
        tokens, tokens
    )


# ---- mutations -----------------------------------------------------------------------------------


def _any_int(rng: random.Random, near: int | None = None) -> int:
    r = rng.random()
    if near is not None and r < 0.4:
        return near + rng.choice([-2, -1, 1, 2, 3])
    if r < 0.8:
        return rng.choice(INTERESTING_INTS)
    return rng.randint(-5, 40)


def _mutate_value(rng: random.Random, value: Any, op_names: list[str]) -> Any:
    if isinstance(value, bool):
        return rng.choice([not value, 0, "f32", [True]])
    if isinstance(value, int):
        return _any_int(rng, value)
    if isinstance(value, float):
        return rng.choice(INTERESTING_FLOATS + [rng.uniform(-5, 5), 3])
    if isinstance(value, str):
        return rng.choice(DTYPES + op_names[:5] + ["", "f16", value + "x"])
    if isinstance(value, (list, tuple)):
        items = list(value)
        choice = rng.random()
        if not items or choice < 0.2:
            items.append(_mutate_value(rng, items[-1], op_names) if items else _any_int(rng))
        elif choice < 0.35:
            items.pop(rng.randrange(len(items)))
        elif choice < 0.45:
            return rng.choice([[], 5, "x", [1.5, 2], [[1]]])
        else:
            i = rng.randrange(len(items))
            items[i] = _mutate_value(rng, items[i], op_names)
        return items
    return _any_int(rng)


def _random_slot(rng: random.Random, desc: dict) -> int:
    n = len(desc["slots"])
    if rng.random() < 0.85 and n:
        return rng.randrange(n)
    return rng.choice([-1, n, n + 5, 2**31 - 1, -(2**31)])


def _mutate_instr(rng: random.Random, desc: dict, op_names: list[str]) -> None:
    instrs = desc["instrs"]
    k = rng.randrange(len(instrs))
    op, ins, outs, attrs = instrs[k]
    ins, outs, attrs = list(ins), list(outs), dict(attrs)
    what = rng.random()
    if what < 0.12:
        op = rng.choice(op_names)
    elif what < 0.55 and attrs:
        name = rng.choice(sorted(attrs))
        if rng.random() < 0.1:
            del attrs[name]
        else:
            attrs[name] = _mutate_value(rng, attrs[name], op_names)
    elif what < 0.65:
        if op == "fused" or rng.random() < 0.3:
            nodes = len(attrs.get("sub_ops", [])) or 2
            count = rng.choice([1, 2, len(outs) + 1, len(outs)])
            attrs["sub_outputs"] = [
                rng.choice([rng.randrange(nodes), nodes, -1, 0]) for _ in range(count)
            ]
        else:
            attrs[rng.choice(["axis", "shape", "kernel", "groups", "x"])] = _any_int(rng)
    elif what < 0.8:
        seq = ins if rng.random() < 0.6 else outs
        r = rng.random()
        if seq and r < 0.6:
            seq[rng.randrange(len(seq))] = _random_slot(rng, desc)
        elif seq and r < 0.8:
            seq.pop(rng.randrange(len(seq)))
        else:
            seq.append(_random_slot(rng, desc))
    elif what < 0.87:
        j = rng.randrange(len(instrs))
        instrs[k], instrs[j] = instrs[j], instrs[k]
        return
    elif what < 0.93 and len(instrs) > 1:
        del instrs[k]
        return
    else:
        instrs.insert(rng.randrange(len(instrs) + 1), instrs[k])
        return
    instrs[k] = (op, ins, outs, attrs)


def _mutate_slots(rng: random.Random, desc: dict) -> None:
    slots = desc["slots"]
    i = rng.randrange(len(slots))
    shape, dtype = slots[i]
    shape = list(shape)
    r = rng.random()
    if r < 0.5 and shape:
        shape[rng.randrange(len(shape))] = _any_int(rng, shape[0])
    elif r < 0.65:
        shape.insert(rng.randrange(len(shape) + 1), rng.choice([0, 1, 2, 3]))
    elif r < 0.75 and shape:
        shape.pop(rng.randrange(len(shape)))
    elif r < 0.8:
        shape = [1] * rng.choice([17, 20])
    else:
        dtype = rng.choice(DTYPES)
    slots[i] = (tuple(shape), dtype)


def _mutate_io(rng: random.Random, desc: dict) -> None:
    r = rng.random()
    if r < 0.3:
        key = "feeds"
    elif r < 0.6:
        key = "results"
    else:
        inplace = dict(desc.get("inplace", {}))
        if inplace and rng.random() < 0.5:
            victim = rng.choice(sorted(inplace))
            inplace[victim] = rng.choice([_any_int(rng), inplace[victim] + 1])
        else:
            inplace[rng.randrange(max(len(desc["results"]), 1) + 1)] = rng.randrange(
                max(len(desc["feeds"]), 1) + 1
            )
        desc["inplace"] = inplace
        return
    seq = list(desc[key])
    if seq and rng.random() < 0.5:
        seq[rng.randrange(len(seq))] = _random_slot(rng, desc)
    elif seq and rng.random() < 0.5:
        seq.pop(rng.randrange(len(seq)))
    else:
        seq.append(_random_slot(rng, desc))
    desc[key] = seq


_DECLARED = re.compile(r"output slot (\d+) is declared \S+ but the op gives (\w+)\[([-\d,]*)\]")


def repair(desc: dict, validate, rounds: int = 8) -> None:
    """Sets declared output slots to what the validator says the ops give (a few rounds)."""
    for _ in range(rounds):
        try:
            validate(desc)
            return
        except ValueError as e:
            m = _DECLARED.search(str(e))
            if not m:
                return
            slot, dtype, dims = int(m.group(1)), m.group(2), m.group(3)
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
            desc["slots"][slot] = (shape, dtype)
        except Exception:
            return


# ---- gentle mutations: programs that mostly stay valid, so their results can be compared --------

FLOAT_UNARY = [
    "neg", "abs", "sign", "square", "relu", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt",
    "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "floor", "ceil", "round",
]  # fmt: skip
FLOAT_BINARY = [
    "add", "sub", "mul", "div", "pow", "atan2", "maximum", "minimum", "floor_divide", "remainder",
]  # fmt: skip
INT_UNARY = ["neg", "abs", "sign", "square", "relu"]
INT_BINARY = ["add", "sub", "mul", "maximum", "minimum", "floor_divide", "remainder"]


def _same_kind_op(rng: random.Random, op: str, dtype: str) -> str | None:
    """Another elementwise op of the same arity giving the same dtype, or None."""
    unary, binary = (
        (FLOAT_UNARY, FLOAT_BINARY) if dtype in ("f32", "f64") else (INT_UNARY, INT_BINARY)
    )
    for family in (unary, binary):
        if op in family:
            return rng.choice(family)
    return None


def _gentle_value(rng: random.Random, value: Any) -> Any:
    """A value of the same type and length, near the ones real programs use."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([-2, -1, 0, 1, 2, 3, value + 1, value - 1])
    if isinstance(value, float):
        return rng.choice(INTERESTING_FLOATS + [0.5, 2.0, -3.0, rng.uniform(-5, 5)])
    if isinstance(value, (list, tuple)) and value:
        items = list(value)
        i = rng.randrange(len(items))
        if not isinstance(items[i], str):
            items[i] = _gentle_value(rng, items[i])
        return items
    return value


def _interpose(rng: random.Random, desc: dict) -> None:
    """A new elementwise instruction between a value and one of its readers."""
    instrs, slots = desc["instrs"], desc["slots"]
    k = rng.randrange(len(instrs))
    readers = [i for i, (_, ins, _, _) in enumerate(instrs) if i > k]
    if not readers or not instrs[k][2]:
        return
    value = rng.choice(instrs[k][2])
    readers = [i for i in readers if value in instrs[i][1]]
    if not readers or not 0 <= value < len(slots):
        return
    shape, dtype = slots[value]
    family = FLOAT_UNARY + FLOAT_BINARY if dtype in ("f32", "f64") else INT_UNARY + INT_BINARY
    if dtype == "bool":
        return
    op = rng.choice(family)
    new = len(slots)
    slots.append((shape, dtype))
    ins = [value] if op in FLOAT_UNARY + INT_UNARY else [value, value]
    j = rng.choice(readers)
    op_j, ins_j, outs_j, attrs_j = instrs[j]
    ins_j = [new if s == value and rng.random() < 0.7 else s for s in ins_j]
    instrs[j] = (op_j, ins_j, outs_j, attrs_j)
    instrs.insert(k + 1, (op, ins, [new], {}))


def _to_float64(desc: dict) -> None:
    """The program in float64: every f32 slot, node and dtype attribute becomes f64."""

    def f64(value: Any) -> Any:
        if value == "f32":
            return "f64"
        return [f64(v) for v in value] if isinstance(value, list) else value

    desc["slots"] = [(shape, f64(dtype)) for shape, dtype in desc["slots"]]
    desc["instrs"] = [
        (op, ins, outs, {k: f64(v) for k, v in attrs.items()})
        for op, ins, outs, attrs in desc["instrs"]
    ]


def _mutate_gently(rng: random.Random, desc: dict) -> None:
    """One mutation that keeps types: an attribute's value, an elementwise op (a fused node's
    too) for another of its kind, a constant's values, or a new elementwise instruction."""
    instrs = desc["instrs"]
    k = rng.randrange(len(instrs))
    op, ins, outs, attrs = instrs[k]
    attrs = dict(attrs)
    r = rng.random()
    if r < 0.2:
        _interpose(rng, desc)
        return
    if op == "fused" and r < 0.6:
        sub_ops = list(attrs["sub_ops"])
        n = rng.randrange(len(sub_ops))
        replacement = _same_kind_op(rng, sub_ops[n], attrs["sub_dtypes"][n])
        if replacement is not None:
            sub_ops[n] = replacement
            attrs["sub_ops"] = sub_ops
    elif r < 0.4 and outs and 0 <= outs[0] < len(desc["slots"]):
        replacement = _same_kind_op(rng, op, desc["slots"][outs[0]][1])
        op = replacement or op
    elif attrs:
        name = rng.choice(sorted(attrs))
        if name not in ("sub_ops", "sub_args", "sub_dtypes", "sub_outputs"):
            attrs[name] = _gentle_value(rng, attrs[name])
    instrs[k] = (op, ins, outs, attrs)


def make_case(seeds: list[dict], seed: int, index: int, op_names: list[str], validate) -> dict:
    """Case `index` of run `seed`: a deterministic mutation of one seed program, gentle (mostly
    valid, so its results are compared) for half the cases, else anything goes."""
    rng = random.Random(f"{seed}:{index}")
    desc = copy.deepcopy(rng.choice(seeds))
    desc["slots"] = list(desc["slots"])
    desc["instrs"] = list(desc["instrs"])
    if rng.random() < 0.5:
        if rng.random() < 0.2:
            _to_float64(desc)
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate_gently(rng, desc)
        repair(desc, validate, rounds=64)
        return desc
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5])):
        r = rng.random()
        if r < 0.6:
            _mutate_instr(rng, desc, op_names)
        elif r < 0.85:
            _mutate_slots(rng, desc)
        else:
            _mutate_io(rng, desc)
    if rng.random() < 0.6:
        repair(desc, validate)
    return desc


# ---- running cases -------------------------------------------------------------------------------


# No huge finite values: their products overflow float32 where the reference, which accumulates
# in float64, stays finite (inf + -inf is NaN natively, inf in the reference).
SPECIAL_FEED_VALUES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40]


def _feed(rng: np.random.Generator, shape: tuple, dtype: str, special: bool) -> np.ndarray:
    # np.asarray: with shape () the generators return scalars, not arrays.
    if dtype in ("f32", "f64"):
        values = np.asarray(rng.standard_normal(shape))
        if special:  # about one element in eight NaN, infinite, zero, huge or subnormal
            where = np.asarray(rng.random(shape) < 0.125)
            picks = np.asarray(rng.choice(SPECIAL_FEED_VALUES, size=shape))
            values = np.where(where, picks, values)
        return np.asarray(values.astype(np.float32 if dtype == "f32" else np.float64))
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    # Mostly valid small indices, sometimes negative or large; with `special`, some extremes
    # (integer arithmetic wraps natively as in numpy).
    int_type = np.int32 if dtype == "i32" else np.int64
    values = np.asarray(rng.integers(-1, 4, size=shape)).astype(int_type)
    if special:
        info = np.iinfo(int_type)
        picks = np.asarray(rng.choice([info.min, info.max, -1, 0], size=shape)).astype(int_type)
        values = np.where(np.asarray(rng.random(shape) < 0.125), picks, values)
    return np.asarray(values, int_type)


# Floats agree when |native - reference| <= FLOAT_RTOL * |reference| + FLOAT_ATOL * scale, scale
# the largest finite magnitude of the reference result (at least 1): mutated programs sum, reduce
# and multiply in other orders than numpy does, and their values span many magnitudes.
FLOAT_RTOL = 1e-3
FLOAT_ATOL = 1e-3


# CPU-only instructions whose references pass their attributes on to a prim op's: (that op, the
# attributes they add).
_CPU_ONLY_PRIM_BASE = {
    "conv2d_bias": ("conv2d", {"relu"}),
    "max_pool2d_relu_grad": ("max_pool2d_grad", set()),
}


def reference_program(desc: dict):
    """The description as a :class:`lucid.backends.cpu.Program`, for its numpy interpreter.

    Attributes a prim op does not declare are dropped (the native validator ignores them: the
    fuzzer adds such names); a ``fused`` instruction's flattened expression becomes its nodes."""
    from lucid.backends.cpu.program import FUSED, FusedNode, Instr, Program
    from lucid.ir import prim as prim_ops

    program = Program()
    for shape, dtype in desc["slots"]:
        program.new_slot(shape, dtype)
    for op, ins, outs, attrs in desc["instrs"]:
        attrs = dict(attrs)
        nodes: list[FusedNode] = []
        out_nodes = None
        if op == FUSED:
            args = list(attrs["sub_args"])
            for k, (name, dtype) in enumerate(
                zip(attrs["sub_ops"], attrs["sub_dtypes"], strict=True)
            ):
                arity = len(prim_ops.lookup(name).operands)
                node_args, args = tuple(args[:arity]), args[arity:]
                node_attrs: dict[str, Any] = {}
                if name == "cast":
                    node_attrs["dtype"] = dtype
                elif name == "normalize":
                    node_attrs["epsilon"] = float(attrs["sub_floats"][k])
                nodes.append(FusedNode(name, node_args, dtype, node_attrs))
            if "sub_outputs" in attrs:
                out_nodes = tuple(attrs["sub_outputs"])
            attrs = {}
        elif op in prim_ops.PRIM_OPS or op in _CPU_ONLY_PRIM_BASE:
            base, extra = _CPU_ONLY_PRIM_BASE.get(op, (op, set()))
            declared = set(prim_ops.lookup(base).attrs) | extra
            attrs = {k: v for k, v in attrs.items() if k in declared}
        program.instrs.append(Instr(op, tuple(ins), tuple(outs), attrs, tuple(nodes), out_nodes))
    program.feeds = list(desc["feeds"])
    program.results = list(desc["results"])
    program.inplace = {int(r): int(f) for r, f in desc.get("inplace", {}).items()}
    return program


def compare_with_reference(
    native: list[np.ndarray], reference: list[np.ndarray], nan_for_infinity: bool = False
) -> str | None:
    """None when the native results agree with the reference's, else what differs first.

    ``nan_for_infinity``: a native NaN may stand for a reference infinity. The caller allows it
    when an input of the instruction is infinite: a factor the reference keeps tiny (float64
    sums, numpy's subnormal exp) can be 0 natively (float32 overflow to inf - inf, fast exp and
    erf flushing below 2^-126), and 0 times that infinity is NaN."""
    if len(native) != len(reference):
        return f"{len(native)} native results, {len(reference)} reference results"
    for i, (got, want) in enumerate(zip(native, reference, strict=True)):
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"result {i}: native {got.dtype}{got.shape}, reference {want.dtype}{want.shape}"
        if got.dtype.kind != "f":
            bad = got != want
        else:
            finite = np.isfinite(want)
            scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
            with np.errstate(invalid="ignore", over="ignore"):
                close = np.abs(got.astype(np.float64) - want) <= (
                    FLOAT_RTOL * np.abs(want.astype(np.float64)) + FLOAT_ATOL * scale
                )
            # NaN where the reference has NaN, the same infinity where it has one.
            same_special = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))
            if nan_for_infinity:
                same_special |= np.isinf(want) & np.isnan(got)
            bad = ~np.where(finite, close & np.isfinite(got), same_special)
        if bad.any():
            at = tuple(int(k) for k in np.argwhere(bad)[0])
            return (
                f"result {i} ({got.dtype}{got.shape}): {int(bad.sum())} of {bad.size} elements "
                f"differ; first at {at}: native {got[at]!r}, reference {want[at]!r}"
            )
    return None


def run_reference(desc: dict, feeds: list[np.ndarray]) -> list[np.ndarray] | BaseException:
    """The reference interpreter's results on copies of ``feeds``, or the exception it raised."""
    with np.errstate(all="ignore"):
        try:
            return reference_program(desc).interpret([f.copy() for f in feeds])
        except Exception as e:  # noqa: BLE001  (compared with the native outcome by the caller)
            return e


def check_against_reference(
    desc: dict, feeds: list[np.ndarray], results: list[np.ndarray], native
) -> str | None:
    """None when a run's ``results`` (on ``feeds``) agree with the reference, else what differs.

    The program runs again with every value a result (and no in-place results). Its results
    must be those values bit for bit: keeping every value changes only how the runtime plans
    buffers. Then each instruction's outputs are compared with the reference interpreter run on
    that one instruction and the native values of its inputs (``compare_with_reference``), so a
    rounding difference is not amplified downstream (by ``floor_divide`` of a sum that is 0 in
    exact arithmetic, a comparison, an argmax) into a false alarm, and a difference is reported
    at the instruction that made it."""
    outputs = [o for _, _, outs, _ in desc["instrs"] for o in outs]
    every_value = dict(desc, results=outputs, inplace={})
    values = dict(zip(desc["feeds"], feeds, strict=True))
    run = native.compile(every_value, cache=False).run([f.copy() for f in feeds])
    values.update(zip(outputs, run, strict=True))
    for i, (slot, got) in enumerate(zip(desc["results"], results, strict=True)):
        kept = values[slot]
        if got.dtype != kept.dtype or not np.array_equal(got, kept, equal_nan=True):
            return f"result {i} (slot {slot}) changes when every value is a result"
    for k, (op, ins, outs, attrs) in enumerate(desc["instrs"]):
        inputs = list(dict.fromkeys(ins))  # add(x, x) reads one feed
        alone = {"slots": desc["slots"], "instrs": [(op, ins, outs, attrs)], "feeds": inputs}
        alone.update(results=list(outs), inplace={})
        reference = run_reference(alone, [values[s] for s in inputs])
        where = f"instruction {k} ({op} {list(ins)} -> {list(outs)})"
        if not isinstance(reference, list):
            return f"{where} ran natively; the reference raised {reference!r}"
        infinite_input = any(
            values[s].dtype.kind == "f" and np.isinf(values[s]).any() for s in inputs
        )
        mismatch = compare_with_reference([values[o] for o in outs], reference, infinite_input)
        if mismatch is not None:
            return f"{where}: {mismatch}"
    return None


def try_case(desc: dict, native) -> str:
    """Validates, compiles and (when small) runs one case; returns its outcome's name."""
    try:
        native.structural_hash(desc)
        native.dump_program(desc)
        native.validate(desc)
    except EXPECTED_ERRORS as e:
        return "invalid:" + type(e).__name__
    try:
        ex = native.compile(desc, cache=False)  # validated: must compile, memory permitting
    except MemoryError:  # a constant of a valid but huge shape
        return "compile-error:MemoryError"
    sizes = {"f32": 4, "f64": 8, "i32": 4, "i64": 8, "bool": 1}
    io_bytes = sum(
        int(np.prod(desc["slots"][s][0], dtype=np.int64)) * sizes[desc["slots"][s][1]]
        for s in list(desc["feeds"]) + list(desc["results"])
    )
    if ex.arena_bytes + io_bytes > RUN_MAX_BYTES or ex.work > RUN_MAX_WORK:
        return "compiled"
    # Feeds are a deterministic function of the program; one case in three has special values.
    rng = np.random.default_rng(native.structural_hash(desc))
    special = rng.random() < 1 / 3
    feeds = [
        _feed(rng, tuple(desc["slots"][s][0]), desc["slots"][s][1], special) for s in desc["feeds"]
    ]
    before = [f.copy() for f in feeds]
    try:
        results = ex.run(feeds)
    except EXPECTED_ERRORS as e:
        # A failed run must leave every feed as it was, and the reference must fail the same way.
        for f, b in zip(feeds, before, strict=True):
            if not np.array_equal(f, b, equal_nan=True):
                raise AssertionError("a failed run changed a feed") from e
        reference = run_reference(desc, before)
        if not isinstance(reference, type(e)):
            raise AssertionError(
                f"the native run raised {type(e).__name__}: {e}; the reference "
                + ("ran" if isinstance(reference, list) else f"raised {reference!r}")
            ) from e
        return "run-error:" + type(e).__name__
    mismatch = check_against_reference(desc, before, results, native)
    if mismatch is not None:
        raise AssertionError("native and reference results differ: " + mismatch)
    return "ran"


def run_batch(seeds_file: str, seed: int, start: int, count: int) -> None:
    """Child process: tries cases start..start+count-1, printing each index first."""
    import resource

    # A mutated shape can ask for terabytes: let such allocations fail (MemoryError) instead of
    # pressing the shared machine.
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_LIMIT, CHILD_MEMORY_LIMIT))
    from lucid import _native

    with open(seeds_file, "rb") as f:
        seeds = pickle.load(f)
    op_names = list(_native.op_names())
    outcomes: dict[str, int] = {}
    for index in range(start, start + count):
        print(f"case {index}", flush=True)
        desc = make_case(seeds, seed, index, op_names, _native.validate)
        try:
            outcome = try_case(desc, _native)
        except Exception as e:  # noqa: BLE001  (reported, with the case, by the parent)
            print(f"unexpected {type(e).__name__}: {e}", flush=True)
            raise SystemExit(3) from e
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print("outcomes", repr(outcomes), flush=True)


@dataclass
class BatchReport:
    outcomes: dict[str, int]
    failure: str | None  # what went wrong, with the offending case; None when all went well


def run_batch_in_subprocess(
    seeds_file: str, seed: int, start: int, count: int, timeout: float
) -> BatchReport:
    """Runs one batch in a child process; a crash, a hang (timeout) or an unexpected exception
    becomes a failure naming the case (rebuilt here from the last index the child printed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [
        sys.executable,
        "-m",
        "tests.native.program_fuzz",
        seeds_file,
        str(seed),
        str(start),
        str(count),
    ]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", LUCID_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=root, env=env
        )
        stdout, stderr, code, hung = proc.stdout, proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        code, hung = None, True
    lines = stdout.strip().splitlines()
    if not hung and code == 0 and lines and lines[-1].startswith("outcomes "):
        return BatchReport(eval(lines[-1][len("outcomes ") :]), None)  # our own dict literal
    what = "hang (timeout)" if hung else f"exit code {code}"
    cases = [int(line.split()[1]) for line in lines if line.startswith("case ")]
    if not cases:
        return BatchReport({}, f"{what} before any case: {stderr[-2000:]}")
    from lucid import _native

    with open(seeds_file, "rb") as f:
        seeds = pickle.load(f)
    desc = make_case(seeds, seed, cases[-1], list(_native.op_names()), _native.validate)
    return BatchReport(
        {},
        f"{what} at case (seed={seed}, index={cases[-1]}):\n{desc!r}\n"
        f"stdout tail: {lines[-3:]}\nstderr tail: {stderr[-1500:]}",
    )


if __name__ == "__main__":
    run_batch(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
