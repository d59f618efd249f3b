"""Calibrate the MPSGraph backend on this Mac: ``python -m lucid.backends.mpsgraph.selfcheck``.

Runs every prim op's emission (so every selector the emitter uses) on the device, plus the edge
cases where Apple's documentation is silent (softmax of an all -inf row, an Int64 -> Int32 cast
that overflows, ``one_hot(-1)``, erf/tanh precision, max-pool gradient ties, NaN in arg
reductions and sorts), each in a child process of its own (MPSGraph reports many failures by
aborting the process). For each case it compares the device with the reference builder
(``reference.py``, Apple's semantics as the backend assumes them) and with prim's semantics, and
prints a conformance table with the machine's macOS version and chip. docs/backend-mpsgraph.md
("Calibrating on a Mac") says what to do with the output.

``--backend mpsgraph-reference`` runs the reference in place of the device (any machine: what
Linux tests); ``--case NAME`` runs the named cases only; ``--json`` prints the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid.ir import prim as P

__all__ = ["CASES", "Case", "check_case", "main", "run_emission", "run_isolated"]


@dataclass(frozen=True)
class Case:
    """One prim op on fixed inputs; ``tolerance`` is (rtol, atol) for float results; ``note``
    says what the reference assumes there when Apple is silent."""

    op: str
    inputs: Callable[[], list[np.ndarray]]
    attrs: dict[str, Any] = field(default_factory=dict)
    tolerance: tuple[float, float] = (2e-5, 2e-6)
    note: str = ""


def _rand(shape: tuple[int, ...], dtype: str = "f32", seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + len(shape) * 7 + sum(shape))
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64"):
        return rng.integers(-20, 21, size=shape).astype(P.NUMPY_DTYPES[dtype])
    return (rng.standard_normal(shape) * 3).astype(np.float32)


def _positive(shape: tuple[int, ...]) -> np.ndarray:
    return np.abs(_rand(shape)) + np.float32(0.1)


_UNARY = ("neg", "abs", "sign", "square", "relu", "exp", "sin", "cos", "tan", "tanh", "sigmoid",
          "erf", "floor", "ceil", "round", "expm1", "isnan", "isinf", "isfinite")  # fmt: skip
_BINARY = ("add", "sub", "mul", "div", "atan2", "maximum", "minimum", "eq", "ne", "lt", "le",
           "gt", "ge")  # fmt: skip
_NAN_ROW = np.array([1.0, np.nan, 3.0, np.inf, -np.inf, 0.0], np.float32)
_CONV = {"strides": [2, 1], "padding": [1, 0, 2, 1], "groups": 2, "dilation": [1, 2]}
_POOL = {"kernel": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1]}

# Integer division pairs (dividends, divisors): INT_MIN // -1 and // 1, x // INT_MIN, quotients
# near 2**63, divisors near 2**62, both signs, a zero divisor.
_DIVISION_I64 = (
    [7, -7, 2**40 + 7, -(2**40 + 7), 0, 5, -(2**63), -(2**63), -(2**63), 2**63 - 1, 2**63 - 1,
     -(2**62) - 3, 2**63 - 2**39],
    [2, 2, 3, 3, 0, -2, -1, 1, -(2**63), -(2**63), 3, 2**62 + 1, 7],
)  # fmt: skip
_DIVISION_I32 = (
    [-(2**31), -(2**31), 2**31 - 1, 2**31 - 1, -7, 2**24 + 1],
    [-1, 1, -(2**31), 7, 2, 3],
)

CASES: dict[str, Case] = {
    **{op: Case(op, lambda: [_rand((3, 4))]) for op in _UNARY},
    **{
        op: Case(op, lambda: [_positive((5,))])
        for op in ("log", "sqrt", "rsqrt", "reciprocal", "log1p")
    },  # fmt: skip
    **{op: Case(op, lambda: [_rand((3, 1)), _rand((4,), seed=1)]) for op in _BINARY},
    "pow": Case("pow", lambda: [_positive((3,)), _rand((3,))]),
    "logical_not": Case("logical_not", lambda: [_rand((4,), "bool")]),
    **{
        op: Case(op, lambda: [_rand((4,), "bool"), _rand((4,), "bool", 1)])
        for op in ("logical_and", "logical_or", "logical_xor")
    },  # fmt: skip
    **{
        f"{op}{suffix}": Case(op, lambda pairs=pairs, dt=dt: [np.array(p, dt) for p in pairs])
        for op in ("floor_divide", "remainder")
        for suffix, dt, pairs in (("", np.int64, _DIVISION_I64), ("_i32", np.int32, _DIVISION_I32))
    },
    "remainder_float": Case(
        "remainder", lambda: [_rand((4,)), np.array([0.0, -0.0, 2.5, -1.0], np.float32)]
    ),
    "maximum_int": Case("maximum", lambda: [_rand((5,), "i64"), _rand((5,), "i64", 1)]),
    "minimum_int": Case("minimum", lambda: [_rand((5,), "i32"), _rand((5,), "i32", 1)]),
    "reduce_min_int": Case("reduce_min", lambda: [_rand((3, 4), "i64")], {"axes": [0, 1]}),
    "select": Case("select", lambda: [_rand((3, 4), "bool"), _rand((3, 4)), _rand((4,), seed=2)]),
    "cast": Case(
        "cast", lambda: [np.array([np.nan, 1.5, -2.5, 3e9, -3e9], np.float32)], {"dtype": "i32"}
    ),  # fmt: skip
    "normalize": Case(
        "normalize",
        lambda: [_rand((2, 3)), _rand((2, 1)), _positive((2, 1)), _rand((3,)), _rand((3,), seed=3)],
        {"epsilon": 1e-3},
    ),  # fmt: skip
    "matmul": Case(
        "matmul", lambda: [_rand((2, 3, 4)), _rand((5, 4))], {"transpose_b": True}, (1e-4, 1e-5)
    ),  # fmt: skip
    "matmul_accumulate": Case(
        "matmul_accumulate",
        lambda: [_rand((3, 4)), _rand((4, 2)), _rand((3, 2)), np.float32(0.5)],
        {},
        (1e-4, 1e-5),
    ),
    **{
        op: Case(op, lambda: [_rand((3, 4, 5))], {"axes": [0, 2]}, (1e-4, 1e-5))
        for op in (
            "reduce_sum",
            "reduce_mean",
            "reduce_max",
            "reduce_min",
            "reduce_prod",
            "variance",
        )
    },  # fmt: skip
    "argmax": Case(
        "argmax",
        lambda: [_NAN_ROW],
        {"axis": 0},
        note="MPSGraph skips NaN (PyTorch 130295); the emission selects the first NaN",
    ),
    "argmin": Case("argmin", lambda: [_rand((3, 4))], {"axis": 0}),
    "argsort": Case(
        "argsort",
        lambda: [np.arange(300, dtype=np.int64)[::-1].copy()],
        {"axis": 0},
        note="Int64 argSort is wrong past 256 elements on macOS 15.4+; the emission "
        "sorts Int32 ranks",
    ),
    "argsort_nan_ties": Case(
        "argsort", lambda: [np.array([np.nan, 1, 1, 0, np.nan, -np.inf], np.float32)], {"axis": 0}
    ),
    "softmax": Case("softmax", lambda: [_rand((3, 4))], {"axis": -1}),
    "softmax_all_neg_inf": Case(
        "softmax",
        lambda: [np.array([[-np.inf] * 4, [0, 1, 2, 3]], np.float32)],
        {"axis": -1},
        note="undocumented: the reference gives NaN for an all -inf row, as torch on the CPU",
    ),
    "log_softmax": Case("log_softmax", lambda: [_rand((3, 4)) * 30], {"axis": 0}, (1e-4, 1e-4)),
    "cumsum": Case(
        "cumsum", lambda: [_rand((3, 4))], {"axis": 1, "exclusive": True, "reverse": True}
    ),  # fmt: skip
    "reshape": Case("reshape", lambda: [_rand((3, 4))], {"shape": [2, 6]}),
    "transpose": Case("transpose", lambda: [_rand((2, 3, 4))], {"perm": [2, 0, 1]}),
    "broadcast_to": Case("broadcast_to", lambda: [_rand((3, 1))], {"shape": [2, 3, 4]}),
    "slice": Case(
        "slice", lambda: [_rand((5, 6))], {"starts": [1, 0], "ends": [5, 6], "strides": [2, 1]}
    ),  # fmt: skip
    "concat": Case("concat", lambda: [_rand((2, 3)), _rand((1, 3))], {"axis": 0}),
    "pad": Case("pad", lambda: [_rand((2, 3))], {"low": [1, 0], "high": [0, 2], "value": 1.5}),
    "gather": Case(
        "gather", lambda: [_rand((5, 3)), np.array([[0, -1], [4, 2]], np.int64)], {"axis": 0}
    ),  # fmt: skip
    "gather_along_axis": Case(
        "gather_along_axis",
        lambda: [_rand((4, 3)), np.array([[0], [2], [1], [-1]], np.int64)],
        {"axis": 1},
    ),
    "scatter_add": Case(
        "scatter_add",
        lambda: [_rand((5, 3)), np.array([[0, -1], [4, 0]], np.int64), _rand((2, 2, 3))],
        {"axis": 0},
    ),
    "scatter_add_along_axis": Case(
        "scatter_add_along_axis",
        lambda: [
            _rand((4, 3)),
            np.array([[0, 0], [2, 1], [1, 1], [-1, 0]], np.int64),
            _rand((4, 2)),
        ],
        {"axis": 1},
    ),  # fmt: skip
    "check_index": Case(
        "check_index",
        lambda: [np.array([[0, 3], [-2, 1]], np.int64)],
        {"low": -2, "high": 4, "message": "index {} is out of bounds"},
    ),
    "one_hot": Case(
        "one_hot",
        lambda: [np.array([0, 3, -1, 5, 2], np.int64)],
        {"depth": 4},
        note="one_hot(-1): the emission relies on an all-off row (TensorFlow's rule)",
    ),
    "conv2d": Case(
        "conv2d", lambda: [_rand((2, 4, 7, 6)), _rand((6, 2, 3, 2))], _CONV, (1e-4, 1e-4)
    ),  # fmt: skip
    "conv2d_data_grad": Case(
        "conv2d_data_grad",
        lambda: [_rand((2, 6, 3, 7)), _rand((6, 2, 3, 2))],
        {**_CONV, "input_shape": [2, 4, 7, 6]},
        (1e-4, 1e-4),
    ),  # fmt: skip
    "conv2d_weights_grad": Case(
        "conv2d_weights_grad",
        lambda: [_rand((2, 4, 7, 6)), _rand((2, 6, 3, 7))],
        {**_CONV, "weight_shape": [6, 2, 3, 2]},
        (1e-4, 1e-4),
    ),  # fmt: skip
    "max_pool2d": Case("max_pool2d", lambda: [_rand((2, 3, 7, 6))], {**_POOL, "dilation": [1, 2]}),
    "max_pool2d_grad_ties": Case(
        "max_pool2d_grad",
        lambda: [_rand((1, 1, 2, 2)), np.ones((1, 1, 4, 4), np.float32)],
        {"kernel": [2, 2], "strides": [2, 2], "padding": [0, 0, 0, 0]},
        note="ties: prim sends the gradient to the first maximum; Apple does not say",
    ),
    "avg_pool2d": Case(
        "avg_pool2d", lambda: [_rand((2, 3, 7, 6))], {**_POOL, "count_include_pad": False}
    ),  # fmt: skip
    "avg_pool2d_grad": Case(
        "avg_pool2d_grad",
        lambda: [_rand((2, 3, 4, 6))],
        {**_POOL, "input_shape": [2, 3, 7, 6], "count_include_pad": True},
    ),
    "constant": Case(
        "constant", lambda: [], {"shape": [2, 3], "dtype": "f32", "value": list(range(6))}
    ),  # fmt: skip
    "fill": Case("fill", lambda: [np.float32(2.5)], {"shape": [2, 2]}),
    "random_uniform": Case(
        "random_uniform",
        lambda: [np.array([-1, 2**63 - 1], np.int64)],
        {"shape": [4096]},
        (0.0, 0.0),
        note="bit-equal to eager's Philox stream",
    ),  # fmt: skip
    "random_normal": Case(
        "random_normal", lambda: [np.array([123, 7], np.int64)], {"shape": [65]}, (1e-4, 1e-4)
    ),  # fmt: skip
    "cast_i64_to_i32_overflow": Case(
        "cast",
        lambda: [np.array([2**31, -(2**31) - 1, 2**40 + 5, 7], np.int64)],
        {"dtype": "i32"},
        note="undocumented: the reference wraps (two's complement); Apple may saturate",
    ),
    "erf_precision": Case(
        "erf",
        lambda: [np.linspace(-4, 4, 257, dtype=np.float32)],
        {},
        (1e-6, 1e-6),
        note="precision against float64",
    ),  # fmt: skip
    "tanh_precision": Case(
        "tanh",
        lambda: [np.linspace(-10, 10, 257, dtype=np.float32)],
        {},
        (1e-6, 1e-6),
        note="precision against float64",
    ),  # fmt: skip
}


def run_emission(op: str, arrays: list[np.ndarray], attrs: dict[str, Any], device: bool) -> list:
    """The prim op's emission run on the device (native) or by the reference builder."""
    from lucid.backends.mpsgraph.emit import Val, emit_op, mps_dims
    from lucid.backends.mpsgraph.native import NativeBuilder
    from lucid.backends.mpsgraph.reference import ReferenceBuilder, run_program

    b = NativeBuilder() if device else ReferenceBuilder()
    ins = [Val(b.placeholder(mps_dims(a.shape), P.dtype_of(a), f"input:{i}"), a.shape,
               P.dtype_of(a)) for i, a in enumerate(arrays)]  # fmt: skip
    outs, _ = emit_op(b, op, ins, attrs)
    program = b.program(list(dict.fromkeys(o.id for o in outs)), [])
    feeds = [np.ascontiguousarray(a).reshape(mps_dims(a.shape)) for a in arrays]
    position = {t: i for i, t in enumerate(program["targets"])}
    results = (NativeBuilder.run(b.compile(program, cache=False), feeds) if device
               else run_program(program, feeds))  # fmt: skip
    return [np.asarray(results[position[o.id]]).reshape(o.shape) for o in outs]


def _compare(got: list, want: list, tolerance: tuple[float, float]) -> tuple[bool, str]:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, f"{g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        if g.dtype.kind == "f":
            same_nan = np.array_equal(np.isnan(g), np.isnan(w))
            finite = ~np.isnan(w)
            diff = np.abs(g[finite].astype(np.float64) - w[finite].astype(np.float64))
            bound = tolerance[1] + tolerance[0] * np.abs(w[finite].astype(np.float64))
            ok = same_nan and bool(np.all((diff <= bound) | (g[finite] == w[finite])))
            worst = max(worst, float(np.max(diff, initial=0.0)))
            if not ok:
                return False, f"max error {worst:.3g}" + ("" if same_nan else ", NaN differs")
        elif not np.array_equal(g, w):
            bad = int(np.argmax((g != w).reshape(-1)))
            return False, f"element {bad}: {g.reshape(-1)[bad]} vs {w.reshape(-1)[bad]}"
    return True, f"max error {worst:.3g}" if worst else "exact"


def check_case(name: str, device: bool) -> dict[str, str]:
    """One case, in this process: the device (or reference) against the reference and prim."""
    case = CASES[name]
    arrays = [np.asarray(a) for a in case.inputs()]
    got = run_emission(case.op, arrays, case.attrs, device)
    row = {"case": name, "op": case.op, "note": case.note}
    try:
        ok, detail = _compare(got, run_emission(case.op, arrays, case.attrs, False), case.tolerance)
        row["reference"] = ("agrees" if ok else "DIFFERS") + f" ({detail})"
    except ArithmeticError as e:  # UndefinedBehavior: Apple leaves it undefined
        row["reference"] = f"undefined there ({e}); the device gives {got[0].reshape(-1)[:6]}"
    want = P.evaluate(case.op, arrays, case.attrs)
    if case.note == "precision against float64":
        want = [np.asarray(P.evaluate(case.op, [a.astype(np.float64) for a in arrays],
                                      case.attrs)[0]).astype(np.float32)]  # fmt: skip
    ok, detail = _compare(got, want, case.tolerance)
    row["prim"] = ("agrees" if ok else "DIFFERS") + f" ({detail})"
    return row


def run_isolated(name: str, backend: str, timeout: float = 600.0) -> dict[str, str]:
    """One case in a child process: a crash (MPSGraph's abort) is reported, not inherited."""
    command = [sys.executable, "-m", "lucid.backends.mpsgraph.selfcheck", "--child", name,
               "--backend", backend]  # fmt: skip
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": name, "reference": f"TIMED OUT after {timeout:.0f} s", "prim": ""}
    if proc.returncode == 0 and proc.stdout.strip():
        return json.loads(proc.stdout.strip().splitlines()[-1])
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:160]
    return {"case": name, "op": CASES[name].op if name in CASES else "?",
            "reference": f"ABORTED ({how}): {tail}", "prim": "", "note": ""}  # fmt: skip


def machine() -> str:
    """macOS version and chip (or what this machine is)."""
    if sys.platform == "darwin":
        chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
        return f"macOS {platform.mac_ver()[0]}, {chip or platform.machine()}"
    return f"{platform.system()} {platform.release()}, {platform.machine()}"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (1 when a case differs or aborts)."""
    parser = argparse.ArgumentParser(prog="python -m lucid.backends.mpsgraph.selfcheck")
    parser.add_argument("--backend", choices=("mpsgraph", "mpsgraph-reference"),
                        default="mpsgraph")  # fmt: skip
    parser.add_argument("--case", action="append", choices=sorted(CASES), default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.backend == "mpsgraph"
    if args.child:
        if os.environ.get("LUCID_SELFCHECK_ABORT") == args.child:  # for the test of isolation
            os.abort()
        print(json.dumps(check_case(args.child, device)))
        return 0
    if device:
        from lucid.backends.mpsgraph.native import native_status

        ok, reason = native_status()
        if not ok:
            print(f"MPSGraph is not available here: {reason}", file=sys.stderr)
            print("(--backend mpsgraph-reference runs the reference instead)", file=sys.stderr)
            return 2
        where = reason
    else:
        where = "the reference builder (no device)"
    rows = [run_isolated(name, args.backend) for name in (args.case or list(CASES))]
    if args.json:
        print(json.dumps({"machine": machine(), "device": where, "rows": rows}, indent=1))
    else:
        print(f"MPSGraph self-check: {machine()}; {where}")
        print("| case | prim op | vs reference | vs prim | note |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['case']} | {r.get('op', '')} | {r['reference']} | {r.get('prim', '')} "
                  f"| {r.get('note', '')} |")  # fmt: skip
    failed = [r for r in rows if "DIFFERS" in r["reference"] + r.get("prim", "")
              or "ABORTED" in r["reference"] or "TIMED OUT" in r["reference"]]  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
