"""The on-disk compile cache (``LUCID_COMPILE_DISK_CACHE=1``): backend programs by IR hash.

An entry is one JSON file ``<key>.json`` in ``LUCID_COMPILE_DISK_CACHE_DIR`` (default
``$XDG_CACHE_HOME/lucid/compile``, else ``~/.cache/lucid/compile``).

The cache only ever deletes what it wrote. It uses a folder it owns, marked by the signature
file ``CACHEDIR.TAG`` it writes there when the folder is new or holds nothing but entries; a
folder holding other files and no such signature is left alone (the disk cache is off for it,
reported once). In its folder it touches only files named ``<64 hex digits>.json`` whose content
starts as an entry does.

The key is a SHA-256 of what determines the executable: the traced graph (its JSON with value
ids renumbered in order, so the same code traced after other work has the same key; importing it
to IR would cost more than the rest of a hit), the graph and backend pass pipelines, the backend
and its program format, the Lucid version, a hash of the code that produced it (every Python
source and extension module of the package, so an edit or a rebuild starts afresh even when
``__version__`` does not change) and the machine (OS, processor architecture).

An entry holds the feed and result roles and the backend's program text, with a SHA-256 over
them: a file that does not parse or match it is ignored, removed, and reported once on the
``lucid.compile`` logger; so is one that does not fit the graph it is found for (other roles, a
program the backend refuses or whose feeds do not fit at the first run), which is then compiled
afresh. Entries are written beside and renamed into place, so a reader never sees half an entry
and concurrent writers of one key leave one whole file. A hit touches the file's mtime; when the
folder holds more than ``LUCID_COMPILE_DISK_CACHE_MAX_MB`` (default 1024) the least recently used
entries are removed. Nothing in an entry is executed: the program is a description the backend
validates.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import sys
import tempfile
from typing import Any

logger = logging.getLogger("lucid.compile")

ENTRY_FORMAT = "lucid.compile-cache"
ENTRY_VERSION = 1
DEFAULT_MAX_MB = 1024.0
_REPORTED: set[str] = set()
SIGNATURE_FILE = "CACHEDIR.TAG"
# The CACHEDIR.TAG convention (https://bford.info/cachedir/) also keeps backup tools out.
SIGNATURE = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This folder is lucid.compile's disk cache (LUCID_COMPILE_DISK_CACHE_DIR).\n"
    b"# Lucid deletes only the <key>.json entries it wrote here.\n"
)
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.json")
_TEMP_NAME = re.compile(r"\.(signature|[0-9a-f]{64})\.[^/]*\.tmp")
# Every entry starts with these bytes (``store`` writes the format field first).
_ENTRY_PREFIX = b'{"format": "%s"' % ENTRY_FORMAT.encode()


def enabled() -> bool:
    value = os.environ.get("LUCID_COMPILE_DISK_CACHE", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def directory() -> str:
    """The cache folder: ``LUCID_COMPILE_DISK_CACHE_DIR``, else the user's cache folder."""
    folder = os.environ.get("LUCID_COMPILE_DISK_CACHE_DIR", "").strip()
    if folder:
        return os.path.abspath(os.path.expanduser(folder))
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "lucid", "compile")


def max_bytes() -> int:
    value = os.environ.get("LUCID_COMPILE_DISK_CACHE_MAX_MB", "").strip()
    if not value:
        return int(DEFAULT_MAX_MB * 2**20)
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not mb > 0:
        raise ValueError(
            f"LUCID_COMPILE_DISK_CACHE_MAX_MB must be a positive number, got {value!r}"
        )
    return int(mb * 2**20)


def machine_facts() -> list[str]:
    """What of this machine an executable may depend on."""
    return [sys.platform, platform.machine(), sys.byteorder]


def trace_text(trace: Any) -> str | None:
    """The canonical text of a trace (value ids renumbered by first appearance, no source
    locations), or None when it does not serialise (the graph is then not cached)."""
    ids: dict[int, int] = {}

    def canon(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k == "loc":
                    continue
                if k == "id" and isinstance(v, int) and not isinstance(v, bool):
                    out[k] = ids.setdefault(v, len(ids))
                else:
                    out[k] = canon(v)
            return out
        if isinstance(node, list):
            return [canon(e) for e in node]
        return node

    try:
        return json.dumps(canon(trace.to_dict()), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


_CODE_FINGERPRINT: list[str] = []


def code_fingerprint() -> str:
    """A SHA-256 of the code that produces an entry: every Python source and compiled extension
    module in the ``lucid`` package's folders (an editable install has two: the sources and the
    built extension). ``__version__`` stays the same across development commits; this changes
    with any edit or rebuild. Computed once per process: 2.7 MB, about 7 ms of processor time."""
    if not _CODE_FINGERPRINT:
        import importlib.machinery

        import lucid

        suffixes = (".py", *importlib.machinery.EXTENSION_SUFFIXES)
        roots = sorted({os.path.abspath(p) for p in getattr(lucid, "__path__", [])})
        files = []
        for root in roots:
            for folder, dirs, names in os.walk(root):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                files += [
                    (os.path.relpath(os.path.join(folder, n), root), os.path.join(folder, n))
                    for n in names
                    if n.endswith(suffixes)
                ]
        h = hashlib.sha256()
        for name, path in sorted(files):
            h.update(name.encode("utf-8", "surrogateescape") + b"\0")
            try:
                with open(path, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
            except OSError as e:  # unreadable: keyed on the error, so never a false match
                h.update(f"unreadable {e.errno}".encode())
        _CODE_FINGERPRINT.append(h.hexdigest())
    return _CODE_FINGERPRINT[0]


def key(graph_text: str, *, backend: Any, graph_pipeline: str) -> str:
    """The entry name of a graph (``trace_text``) compiled by ``backend``."""
    import lucid

    facts = [
        ENTRY_VERSION,
        str(lucid.__version__),
        code_fingerprint(),
        backend.name,
        backend.pipeline,
        getattr(backend, "program_format", None),
        graph_pipeline,
        machine_facts(),
    ]
    h = hashlib.sha256(json.dumps(facts).encode())
    h.update(b"\0")
    h.update(graph_text.encode("utf-8"))
    return h.hexdigest()


def _digest(feed_roles: list, result_roles: list, program: str) -> str:
    text = json.dumps([feed_roles, result_roles, program])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _report(path: str, problem: str) -> None:
    if path not in _REPORTED:
        _REPORTED.add(path)
        logger.warning("lucid.compile: disk cache entry %s ignored and removed: %s", path, problem)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _claim(folder: str) -> bool:
    """Whether the cache may write and delete in ``folder``: it holds the cache's signature, or
    it is created now, or holds nothing but what the cache writes (an earlier Lucid's entries,
    another process's half-written ones), and the signature is written. Otherwise reported
    once."""
    tag = os.path.join(folder, SIGNATURE_FILE)
    try:
        os.makedirs(folder, exist_ok=True)
        if not _is_signature(tag) and all(_is_ours(folder, n) for n in os.listdir(folder)):
            _write_signature(folder, tag)
        owned = _is_signature(tag)
    except OSError as e:
        if folder not in _REPORTED:
            _REPORTED.add(folder)
            logger.warning("lucid.compile: cannot write the disk cache in %s: %s", folder, e)
        return False
    if not owned:
        if folder not in _REPORTED:
            _REPORTED.add(folder)
            logger.warning(
                "lucid.compile: the disk cache is off for %s: it holds files Lucid did not write "
                "and no lucid.compile %s; point LUCID_COMPILE_DISK_CACHE_DIR at a new or empty "
                "folder",
                folder,
                SIGNATURE_FILE,
            )
        return False
    return True


def _is_signature(tag: str) -> bool:
    try:
        with open(tag, "rb") as f:
            return f.read(len(SIGNATURE) + 1) == SIGNATURE
    except OSError:
        return False


def _write_signature(folder: str, tag: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".signature.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(SIGNATURE)
        os.replace(tmp, tag)  # concurrent claimers write the same bytes
    finally:
        _remove(tmp)


def _is_ours(folder: str, filename: str) -> bool:
    """Whether ``filename`` is something only the cache makes: an entry, or a temporary file of
    an entry or of the signature being written."""
    if _TEMP_NAME.fullmatch(filename):
        return True
    return _is_entry(folder, filename)


def _is_entry(folder: str, filename: str) -> bool:
    """Whether ``filename`` in ``folder`` is an entry the cache wrote (by name and content)."""
    if not _ENTRY_NAME.fullmatch(filename):
        return False
    try:
        with open(os.path.join(folder, filename), "rb") as f:
            return f.read(len(_ENTRY_PREFIX)) == _ENTRY_PREFIX
    except OSError:
        return False


def load(name: str) -> tuple[list[str], list[str], str] | None:
    """The (feed roles, result roles, program text) of entry ``name``, or None (absent, or
    corrupt: then removed and reported once)."""
    folder = directory()
    path = os.path.join(folder, name + ".json")
    if not _is_signature(os.path.join(folder, SIGNATURE_FILE)):
        return None  # not the cache's folder: nothing in it is read, let alone removed
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        _report(path, f"unreadable ({e.strerror or e})")
        return None
    try:
        entry = json.loads(raw.decode("utf-8"))
        if entry["format"] != ENTRY_FORMAT or entry["version"] != ENTRY_VERSION:
            raise ValueError("another entry format")
        if entry["key"] != name:
            raise ValueError("it belongs to another key")
        feeds, results, program = entry["feed_roles"], entry["result_roles"], entry["program"]
        if not (
            isinstance(program, str)
            and isinstance(feeds, list)
            and isinstance(results, list)
            and all(isinstance(r, str) for r in [*feeds, *results])
        ):
            raise ValueError("malformed fields")
        if entry["sha256"] != _digest(feeds, results, program):
            raise ValueError("checksum mismatch")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        _report(path, f"corrupt ({e})")
        _remove(path)
        return None
    try:
        os.utime(path)  # recency for the LRU eviction
    except OSError:
        pass
    return feeds, results, program


def discard(name: str, problem: str) -> None:
    """Remove entry ``name`` that the backend refused (reported once)."""
    path = os.path.join(directory(), name + ".json")
    _report(path, problem)
    _remove(path)


def store(name: str, feed_roles: list[str], result_roles: list[str], program: str) -> None:
    """Write entry ``name`` atomically, then evict down to the size cap. Failing to write (a
    read-only folder, a full disk) is reported once and otherwise ignored."""
    folder = directory()
    entry = {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "key": name,
        "feed_roles": list(feed_roles),
        "result_roles": list(result_roles),
        "program": program,
        "sha256": _digest(list(feed_roles), list(result_roles), program),
    }
    data = json.dumps(entry).encode("utf-8")
    if not _claim(folder):
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(folder, name + ".json"))
        tmp = None
    except OSError as e:
        if folder not in _REPORTED:
            _REPORTED.add(folder)
            logger.warning("lucid.compile: cannot write the disk cache in %s: %s", folder, e)
        return
    finally:
        if tmp is not None:
            _remove(tmp)
    evict(folder, max_bytes())


def evict(folder: str, cap: int) -> list[str]:
    """Remove the least recently used entries until the folder's entries fit in ``cap``
    bytes; returns the names removed. Only entries the cache wrote, in a folder it owns, are
    counted or removed. Entries vanishing meanwhile (another process evicting) are fine."""
    entries = []
    if not _is_signature(os.path.join(folder, SIGNATURE_FILE)):
        return []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for n in names:
        if not _is_entry(folder, n):
            continue
        try:
            st = os.stat(os.path.join(folder, n))
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, n))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, n in sorted(entries):
        if total <= cap:
            break
        _remove(os.path.join(folder, n))
        total -= size
        removed.append(n[: -len(".json")])
    return removed
