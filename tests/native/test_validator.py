"""Malformed programs and bad feeds raise clear Python exceptions; none crashes the process."""

import copy
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native


def valid_program():
    """x:f32[2,3], b:f32[3] -> exp(x + b), sum over axis 1."""
    return {
        "slots": [((2, 3), "f32"), ((3,), "f32"), ((2, 3), "f32"), ((2, 3), "f32"), ((2,), "f32")],
        "instrs": [
            ("add", [0, 1], [2], {}),
            ("exp", [2], [3], {}),
            ("reduce_sum", [3], [4], {"axes": [1], "keepdims": False}),
        ],
        "feeds": [0, 1],
        "results": [4, 3],
    }


def mutated(fn):
    desc = copy.deepcopy(valid_program())
    fn(desc)
    return desc


def _set(path, value):
    def apply(desc):
        target = desc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


def _instr(index, **changes):
    def apply(desc):
        op, ins, outs, attrs = desc["instrs"][index]
        desc["instrs"][index] = (
            changes.get("op", op),
            changes.get("ins", ins),
            changes.get("outs", outs),
            changes.get("attrs", attrs),
        )

    return apply


MALFORMED = {
    "unknown opcode": (_instr(0, op="frobnicate"), "unknown opcode 'frobnicate'"),
    "input slot out of range": (_instr(0, ins=[0, 9]), "slot 9 out of range"),
    "negative slot": (_instr(1, ins=[-1]), "slot -1 out of range"),
    "output slot out of range": (_instr(1, outs=[7]), "slot 7 out of range"),
    "use before definition": (_instr(0, ins=[0, 3]), "used before it is defined"),
    "output defined twice": (_instr(1, outs=[2]), "already defined"),
    "two outputs": (_instr(1, outs=[3, 4]), "exactly 1 output"),
    "wrong operand count": (_instr(1, ins=[2, 2]), "takes 1 operand"),
    "declared shape mismatch": (_set(("slots", 3), ((3, 2), "f32")), "declared f32[3,2]"),
    "declared dtype mismatch": (_set(("slots", 3), ((2, 3), "f64")), "declared f64[2,3]"),
    "operand dtype rule": (_set(("slots", 1), ((3,), "i32")), "same-dtype"),
    "shapes do not broadcast": (_set(("slots", 1), ((4,), "f32")), "do not broadcast"),
    "missing attribute": (_instr(2, attrs={"keepdims": False}), "missing attribute 'axes'"),
    "wrong attribute type": (_instr(2, attrs={"axes": 1, "keepdims": False}), "list of ints"),
    "axis out of range": (_instr(2, attrs={"axes": [5], "keepdims": False}), "axis 5"),
    "unknown dtype": (_set(("slots", 0), ((2, 3), "f17")), "unknown dtype"),
    "negative dimension": (_set(("slots", 0), ((-2, 3), "f32")), "negative dimension"),
    "feed out of range": (_set(("feeds",), [0, 11]), "feed 1: slot 11"),
    "feed twice": (_set(("feeds",), [0, 0]), "fed twice"),
    "result never defined": (
        lambda d: (d["slots"].append(((1,), "f32")), d.__setitem__("results", [5])),
        "never defined",
    ),
    "result out of range": (_set(("results",), [40]), "result 0: slot 40"),
    "inplace mismatch": (_set(("inplace",), {0: 0}), "does not match feed"),
    "inplace index": (_set(("inplace",), {5: 0}), "inplace result index 5"),
    "instruction not a tuple": (_set(("instrs", 0), "add"), "must be (opcode"),
    "slot not a pair": (_set(("slots", 0), (2, 3, 4)), "must be (shape, dtype)"),
    "shape not a list": (_set(("slots", 0), (2, "f32")), "slot 0 shape must be a list of ints"),
    "missing key": (lambda d: d.pop("feeds"), "lacks 'feeds'"),
    "attrs not a dict": (_instr(0, attrs=[1]), "attrs must be a dict"),
    "mixed list attribute": (_instr(2, attrs={"axes": [1, "a"], "keepdims": False}), "mixes"),
    "slots not a list": (_set(("slots",), 5), "'slots' must be a list"),
    "instrs not a list": (_set(("instrs",), 3), "'instrs' must be a list"),
    "huge dimension": (_set(("slots", 0), ((2**70, 3), "f32")), "does not fit in 64 bits"),
    "huge inplace index": (_set(("inplace",), {2**70: 0}), "inplace entry"),
    "huge attribute": (_instr(2, attrs={"axes": [2**70], "keepdims": False}), "out of range"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_each_malformed_program_raises_value_error(kind):
    mutate, message = MALFORMED[kind]
    with pytest.raises(ValueError, match=re.escape(message)):
        _native.compile(mutated(mutate), cache=False)


def test_fused_instruction_is_validated_node_by_node():
    desc = {
        "slots": [((4,), "f32"), ((4,), "f32")],
        "instrs": [
            (
                "fused",
                [0],
                [1],
                {
                    "sub_ops": ["exp", "neg"],
                    "sub_args": [0, 1],
                    "sub_dtypes": ["f32", "f32"],
                    "sub_floats": [0.0, 0.0],
                },
            )
        ],
        "feeds": [0],
        "results": [1],
    }
    assert _native.compile(desc, cache=False).run([np.ones(4, np.float32)])[0][0] == pytest.approx(
        -np.e
    )
    bad_arg = copy.deepcopy(desc)
    bad_arg["instrs"][0][3]["sub_args"] = [0, 2]
    with pytest.raises(ValueError, match="not an input or an earlier node"):
        _native.compile(bad_arg, cache=False)
    bad_op = copy.deepcopy(desc)
    bad_op["instrs"][0][3]["sub_ops"] = ["exp", "matmul"]
    with pytest.raises(ValueError, match="non-elementwise"):
        _native.compile(bad_op, cache=False)
    bad_dtype = copy.deepcopy(desc)
    bad_dtype["instrs"][0][3]["sub_dtypes"] = ["f32", "bool"]
    with pytest.raises(ValueError, match="declares dtype bool"):
        _native.compile(bad_dtype, cache=False)


def test_run_checks_feed_count_dtype_shape_and_layout():
    ex = _native.compile(valid_program(), cache=False)
    x, b = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    with pytest.raises(ValueError, match="expected 2 feed"):
        ex.run([x])
    with pytest.raises(TypeError, match="feed 1 has dtype float64"):
        ex.run([x, b.astype(np.float64)])
    with pytest.raises(ValueError, match=r"feed 0 has shape \[3, 2\]"):
        ex.run([x.reshape(3, 2), b])
    with pytest.raises(ValueError, match="C-contiguous"):
        ex.run([np.ones((3, 2), np.float32).T, b])
    with pytest.raises(TypeError, match="must be a numpy array"):
        ex.run([x, [1.0, 2.0, 3.0]])
    total, expx = ex.run([x, b])
    np.testing.assert_allclose(total, np.full(2, 3 * np.exp(2.0)), rtol=1e-6)


def test_readonly_feed_cannot_be_updated_in_place():
    desc = {
        "slots": [((3,), "f32"), ((3,), "f32")],
        "instrs": [("neg", [0], [1], {})],
        "feeds": [0],
        "results": [1],
        "inplace": {0: 0},
    }
    ex = _native.compile(desc, cache=False)
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ex.run([frozen])


CRASH_SCRIPT = textwrap.dedent(
    """
    import copy, random, sys
    import numpy as np
    from lucid import _native
    base = {
        "slots": [((2, 3), "f32"), ((3,), "f32"), ((2, 3), "f32"), ((2, 3), "f32"), ((2,), "f32")],
        "instrs": [("add", [0, 1], [2], {}), ("exp", [2], [3], {}),
                   ("reduce_sum", [3], [4], {"axes": [1], "keepdims": False})],
        "feeds": [0, 1], "results": [4, 3],
    }
    junk = [-1, 0, 1, 2, 5, 99, -(2**40), 2**62, "f32", "i64", "bool", "x", None, [], [0], [1, 2],
            (7,), (2, 3), (3, 2), 1.5, True, {}, {"axes": [0]}, ((2, 3), "f32"), ((), "i64")]
    rng = random.Random(int(sys.argv[1]))
    outcomes = {"ok": 0, "ValueError": 0, "TypeError": 0}
    for _ in range(400):
        desc = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(["slots", "instrs", "feeds", "results"])
            seq = desc[key]
            if not seq:
                continue
            i = rng.randrange(len(seq))
            item = seq[i]
            if isinstance(item, tuple) and rng.random() < 0.7:
                parts = list(item)
                parts[rng.randrange(len(parts))] = rng.choice(junk)
                seq[i] = tuple(parts)
            else:
                seq[i] = rng.choice(junk)
        try:
            ex = _native.compile(desc, cache=False)
            ex.run([np.ones((2, 3), np.float32), np.ones(3, np.float32)])
            outcomes["ok"] += 1
        except ValueError:
            outcomes["ValueError"] += 1
        except TypeError:
            outcomes["TypeError"] += 1
    print(outcomes)
    """
)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
@pytest.mark.parametrize("seed", [0, 1])
def test_randomly_corrupted_programs_never_crash_the_process(seed):
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(seed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcomes = eval(proc.stdout.strip().splitlines()[-1])  # a dict literal we printed ourselves
    assert outcomes["ValueError"] > 100


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_malformed_programs_in_a_subprocess_leave_it_alive():
    script = textwrap.dedent(
        """
        from lucid import _native
        one = [((2,), "f32")]
        two = [((2,), "f32"), ((3,), "f32")]
        for desc in [
            {"slots": one, "instrs": [("exp", [5], [0], {})], "feeds": [], "results": [0]},
            {"slots": one, "instrs": [("nope", [], [0], {})], "feeds": [], "results": [0]},
            {"slots": two, "instrs": [("reshape", [0], [1], {"shape": [3]})],
             "feeds": [0], "results": [1]},
        ]:
            try:
                _native.compile(desc, cache=False)
            except ValueError as e:
                print("ValueError:", e)
        print("alive")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "alive" and sum(line.startswith("ValueError") for line in lines) == 3


@settings(max_examples=25)
@given(slot=st.integers(-(2**31), 2**31 - 1))
def test_any_out_of_range_slot_index_is_rejected(slot):
    desc = valid_program()
    desc["instrs"][1] = ("exp", [slot], [3], {})
    if slot in (0, 2):  # the two slots of the right type defined before instruction 1
        _native.compile(desc, cache=False)
    else:
        with pytest.raises(ValueError):
            _native.compile(desc, cache=False)


@pytest.mark.parametrize("rows", [2, 100_000])
def test_a_fused_input_no_node_reads_must_still_broadcast_to_the_result(rows):
    # Found by the differential fuzzer: the evaluator walks every input over the output, so an
    # unread [rows, 1] input of a 0-d result was read out of bounds (a crash).
    desc = {
        "slots": [((rows, 1), "f32"), ((), "f32"), ((), "f32")],
        "instrs": [
            (
                "fused",
                [0, 1],
                [2],
                {"sub_ops": ["neg"], "sub_args": [1], "sub_dtypes": ["f32"], "sub_floats": [0.0]},
            )
        ],
        "feeds": [0, 1],
        "results": [2],
        "inplace": {},
    }
    with pytest.raises(ValueError, match="fused input 0 shape"):
        _native.validate(desc)
