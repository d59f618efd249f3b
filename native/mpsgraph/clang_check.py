"""Type-check the Objective-C++ of `native/mpsgraph` on Linux, as Xcode would on a Mac.

Each file is compiled with `clang -fsyntax-only -x objective-c++ -target arm64-apple-macos14.0
-fobjc-arc -Werror=unguarded-availability-new` against the stub SDK in `stubs/` (made by
`stubgen.py`), with libc++ and the arm64 glibc headers standing in for Apple's C and C++
headers. That catches misspelled selectors, wrong argument types and calls to methods newer than
the deployment target outside `@available`. It needs clang with libc++ headers and the arm64
C headers (Debian: `clang-19 libc++-19-dev libc6-dev-arm64-cross`; `.ci/run` installs them).

The pybind11 binding (`bind_mpsgraph.cpp`) is checked the same way as C++, with pybind11's and
Python's headers.

Usage: `python native/mpsgraph/clang_check.py [FILE ...]` (default: every `.mm`, `.h` and
`.cpp` of `native/mpsgraph`). Set `LUCID_CLANG` to choose the compiler.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUBS = HERE / "stubs"
DEPLOYMENT_TARGET = "14.0"
CLANG_NAMES = ("clang-19", "clang-20", "clang-21", "clang-18", "clang")
ARM64_C_HEADERS = Path("/usr/aarch64-linux-gnu/include")
# The check runs two compilers at once: the machine it was written for has two cores.
PARALLEL = 2


@dataclass(frozen=True)
class Toolchain:
    clang: str
    libcxx_headers: Path
    c_headers: Path


class ToolchainMissing(RuntimeError):
    """clang, libc++ headers or the arm64 C headers are not installed."""


def _libcxx_for(clang: str) -> Path | None:
    match = re.search(r"clang-(\d+)$", clang)
    candidates = []
    if match:
        candidates.append(Path(f"/usr/lib/llvm-{match.group(1)}/include/c++/v1"))
    resolved = Path(shutil.which(clang) or clang).resolve()
    # /usr/lib/llvm-N/bin/clang -> /usr/lib/llvm-N/include/c++/v1
    candidates.append(resolved.parent.parent / "include" / "c++" / "v1")
    candidates.append(Path("/usr/include/c++/v1"))
    for candidate in candidates:
        if (candidate / "vector").exists():
            return candidate
    return None


def find_toolchain() -> Toolchain:
    """The clang, libc++ and arm64 C headers to use, or ToolchainMissing saying what lacks."""
    names = [os.environ["LUCID_CLANG"]] if os.environ.get("LUCID_CLANG") else CLANG_NAMES
    problems = []
    for name in names:
        if not shutil.which(name):
            continue
        libcxx = _libcxx_for(name)
        if libcxx is None:
            problems.append(f"{name} has no libc++ headers (install libc++-N-dev)")
            continue
        if not (ARM64_C_HEADERS / "stdio.h").exists():
            problems.append(f"no arm64 C headers in {ARM64_C_HEADERS} (libc6-dev-arm64-cross)")
            continue
        return Toolchain(shutil.which(name) or name, libcxx, ARM64_C_HEADERS)
    if not problems:
        problems.append(f"no clang found (tried {', '.join(names)})")
    raise ToolchainMissing("; ".join(problems))


def command(toolchain: Toolchain, source: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The clang invocation that type-checks one file against the stub SDK."""
    # The .cpp files are plain C++; the pybind11 binding also needs pybind11's and Python's headers.
    binding = source.name.startswith("bind_")
    language = {".h": "objective-c++-header", ".cpp": "c++"}.get(source.suffix, "objective-c++")
    return [
        toolchain.clang,
        "-fsyntax-only",
        "-x",
        language,
        "-std=c++17",
        *(binding_includes() if binding else ()),
        *(("-fobjc-arc",) if source.suffix != ".cpp" else ()),
        "-target",
        f"arm64-apple-macos{DEPLOYMENT_TARGET}",
        "-Werror=unguarded-availability-new",
        "-Werror=objc-method-access",
        "-Wall",
        "-Werror",
        "-Wno-nullability-completeness",
        "-Wno-pragma-once-outside-header",
        # The stub SDK as system headers, like Apple's: their own warnings are not ours.
        "-isystem",
        str(STUBS),
        "-I",
        str(HERE),
        # Apple's headers are the stubs; the host's x86_64 glibc must stay out.
        "-nostdlibinc",
        "-isystem",
        str(toolchain.libcxx_headers),
        "-idirafter",
        str(toolchain.c_headers),
        "-idirafter",
        str(STUBS / "_libc"),
        # The Darwin target predefines __nonnull, which breaks glibc's macro of that name.
        "-U__nonnull",
        "-D_GNU_SOURCE",
        *extra,
        str(source),
    ]


@dataclass(frozen=True)
class Result:
    source: Path
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def check_file(toolchain: Toolchain, source: Path, extra: tuple[str, ...] = ()) -> Result:
    proc = subprocess.run(
        command(toolchain, source, extra), capture_output=True, text=True, timeout=300
    )
    return Result(source, proc.returncode, proc.stdout + proc.stderr)


def check_files(
    toolchain: Toolchain, sources: list[Path], extra: tuple[str, ...] = ()
) -> list[Result]:
    """Type-check several files, two compilers at a time."""
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return list(pool.map(lambda source: check_file(toolchain, source, extra), sources))


def binding_checkable() -> str | None:
    """Why the pybind11 binding cannot be checked here (its headers are missing), or None."""
    try:
        import pybind11  # noqa: F401
    except ImportError:
        return "pybind11 is not installed in this environment (pip install pybind11)"
    return None


def project_sources(binding: bool = True) -> list[Path]:
    """Every source and header of native/mpsgraph (the stubs excepted), the slowest first: the
    pybind11 binding (when `binding`), then the Objective-C++."""
    rest = sorted(path for suffix in ("*.mm", "*.h", "*.cpp") for path in HERE.glob(suffix))
    rest = [path for path in rest if not path.name.startswith("bind_")]
    return (sorted(HERE.glob("bind_*.cpp")) if binding else []) + rest


def binding_includes() -> tuple[str, ...]:
    """Include flags for the pybind11 binding: pybind11's and Python's headers."""
    import sysconfig

    import pybind11

    return ("-isystem", pybind11.get_include(), "-isystem", sysconfig.get_paths()["include"])


@dataclass
class TableDecl:
    """What clang's AST shows of one `k...` table: its string literals and message sends."""

    name: str
    # In source order: ("string", value), ("send", selector, receiver type or class) or
    # ("call", member function, integer argument) for calls like `a.tensor(0)`.
    items: list[tuple[str, ...]]

    def entries(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """(string, sends after it up to the next string) for tables of {"key", lambda}."""
        out: list[tuple[str, list[tuple[str, str]]]] = []
        for item in self.items:
            if item[0] == "string":
                out.append((item[1], []))
            elif out and item[0] == "send":
                out[-1][1].append((item[1], item[2]))
        return out

    def entry_calls(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """(string, member calls with an integer argument up to the next string)."""
        out: list[tuple[str, list[tuple[str, int]]]] = []
        for item in self.items:
            if item[0] == "string":
                out.append((item[1], []))
            elif out and item[0] == "call":
                out[-1][1].append((item[1], int(item[2])))
        return out

    def strings(self) -> list[str]:
        return [item[1] for item in self.items if item[0] == "string"]

    def sends(self) -> list[tuple[str, str]]:
        return [(item[1], item[2]) for item in self.items if item[0] == "send"]


_DUMPING = re.compile(r"^Dumping (.+):$")
_STRING = re.compile(r"StringLiteral (0x[0-9a-f]+) <.*?> '[^']*' lvalue (\".*\")$")
_SEND = re.compile(
    r"ObjCMessageExpr (0x[0-9a-f]+) <.*?> '[^']*' selector=(\S+)(?: class='([^']+)')?"
)
_TYPE = re.compile(r"'([^']+)'")
_MEMBER = re.compile(r"MemberExpr (0x[0-9a-f]+) <.*?> '<bound member function type>' \.(\w+) ")
_INTEGER = re.compile(r"IntegerLiteral 0x[0-9a-f]+ <.*?> '[^']*' (\d+)$")


def tables(toolchain: Toolchain, source: Path) -> dict[str, TableDecl]:
    """The file-scope `k...` constants of `source` as clang sees them (its AST, text dump).

    Also type-checks the file: raises RuntimeError with clang's errors when it does not compile.
    """
    extra = ("-Xclang", "-ast-dump", "-Xclang", "-ast-dump-filter=::k", "-fno-color-diagnostics")
    proc = subprocess.run(
        command(toolchain, source, extra), capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"clang AST dump of {source} failed:\n{proc.stderr[-4000:]}")
    decls: dict[str, TableDecl] = {}
    current: TableDecl | None = None
    # A lambda's body is printed twice (in its closure type and as the expression).
    seen: set[str] = set()
    lines = proc.stdout.splitlines()
    for index, line in enumerate(lines):
        dumping = _DUMPING.match(line)
        if dumping:
            name = dumping.group(1).rsplit("::", 1)[-1]
            current = decls.setdefault(name, TableDecl(name, []))
            continue
        if current is None:
            continue
        string = _STRING.search(line)
        if string:
            address, literal = string.groups()
            if address not in seen:
                seen.add(address)
                current.items.append(("string", json.loads(literal)))
            continue
        member = _MEMBER.search(line)
        if member:
            address, function = member.groups()
            # The call's argument follows within a few lines (a.tensor(0): MemberExpr, DeclRefExpr
            # of `a`, IntegerLiteral); calls without an integer argument are not recorded.
            for following in lines[index + 1 : index + 4]:
                integer = _INTEGER.search(following)
                if integer and address not in seen:
                    seen.add(address)
                    current.items.append(("call", function, integer.group(1)))
                    break
            continue
        send = _SEND.search(line)
        if send:
            address, selector, cls = send.groups()
            if address in seen:
                continue
            seen.add(address)
            receiver = cls
            if receiver is None:  # an instance message: its first child is the receiver
                depth = len(line) - len(line.lstrip(" |`-"))
                for child in lines[index + 1 :]:
                    if len(child) - len(child.lstrip(" |`-")) > depth:
                        match = _TYPE.search(child)
                        receiver = match.group(1) if match else "?"
                        break
            current.items.append(("send", selector, receiver or "?"))
    return decls


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    try:
        toolchain = find_toolchain()
    except ToolchainMissing as missing:
        print(f"clang_check: {missing}", file=sys.stderr)
        return 2
    why_not = binding_checkable()
    if why_not and not args:
        print(f"clang_check: skipping bind_mpsgraph.cpp: {why_not}", file=sys.stderr)
    sources = [Path(a) for a in args] or project_sources(binding=why_not is None)
    failures = 0
    for result in check_files(toolchain, sources):
        status = "ok" if result.ok else "FAILED"
        print(f"{status}: {result.source}")
        if not result.ok:
            failures += 1
            print(result.output)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
