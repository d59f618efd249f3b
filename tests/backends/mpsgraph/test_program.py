"""The recorded-program format: the recording builder and the validator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucid.backends.mpsgraph import program as P


def _small() -> dict:
    b = P.RecordingBuilder()
    x = b.placeholder((4, 3), "f32", "input:0")
    y = b.placeholder((3,), "f32", "input:1")
    (s,) = b.call(
        "additionWithPrimaryTensor:secondaryTensor:name:", [P.tensor(x), P.tensor(y), P.NIL]
    )
    (c,) = b.call(
        "constantWithData:shape:dataType:",
        [P.constant(np.arange(3, dtype=np.float32), "f32"), P.shape((3,)), P.dtype("f32")],
    )
    (m,) = b.call(
        "multiplicationWithPrimaryTensor:secondaryTensor:name:", [P.tensor(s), P.tensor(c), P.NIL]
    )
    return b.program([m, s], [(1, 0)])


def test_a_recorded_program_is_json_and_validates():
    prog = _small()
    again = json.loads(json.dumps(prog))
    P.validate(again)
    assert again["targets"] == [4, 2] and again["inplace"] == [[1, 0]]
    assert [c["selector"].split("With")[0] for c in again["calls"]] == [
        "addition", "constant", "multiplication",
    ]  # fmt: skip
    data = P.decode_constant(again["calls"][1]["args"][0])
    np.testing.assert_array_equal(data, [0, 1, 2])


def test_the_builder_refuses_unknown_selectors_and_wrong_arguments():
    b = P.RecordingBuilder()
    x = b.placeholder((2,), "f32", "input:0")
    with pytest.raises(P.ProgramError, match="not in the selector table"):
        b.call("additionWithTensor:name:", [P.tensor(x), P.NIL])
    with pytest.raises(P.ProgramError, match="expected tensor"):
        b.call("negativeWithTensor:name:", [P.integer(3), P.NIL])
    with pytest.raises(P.ProgramError, match="takes 2 arguments"):
        b.call("negativeWithTensor:name:", [P.tensor(x)])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p["calls"][0]["args"].__setitem__(0, {"tensor": 99}), "before it is defined"),
        (lambda p: p.__setitem__("format", "v0"), "not a lucid.mpsgraph/v1"),
        (lambda p: p["calls"][2].__setitem__("selector", "nope:"), "not in the selector table"),
        (lambda p: p.__setitem__("inplace", [[5, 0]]), "out of range"),
        (
            lambda p: p["placeholders"][0].__setitem__("dtype", "MPSDataTypeFloat64"),
            "unknown dtype",
        ),
    ],
)
def test_validate_names_what_is_wrong(mutate, message):
    prog = _small()
    mutate(prog)
    with pytest.raises(P.ProgramError, match=message):
        P.validate(prog)


def test_special_doubles_are_spelled_as_strings():
    for v in (float("inf"), float("-inf")):
        enc = P.double(v)
        assert isinstance(enc["double"], str) and P.decode_double(enc) == v
    assert np.isnan(P.decode_double(P.double(float("nan"))))
    json.dumps(P.double(float("nan")), allow_nan=False)
