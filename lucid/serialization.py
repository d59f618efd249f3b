"""``lucid.save`` / ``lucid.load``: checkpoints that never execute code when loaded (unless a
pickled file is loaded with ``weights_only=False``).

A checkpoint is a safetensors file (https://github.com/huggingface/safetensors, written here
from its format description, no dependency):

- 8 bytes: ``N``, the header's length, an unsigned little-endian 64-bit integer;
- ``N`` bytes: a UTF-8 JSON object mapping each tensor's name to ``{"dtype": "F32", "shape": [..],
  "data_offsets": [begin, end]}`` (offsets into the data that follows), plus an optional
  ``"__metadata__"`` object of string to string; padded with spaces to a multiple of 8 bytes;
- the raw little-endian, C-ordered bytes of every tensor, back to back.

Lucid stores the structure of the saved object (dicts, lists, tuples, numbers, strings, None and
where each tensor goes) as JSON in ``__metadata__["lucid.structure"]``.

Every byte of the file is covered by a SHA-256 checked before anything is parsed: the header
starts with ``{"__metadata__":{"lucid.sha256":"<64 hex digits>"``, at a fixed place, and the
digest is that of the whole file with those 64 digits replaced by ``0``. A file that starts
another way is a foreign safetensors file; if its metadata nevertheless carries Lucid's marks
(a damaged Lucid file, or one from a development version without the digest), it is refused.
Loading only ever builds the handful of types listed in ``_decode``; nothing is imported or
called by name.

What the safe format cannot hold (a whole module, an optimizer, a namedtuple) is pickled, as
``torch.save`` does: ``PICKLE_MAGIC``, the SHA-256 of the pickle, the pickle. ``load`` refuses
such a file unless called with ``weights_only=False`` (``WeightsOnlyError`` naming the flag), as
``torch.load`` does since 2.6. Any safetensors reader can read the tensors
of a Lucid checkpoint, and ``lucid.load`` reads any safetensors file (as a dict of tensors when
it has no Lucid structure).
"""

from __future__ import annotations

import base64
import collections
import errno
import hashlib
import json
import math
import os
import pickle
import stat
import tempfile
from typing import IO, Any

import numpy as np

from lucid import _dtype
from lucid._tensor import Tensor

__all__ = ["WeightsOnlyError", "load", "save"]

FORMAT = "lucid"
STRUCTURE_KEY = "lucid.structure"
SHA256_KEY = "lucid.sha256"
METADATA_KEY = "__metadata__"
# The header of a Lucid file starts with these bytes, then the 64 hex digits of the digest.
_DIGEST_PREFIX = b'{"%s":{"%s":"' % (METADATA_KEY.encode(), SHA256_KEY.encode())
_DIGEST_AT = 8 + len(_DIGEST_PREFIX)  # byte offset of the digest in the file
_DIGEST_PLACEHOLDER = b"0" * 64
_MAX_NDIM = 32  # numpy's limit before 2.0 (64 since)
_MAX_DEPTH = 100  # of a saved structure: real checkpoints nest a few levels
MAX_HEADER_BYTES = 100_000_000
# A pickled file starts with these 8 bytes; read as a safetensors header length they are far
# over MAX_HEADER_BYTES, so no safetensors file is mistaken for one.
PICKLE_MAGIC = b"LUCIDPKL"  # the limit safetensors' own reader applies

# safetensors dtype name -> numpy dtype (little-endian), for the dtypes Lucid has.
# BF16 is ml_dtypes' bfloat16 (native byte order: little on every host), looked up on first use
# so that importing lucid, or saving and loading other dtypes, does not import ml_dtypes.
_TO_NUMPY = _dtype.BFloat16Table(
    {
        "BOOL": np.dtype("?"),
        "U8": np.dtype("u1"),
        "I8": np.dtype("i1"),
        "I16": np.dtype("<i2"),
        "I32": np.dtype("<i4"),
        "I64": np.dtype("<i8"),
        "F16": np.dtype("<f2"),
        "F32": np.dtype("<f4"),
        "F64": np.dtype("<f8"),
    },
    name="BF16",
)
_FROM_NUMPY = _dtype.BFloat16Table(
    {v.newbyteorder("="): k for k, v in _TO_NUMPY.items()}, value="BF16"
)
_STORABLE = "bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"
# Read but not written: widened exactly to a dtype Lucid has.
_WIDENED = {"U16": (np.dtype("<u2"), 2), "U32": (np.dtype("<u4"), 4)}
_KNOWN_UNSUPPORTED = {"U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"}


# --- save ---------------------------------------------------------------------------------------
class _Encoder:
    """Turns a Python object into a JSON structure plus named arrays."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.names_by_id: dict[int, str] = {}
        self.keep_alive: list[Any] = []  # ids stay unique while encoding
        self.active: set[int] = set()

    def name_for(self, obj: Any, arr: np.ndarray, path: str) -> str:
        known = self.names_by_id.get(id(obj))
        if known is not None:
            return known  # one object saved once; loads back as one shared object
        name = path or "tensor"
        if name == METADATA_KEY or name in self.arrays:
            i = 1
            while f"{name}#{i}" in self.arrays:
                i += 1
            name = f"{name}#{i}"
        self.arrays[name] = arr
        self.names_by_id[id(obj)] = name
        self.keep_alive.append(obj)
        return name

    def encode(self, obj: Any, path: str) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if isinstance(obj, Tensor):
            return self.encode_tensor(obj, path)
        if isinstance(obj, np.ndarray):
            return {"ndarray": self.name_for(obj, self.check_array(obj, path), path)}
        if isinstance(obj, np.generic):
            arr = self.check_array(np.asarray(obj), path)
            return {"npscalar": self.name_for(obj, arr, path)}
        if isinstance(obj, _dtype.dtype):
            return {"dtype": obj.name}
        if isinstance(obj, bytes):
            return {"bytes": base64.b64encode(obj).decode("ascii")}
        if isinstance(obj, (list, tuple, dict, set, frozenset)):
            if id(obj) in self.active:
                raise ValueError(f"lucid.save: {_where(path)} contains itself (a cycle)")
            self.active.add(id(obj))
            try:
                return self.encode_container(obj, path)
            finally:
                self.active.discard(id(obj))
        kind = type(obj).__name__
        hint = ""
        if hasattr(obj, "state_dict") and callable(obj.state_dict):
            hint = "; save its state_dict() instead (lucid.save(obj.state_dict(), path))"
        raise TypeError(
            f"lucid.save: cannot save {kind} at {_where(path)}: checkpoints hold tensors, numpy "
            f"arrays, numbers, strings, bytes, None, dtypes and dicts/lists/tuples/sets of them"
            f"{hint}"
        )

    def encode_container(self, obj: Any, path: str) -> Any:
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            raise TypeError(
                f"lucid.save: cannot save the namedtuple {type(obj).__name__} at {_where(path)} "
                "(loading it would need its class); convert it to a tuple or dict"
            )
        if isinstance(obj, list) and type(obj) is list:
            return [self.encode(v, _join(path, i)) for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return {"tuple": [self.encode(v, _join(path, i)) for i, v in enumerate(obj)]}
        if type(obj) in (set, frozenset):
            items = sorted(obj, key=repr)  # a stable file for equal sets
            tag = "set" if type(obj) is set else "frozenset"
            return {tag: [self.encode(v, _join(path, i)) for i, v in enumerate(items)]}
        if type(obj) in (dict, collections.OrderedDict, collections.Counter):
            tag = {dict: "dict", collections.OrderedDict: "odict", collections.Counter: "counter"}
            pairs = [
                [self.encode(k, _join(path, "key")), self.encode(v, _join(path, k))]
                for k, v in obj.items()
            ]
            return {tag[type(obj)]: pairs}
        raise TypeError(
            f"lucid.save: cannot save {type(obj).__name__} at {_where(path)} (a subclass of "
            f"{type(obj).__mro__[1].__name__}); convert it to a plain dict, list or tuple"
        )

    def encode_tensor(self, t: Tensor, path: str) -> Any:
        if t.is_traced:
            raise ValueError(
                f"lucid.save: {_where(path)} is a trace tensor (inside lucid.compile) with no value"
            )
        from lucid.nn.parameter import Parameter

        arr = self.check_array(t._data, path)
        tag = "parameter" if isinstance(t, Parameter) else "tensor"
        return {tag: self.name_for(t, arr, path), "requires_grad": bool(t.requires_grad)}

    @staticmethod
    def check_array(arr: np.ndarray, path: str) -> np.ndarray:
        if arr.dtype.newbyteorder("=") not in _FROM_NUMPY:
            raise TypeError(
                f"lucid.save: {_where(path)} has dtype {arr.dtype}, which Lucid cannot store; "
                f"storable: {_STORABLE}"
            )
        return arr


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _where(path: str) -> str:
    return f"'{path}'" if path else "the saved object"


def _serialize(obj: Any) -> bytes:
    enc = _Encoder()
    structure = enc.encode(obj, "")
    header: dict[str, Any] = {}
    chunks = []
    offset = 0
    for name, arr in enc.arrays.items():
        little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        raw = little.tobytes()
        header[name] = {
            "dtype": _FROM_NUMPY[arr.dtype.newbyteorder("=")],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    data = b"".join(chunks)
    header = {
        METADATA_KEY: {
            SHA256_KEY: _DIGEST_PLACEHOLDER.decode(),  # first: its place is fixed
            "format": FORMAT,
            STRUCTURE_KEY: json.dumps(structure, allow_nan=False, separators=(",", ":")),
        },
        **header,
    }
    return _seal(json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8"), data)


def _seal(header: bytes, data: bytes) -> bytes:
    """The file of a compact JSON ``header`` whose metadata starts with the digest (any 64
    characters), and ``data``: the header padded, the digest of the whole file put in place."""
    header += b" " * (-(8 + len(header)) % 8)  # tensor data starts 8-byte aligned
    payload = bytearray(len(header).to_bytes(8, "little") + header + data)
    if payload[8:_DIGEST_AT] != _DIGEST_PREFIX:
        raise ValueError("lucid.save: the header does not start with the digest's place")
    payload[_DIGEST_AT : _DIGEST_AT + 64] = _DIGEST_PLACEHOLDER
    payload[_DIGEST_AT : _DIGEST_AT + 64] = hashlib.sha256(payload).hexdigest().encode()
    return bytes(payload)


def save(obj: Any, f: str | os.PathLike | IO[bytes]) -> None:
    """Save ``obj`` (tensors, state dicts, optimizer/scheduler state, numpy arrays, numbers,
    strings, None, nested in dicts, lists and tuples) to ``f``, a path or a binary file object.

    The file is safetensors (see this module's docstring). Anything else (a whole module, an
    optimizer, a namedtuple...) is pickled, as ``torch.save`` does; ``lucid.load`` reads such
    a file only with ``weights_only=False``, since unpickling runs code named in the file.

    Writing to a path is atomic: the data goes to a temporary file beside it that is renamed
    over ``f`` once complete, so a crash never leaves a half-written checkpoint. A symbolic
    link is followed (its target is replaced, the link stays); a FIFO or a character device
    (``/dev/null``, ``/dev/stdout``) is written straight into; a directory, block device or
    socket is refused.
    """
    try:
        payload = _serialize(obj)
    except TypeError as unsafe:  # a type the safe format has no place for: pickled, as torch
        payload = _pickled(obj, unsafe)
    if hasattr(f, "write"):
        f.write(payload)
        return
    write_file(f, payload, "lucid.save")


def _pickled(obj: Any, unsafe: TypeError) -> bytes:
    """The pickle file of ``obj``: ``PICKLE_MAGIC``, the SHA-256 of the pickle, the pickle."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - PicklingError, TypeError, AttributeError, ...
        raise TypeError(f"{unsafe}; pickling it failed too ({type(e).__name__}: {e})") from None
    return PICKLE_MAGIC + hashlib.sha256(data).digest() + data


def write_file(f: str | os.PathLike, payload: bytes, who: str) -> None:
    """Write ``payload`` to the path ``f`` as ``save`` does (atomic replace of a regular file at
    the symbolic link's target; straight into a FIFO or character device); ``who`` names the
    caller in errors."""
    path = os.fspath(f)
    if not isinstance(path, str):
        path = os.fsdecode(path)
    target = os.path.realpath(path)  # a link's target is what the user means to replace
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            with open(target, "wb") as out:  # a reader (or the device) takes the bytes
                out.write(payload)
            return
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, f"{who}: {path!r} is a directory", path)
        raise ValueError(
            f"{who}: {path!r} is a {_kind(mode)}; it writes regular files (atomically), FIFOs "
            "and character devices, and never replaces anything else"
        )
    directory = os.path.dirname(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=directory)  # fmt: skip
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would have.
        os.chmod(tmp, _new_file_mode(target))
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        _fsync_directory(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _kind(mode: int) -> str:
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _new_file_mode(path: str) -> int:
    """The permission bits of the file being replaced, or of a new file under the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable where the platform allows it (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- load ---------------------------------------------------------------------------------------
def _bad(source: str, problem: str) -> ValueError:
    return ValueError(f"lucid.load: {source} is not a valid checkpoint: {problem}")


def _verify_digest(buf: bytes, source: str) -> bool:
    """Whether ``buf`` is a Lucid file (its header starts with the digest), after checking the
    digest against every byte of the file; raises when it does not match."""
    if bytes(buf[8:_DIGEST_AT]) != _DIGEST_PREFIX or len(buf) < _DIGEST_AT + 64:
        return False
    stored = bytes(buf[_DIGEST_AT : _DIGEST_AT + 64])
    h = hashlib.sha256()
    h.update(memoryview(buf)[:_DIGEST_AT])
    h.update(_DIGEST_PLACEHOLDER)
    h.update(memoryview(buf)[_DIGEST_AT + 64 :])
    if h.hexdigest().encode() != stored:
        raise _bad(source, "it does not match its SHA-256 (the file is corrupted or was altered)")
    return True


def _parse(buf: bytes, source: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and the metadata of a safetensors file, every field checked (a Lucid file's
    digest before anything else)."""
    if len(buf) < 8:
        raise _bad(source, f"it has {len(buf)} bytes, fewer than the 8-byte header length")
    n = int.from_bytes(buf[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise _bad(source, f"its header length field says {n} bytes (corrupted or not safetensors)")
    if 8 + n > len(buf):
        raise _bad(
            source,
            f"its header length field says {n} bytes but only {len(buf) - 8} follow "
            "(truncated file?)",
        )
    lucid_file = _verify_digest(buf, source)
    try:
        text = bytes(buf[8 : 8 + n]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(source, f"its header is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.lstrip().startswith("{"):
        raise _bad(source, "its header is not a JSON object")
    try:
        header = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise _bad(source, f"its header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(source, "its header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _bad(source, "__metadata__ must map strings to strings")
    if not lucid_file and (
        metadata.get("format") == FORMAT or any(k.startswith("lucid.") for k in metadata)
    ):
        # A damaged Lucid file whose digest's place changed would otherwise load unchecked.
        raise _bad(
            source,
            "it carries Lucid metadata but no SHA-256 of the whole file where Lucid writes it "
            "(damaged, or saved by a development version of Lucid that checksummed only the "
            "tensor data; any safetensors reader can still read its tensors)",
        )
    data = memoryview(buf)[8 + n :]
    spans = []
    entries = []
    for name, entry in header.items():
        dtype, shape, begin, end = _check_entry(name, entry, source)
        spans.append((begin, end, name))
        entries.append((name, dtype, shape, begin, end))
    spans.sort()
    expected = 0
    for begin, end, name in spans:
        if begin != expected:
            what = "overlaps the previous tensor" if begin < expected else "leaves a gap before it"
            raise _bad(source, f"tensor {name!r} starts at byte {begin} and {what} (expected "
                               f"{expected})")  # fmt: skip
        expected = end
    if expected > len(data):
        raise _bad(
            source,
            f"the tensors need {expected} bytes of data but the file has {len(data)} "
            "(truncated file?)",
        )
    if expected < len(data):
        raise _bad(source, f"{len(data) - expected} unexpected bytes after the last tensor")
    arrays = {}
    for name, dtype, shape, begin, end in entries:
        arrays[name] = _read_array(data[begin:end], dtype, shape)
        if dtype == "BOOL" and arrays[name].size and arrays[name].view(np.uint8).max() > 1:
            raise _bad(source, f"the BOOL tensor {name!r} holds bytes other than 0 and 1")
    return arrays, metadata


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {dup!r} appears twice")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_entry(name: str, entry: Any, source: str) -> tuple[str, list[int], int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _bad(source, f"tensor {name!r} must be an object with exactly dtype, shape and "
                           f"data_offsets, got {entry!r}"[:300])  # fmt: skip
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or (dtype not in _TO_NUMPY and dtype not in _WIDENED):
        if dtype in _KNOWN_UNSUPPORTED:
            raise ValueError(
                f"lucid.load: tensor {name!r} in {source} has dtype {dtype}, which Lucid has "
                "no dtype for"
            )
        raise _bad(source, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
        raise _bad(source, f"tensor {name!r} has shape {shape!r}, not a list of sizes"[:300])
    if len(shape) > _MAX_NDIM or math.prod(d for d in shape if d) >= 2**62:
        raise _bad(source, f"tensor {name!r} has shape {shape!r}, larger than any array can be"
                           [:300])  # fmt: skip
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_index(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _bad(source, f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    itemsize = _TO_NUMPY[dtype].itemsize if dtype in _TO_NUMPY else _WIDENED[dtype][1]
    want = math.prod(shape) * itemsize
    if offsets[1] - offsets[0] != want:
        raise _bad(
            source,
            f"tensor {name!r} of shape {shape} and dtype {dtype} needs {want} bytes, its "
            f"data_offsets span {offsets[1] - offsets[0]}",
        )
    return dtype, shape, offsets[0], offsets[1]


def _is_index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read_array(raw: memoryview, dtype: str, shape: list[int]) -> np.ndarray:
    if dtype in _TO_NUMPY:
        arr = np.frombuffer(raw, dtype=_TO_NUMPY[dtype])
        return arr.astype(_TO_NUMPY[dtype].newbyteorder("="), copy=True).reshape(shape)
    words = np.frombuffer(raw, dtype=_WIDENED[dtype][0]).astype(np.uint32)
    return words.astype(np.int32 if dtype == "U16" else np.int64).reshape(shape)


_CONTAINER_TAGS = {
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
}
_MAPPING_TAGS = {
    "dict": dict,
    "odict": collections.OrderedDict,
    "counter": collections.Counter,
}


class _Decoder:
    def __init__(self, arrays: dict[str, np.ndarray], source: str) -> None:
        self.arrays = arrays
        self.source = source
        self.built: dict[str, Any] = {}  # one saved object -> one loaded object

    def bad(self, problem: str) -> ValueError:
        return _bad(self.source, f"its structure {problem}")

    def array(self, name: Any) -> np.ndarray:
        if not isinstance(name, str) or name not in self.arrays:
            raise self.bad(f"refers to a tensor {name!r} the file does not hold")
        return self.arrays[name]

    def decode(self, node: Any, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise self.bad(f"is nested more than {_MAX_DEPTH} levels deep")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, depth + 1) for v in node]
        if not isinstance(node, dict) or not node:
            raise self.bad(f"has an unexpected node {node!r}"[:300])
        tag = next(iter(node))
        value = node[tag]
        if tag in ("tensor", "parameter"):
            return self.tensor(tag, value, node)
        if len(node) != 1:
            raise self.bad(f"has a {tag!r} node with extra keys {sorted(node)}")
        if tag in ("ndarray", "npscalar"):
            arr = self.array(value)  # checks the name before it is used as a key
            key = (tag, value)
            if key not in self.built:
                arr = arr.copy()
                self.built[key] = arr if tag == "ndarray" else arr[()]
            return self.built[key]
        if tag == "float":
            if value not in ("inf", "-inf", "nan"):
                raise self.bad(f"has a float node {value!r}")
            return float(value)
        if tag == "dtype":
            try:
                return _dtype.from_name(value)
            except (TypeError, KeyError):
                raise self.bad(f"names an unknown dtype {value!r}") from None
        if tag == "bytes":
            try:
                return base64.b64decode(value, validate=True)
            except (TypeError, ValueError):
                raise self.bad("has a bytes node that is not base64") from None
        if tag not in _CONTAINER_TAGS and tag not in _MAPPING_TAGS:
            raise self.bad(f"has an unknown node type {tag!r}")
        if not isinstance(value, list):
            raise self.bad(f"has a {tag!r} node whose value is not a list")
        if tag in _CONTAINER_TAGS:
            items = [self.decode(v, depth + 1) for v in value]
            try:
                return _CONTAINER_TAGS[tag](items)
            except TypeError as e:
                raise self.bad(f"has a {tag} of unhashable items ({e})") from None
        out = _MAPPING_TAGS[tag]()
        for pair in value:
            if not isinstance(pair, list) or len(pair) != 2:
                raise self.bad(f"has a {tag} entry that is not a [key, value] pair")
            key = self.decode(pair[0], depth + 1)
            try:
                out[key] = self.decode(pair[1], depth + 1)
            except TypeError as e:
                raise self.bad(f"has a {tag} key that is unhashable ({e})") from None
        return out

    def tensor(self, tag: str, name: Any, node: dict) -> Tensor:
        if set(node) != {tag, "requires_grad"} or not isinstance(node["requires_grad"], bool):
            raise self.bad(f"has a malformed {tag} node {node!r}"[:300])
        key = ("tensor", name)
        if key in self.built:
            return self.built[key]
        arr = self.array(name)
        requires_grad = node["requires_grad"]
        if requires_grad and arr.dtype.kind != "f":
            raise self.bad(f"marks the {arr.dtype} tensor {name!r} as requiring grad")
        if tag == "parameter":
            from lucid.nn.parameter import Parameter

            t: Tensor = Parameter(Tensor._wrap(arr), requires_grad=requires_grad)
        else:
            t = Tensor._wrap(arr)
            t.requires_grad = requires_grad
        self.built[key] = t
        return t


class WeightsOnlyError(pickle.UnpicklingError, ValueError):
    """``lucid.load`` of a pickled file without ``weights_only=False``."""


def _unpickle(buf: bytes, source: str, weights_only: bool | None) -> Any:
    if weights_only is not False:
        raise WeightsOnlyError(
            f"lucid.load: {source} holds a pickled object (lucid.save of something other than "
            "tensors, state dicts and plain containers, e.g. a whole module); unpickling can run "
            "any code the file names, so it is refused by default. If you trust where the file "
            "comes from, pass weights_only=False; otherwise ask for its state_dict() saved "
            "with lucid.save, which loads safely"
        )
    digest, data = bytes(buf[8:40]), memoryview(buf)[40:]
    if len(buf) < 40 or hashlib.sha256(data).digest() != digest:
        raise _bad(source, "its pickle does not match its SHA-256 (the file is corrupted)")
    return pickle.loads(data)


def _read_bytes(f: str | os.PathLike | IO[bytes]) -> tuple[bytes, str]:
    if hasattr(f, "read"):
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("lucid.load: the file object must be opened in binary mode ('rb')")
        return bytes(data), getattr(f, "name", "the file object")
    path = os.fspath(f)
    with open(path, "rb") as fh:
        return fh.read(), repr(os.fsdecode(path))


def load(
    f: str | os.PathLike | IO[bytes],
    map_location: Any = None,
    weights_only: bool | None = None,
) -> Any:
    """Load what ``lucid.save`` saved (or any safetensors file, as a dict of tensors).

    Tensors come back with their dtype, shape, values and ``requires_grad``; parameters as
    ``nn.Parameter``; an object saved twice in one checkpoint (tied weights) comes back as one
    object. Nothing in a safetensors file is executed. A pickled file (``lucid.save`` of a whole
    module, an optimizer...) is refused with ``WeightsOnlyError`` unless ``weights_only=False``:
    unpickling runs code the file names, so pass it only for files you trust (torch >= 2.6 does
    the same). ``map_location`` may only be None or ``"cpu"``. Raises ValueError naming the
    problem for a truncated, corrupted or foreign file.
    """
    if map_location not in (None, "cpu") and str(map_location) != "cpu":
        raise ValueError(
            f"lucid.load: map_location={map_location!r} is not supported; Lucid tensors live on "
            "the CPU (use None or 'cpu')"
        )
    buf, source = _read_bytes(f)
    if bytes(buf[:8]) == PICKLE_MAGIC:
        return _unpickle(buf, source, weights_only)
    arrays, metadata = _parse(buf, source)
    structure = metadata.get(STRUCTURE_KEY)
    decoder = _Decoder(arrays, source)
    if structure is None:  # a plain safetensors file: its tensors by name, in file order
        return {name: decoder.tensor("tensor", name, {"tensor": name, "requires_grad": False})
                for name in arrays}  # fmt: skip
    try:
        tree = json.loads(structure, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise _bad(source, f"its structure is not valid JSON ({e})") from None
    return decoder.decode(tree)
