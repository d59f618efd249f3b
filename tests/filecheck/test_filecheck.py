"""A small FileCheck: runs each ``.mlir`` file here through ``lucid-opt`` as its ``// RUN:``
line says and matches the output against its ``// CHECK`` lines.

Directives: ``// RUN: lucid-opt %s <flags>`` (``%s`` is the file), ``// CHECK: text`` (found
on a later line), ``// CHECK-NEXT: text`` (on the very next line), ``// CHECK-NOT: text``
(absent between the surrounding matches), ``// ERROR: text`` (the case must fail: lucid-opt
exits 1 with one error line matching each ERROR pattern). ``{{regex}}`` inside a pattern is a
regular expression; the rest matches literally. Files may hold several cases separated by
``// -----``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lucid.tools.opt import main as lucid_opt

HERE = Path(__file__).parent
CASES = [
    (path, i)
    for path in sorted(HERE.glob("*.mlir"))
    for i in range(len(path.read_text().split("// -----")))
]


def _regex(pattern: str) -> re.Pattern:
    parts = re.split(r"\{\{(.*?)\}\}", pattern.strip())
    return re.compile("".join(p if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def _check(output: str, directives: list[tuple[str, str]], where: str) -> None:
    lines = output.splitlines()
    cursor = 0  # first line a CHECK may match
    last = -1  # line of the last match
    pending_not: list[re.Pattern] = []
    for kind, pattern in directives:
        rx = _regex(pattern)
        if kind == "CHECK-NOT":
            pending_not.append(rx)
            continue
        if kind == "CHECK-NEXT":
            candidates = [last + 1] if last + 1 < len(lines) else []
        else:
            candidates = list(range(cursor, len(lines)))
        hit = next((i for i in candidates if rx.search(lines[i])), None)
        if hit is None:
            shown = "\n".join(lines[cursor:])
            raise AssertionError(f"{where}: {kind}: {pattern!r} not found in:\n{shown}")
        for nrx in pending_not:
            for i in range(cursor, hit):
                if nrx.search(lines[i]):
                    raise AssertionError(f"{where}: CHECK-NOT {nrx.pattern!r} matched: {lines[i]}")
        pending_not = []
        last, cursor = hit, hit + 1
    for nrx in pending_not:
        for line in lines[cursor:]:
            if nrx.search(line):
                raise AssertionError(f"{where}: CHECK-NOT {nrx.pattern!r} matched: {line}")


@pytest.mark.parametrize("path, index", CASES, ids=[f"{p.stem}-{i}" for p, i in CASES])
def test_filecheck(path, index, tmp_path, capsys):
    text = path.read_text()
    run = re.search(r"^// RUN: lucid-opt %s(.*)$", text, re.M)
    assert run, f"{path.name} has no '// RUN: lucid-opt %s ...' line"
    case = text.split("// -----")[index]
    directives = re.findall(r"^\s*// (CHECK(?:-NEXT|-NOT)?): (.*)$", case, re.M)
    errors = re.findall(r"^\s*// ERROR: (.*)$", case, re.M)
    assert directives or errors, f"{path.name} case {index} has no CHECK or ERROR lines"
    source = tmp_path / "case.mlir"
    source.write_text(case)
    capsys.readouterr()
    code = lucid_opt([str(source), *shlex.split(run.group(1))])
    out, err = capsys.readouterr()
    if errors:
        assert code == 1 and out == "", f"{path.name} case {index} should fail:\n{out}{err}"
        assert err.count("\n") == 1 and err.startswith("lucid-opt: error: "), err
        for pattern in errors:
            assert _regex(pattern).search(err), f"ERROR {pattern!r} not in: {err}"
        return
    assert code == 0, err
    _check(out, directives, f"{path.name} case {index}")


def test_the_checker_itself_rejects_what_it_should():
    out = "alpha\nbeta %7 gamma\ndelta"
    _check(out, [("CHECK", "alpha"), ("CHECK-NEXT", "beta %{{[0-9]+}}"), ("CHECK", "delta")], "t")
    bad = [
        [("CHECK", "alpha"), ("CHECK-NEXT", "delta")],  # not the next line
        [("CHECK", "delta"), ("CHECK", "alpha")],  # out of order
        [("CHECK", "alpha"), ("CHECK-NOT", "beta"), ("CHECK", "delta")],  # forbidden in between
        [("CHECK", "beta %{{[a-z]+}}")],  # the regex part must match
    ]
    for directives in bad:
        with pytest.raises(AssertionError):
            _check(out, directives, "t")
