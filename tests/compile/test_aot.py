"""save_compiled / load_compiled: round trips in a fresh process, weights from the file or from
``model=``, unsaved signatures, version and kind checks, atomic writes."""

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile import load_compiled, save_compiled

sys.path.insert(0, str(Path(__file__).parent))
from models import MLP, LeNet, LSTMModel, TinyGPT  # noqa: E402


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x, scale=2.0):
        h = self.fc(x)
        return {"logits": h * scale, "probs": F.softmax(h, dim=-1), "input": x, "tag": "v1"}


@dataclasses.dataclass
class Pair:
    first: lucid.Tensor
    second: lucid.Tensor


class DataclassModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return Pair(self.fc(x), (x, self.fc(x).sum()))


def _rand(*shape, seed=0):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _cases():
    """(name, model, list of (args, kwargs)) with every model in eval mode."""
    lucid.manual_seed(0)
    idx = lucid.tensor(np.random.default_rng(3).integers(0, 20, (2, 8)).astype(np.int64))
    cases = [
        ("mlp", MLP(), [((_rand(2, 16),), {}), ((_rand(5, 16, seed=1),), {})]),
        ("cnn", LeNet(), [((_rand(2, 1, 12, 12),), {})]),
        ("gpt", TinyGPT(), [((idx,), {})]),
        ("lstm", LSTMModel(), [((_rand(3, 5, 6),), {})]),
        ("dict", DictModel(), [((_rand(2, 5),), {}), ((_rand(2, 5),), {"scale": 3.0})]),
    ]
    for _, model, _ in cases:
        model.eval()
    # The CNN's BatchNorm statistics are not the initial ones.
    with lucid.no_grad():
        cases[1][1].train()
        cases[1][1](_rand(4, 1, 12, 12, seed=9))
        cases[1][1].eval()
    return cases


def _flat(out):
    if isinstance(out, lucid.Tensor):
        return [out.numpy()]
    if isinstance(out, (tuple, list)):
        return [a for e in out for a in _flat(e)]
    if isinstance(out, dict):
        return [a for v in out.values() for a in _flat(v)]
    return [np.asarray(out)]


def _save_case(tmp_path, name, model, calls):
    cm = lucid.compile(model, backend="cpu")
    outs = []
    with lucid.no_grad():
        for args, kwargs in calls:
            outs.append(_flat(cm(*args, **kwargs)))
    path = tmp_path / f"{name}.lucidc"
    assert save_compiled(cm, path)
    return cm, path, outs


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import lucid
    from lucid.compile import load_compiled

    def flat(out):
        if isinstance(out, lucid.Tensor):
            return [out.numpy()]
        if isinstance(out, (tuple, list)):
            return [a for e in out for a in flat(e)]
        if isinstance(out, dict):
            return [a for v in out.values() for a in flat(v)]
        return [np.asarray(out)]

    plan = json.load(open(sys.argv[1]))
    for item in plan:
        m = load_compiled(item["path"])
        inputs = np.load(item["inputs"])
        arrays = []
        with lucid.no_grad():
            for i, kw in enumerate(item["kwargs"]):
                args = [lucid.tensor(inputs[f"{i}_{j}"]) for j in range(item["n_args"][i])]
                arrays += flat(m(*args, **kw))
        assert all(s == "program" for s in m.cache_info()["sources"].values()), m.cache_info()
        np.savez(item["out"], *arrays)
    print("ok")
    """
)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
def test_round_trip_in_a_fresh_process_is_bit_identical(tmp_path):
    plan = []
    expected = {}
    for name, model, calls in _cases():
        _, path, outs = _save_case(tmp_path, name, model, calls)
        inputs = {f"{i}_{j}": a.numpy() for i, (args, _) in enumerate(calls) for j, a in
                  enumerate(args)}  # fmt: skip
        np.savez(tmp_path / f"{name}-in.npz", **inputs)
        plan.append(
            {
                "path": str(path),
                "inputs": str(tmp_path / f"{name}-in.npz"),
                "kwargs": [kw for _, kw in calls],
                "n_args": [len(args) for args, _ in calls],
                "out": str(tmp_path / f"{name}-out.npz"),
            }
        )
        expected[name] = [a for o in outs for a in o]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "child.py").write_text(_CHILD)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # the models' module is not importable there
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    for name, want in expected.items():
        got = np.load(tmp_path / f"{name}-out.npz")
        got = [got[f"arr_{i}"] for i in range(len(got.files))]
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert g.tobytes() == w.tobytes(), name


def test_loaded_module_serves_structures_and_raises_for_unsaved_signatures(tmp_path):
    model = DictModel().eval()
    x = _rand(2, 5)
    _, path, _ = _save_case(tmp_path, "d", model, [((x,), {})])
    m = load_compiled(path)
    out = m(x)
    assert set(out) == {"logits", "probs", "input", "tag"}
    assert out["input"] is x and out["tag"] == "v1"
    with lucid.no_grad():
        want = model(x)
    assert np.array_equal(out["logits"].numpy(), want["logits"].numpy())
    with pytest.raises(ValueError, match=r"match no saved signature.*saved: CacheKey"):
        m(_rand(3, 5))
    with pytest.raises(ValueError, match="match no saved signature"):
        m(x, scale=5.0)
    info = m.cache_info()
    assert info["entries"] == 1 and info["n_calls"][info["keys"][0]] == 1
    assert m.timing()[0]["n_hits"] == 1 and m.timing()[0]["source"] == "program"
    assert "lucid.linear" in m.ir() or "func.func" in m.ir()
    assert "native program" in m.ir(stage="final")


def test_dataclass_output_comes_back_as_a_dict(tmp_path):
    model = DataclassModel().eval()
    x = _rand(3, 4)
    _, path, _ = _save_case(tmp_path, "dc", model, [((x,), {})])
    out = load_compiled(path)(x)
    assert set(out) == {"first", "second"} and out["second"][0] is x
    with lucid.no_grad():
        want = model(x)
    assert np.array_equal(out["first"].numpy(), want.first.numpy())
    assert np.array_equal(out["second"][1].numpy(), want.second[1].numpy())


def test_weights_from_model_by_name_and_unsaved_signatures_compile(tmp_path):
    model = MLP().eval()
    x = _rand(2, 16)
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        cm(x)
    path = tmp_path / "w.lucidc"
    assert save_compiled(cm, path, include_weights=False)
    with pytest.raises(ValueError, match=r"holds no weight 'param:fc1\.(weight|bias)'"):
        load_compiled(path)
    other = MLP().eval()
    m = load_compiled(path, model=other)
    with lucid.no_grad():
        assert np.array_equal(m(x).numpy(), other(x).numpy())
        y = _rand(7, 16)
        assert np.array_equal(m(y).numpy(), other(y).numpy())  # compiled, not saved
    assert m.cache_info()["compiled"]["entries"] == 1
    with pytest.raises(ValueError, match=r"param:fc1.weight of shape \(32, 8\)"):
        load_compiled(path, model=MLP(d_in=8))


def test_weights_in_the_file_are_used_and_updated_buffers_stay_in_the_loaded_module(tmp_path):
    model = LeNet()
    model.train()
    x = _rand(2, 1, 12, 12)
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        cm(x)
    path = tmp_path / "bn.lucidc"
    assert save_compiled(cm, path)
    stats = model.bn1.running_mean.numpy().copy()
    m = load_compiled(path)
    assert m.training
    with lucid.no_grad():
        got = m(x)
        want = cm(x)
    assert np.array_equal(got.numpy(), want.numpy())
    assert np.array_equal(m._weights["buffer:bn1.running_mean"].numpy(),
                          model.bn1.running_mean.numpy())  # fmt: skip
    assert not np.array_equal(stats, model.bn1.running_mean.numpy())


def test_nothing_to_save_returns_false_and_says_why(tmp_path, caplog):
    cm = lucid.compile(MLP(), backend="cpu")
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        assert save_compiled(cm, tmp_path / "none.lucidc") is False
    assert "no compiled signature" in caplog.text
    assert not (tmp_path / "none.lucidc").exists()
    with pytest.raises(TypeError, match="needs a CompiledModule"):
        save_compiled(MLP(), tmp_path / "x")


def _rewrite_manifest(path, edit):
    from lucid import serialization

    obj = serialization.load(path)
    manifest = json.loads(obj["manifest"])
    edit(manifest, obj)
    obj["manifest"] = json.dumps(manifest, sort_keys=True)
    import hashlib

    obj["manifest_sha256"] = hashlib.sha256(obj["manifest"].encode()).hexdigest()
    serialization.save(obj, path)


def test_wrong_version_kind_and_other_lucid_version(tmp_path):
    model = MLP().eval()
    x = _rand(2, 16)
    _, path, outs = _save_case(tmp_path, "v", model, [((x,), {})])
    lucid.save({"w": lucid.ones(2)}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not a lucid.compiled file"):
        load_compiled(tmp_path / "plain.pt")
    (tmp_path / "text.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a usable compiled file"):
        load_compiled(tmp_path / "text.txt")
    with pytest.raises(OSError):
        load_compiled(tmp_path / "missing.lucidc")

    other = tmp_path / "other.lucidc"
    other.write_bytes(path.read_bytes())
    _rewrite_manifest(other, lambda m, _: m.update(lucid_version="0.0.0-elsewhere"))
    m = load_compiled(other)
    assert set(m.cache_info()["sources"].values()) == {"ir"}  # rebuilt from the saved IR
    assert np.array_equal(m(x).numpy(), outs[0][0])

    future = tmp_path / "future.lucidc"
    future.write_bytes(path.read_bytes())
    _rewrite_manifest(future, lambda m, _: m.update(format_version=99))
    with pytest.raises(ValueError, match="format version 99"):
        load_compiled(future)


def test_tampered_part_is_refused(tmp_path):
    from lucid import serialization

    _, path, _ = _save_case(tmp_path, "t", MLP().eval(), [((_rand(2, 16),), {})])
    obj = serialization.load(path)
    original = obj["parts"]["program/0"]
    # An opcode changed (the CPU program names its GEMMs gemm or matmul).
    obj["parts"]["program/0"] = original.replace("gemm", "add", 1).replace("matmul", "add", 1)
    assert obj["parts"]["program/0"] != original
    serialization.save(obj, path)
    with pytest.raises(ValueError, match="part 'program/0' does not match its checksum"):
        load_compiled(path)


def _craft(path, edit):
    """A hostile file: ``edit(manifest, parts)`` applied, every checksum recomputed to match."""
    import hashlib

    from lucid import serialization

    obj = serialization.load(path)
    manifest = json.loads(obj["manifest"])
    edit(manifest, obj["parts"])
    manifest["parts"] = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in obj["parts"].items()}
    obj["manifest"] = json.dumps(manifest, sort_keys=True)
    obj["manifest_sha256"] = hashlib.sha256(obj["manifest"].encode()).hexdigest()
    serialization.save(obj, path)


def _nested(depth, leaf):
    node = leaf
    for _ in range(depth):
        node = ["tuple", [node]]
    return node


def _sig0(edit):
    return lambda manifest, parts: edit(manifest["signatures"][0], parts)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_sig0(lambda r, p: r.update(output=_nested(300, ["out", 0]))), "nested more than"),
        (_sig0(lambda r, p: r.update(output=["out", 5])), "refers to result 5 of 1"),
        (_sig0(lambda r, p: r.update(output=["arg", [3]])), "returns an argument"),
        (_sig0(lambda r, p: r.update(output=["kw", "y"])), "keyword argument 'y'"),
        (_sig0(lambda r, p: r.update(output=["eval", "os.system"])), "unknown node 'eval'"),
        (_sig0(lambda r, p: r.update(match=[[], [], False])), "'match' is not a str"),
        (_sig0(lambda r, p: r.update(match="[" * 5000 + "]" * 5000)), "'match' is not"),
        (
            _sig0(lambda r, p: r.update(match=json.dumps([[_nested(150, ["int", 1])], [], 0]))),
            "'match' is nested more than",
        ),
        (
            _sig0(lambda r, p: r.update(match=json.dumps([[["tensor", [2], "f"]]]))),
            "'match' is not \\[arguments",
        ),
        (
            _sig0(lambda r, p: r.update(feed_roles=["input:3", *r["feed_roles"][1:]])),
            "feed 'input:3'",
        ),
        (_sig0(lambda r, p: r.update(ir="ir/9")), "names no part"),
        (_sig0(lambda r, p: r.update(result_roles="output:0")), "not a list of role names"),
        (lambda m, p: m["signatures"].__setitem__(0, 7), "signature 0: is not a record"),
        (
            _sig0(lambda r, p: (r.pop("program"), p.update({"ir/0": "builtin.module {" * 3000}))),
            "signature 0:",
        ),  # fmt: skip
    ],
)
def test_crafted_files_raise_value_error_naming_file_and_part(tmp_path, edit, match):
    _, path, _ = _save_case(tmp_path, "c", MLP().eval(), [((_rand(2, 16),), {})])
    _craft(path, edit)
    with pytest.raises(ValueError, match="c.lucidc") as info:
        load_compiled(path)
    assert info.match(match)


def test_a_deeply_nested_program_part_falls_back_to_the_saved_ir(tmp_path):
    x = _rand(2, 16)
    _, path, outs = _save_case(tmp_path, "d", MLP().eval(), [((x,), {})])
    _craft(path, lambda m, parts: parts.update({"program/0": "[" * 100_000 + "]" * 100_000}))
    m = load_compiled(path)
    assert m.cache_info()["sources"] == {m.cache_info()["keys"][0]: "ir"}
    with lucid.no_grad():
        assert np.array_equal(m(x).numpy(), outs[0][0])


def test_save_compiled_through_a_symlink_keeps_the_link(tmp_path):
    cm, path, _ = _save_case(tmp_path, "s", MLP().eval(), [((_rand(2, 16),), {})])
    link = tmp_path / "latest.lucidc"
    link.symlink_to(path)
    assert save_compiled(cm, link)
    assert link.is_symlink() and load_compiled(link).cache_info()["entries"] == 1


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    cm, path, _ = _save_case(tmp_path, "a", MLP().eval(), [((_rand(2, 16),), {})])
    first = path.read_bytes()
    assert save_compiled(cm, path)
    assert path.read_bytes() == first  # deterministic
    assert sorted(os.listdir(tmp_path)) == ["a.lucidc"]


def test_fault_injection_gives_a_clean_error_or_the_same_numbers(tmp_path):
    """Sampled truncations and byte flips over the whole file: load_compiled raises
    ValueError/OSError, or (a flip the format tolerates, e.g. JSON whitespace) the loaded
    module gives exactly the original numbers; never a crash or other numbers."""
    model = LeNet().eval()
    x = _rand(2, 1, 12, 12)
    _, path, outs = _save_case(tmp_path, "f", model, [((x,), {})])
    raw = path.read_bytes()
    want = outs[0][0].tobytes()
    rng = np.random.default_rng(0)
    bad = tmp_path / "bad.lucidc"
    cuts = sorted({0, 1, 7, 8, 9, len(raw) - 1, *rng.integers(0, len(raw), 20).tolist()})
    flips = sorted({0, 3, 8, 9, len(raw) - 1, *rng.integers(0, len(raw), 60).tolist()})
    cases = [raw[:n] for n in cuts]
    for i in flips:
        flipped = bytearray(raw)
        flipped[i] ^= 1 << int(rng.integers(0, 8))
        cases.append(bytes(flipped))
    errors = 0
    for data in cases:
        bad.write_bytes(data)
        try:
            m = load_compiled(bad)
        except (ValueError, OSError):
            errors += 1
            continue
        with lucid.no_grad():
            assert m(x).numpy().tobytes() == want
    assert errors >= len(cases) - 5  # nearly every fault is caught


_SAVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import lucid
    import lucid.nn as nn
    from lucid.compile import save_compiled
    lucid.manual_seed(int(sys.argv[2]))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = lucid.tensor(np.arange(32, dtype=np.float32).reshape(2, 16) / 10)
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        np.save(sys.argv[3], cm(x).numpy())
    for _ in range(3):
        assert save_compiled(cm, sys.argv[1])
    """
)


@pytest.mark.slow  # 2 processes; in the default run: test_a_reader_during_writes_sees_a_whole_file
def test_two_processes_saving_to_one_path_leave_one_whole_file(tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    target = tmp_path / "shared.lucidc"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(target), str(seed), str(tmp_path / f"o{seed}.npy")],
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for seed in (1, 2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    x = lucid.tensor(np.arange(32, dtype=np.float32).reshape(2, 16) / 10)
    got = load_compiled(target)(x).numpy().tobytes()
    assert got in {np.load(tmp_path / f"o{s}.npy").tobytes() for s in (1, 2)}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_mpsgraph_reference_saves_ir_and_loads_on_either_backend(tmp_path):
    model = LeNet().eval()
    x = _rand(2, 1, 12, 12)
    cm = lucid.compile(model, backend="mpsgraph-reference")
    with lucid.no_grad():
        want = cm(x).numpy()
    path = tmp_path / "ref.lucidc"
    assert save_compiled(cm, path)
    same = load_compiled(path, backend="mpsgraph-reference")
    assert set(same.cache_info()["sources"].values()) == {"ir"}  # it exports no program
    assert same(x).numpy().tobytes() == want.tobytes()
    cpu = load_compiled(path, backend="cpu")
    np.testing.assert_allclose(cpu(x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_reader_during_writes_sees_a_whole_file(tmp_path):
    import threading

    models = [MLP().eval(), MLP().eval()]
    x = _rand(2, 16)
    saved = []
    for i, model in enumerate(models):
        cm, path, outs = _save_case(tmp_path, f"m{i}", model, [((x,), {})])
        saved.append((cm, outs[0][0].tobytes()))
    target = tmp_path / "live.lucidc"
    assert save_compiled(saved[0][0], target)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            save_compiled(saved[i % 2][0], target)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(15):
            got = load_compiled(target)(x).numpy().tobytes()
            assert got in (saved[0][1], saved[1][1])
    finally:
        stop.set()
        thread.join()


def test_loaded_module_profile_leaves_buffers_and_matches_the_compiled_program(tmp_path):
    model = LeNet()
    model.train()
    x = _rand(2, 1, 12, 12)
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        cm(x)
    path = tmp_path / "p.lucidc"
    assert save_compiled(cm, path)
    m = load_compiled(path)
    before = {r: t.numpy().tobytes() for r, t in m._weights.items()}
    rows = m.profile(x, repeats=2)
    assert sorted(r["op"] for r in rows) == sorted(r["op"] for r in cm.profile(x, repeats=1))
    assert rows[0]["ms"] >= rows[-1]["ms"] and all("instr" in r for r in rows)
    # Training-mode BatchNorm updates its statistics in place: profiling runs on copies.
    assert {r: t.numpy().tobytes() for r, t in m._weights.items()} == before
    assert m.cache_info()["n_calls"] == {m.cache_info()["keys"][0]: 0}
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        m.profile(x, repeats=0)
    with pytest.raises(ValueError, match="match no saved signature"):
        m.eval().profile(x)  # only the training-mode signature was saved
