"""Loading a trace refuses malformed JSON with a ValueError that names the JSON path."""

from __future__ import annotations

import copy

import pytest

from lucid.trace._trace import FORMAT, Trace

VALID = {
    "format": FORMAT,
    "feeds": [{"role": "input:0", "id": 0, "shape": [2, 3], "dtype": "float32"}],
    "ops": [
        {
            "name": "mul",
            "inputs": [{"id": 0}, {"const": 2.0}],
            "outputs": [{"id": 1, "shape": [2, 3], "dtype": "float32"}],
            "attrs": {},
        },
        {
            "name": "sum",
            "inputs": [{"id": 1}],
            "outputs": [{"id": 2, "shape": [2], "dtype": "float32"}],
            "attrs": {"dim": 1, "keepdim": False, "dtype": None},
            "loc": ["model.py", 12],
        },
    ],
    "outputs": [{"role": "output:0", "id": 2}],
}


def _with(path: list, value) -> dict:
    data = copy.deepcopy(VALID)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_the_valid_trace_loads():
    tr = Trace.from_dict(copy.deepcopy(VALID))
    assert [op.name for op in tr.ops] == ["mul", "sum"]
    assert tr.ops[1].loc == ("model.py", 12)


@pytest.mark.parametrize(
    "path, value, where, what",
    [
        (["feeds", 0, "shape", 1], -3, r"\$\.feeds\[0\]\.shape\[1\]", "integer >= 0"),
        (["feeds", 0, "shape", 0], 2.0, r"\$\.feeds\[0\]\.shape\[0\]", "got 2.0"),
        (["feeds", 0, "shape", 0], True, r"\$\.feeds\[0\]\.shape\[0\]", "got True"),
        (["feeds", 0, "shape", 0], float("inf"), r"\.shape\[0\]", "got inf"),
        (["feeds", 0, "shape", 0], 2**63, r"\.shape\[0\]", "integer"),
        (["ops", 0, "outputs", 0, "shape", 0], "2", r"\$\.ops\[0\]\.outputs\[0\]\.shape\[0\]", ""),
        (["feeds", 0, "shape"], 7, r"\$\.feeds\[0\]\.shape", "expected a list"),
        (["feeds", 0, "id"], True, r"\$\.feeds\[0\]\.id", "integer id"),
        (["feeds", 0, "id"], 0.0, r"\$\.feeds\[0\]\.id", "integer id"),
        (["feeds", 0, "dtype"], "float33", r"\$\.feeds\[0\]\.dtype", "unknown dtype"),
        (["feeds", 0, "dtype"], [1], r"\$\.feeds\[0\]\.dtype", "dtype name"),
        (["feeds", 0, "role"], 3, r"\$\.feeds\[0\]\.role", "role string"),
        (["ops", 0, "inputs", 1, "const"], "two", r"\$\.ops\[0\]\.inputs\[1\]\.const", "bool"),
        (["ops", 0, "inputs", 1, "const"], None, r"\.inputs\[1\]\.const", "a number"),
        (["ops", 0, "inputs", 0, "id"], 9, r"\$\.ops\[0\]\.inputs\[0\]\.id", "before defining"),
        (["ops", 0, "outputs", 0, "id"], 0, r"\$\.ops\[0\]\.outputs\[0\]\.id", "twice"),
        (["ops", 0, "name"], None, r"\$\.ops\[0\]\.name", "op name"),
        (["ops", 1, "attrs", "dim"], {"x": 1}, r"\$\.ops\[1\]\.attrs\.dim", "encoding"),
        (["ops", 1, "attrs", "dtype"], {"dtype": "nope"}, r"\.attrs\.dtype", "unknown dtype"),
        (["ops", 1, "attrs"], [1], r"\$\.ops\[1\]\.attrs", "an object"),
        (["ops", 1, "loc"], ["model.py", "x"], r"\$\.ops\[1\]\.loc", r"\[file, line\]"),
        (["ops", 1], "sum", r"\$\.ops\[1\]", "an object"),
        (["outputs", 0], {"role": "output:0", "const": 1.0}, r"\$\.outputs\[0\]", "constant"),
        (["outputs", 0, "id"], 5, r"\$\.outputs\[0\]\.id", "before defining"),
        (["outputs"], {}, r"\$\.outputs", "expected a list"),
    ],
)
def test_malformed_field_is_refused_with_its_json_path(path, value, where, what):
    with pytest.raises(ValueError, match=rf"{where}.*{what}"):
        Trace.from_dict(_with(path, value))


def test_missing_field_is_named():
    data = copy.deepcopy(VALID)
    del data["ops"][0]["outputs"]
    with pytest.raises(ValueError, match=r"\$\.ops\[0\]: missing field 'outputs'"):
        Trace.from_dict(data)
