"""Every code block of README.md and docs/*.md runs here.

The convention, written in the fence's info string: the language, then markers.

    ```python               runs on its own: a fresh namespace, a scratch working folder
    ```python continued     runs after the previous python block that runs in the same file,
                            in its namespace and folder (prefer blocks that stand alone)
    ```python fragment      an excerpt that cannot run on its own (not run)
    ```python slow          runs only with ``-m slow``
    ```sh                   shell commands, run with bash -e in a scratch folder; ``python``,
                            ``lucid-opt``, ``lucid-inspect-trace`` and ``xdsl-opt`` are this venv's
    ```sh continued         runs in the folder of the previous shell block of the file
    ```sh manual            a whole command the suite does not run (installs, benchmarks, needs
                            another machine, runs the suite itself)
    ```text, ```mlir, ...   not code (output, IR, diagrams, data): not run; ```json must parse

Every block names its language: a bare fence fails
`test_every_block_declares_its_language_and_known_markers`, as does an unknown marker, or a
running shell block that installs, deletes or names a path outside its folder (mark it
``manual``). Markers combine where it makes sense (``python continued slow``); a block continued
from a slow one runs it too.

Shell blocks find these sample files in their folder: ``model.mlir`` (the module of
docs/passes.md's first example), ``trace.json`` (its trace) and ``symbolic.mlir`` (a
``Linear(8, 4)`` + ReLU traced with a symbolic batch: ``tensor<?x8xf32>``).

A failure names the block as ``file:line`` (the line of its opening fence) with the traceback,
whose frames point at the doc's own lines. The blocks run in a helper process
(tests/docs_runner.py) that imports Lucid once and forks a child per chain of blocks (a fresh
interpreter per chain where forking is unsafe, or with ``LUCID_DOCS_NO_FORK=1``). The chains
of the selected blocks start running in the background as soon as the run's tests are known
(``background_work``), so they use the machine's other core while the tests before this
module run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().parent / "docs_runner.py"
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

PYTHON = {"python", "py", "python3"}
SHELL = {"sh", "bash", "shell"}
MARKERS = {"continued", "fragment", "slow", "manual"}
CHAIN_TIMEOUT_S = 300.0
# A shell block that runs must stay inside its scratch folder and this venv: one that installs,
# deletes or names a path outside is refused (mark it manual) rather than run.
_UNSAFE_SHELL = re.compile(
    r"\b(pip3?|venv|virtualenv|sudo|apt-get|apt|git|rm|curl|wget|pytest)\b"
    r"|(^|[\s=\"'])(/(?!dev/null\b)|~|\.\./|\.venv/)"
)

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository, e.g. "docs/user-guide.md"
    source: str  # the file's absolute path (tracebacks show its lines)
    line: int  # 1-based line of the opening fence
    lang: str
    markers: tuple[str, ...]
    code: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def kind(self) -> str:
        if self.lang in PYTHON:
            return "python"
        return "sh" if self.lang in SHELL else "data"

    @property
    def runs(self) -> bool:
        """Run by this module (slow ones under ``-m slow``)."""
        return self.kind != "data" and not {"fragment", "manual"} & set(self.markers)


def parse_blocks(path: Path, root: Path = REPO) -> list[Block]:
    """The fenced code blocks of one Markdown file, in order (paths shown relative to root)."""
    rel = path.relative_to(root).as_posix()
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        words = m["info"].split()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]
        ]
        blocks.append(
            Block(
                path=rel,
                source=str(path.resolve()),
                line=i + 1,
                lang=words[0].lower() if words else "",
                markers=tuple(words[1:]),
                code="\n".join(body) + "\n",
            )
        )
        i = j + 1
    return blocks


ALL_BLOCKS = [b for path in DOC_FILES for b in parse_blocks(path)]


def chains_of(blocks: list[Block]) -> dict[Block, list[Block]]:
    """Each running block -> its chain: the block that starts it and its continuations."""
    chains: dict[Block, list[Block]] = {}
    by_file: dict[tuple[str, str], list[Block]] = {}
    for b in blocks:
        if b.runs:
            by_file.setdefault((b.path, b.kind), []).append(b)
    for file_blocks in by_file.values():
        chain: list[Block] = []
        for b in file_blocks:
            if "continued" not in b.markers or not chain:
                chain = []
            chain.append(b)
            chains[b] = chain
    return chains


CHAINS = chains_of(ALL_BLOCKS)


def test_every_block_declares_its_language_and_known_markers():
    problems = []
    runs_before: set[tuple[str, str]] = set()
    for b in ALL_BLOCKS:
        if not b.lang:
            problems.append(
                f"{b.where}: a fence without a language: name it (python, sh, text, mlir, ...)"
            )
        unknown = set(b.markers) - MARKERS
        if unknown:
            problems.append(
                f"{b.where}: unknown markers {sorted(unknown)}; known: {sorted(MARKERS)}"
            )
        if {"fragment", "manual"} & set(b.markers) and "continued" in b.markers:
            problems.append(f"{b.where}: a block that does not run cannot be 'continued'")
        if "continued" in b.markers and b.runs and (b.path, b.kind) not in runs_before:
            problems.append(
                f"{b.where}: 'continued', but no earlier {b.kind} block of {b.path} runs"
            )
        if b.runs and b.kind == "sh" and _UNSAFE_SHELL.search(b.code):
            problems.append(
                f"{b.where}: a shell block that installs, deletes or reaches outside its "
                f"folder ({_UNSAFE_SHELL.search(b.code).group(0).strip()!r}) must be 'manual'"
            )
        if b.runs:
            runs_before.add((b.path, b.kind))
    assert not problems, "code blocks of the docs:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "block",
    [b for b in ALL_BLOCKS if b.lang == "json"],
    ids=lambda b: b.where,
)
def test_json_block_parses(block):
    try:
        json.loads(block.code)
    except json.JSONDecodeError as e:
        pytest.fail(f"{block.where}: the json block does not parse: {e}", pytrace=False)


class Runner:
    """The helper process (tests/docs_runner.py) and the results of the chains it ran. Its
    methods may be called from two threads (the background one and the tests')."""

    def __init__(self, env: dict | None = None) -> None:
        self._lock = threading.RLock()  # one request at a time on the helper's pipes
        self.proc = subprocess.Popen(
            [sys.executable, str(RUNNER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
            env=env,
        )
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("tests/docs_runner.py exited before it was ready (see stderr)")
        self.results: dict[Block, dict] = {}
        self.scratch = tempfile.TemporaryDirectory(prefix="lucid-docs-")

    def run(
        self, chain: list[Block], timeout: float = CHAIN_TIMEOUT_S, fresh_process: bool = False
    ) -> dict:
        """Run one chain; ``fresh_process`` runs it in a fresh interpreter instead of a fork."""
        with self._lock:
            return self._run(chain, timeout, fresh_process)

    def _run(self, chain: list[Block], timeout: float, fresh_process: bool) -> dict:
        folder = tempfile.mkdtemp(dir=self.scratch.name)
        request = {
            "blocks": [
                {
                    "lang": b.kind,
                    "code": b.code,
                    "line": b.line,
                    "abspath": b.source,
                }
                for b in chain
            ],
            "cwd": folder,
            "timeout": timeout,
            "fresh_process": fresh_process,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("tests/docs_runner.py died (see stderr)")
        return json.loads(answer)

    def result_of(self, block: Block, slow_selected: bool) -> dict:
        with self._lock:
            if block not in self.results:
                self._run_chain_of(block, slow_selected)
            return self.results[block]

    def _run_chain_of(self, block: Block, slow_selected: bool) -> None:
        chain = CHAINS[block]
        # Run the chain up to this block, and on through the continuations after it that
        # this run selects, so each chain usually runs once.
        upto = chain.index(block)
        while (
            upto + 1 < len(chain)
            and chain[upto + 1] not in self.results
            and (slow_selected or "slow" not in chain[upto + 1].markers)
        ):
            upto += 1
        answer = self.run(chain[: upto + 1])
        if answer.get("timeout"):
            for b in chain[: upto + 1]:
                self.results[b] = {"ok": False, "error": f"timed out after {CHAIN_TIMEOUT_S} s"}
        else:
            by_line = {r["line"]: r for r in answer["results"]}
            failed = next((r for r in answer["results"] if not r["ok"]), None)
            for b in chain[: upto + 1]:
                if b.line in by_line:
                    self.results[b] = by_line[b.line]
                else:
                    first = next(c for c in chain if c.line == failed["line"]) if failed else b
                    self.results[b] = {
                        "ok": False,
                        "error": f"not run: {first.where}, earlier in its chain, failed",
                    }

    def close(self) -> None:
        """Stop the helper once its current chain is done; at once when the run ends early
        (``-x``, Ctrl-C) while the background thread still has a chain running."""
        if not self._lock.acquire(blocking=False):
            self.proc.kill()  # the thread's answer never comes: it stops with an error
            self.proc.wait(timeout=60)
            with contextlib.suppress(OSError):  # the chain's process may still write there
                self.scratch.cleanup()
            return
        try:
            if self.proc.stdin.closed:
                return
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc.stdout.close()
            self.scratch.cleanup()
        finally:
            self._lock.release()


def _unsafe_blocks_of(chain: list[Block]) -> list[Block]:
    return [b for b in chain if b.kind == "sh" and _UNSAFE_SHELL.search(b.code)]


def _slow_selected(config: pytest.Config) -> bool:
    return "not slow" not in (config.getoption("-m") or "")


# The runner started by background_work's job, once it is ready (None: no job).
_background_runner: Future | None = None


def background_work(items: list[pytest.Item], config: pytest.Config):
    """Called by tests/conftest.py with this module's selected tests: the job it runs in the
    background, which starts the runner and runs the chains of the selected blocks in the tests'
    order (the tests then find their results ready, or wait for them)."""
    global _background_runner
    blocks = [
        item.callspec.params["block"]
        for item in items
        if getattr(item, "originalname", None) == "test_code_block_runs"
    ]
    # As test_code_block_runs: a chain with an unsafe shell block is refused, never run.
    blocks = [b for b in blocks if not _unsafe_blocks_of(CHAINS[b])]
    if not blocks:
        return None
    slow_selected = _slow_selected(config)
    started: Future = Future()

    def work() -> None:
        try:
            runner = Runner()
        except BaseException as e:  # noqa: BLE001 - the runner fixture raises it again
            started.set_exception(e)
            return
        started.set_result(runner)
        for block in blocks:
            try:
                runner.result_of(block, slow_selected)
            except (OSError, ValueError, RuntimeError):
                return  # closed or died: the test asking for this block raises it again

    def close() -> None:
        if started.done() and started.exception() is None:
            started.result().close()

    config.add_cleanup(close)
    _background_runner = started
    return work


@pytest.fixture(scope="module")
def runner():
    r = _background_runner.result() if _background_runner is not None else Runner()
    yield r
    r.close()


def _param(b: Block):
    marks = [pytest.mark.slow] if "slow" in b.markers else []
    return pytest.param(b, id=b.where, marks=marks)


@pytest.mark.parametrize("block", [_param(b) for b in ALL_BLOCKS if b.runs])
def test_code_block_runs(block, runner, request):
    unsafe = _unsafe_blocks_of(CHAINS[block])
    if unsafe:
        pytest.fail(f"{unsafe[0].where}: not run: mark this shell block 'manual'", pytrace=False)
    result = runner.result_of(block, _slow_selected(request.config))
    if not result["ok"]:
        printed = result.get("printed")
        extra = f"\n--- printed before the failure ---\n{printed}" if printed else ""
        pytest.fail(
            f"{block.where} ({block.kind} block) failed:\n{result['error']}{extra}",
            pytrace=False,
        )


def test_readme_has_two_setup_commands_and_ci_runs_them():
    """The README's set-up is two commands (install + demo, tests), and .ci/run runs the same."""
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set up") :]
    setup = setup[: setup.index("\n## ", 1)]
    blocks = [b for b in parse_blocks(REPO / "README.md") if b.kind == "sh"]
    commands = [b.code.strip() for b in blocks if b.code.strip() in setup]
    assert len(commands) == 2, f"README.md's set-up has {len(commands)} shell commands, not 2"
    install, tests = commands
    ci = (REPO / ".ci" / "run").read_text()
    for part in install.split(" && ") + [tests]:
        part = part.replace("-m lucid.demo", "-m lucid.demo --quick")  # CI runs the quick demo
        assert part in ci, f".ci/run does not run the README's set-up step {part!r}"


OUTSIDE_DOCUMENTS = re.compile(
    r"\b(DESIGN|PERF|API|NATIVE-BUILD|XDSL-NOTES|MPSGRAPH-NOTES|STYLE)\.md\b|MPSGRAPH-NOTES"
    r"|/work/|\bissue \d+\b"
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_docs_stand_alone():
    """No reference to documents outside the repository (the project's planning notes, issue
    numbers, this machine's folders) in the docs, the benchmarks or Lucid's sources; every
    relative link of the docs names a file of the repository."""
    problems = []
    texts = [
        *DOC_FILES,
        *sorted((REPO / "benchmarks").glob("*.py")),
        *sorted((REPO / "lucid").rglob("*.py")),
    ]
    for path in texts:
        rel = path.relative_to(REPO).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = OUTSIDE_DOCUMENTS.search(line)
            if m:
                problems.append(f"{rel}:{n}: refers to {m.group(0)!r}, outside the repository")
            if path.suffix != ".md":
                continue
            for target in _LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a web address or an anchor of the same page
                if not (path.parent / target.split("#")[0]).exists():
                    problems.append(f"{rel}:{n}: the link {target!r} names no file")
    assert not problems, "\n".join(problems)


def test_a_failing_block_names_its_file_and_line(runner, tmp_path):
    doc = tmp_path / "guide.md"
    doc.write_text(
        "# A guide\n\n```python\nx = 1\n```\n\nProse.\n\n"
        "```python continued\ny = x + 1\nassert y == 3, 'y is not 3'\n```\n\n"
        "```sh\necho fine\nfalse\necho never\n```\n"
    )
    blocks = parse_blocks(doc, root=tmp_path)
    assert [(b.where, b.kind, b.markers) for b in blocks] == [
        ("guide.md:3", "python", ()),
        ("guide.md:9", "python", ("continued",)),
        ("guide.md:14", "sh", ()),
    ]
    chains = chains_of(blocks)
    assert chains[blocks[1]] == blocks[:2] and chains[blocks[2]] == blocks[2:]

    first, second = runner.run(chains[blocks[1]])["results"]
    assert first["ok"] and not second["ok"]
    assert f'File "{doc}", line 11' in second["error"]  # the failing line of the doc itself
    assert "AssertionError: y is not 3" in second["error"]
    assert "docs_runner" not in second["error"]  # only the block's own frames

    (shell,) = runner.run(chains[blocks[2]])["results"]
    assert not shell["ok"] and "exit status 1" in shell["error"] and "+ false" in shell["error"]
    assert "never" not in shell["error"].split("--- stdout ---")[1]


def test_a_block_past_its_timeout_is_stopped(runner, tmp_path):
    doc = tmp_path / "slow.md"
    doc.write_text("```python\nimport time\ntime.sleep(60)\n```\n")
    (block,) = parse_blocks(doc, root=tmp_path)
    assert runner.run([block], timeout=0.5) == {"timeout": True}


def test_background_work_runs_what_the_tests_would_and_no_refused_chain(monkeypatch, tmp_path):
    """background_work's job asks the runner for the selected blocks, in order, with the run's
    slow selection, and leaves out a chain the test refuses (an unsafe shell block)."""
    doc = tmp_path / "guide.md"
    doc.write_text("```python\nx = 1\n```\n\n```sh\nrm -r somewhere\n```\n\n```sh\necho hi\n```\n")
    blocks = parse_blocks(doc, root=tmp_path)
    asked = []

    class FakeRunner:
        def result_of(self, block, slow_selected):
            asked.append((block.line, slow_selected))

    monkeypatch.setitem(globals(), "CHAINS", chains_of(blocks))
    monkeypatch.setitem(globals(), "Runner", FakeRunner)
    monkeypatch.setitem(globals(), "_background_runner", None)
    items = [
        SimpleNamespace(
            originalname="test_code_block_runs", callspec=SimpleNamespace(params={"block": b})
        )
        for b in blocks
    ] + [SimpleNamespace(originalname="test_docs_stand_alone")]
    cleanups = []
    config = SimpleNamespace(getoption=lambda name: "not slow", add_cleanup=cleanups.append)
    job = background_work(items, config)
    job()
    assert asked == [(1, False), (9, False)]
    assert isinstance(_background_runner.result(), FakeRunner) and len(cleanups) == 1


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_chains_also_run_in_fresh_processes(runner, tmp_path):
    """Where forking is unsafe (macOS), each chain runs in a fresh interpreter; same answers.
    The shared runner starts them (``fresh_process``); the slow test below runs a whole runner
    that never forks, shell blocks included."""
    doc = tmp_path / "guide.md"
    doc.write_text(
        "```python\nimport sys\nimport lucid\n"
        "assert sys.argv[1:2] == ['--chain'], 'a forked child, not a fresh interpreter'\n"
        "x = lucid.ones(2)\n```\n\n"
        "```python continued\nassert x.sum().item() == 3, 'two ones'\n```\n\n"
        "```python\nimport time\ntime.sleep(60)\n```\n"
    )
    blocks = parse_blocks(doc, root=tmp_path)
    first, second = runner.run(blocks[:2], fresh_process=True)["results"]
    assert first["ok"], first["error"]
    assert not second["ok"]
    assert f'File "{doc}", line 9' in second["error"] and "two ones" in second["error"]
    assert runner.run(blocks[2:], timeout=1.0, fresh_process=True) == {"timeout": True}


@pytest.mark.slow
def test_a_runner_that_never_forks_gives_the_same_answers(tmp_path):
    """``LUCID_DOCS_NO_FORK=1``: every chain of the runner, shell blocks with the sample files
    included, runs in a fresh interpreter."""
    doc = tmp_path / "guide.md"
    doc.write_text(
        "```python\nimport lucid\nx = lucid.ones(2)\n```\n\n"
        "```python continued\nassert x.sum().item() == 3, 'two ones'\n```\n\n"
        "```sh\nlucid-opt model.mlir -p cse > /dev/null && test -f symbolic.mlir\n```\n\n"
        "```python\nimport time\ntime.sleep(60)\n```\n"
    )
    blocks = parse_blocks(doc, root=tmp_path)
    runner = Runner(env={**os.environ, "LUCID_DOCS_NO_FORK": "1"})
    try:
        first, second = runner.run(blocks[:2])["results"]
        assert first["ok"] and not second["ok"]
        assert f'File "{doc}", line 7' in second["error"] and "two ones" in second["error"]
        (shell,) = runner.run(blocks[2:3])["results"]
        assert shell["ok"], shell.get("error")  # the sample files are there too
        assert runner.run(blocks[3:], timeout=2.0) == {"timeout": True}
    finally:
        runner.close()
