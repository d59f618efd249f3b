"""The on-disk compile cache: a second compile of one graph comes from disk with the same
numbers; concurrent processes; corrupt entries ignored, removed and reported once; LRU eviction."""

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import lucid
from lucid.compile import _disk_cache

sys.path.insert(0, str(Path(__file__).parent))
from models import MLP, LeNet  # noqa: E402


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE", "1")
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_DIR", str(folder))
    _disk_cache._REPORTED.clear()
    return folder


def _entries(folder):
    return sorted(p for p in folder.glob("*.json")) if folder.exists() else []


def _run(model, x):
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        out = cm(x).numpy()
    return cm, out


def test_second_compile_comes_from_disk_with_identical_results(cache_dir):
    model = LeNet().eval()
    x = lucid.randn(2, 1, 12, 12)
    cold, want = _run(model, x)
    assert not cold.timing()[0]["from_disk"]
    assert len(_entries(cache_dir)) == 1
    warm, got = _run(model, x)
    row = warm.timing()[0]
    assert row["from_disk"] and "disk-cache-load" in row["passes_ms"]
    assert "lower-to-prim" not in row["passes_ms"]
    assert got.tobytes() == want.tobytes()
    # Another graph (other weights' shapes) is another entry.
    _run(MLP(), lucid.randn(3, 16))
    assert len(_entries(cache_dir)) == 2


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE", raising=False)
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_DIR", str(tmp_path / "c"))
    cm, _ = _run(MLP(), lucid.randn(2, 16))
    assert not (tmp_path / "c").exists() and not cm.timing()[0]["from_disk"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],
        lambda raw: (
            raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 4]) + raw[len(raw) // 2 + 1 :]
        ),
        lambda raw: b"\xff\xfe" + raw,
        lambda raw: b"",
    ],
)
def test_corrupt_entry_is_ignored_removed_and_reported_once(cache_dir, caplog, damage):
    model = MLP().eval()
    x = lucid.randn(2, 16)
    _, want = _run(model, x)
    (entry,) = _entries(cache_dir)
    entry.write_bytes(damage(entry.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        cm, got = _run(model, x)
    assert not cm.timing()[0]["from_disk"]
    assert got.tobytes() == want.tobytes()
    assert caplog.text.count("disk cache entry") == 1 and "ignored and removed" in caplog.text
    # The recompiled entry replaced it and is good again.
    warm, got = _run(model, x)
    assert warm.timing()[0]["from_disk"] and got.tobytes() == want.tobytes()


def test_eviction_keeps_the_most_recently_used_under_the_cap(cache_dir, monkeypatch):
    models = [MLP(d_hidden=h) for h in (8, 12, 16)]
    x = lucid.randn(2, 16)
    for m in models:
        _run(m, x)
        time.sleep(0.02)  # distinct mtimes
    entries = _entries(cache_dir)
    assert len(entries) == 3
    sizes = {p.stem: p.stat().st_size for p in entries}
    first_key = min(entries, key=lambda p: p.stat().st_mtime_ns).stem
    time.sleep(0.02)
    _run(models[0], x)  # a hit: now the most recently used
    cap_mb = (sum(sizes.values()) - 1) / 2**20
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_MAX_MB", repr(cap_mb))
    _run(MLP(d_hidden=20), x)  # a fourth entry: the two oldest go
    left = {p.stem for p in _entries(cache_dir)}
    assert first_key in left and len(left) == 2
    total = sum(p.stat().st_size for p in _entries(cache_dir))
    assert total <= cap_mb * 2**20


def test_bad_cap_setting_is_refused(cache_dir, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_MAX_MB", "lots")
    with pytest.raises(ValueError, match="LUCID_COMPILE_DISK_CACHE_MAX_MB"):
        _disk_cache.max_bytes()
    cm = lucid.compile(MLP(), backend="cpu")
    with pytest.raises(ValueError, match="LUCID_COMPILE_DISK_CACHE_MAX_MB must be a positive"):
        cm(lucid.randn(2, 16))  # refused at the first compile, not a silent fallback
    assert not cm.cache_info()["eager_only"]


def test_unwritable_folder_compiles_anyway(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE", "1")
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_DIR", str(blocker / "sub"))
    _disk_cache._REPORTED.clear()
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        cm, _ = _run(MLP(), lucid.randn(2, 16))
    assert cm.cache_info()["entries"] == 1 and "cannot write the disk cache" in caplog.text


_WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import lucid
    import lucid.nn as nn
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = lucid.tensor(np.arange(32, dtype=np.float32).reshape(2, 16) / 10)
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        out = cm(x).numpy()
    np.save(sys.argv[1], out)
    print("disk" if cm.timing()[0]["from_disk"] else "compiled")
    """
)


@pytest.mark.slow  # three processes; the default run has the in-process disk round trip
def test_processes_compiling_concurrently_share_the_cache(cache_dir, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ)

    def start(i):
        return subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"out{i}.npy")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )

    procs = [start(i) for i in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert len(_entries(cache_dir)) == 1
    assert not list(cache_dir.glob("*.tmp"))
    late = start(2)
    stdout, stderr = late.communicate(timeout=300)
    assert late.returncode == 0 and stdout.strip() == "disk", stderr
    outs = [np.load(tmp_path / f"out{i}.npy") for i in range(3)]
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)


_WARM_PROCESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import lucid
    import lucid.nn as nn
    from lucid.compile import load_compiled, save_compiled

    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = lucid.tensor(np.ones((2, 8), np.float32))
    before = set(sys.modules)
    with lucid.no_grad():
        if sys.argv[1] == "load":
            out = load_compiled(sys.argv[2])(x)
        else:
            cm = lucid.compile(model, backend="cpu")
            out = cm(x)
            if sys.argv[1] == "save":
                assert save_compiled(cm, sys.argv[2])
    new = sorted(m for m in set(sys.modules) - before if m.startswith("lucid"))
    print(json.dumps({"modules": new, "out": out.numpy().tolist()}))
    """
)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_a_warm_hit_and_load_compiled_skip_the_compiler_modules(cache_dir, tmp_path):
    """A process served by the disk cache or by load_compiled never loads the lowering passes,
    the CPU program model or its fusion pass (each costs the first call import time)."""
    import json

    script = tmp_path / "warm.py"
    script.write_text(_WARM_PROCESS)
    saved = tmp_path / "m.lucidc"

    def run(mode):
        out = subprocess.run(
            [sys.executable, str(script), mode, str(saved)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={
                **os.environ,
                "LUCID_COMPILE_DISK_CACHE": "1",
                "LUCID_COMPILE_DISK_CACHE_DIR": str(cache_dir),
            },  # fmt: skip
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run("save")
    compiler = {"lucid.passes.lower_to_prim", "lucid.backends.cpu.fuse_elementwise",
                "lucid.backends.cpu.rewrites", "lucid.backends.cpu.program",
                "lucid.backends.cpu.emit"}  # fmt: skip
    assert compiler <= set(cold["modules"])  # the cold compile needs them
    for mode in ("compile", "load"):
        warm = run(mode)
        assert warm["out"] == cold["out"], mode
        assert not compiler & set(warm["modules"]), (mode, warm["modules"])


def _foreign_files(folder):
    """Files a user might keep, with every extension and name shape the cache uses."""
    files = {
        "config.json": b'{"lr": 0.1}',
        "a" * 64 + ".json": b'{"not": "an entry"}',  # an entry's name, not its content
        ".notes.tmp": b"draft",
        "." + "b" * 64 + ".x.tmp": b"someone else's",
        "data.npy": b"\x93NUMPY",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _assert_untouched(folder, files):
    for name, data in files.items():
        assert (folder / name).read_bytes() == data, name


def test_a_folder_the_cache_does_not_own_is_never_written_or_evicted(
    cache_dir, monkeypatch, caplog
):
    files = _foreign_files(cache_dir)
    (cache_dir / "CACHEDIR.TAG").write_bytes(b"Signature: 8a477f597d28d172789f06886806bc55\n")
    files["CACHEDIR.TAG"] = (cache_dir / "CACHEDIR.TAG").read_bytes()  # another tool's tag
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_MAX_MB", "0.000001")
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        cm, _ = _run(MLP(), lucid.randn(2, 16))
        _run(MLP(d_hidden=8), lucid.randn(2, 16))
    assert cm.cache_info()["entries"] == 1
    _assert_untouched(cache_dir, files)
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(files)
    assert caplog.text.count("the disk cache is off for") == 1
    assert _disk_cache.evict(str(cache_dir), 0) == []


def test_eviction_in_its_own_folder_removes_only_its_entries(cache_dir, monkeypatch):
    x = lucid.randn(2, 16)
    _run(MLP(), x)  # creates the folder and its signature
    assert (cache_dir / "CACHEDIR.TAG").read_bytes() == _disk_cache.SIGNATURE
    files = _foreign_files(cache_dir)  # dropped in later
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_MAX_MB", "0.000001")
    _run(MLP(d_hidden=8), x)
    _run(MLP(d_hidden=12), x)
    _assert_untouched(cache_dir, files)
    left = {p.name for p in cache_dir.iterdir()} - set(files) - {"CACHEDIR.TAG"}
    assert left == set()  # every entry of its own went (each is over the tiny cap)
    # A folder holding only an earlier Lucid's entries is adopted.
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE_MAX_MB")
    old = cache_dir.parent / "old"
    old.mkdir()
    monkeypatch.setenv("LUCID_COMPILE_DISK_CACHE_DIR", str(old))
    _run(MLP(), x)
    (entry,) = _entries(old)
    (old / "CACHEDIR.TAG").unlink()
    _run(MLP(d_hidden=8), x)
    assert (old / "CACHEDIR.TAG").exists() and len(_entries(old)) == 2
    # A folder removed while the process runs is made again, tag and all.
    shutil.rmtree(old)
    _run(MLP(d_hidden=12), x)
    assert (old / "CACHEDIR.TAG").exists() and len(_entries(old)) == 1


def _rewrite_entry(path, edit):
    """A poisoned entry: ``edit(entry)`` applied, its checksum recomputed to match."""
    import json

    entry = json.loads(path.read_text())
    edit(entry)
    entry["sha256"] = _disk_cache._digest(
        entry["feed_roles"], entry["result_roles"], entry["program"]
    )
    path.write_text(json.dumps(entry))


def _program_of(model, x, folder):
    _run(model, x)
    (entry,) = [p for p in _entries(folder)]
    import json

    program = json.loads(entry.read_text())["program"]
    entry.unlink()
    return program


@pytest.mark.parametrize(
    "poison",
    [
        lambda e, other: e.update(feed_roles=e["feed_roles"][::-1]),
        lambda e, other: e.update(program="[" * 100_000 + "]" * 100_000),
        lambda e, other: e.update(program=other),  # another graph's program, the same roles
    ],
    ids=["roles-reversed", "nested-program", "program-of-another-graph"],
)
@pytest.mark.parametrize("strict", [False, True])
def test_an_entry_that_does_not_fit_its_graph_is_removed_and_recompiled_once(
    cache_dir, caplog, poison, strict
):
    x = lucid.randn(2, 16)
    other = _program_of(MLP(d_hidden=12).eval(), x, cache_dir)
    model = MLP(d_hidden=8).eval()
    _, want = _run(model, x)
    (entry,) = _entries(cache_dir)
    _rewrite_entry(entry, lambda e: poison(e, other))
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        cm = lucid.compile(model, backend="cpu", strict=strict)
        with lucid.no_grad():
            got = cm(x).numpy()
    assert got.tobytes() == want.tobytes()
    assert not cm.cache_info()["eager_only"]
    assert not cm.timing()[0]["from_disk"]
    assert caplog.text.count("ignored and removed") == 1
    # The entry was replaced by a good one: the next process is served from disk.
    warm, got = _run(model, x)
    assert warm.timing()[0]["from_disk"] and got.tobytes() == want.tobytes()


def test_the_key_follows_the_code_not_the_version_string(tmp_path, monkeypatch):
    import importlib.machinery

    import lucid as package

    fake = tmp_path / "pkg"
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("x = 1\n")
    (fake / "sub" / "mod.py").write_text("y = 2\n")
    build = tmp_path / "build"  # an editable install: the extension in a folder of its own
    build.mkdir()
    extension = build / ("_ext" + importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"\x7fELF one build")
    monkeypatch.setattr(package, "__path__", [str(fake), str(build)])
    monkeypatch.setattr(_disk_cache, "_CODE_FINGERPRINT", [])
    first = _disk_cache.code_fingerprint()
    assert _disk_cache.code_fingerprint() == first  # computed once
    (fake / "sub" / "mod.py").write_text("y = 3\n")  # an edit, __version__ unchanged
    monkeypatch.setattr(_disk_cache, "_CODE_FINGERPRINT", [])
    second = _disk_cache.code_fingerprint()
    assert second != first
    extension.write_bytes(b"\x7fELF another build")  # a rebuild
    monkeypatch.setattr(_disk_cache, "_CODE_FINGERPRINT", [])
    assert _disk_cache.code_fingerprint() not in (first, second)

    class Target:
        name, pipeline, program_format = "cpu", "prim-simplify", "f/1"

    monkeypatch.setattr(_disk_cache, "_CODE_FINGERPRINT", [first])
    key_first = _disk_cache.key("{}", backend=Target, graph_pipeline="cse")
    monkeypatch.setattr(_disk_cache, "_CODE_FINGERPRINT", [second])
    assert _disk_cache.key("{}", backend=Target, graph_pipeline="cse") != key_first
