"""lucid.save / lucid.load: safetensors files (per the format's description), exact round trips,
resuming training, numpy state dicts, atomic writes and clear errors for bad files."""

from __future__ import annotations

import collections
import io
import json
import math
import os
import socket
import stat
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid import serialization
from lucid.optim import lr_scheduler

DTYPES = [
    lucid.bool_,
    lucid.uint8,
    lucid.int8,
    lucid.int16,
    lucid.int32,
    lucid.int64,
    lucid.float16,
    lucid.float32,
    lucid.float64,
]
ST_NAMES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
}


def _round_trip(obj):
    buf = io.BytesIO()
    lucid.save(obj, buf)
    return lucid.load(io.BytesIO(buf.getvalue()))


def _bits(t):
    """Every byte of a tensor, so NaN payloads and -0.0 count."""
    return np.ascontiguousarray(t.numpy()).tobytes()


def _random_array(dtype, shape, rng):
    n = math.prod(shape)
    if dtype is lucid.bool_:
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype.numpy).reshape(shape)  # every bit pattern: NaNs, infs, subnormals


def _read_header(data: bytes):
    """An independent reader of the safetensors layout."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return n, header, data[8 + n :]


# --- round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 1, 2)])
def test_every_dtype_bit_exact(dtype, shape):
    rng = np.random.default_rng(abs(hash((dtype.name, shape))) % 2**32)
    t = lucid.from_numpy(_random_array(dtype, shape, rng))
    back = _round_trip({"t": t})["t"]
    assert back.dtype == dtype and tuple(back.shape) == shape
    assert _bits(back) == _bits(t)
    assert back is not t and not np.shares_memory(back.numpy(), t.numpy())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_file_layout_follows_the_safetensors_spec(dtype):
    rng = np.random.default_rng(1)
    a = _random_array(dtype, (2, 3), rng)
    buf = io.BytesIO()
    lucid.save({"w": lucid.from_numpy(a)}, buf)
    data = buf.getvalue()
    n, header, body = _read_header(data)
    assert (8 + n) % 8 == 0  # tensor data 8-byte aligned
    entry = header["w"]
    assert entry["dtype"] == ST_NAMES[dtype.name] and entry["shape"] == [2, 3]
    b, e = entry["data_offsets"]
    little = a.astype(a.dtype.newbyteorder("<"))
    assert body[b:e] == little.tobytes()
    assert header["__metadata__"]["format"] == "lucid"
    assert all(isinstance(v, str) for v in header["__metadata__"].values())


def test_state_dict_is_a_plain_safetensors_file_named_by_keys():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    buf = io.BytesIO()
    lucid.save(model.state_dict(), buf)
    _, header, _ = _read_header(buf.getvalue())
    tensor_names = [k for k in header if k != "__metadata__"]
    assert tensor_names == list(model.state_dict())  # other readers see the usual names


def test_state_dict_round_trip_into_new_model():
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    model(lucid.randn(5, 3, dtype=lucid.float64))  # move the running stats
    loaded = _round_trip(model.state_dict())
    assert isinstance(loaded, collections.OrderedDict)
    other = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    other.load_state_dict(loaded)
    for (k, a), (k2, b) in zip(model.state_dict().items(), other.state_dict().items(), strict=True):
        assert k == k2 and a.dtype == b.dtype and _bits(a) == _bits(b)
    model.eval()
    other.eval()
    x = lucid.randn(2, 3, dtype=lucid.float64)
    np.testing.assert_array_equal(model(x).detach().numpy(), other(x).detach().numpy())


def _make_run(seed=0):
    lucid.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).double()
    opt = lucid.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _train(model, opt, sched, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = lucid.tensor(rng.standard_normal((6, 4)), dtype=lucid.float64)
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()
        sched.step()


@pytest.mark.parametrize("with_plateau", [False, True])
def test_checkpoint_resumes_training_exactly(tmp_path, with_plateau):
    model, opt, sched = _make_run()
    _train(model, opt, sched, 3, seed=1)
    plateau = lr_scheduler.ReduceLROnPlateau(opt, patience=0) if with_plateau else None
    if plateau:
        plateau.step(1.0)
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "epoch": 3,
        "rng": lucid.get_rng_state(),
    }
    if plateau:
        ckpt["plateau"] = plateau.state_dict()
    path = tmp_path / "ckpt.lucid"
    lucid.save(ckpt, path)
    _train(model, opt, sched, 3, seed=2)  # the uninterrupted run

    model2, opt2, sched2 = _make_run(seed=5)  # different init: everything must come from the file
    state = lucid.load(str(path))
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    sched2.load_state_dict(state["scheduler"])
    if plateau:
        plateau2 = lr_scheduler.ReduceLROnPlateau(opt2)
        plateau2.load_state_dict(state["plateau"])
        assert plateau2.best == 1.0 and plateau2.patience == 0
    assert state["epoch"] == 3
    _train(model2, opt2, sched2, 3, seed=2)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert _bits(a) == _bits(b)
    assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        for key in opt.state[p]:
            assert _bits(opt.state[p][key]) == _bits(opt2.state[p2][key])


def test_scheduler_state_with_counter_and_inf_round_trips():
    _, opt, _ = _make_run()
    ms = lr_scheduler.MultiStepLR(opt, milestones=[3, 3, 7])
    plateau = lr_scheduler.ReduceLROnPlateau(opt)
    back = _round_trip({"ms": ms.state_dict(), "plateau": plateau.state_dict()})
    assert back["ms"]["milestones"] == collections.Counter({3: 2, 7: 1})
    assert type(back["ms"]["milestones"]) is collections.Counter
    assert back["plateau"]["best"] == math.inf and back["plateau"]["mode_worse"] == math.inf
    assert back["ms"] == ms.state_dict()


def test_python_values_and_containers():
    obj = {
        "none": None,
        "bools": [True, False],
        "ints": [0, -1, 2**70, -(2**63)],
        "floats": [0.1, -0.0, 1e308, 5e-324, math.inf, -math.inf],
        "text": 'naïve ✓ "quoted" \n',
        "tuple": (1, (2, "x")),
        "empty": ([], {}, ()),
        1: "int key",
        (2, "b"): "tuple key",
        None: "none key",
        2.5: "float key",
        "odict": collections.OrderedDict([("b", 1), ("a", 2)]),
        "set": {3, 1, 2},
        "frozen": frozenset({"x"}),
        "bytes": b"\x00\xffraw",
        "dtype": lucid.float16,
        "np_scalar": np.float32(1.5),
        "np_array": np.arange(6, dtype=np.int16).reshape(2, 3),
    }
    back = _round_trip(obj)
    assert back == {k: v for k, v in obj.items() if k != "np_array"} | {
        "np_array": back["np_array"]
    }
    assert math.copysign(1.0, back["floats"][1]) == -1.0
    assert type(back["tuple"]) is tuple and type(back["tuple"][1]) is tuple
    assert type(back["odict"]) is collections.OrderedDict and list(back["odict"]) == ["b", "a"]
    assert type(back["set"]) is set and type(back["frozen"]) is frozenset
    assert back["np_scalar"].dtype == np.float32 and isinstance(back["np_scalar"], np.generic)
    assert isinstance(back["np_array"], np.ndarray) and back["np_array"].dtype == np.int16
    np.testing.assert_array_equal(back["np_array"], obj["np_array"])
    assert list(back) == list(obj)  # insertion order kept
    nan = _round_trip([math.nan])[0]
    assert math.isnan(nan)


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.builds(
        lambda shape, seed: lucid.tensor(np.random.default_rng(seed).standard_normal(shape)),
        st.lists(st.integers(0, 3), max_size=3),
        st.integers(0, 100),
    ),
)
_trees = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3),
    ),
    max_leaves=12,
)


def _same(a, b):
    if isinstance(a, lucid.Tensor):
        return isinstance(b, lucid.Tensor) and a.dtype == b.dtype and _bits(a) == _bits(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and (a == b or (a != a and b != b))


@settings(max_examples=60, deadline=None)
@given(_trees)
def test_nested_structures_round_trip(obj):
    assert _same(obj, _round_trip(obj))


def test_parameters_requires_grad_and_sharing_kept():
    w = nn.Parameter(lucid.randn(2, 2))
    frozen = nn.Parameter(lucid.randn(2), requires_grad=False)
    t = lucid.randn(3, requires_grad=True)
    plain = lucid.arange(3)
    back = _round_trip({"a": w, "b": w, "list": [w, frozen, t, plain]})
    assert back["a"] is back["b"] is back["list"][0]  # tied weights stay tied
    assert isinstance(back["a"], nn.Parameter) and back["a"].requires_grad
    assert isinstance(back["list"][1], nn.Parameter) and not back["list"][1].requires_grad
    assert not isinstance(back["list"][2], nn.Parameter) and back["list"][2].requires_grad
    assert back["list"][2].is_leaf and not back["list"][3].requires_grad


def test_views_non_contiguous_and_big_endian():
    base = lucid.arange(12, dtype=lucid.float64).reshape(3, 4)
    view = base.transpose(0, 1)
    big = np.arange(5, dtype=">i4")
    back = _round_trip({"view": view, "big": big, "nonleaf": base * 2})
    np.testing.assert_array_equal(back["view"].numpy(), view.numpy())
    np.testing.assert_array_equal(back["big"], np.arange(5))
    assert back["big"].dtype == np.int32


def test_non_leaf_tensor_saved_detached():
    x = lucid.randn(3, requires_grad=True)
    y = x * 2
    back = _round_trip(y)
    assert back.is_leaf and back.requires_grad and back.grad_fn is None
    np.testing.assert_array_equal(back.numpy(), y.detach().numpy())


# --- paths and atomic writes -------------------------------------------------------------------
def test_path_forms_and_overwrite(tmp_path):
    p = tmp_path / "a.safetensors"
    lucid.save({"x": lucid.ones(2)}, p)  # pathlib
    lucid.save({"x": lucid.zeros(3)}, str(p))  # overwrite, str path
    assert lucid.load(p)["x"].shape == (3,)
    with open(p, "rb") as fh:
        assert lucid.load(fh)["x"].shape == (3,)
    assert os.listdir(tmp_path) == ["a.safetensors"]  # no temporary files left


def test_saved_file_has_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        p = tmp_path / "new.safetensors"
        lucid.save({"x": lucid.ones(1)}, p)
        assert p.stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600
        p.chmod(0o640)
        lucid.save({"x": lucid.zeros(1)}, p)  # overwriting keeps the file's mode
        assert p.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_save_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real" / "ckpt.safetensors"
    target.parent.mkdir()
    lucid.save({"x": lucid.ones(2)}, target)
    link = tmp_path / "latest"
    link.symlink_to(target)
    lucid.save({"x": lucid.zeros(3)}, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert lucid.load(target)["x"].shape == (3,)
    dangling = tmp_path / "next"
    dangling.symlink_to(tmp_path / "real" / "new.safetensors")
    lucid.save({"x": lucid.ones(1)}, dangling)  # creates the target, as open() would
    assert dangling.is_symlink()
    assert lucid.load(tmp_path / "real" / "new.safetensors")["x"].shape == (1,)
    assert sorted(os.listdir(tmp_path / "real")) == ["ckpt.safetensors", "new.safetensors"]


def test_save_writes_into_a_fifo_for_its_reader(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        lucid.save({"x": lucid.arange(3)}, fifo)
    finally:
        reader.join(timeout=30)
        if reader.is_alive() and stat.S_ISFIFO(fifo.stat().st_mode):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the waiting reader
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still a FIFO, not a file
    assert lucid.load(io.BytesIO(got[0]))["x"].tolist() == [0, 1, 2]


def test_save_writes_into_a_character_device_and_never_replaces_it(tmp_path):
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a copy of /dev/null
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")
    lucid.save({"x": lucid.ones(2)}, null)
    assert stat.S_ISCHR(null.stat().st_mode)
    assert os.listdir(tmp_path) == ["null"]


def test_save_refuses_directories_and_sockets(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        lucid.save({"x": lucid.ones(2)}, tmp_path)
    sock_path = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        with pytest.raises(ValueError, match="is a socket.*never replaces"):
            lucid.save({"x": lucid.ones(2)}, sock_path)
        assert stat.S_ISSOCK(sock_path.stat().st_mode)
    finally:
        sock.close()


def test_failed_save_leaves_old_file_untouched(tmp_path, monkeypatch):
    p = tmp_path / "ckpt"
    lucid.save({"x": lucid.ones(2)}, p)
    before = p.read_bytes()
    with pytest.raises(TypeError, match="cannot save"):
        lucid.save({"x": lucid.zeros(2), "f": lambda: 0}, p)
    assert p.read_bytes() == before

    def fail_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="disk full"):
        lucid.save({"x": lucid.zeros(2)}, p)
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt"]


# --- what cannot be saved ------------------------------------------------------------------------
Pair = collections.namedtuple("Pair", "a b")


def test_unsavable_objects_are_named():
    with pytest.raises(TypeError, match=r"cannot save function at 'cfg.fn'.*pickling it failed"):
        lucid.save({"cfg": {"fn": lambda: 0}}, io.BytesIO())
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="cycle"):
        lucid.save(cyclic, io.BytesIO())


@pytest.mark.parametrize(
    "obj",
    [
        Pair(lucid.ones(2), 3),
        collections.defaultdict(list, a=[1]),
        {"c": np.arange(3) * 1j},
    ],
    ids=["namedtuple", "defaultdict", "complex"],
)
def test_what_the_safe_format_cannot_hold_is_pickled_and_loads_only_when_asked(obj, tmp_path):
    path = tmp_path / "obj.pt"
    lucid.save(obj, path)
    with pytest.raises(ValueError, match=r"obj.pt.* pickled object.*weights_only=False"):
        lucid.load(path)
    with pytest.raises(serialization.WeightsOnlyError):
        lucid.load(path, weights_only=True)
    back = lucid.load(path, weights_only=False)
    assert type(back) is type(obj)


def test_whole_module_save_pickles_and_load_needs_weights_only_false(tmp_path):
    import pickle

    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model(lucid.randn(5, 3))  # running statistics move
    path = tmp_path / "model.pt"
    lucid.save(model, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        lucid.load(path)  # like torch >= 2.6
    loaded = lucid.load(path, weights_only=False)
    assert type(loaded) is nn.Sequential and loaded is not model
    for (k, v), (k2, v2) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert k == k2 and _bits(v) == _bits(v2)
    x = lucid.randn(2, 3)
    model.eval(), loaded.eval()
    with lucid.no_grad():
        assert _bits(model(x)) == _bits(loaded(x))
    # A damaged pickle is refused before anything is unpickled.
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(data)
    with pytest.raises(ValueError, match="does not match its SHA-256"):
        lucid.load(path, weights_only=False)
    # State dicts stay in the safe format.
    lucid.save(model.state_dict(), path)
    assert set(lucid.load(path)) == set(model.state_dict())


# --- files written by hand per the spec ---------------------------------------------------
def _hand_file(tensors, metadata=None, pad=0):
    """A safetensors file assembled from the format description alone."""
    header, body, offset = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        body += raw
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + body


def test_hand_written_file_loads_as_dict_of_tensors():
    f32 = np.array([[1.5, -2.0], [3.25, 0.0]], "<f4")
    i64 = np.array([7, -9, 2**40], "<i8")
    bf16 = np.array([1.0, -3.5, 2.0**-130], np.float32)  # exactly representable in bfloat16
    raw_bf16 = (bf16.view(np.uint32) >> 16).astype("<u2").tobytes()
    data = _hand_file(
        {
            "weight": ("F32", [2, 2], f32.tobytes()),
            "ids": ("I64", [3], i64.tobytes()),
            "mask": ("BOOL", [2], b"\x01\x00"),
            "scalar": ("F64", [], struct.pack("<d", math.pi)),
            "half": ("BF16", [3], raw_bf16),
            "small": ("U16", [2], struct.pack("<HH", 65535, 1)),
        },
        metadata={"format": "pt"},
        pad=5,
    )
    got = lucid.load(io.BytesIO(data))
    assert list(got) == ["weight", "ids", "mask", "scalar", "half", "small"]
    np.testing.assert_array_equal(got["weight"].numpy(), f32)
    assert got["ids"].dtype == lucid.int64 and got["ids"].tolist() == [7, -9, 2**40]
    assert got["mask"].dtype == lucid.bool_ and got["mask"].tolist() == [True, False]
    assert got["scalar"].shape == () and got["scalar"].item() == math.pi
    assert got["half"].dtype == lucid.bfloat16
    np.testing.assert_array_equal(got["half"].numpy().astype(np.float32), bf16)
    assert got["small"].dtype == lucid.int32 and got["small"].tolist() == [65535, 1]


def test_hand_written_state_dict_loads_into_a_module():
    w = np.arange(6, dtype="<f4").reshape(2, 3)
    b = np.array([0.5, -0.5], "<f4")
    data = _hand_file({"weight": ("F32", [2, 3], w.tobytes()), "bias": ("F32", [2], b.tobytes())})
    model = nn.Linear(3, 2)
    model.load_state_dict(lucid.load(io.BytesIO(data)))
    np.testing.assert_array_equal(model.weight.detach().numpy(), w)
    np.testing.assert_array_equal(model.bias.detach().numpy(), b)


def test_safetensors_package_reads_our_file_if_installed(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    safetensors = pytest.importorskip("safetensors")
    buf = io.BytesIO()
    arrays = {"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 2), np.int64)}
    lucid.save({k: lucid.from_numpy(v) for k, v in arrays.items()}, buf)
    got = st_numpy.load(buf.getvalue())
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
    path = tmp_path / "ckpt.safetensors"  # a real checkpoint, digest and structure included
    path.write_bytes(_checkpoint_bytes())
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert len(f.metadata()["lucid.sha256"]) == 64
        names = list(f.keys())
        assert names and all(f.get_tensor(n).size >= 0 for n in names)


# --- bad files ----------------------------------------------------------------------------
def _checkpoint_bytes():
    """A real training checkpoint: model, Adam state (betas, lr, moments) and a scheduler."""
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = lucid.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999))
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model(lucid.randn(5, 3)).sum().backward()
    opt.step()
    sched.step()
    buf = io.BytesIO()
    lucid.save({"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "epoch": 1}, buf)  # fmt: skip
    return buf.getvalue()


def test_every_single_bit_flip_of_the_header_raises_naming_the_file(tmp_path):
    data = _checkpoint_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    path = tmp_path / "ckpt.safetensors"
    path.write_bytes(data)
    lucid.load(path)  # the intact file loads
    loaded = []
    for byte in range(8 + n):  # the length field and the whole JSON header
        for bit in range(8):
            flipped = bytearray(data)
            flipped[byte] ^= 1 << bit
            f = io.BytesIO(bytes(flipped))
            f.name = str(path)  # as an open file would be named; writing 25k files is slow
            try:
                lucid.load(f)
            except ValueError as e:
                assert str(path) in str(e), str(e)
            else:
                loaded.append((byte, bit))
    assert not loaded, f"{len(loaded)} of {8 * (8 + n)} flips loaded, e.g. {loaded[:5]}"
    mid = 8 + n // 2  # inside the digest's cover, outside its own place
    path.write_bytes(data[:mid] + bytes([data[mid] ^ 2]) + data[mid + 1 :])
    with pytest.raises(ValueError, match=f"{path.name}.* does not match its SHA-256"):
        lucid.load(path)


def test_legacy_or_damaged_lucid_metadata_without_the_digest_is_refused():
    data = _good_bytes()
    n, header, body = _read_header(data)
    del header["__metadata__"]["lucid.sha256"]
    text = json.dumps(header).encode()
    with pytest.raises(ValueError, match="carries Lucid metadata but no SHA-256"):
        lucid.load(io.BytesIO(struct.pack("<Q", len(text)) + text + body))


def _good_bytes():
    buf = io.BytesIO()
    lucid.save({"a": lucid.arange(4, dtype=lucid.float32), "b": [1, 2]}, buf)
    return buf.getvalue()


def test_every_truncation_raises_value_error():
    data = _good_bytes()
    for n in range(len(data)):
        with pytest.raises(ValueError, match="not a valid checkpoint"):
            lucid.load(io.BytesIO(data[:n]))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: b"", "fewer than the 8-byte header length"),
        (lambda d: d[:7] + b"\x80" + d[8:], "header length field says"),
        (lambda d: d + b"\x00", "does not match its SHA-256"),
        (
            lambda d: _hand_file({"a": ("F32", [1], b"\x00" * 4)}) + b"\x00",
            "unexpected bytes after the last tensor",
        ),  # fmt: skip
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "does not match its SHA-256"),
        (lambda d: b"PK\x03\x04" + b"\x00" * 60, "header length field|not UTF-8|not a JSON"),
        (lambda d: struct.pack("<Q", 4) + b"\xff\xfe{}", "not UTF-8"),
        (lambda d: struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (lambda d: struct.pack("<Q", 3) + b"{x}", "not valid JSON"),
        (lambda d: struct.pack("<Q", 16) + b'{"a": 1, "a": 2}', "'a' appears twice"),
    ],
)
def test_corrupted_files(make, match):
    with pytest.raises(ValueError, match=match):
        lucid.load(io.BytesIO(make(_good_bytes())))


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ({"a": ("F32", [2], b"\x00" * 4)}, "needs 8 bytes"),
        ({"a": ("F99", [1], b"\x00" * 4)}, "unknown dtype 'F99'"),
        ({"a": ("U64", [1], b"\x00" * 8)}, "U64, which Lucid has no dtype for"),
        ({"a": ("F32", [-1], b"")}, "not a list of sizes"),
        ({"a": ("F32", "2", b"")}, "not a list of sizes"),
        ({"a": ("BOOL", [1], b"\x02")}, "other than 0 and 1"),
    ],
)
def test_bad_entries(tensors, match):
    with pytest.raises(ValueError, match=match):
        lucid.load(io.BytesIO(_hand_file(tensors)))


def _edit_header(edit):
    """A crafted file: the header edited, then sealed with a matching digest."""
    data = _good_bytes()
    n, header, body = _read_header(data)
    edit(header)
    return serialization._seal(json.dumps(header, separators=(",", ":")).encode(), body)


def _structure(header, value):
    header["__metadata__"]["lucid.structure"] = value


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h: h["a"].update(data_offsets=[4, 20]), "leaves a gap|needs 16 bytes"),
        (
            lambda h: h.update(extra={"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}),
            "overlaps",
        ),  # fmt: skip
        (lambda h: h["a"].update(offsets=[0, 16]), "exactly dtype, shape and data_offsets"),
        (lambda h: h["__metadata__"].update(x=1), "map strings to strings"),
        (lambda h: _structure(h, "{not json"), "structure is not valid JSON"),
        (
            lambda h: _structure(h, '{"dict": [["a", {"tensor": "zz", "requires_grad": false}]]}'),
            "tensor 'zz' the file does not hold",
        ),  # fmt: skip
        (lambda h: _structure(h, '{"pickle": "os.system"}'), "unknown node type 'pickle'"),
        (lambda h: _structure(h, '{"float": "1e5"}'), "float node"),
        (lambda h: _structure(h, '{"dict": [[[1], 2]]}'), "unhashable"),
        (lambda h: _structure(h, '{"tensor": "a", "requires_grad": "yes"}'), "malformed"),
        (lambda h: _structure(h, "NaN"), "not valid JSON"),
        (lambda h: _structure(h, "[" * 500 + "]" * 500), "nested more than 100 levels"),
        (lambda h: _structure(h, '{"tuple": [' * 300 + "]}" * 300), "nested more than"),
        (lambda h: _structure(h, '{"ndarray": [1]}'), "tensor \\[1\\] the file does not hold"),
        (
            lambda h: h.update(z={"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}),
            "tensor 'z' has shape \\[0, 1180591620717411303424\\], larger than",
        ),
        (
            lambda h: h.update(z={"dtype": "F32", "shape": [0] + [1] * 40, "data_offsets": [0, 0]}),
            "tensor 'z' has shape",
        ),
    ],
)
def test_bad_headers_and_structures(edit, match, tmp_path):
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(_edit_header(edit))
    with pytest.raises(ValueError, match=match) as info:
        lucid.load(path)
    assert repr(str(path)) in str(info.value)


def test_map_location_and_text_mode(tmp_path):
    data = _good_bytes()
    assert lucid.load(io.BytesIO(data), map_location="cpu", weights_only=True)["b"] == [1, 2]
    with pytest.raises(ValueError, match="map_location='cuda' is not supported"):
        lucid.load(io.BytesIO(data), map_location="cuda")
    p = tmp_path / "f"
    p.write_bytes(data)
    with open(p, encoding="latin-1") as fh, pytest.raises(TypeError, match="binary mode"):
        lucid.load(fh)
    with pytest.raises(FileNotFoundError):
        lucid.load(tmp_path / "missing")


# --- numpy state dicts --------------------------------------------------------------------------
def test_module_load_state_dict_accepts_numpy():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    arrays = {k: np.random.default_rng(0).standard_normal(v.shape).astype(np.float32)
              for k, v in model.state_dict().items() if v.dtype.is_floating_point}  # fmt: skip
    arrays["1.num_batches_tracked"] = np.int64(7)  # a numpy scalar
    model.load_state_dict(arrays)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), arrays[k])
    assert isinstance(model[0].weight, nn.Parameter)
    with pytest.raises(RuntimeError, match="size mismatch for 0.bias"):
        model.load_state_dict({**arrays, "0.bias": np.zeros(5, np.float32)})
    with pytest.raises(TypeError, match=r'state_dict\["0.bias"\].*complex128'):
        model.load_state_dict({**arrays, "0.bias": np.zeros(2, complex)})


def test_module_load_state_dict_numpy_assign_shares_memory():
    model = nn.Linear(2, 1)
    w = np.ones((1, 2), np.float32)
    model.load_state_dict({"weight": w, "bias": np.zeros(1, np.float32)}, assign=True)
    w[0, 0] = 5.0
    assert model.weight[0, 0].item() == 5.0  # like torch.from_numpy
    assert isinstance(model.weight, nn.Parameter) and model.weight.requires_grad


def test_optimizer_load_state_dict_accepts_numpy():
    model, opt, sched = _make_run()
    _train(model, opt, sched, 2, seed=3)
    sd = opt.state_dict()
    as_numpy = {
        "state": {i: {k: v.numpy() for k, v in st.items()} for i, st in sd["state"].items()},
        "param_groups": sd["param_groups"],
    }
    model2, opt2, _ = _make_run()
    opt2.load_state_dict(as_numpy)
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        for key, v in opt.state[p].items():
            got = opt2.state[p2][key]
            assert isinstance(got, lucid.Tensor) and _bits(got) == _bits(v)
    assert opt2.state[list(model2.parameters())[0]]["step"].dtype == lucid.float32


@pytest.mark.parametrize("dt,tag", [(lucid.float16, "F16"), (lucid.bfloat16, "BF16")])
def test_half_tensors_round_trip_bit_exact_with_their_safetensors_tag(dt, tag):
    # Every 16-bit pattern: NaNs (with payloads), infinities, subnormals, both zeros.
    bits = np.arange(2**16, dtype=np.uint16)
    t = lucid.from_numpy(bits.view(dt.numpy).copy())
    model = nn.Linear(3, 2).to(dt)
    buf = io.BytesIO()
    lucid.save({"all": t, "model": model.state_dict()}, buf)
    header_len = struct.unpack("<Q", buf.getvalue()[:8])[0]
    header = json.loads(buf.getvalue()[8 : 8 + header_len])
    assert {e["dtype"] for k, e in header.items() if k != "__metadata__"} == {tag}
    buf.seek(0)
    got = lucid.load(buf)
    assert got["all"].dtype is dt
    np.testing.assert_array_equal(got["all"].numpy().view(np.uint16), bits)
    for name, p in model.state_dict().items():
        assert got["model"][name].dtype is dt
        np.testing.assert_array_equal(
            got["model"][name].numpy().view(np.uint16), p.detach().numpy().view(np.uint16)
        )
