"""The MPSGraph binding and the portable runtime, built on Linux against a host-memory stand-in
for the Metal side.

`bind_mpsgraph.cpp` (program decoding, feed checks, zero-copy results, in-place write-back) and
`mpsgraph_program.cpp` (structural key, executable cache, bindings file) are plain C++: this test
compiles them with g++ together with FAKE_METAL_SIDE below, which implements the four functions
the Objective-C++ files provide (availability, compile_uncached, load, replay_selectors) for
programs of placeholders, identity and float32 addition, and checks them from Python. What
MPSGraph itself does is the Mac's to verify (tests/backends/mpsgraph/test_macos_native.py).
Slow (about half a minute of compiling), so outside the default run.
"""

import base64
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MPSGRAPH = REPO / "native" / "mpsgraph"

pytestmark = pytest.mark.slow

FAKE_METAL_SIDE = r"""
// Stand-in for mpsgraph_runtime.mm / mpsgraph_replay.mm: runs identity and float32 addition in
// host memory, so the binding and the portable runtime can be exercised on Linux.
#include <unistd.h>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "mpsgraph_native.h"

namespace lucid::mpsgraph {
void init_mpsgraph(pybind11::module_& m);

namespace {
class HostResult : public ResultBuffer {
 public:
  void* data() override { return bytes.data(); }
  std::vector<char> bytes;
};

class FakeExecutable : public Executable {
 public:
  explicit FakeExecutable(const Program& p) : program_(p), hash_(structural_hash(p)) {}
  std::vector<std::shared_ptr<ResultBuffer>> run(const std::vector<HostTensor>& feeds,
                                                 RunStats* stats) override {
    std::map<int64_t, const HostTensor*> values;
    for (size_t i = 0; i < feeds.size(); ++i) values[program_.placeholders[i].id] = &feeds[i];
    std::map<int64_t, std::shared_ptr<HostResult>> computed;
    for (const Call& call : program_.calls) {
      if (call.selector != "additionWithPrimaryTensor:secondaryTensor:name:") {
        throw std::runtime_error("fake Metal side: cannot run " + call.selector);
      }
      const HostTensor* a = values.at(call.args[0].tensor);
      const HostTensor* b = values.at(call.args[1].tensor);
      auto r = std::make_shared<HostResult>();
      r->bytes.resize(a->nbytes);
      r->nbytes = a->nbytes;
      r->shape = a->shape;
      r->dtype = a->dtype;
      auto* out = reinterpret_cast<float*>(r->bytes.data());
      for (size_t k = 0; k < a->nbytes / 4; ++k) {
        out[k] = static_cast<const float*>(a->data)[k] + static_cast<const float*>(b->data)[k];
      }
      computed[call.results[0]] = r;
    }
    std::vector<std::shared_ptr<ResultBuffer>> results;
    for (int64_t id : program_.targets) {
      if (computed.count(id)) {
        results.push_back(computed[id]);
        continue;
      }
      const HostTensor* t = values.at(id);
      auto r = std::make_shared<HostResult>();
      r->bytes.assign(static_cast<const char*>(t->data),
                      static_cast<const char*>(t->data) + t->nbytes);
      r->nbytes = t->nbytes;
      r->shape = t->shape;
      r->dtype = t->dtype;
      results.push_back(r);
    }
    // The runtime's own decision, with this machine's page size.
    for (const HostTensor& t : feeds) {
      if (stats) ++(can_wrap_without_copy(t, static_cast<size_t>(getpagesize()))
                        ? stats->wrapped_inputs : stats->copied_inputs);
    }
    return results;
  }
  void serialize(const std::string& path) override {
    std::ofstream(path) << "fake package\n";
    Bindings b;
    for (size_t i = 0; i < program_.placeholders.size(); ++i) b.feed_order.push_back(i);
    for (size_t i = 0; i < program_.targets.size(); ++i) b.result_order.push_back(i);
    write_bindings(path + kBindingsSuffix, hash_, b);
  }
  uint64_t hash() const override { return hash_; }
  const std::vector<Placeholder>& feeds() const override { return program_.placeholders; }
  size_t num_results() const override { return program_.targets.size(); }
  const std::vector<std::pair<int64_t, int64_t>>& inplace() const override {
    return program_.inplace;
  }

 private:
  Program program_;
  uint64_t hash_;
};
}  // namespace

Availability availability() { return {true, "fake Metal side"}; }
std::shared_ptr<Executable> compile_uncached(const Program& p) {
  return std::make_shared<FakeExecutable>(p);
}
std::shared_ptr<Executable> load(const std::string& path, const Program& p) {
  read_bindings(path + kBindingsSuffix, p);
  return std::make_shared<FakeExecutable>(p);
}
std::vector<std::string> replay_selectors() {
  return {"additionWithPrimaryTensor:secondaryTensor:name:"};
}
}  // namespace lucid::mpsgraph

PYBIND11_MODULE(mpsgraph_binding_check, m) {
  lucid::mpsgraph::init_mpsgraph(m);
  // The portable pieces of the Metal side, for the tests (tensor identities as integers).
  m.def("match_positions", [](const std::vector<uintptr_t>& executable,
                              const std::vector<uintptr_t>& program) {
    std::vector<const void*> e, p;
    for (uintptr_t v : executable) e.push_back(reinterpret_cast<const void*>(v));
    for (uintptr_t v : program) p.push_back(reinterpret_cast<const void*>(v));
    return lucid::mpsgraph::match_positions(e, p, "target");
  });
  m.def("lru_trace", [](size_t capacity, const std::vector<int>& keys) {
    // Looks each key up, inserting it when absent; returns which lookups hit, and the size.
    lucid::mpsgraph::BoundedLru<std::vector<int64_t>, int> lru(capacity);
    std::vector<bool> hits;
    for (int k : keys) {
      std::vector<int64_t> key{k, -k};
      hits.push_back(lru.find(key) != nullptr);
      if (!hits.back()) lru.put(key, k);
    }
    return std::make_pair(hits, lru.size());
  });
}
"""

F32 = "MPSDataTypeFloat32"
ADD = "additionWithPrimaryTensor:secondaryTensor:name:"


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    try:
        import pybind11
    except ImportError:
        pytest.skip("needs pybind11's headers (pip install pybind11)")
    folder = tmp_path_factory.mktemp("mpsgraph_binding")
    fake = folder / "fake_metal_side.cpp"
    fake.write_text(FAKE_METAL_SIDE)
    target = folder / f"mpsgraph_binding_check{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [
        os.environ.get("CXX", "g++"), "-std=c++17", "-O0", "-shared", "-fPIC", "-Wall", "-Werror",
        "-I", pybind11.get_include(), "-I", sysconfig.get_paths()["include"], "-I", str(MPSGRAPH),
        str(MPSGRAPH / "bind_mpsgraph.cpp"), str(MPSGRAPH / "mpsgraph_program.cpp"), str(fake),
        "-o", str(target),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sys.path.insert(0, str(folder))
    try:
        import mpsgraph_binding_check
    finally:
        sys.path.remove(str(folder))
    mpsgraph_binding_check.folder = folder
    return mpsgraph_binding_check


def program(placeholders, calls=(), targets=(0,), inplace=()):
    return {
        "format": "lucid.mpsgraph/v1",
        "placeholders": [
            {"id": i, "shape": list(shape), "dtype": dtype, "role": f"input:{i}"}
            for i, (shape, dtype) in enumerate(placeholders)
        ],
        "calls": list(calls),
        "targets": list(targets),
        "inplace": [list(p) for p in inplace],
    }


def add_call(a, b, result):
    return {"selector": ADD, "args": [{"tensor": a}, {"tensor": b}, {"nil": True}],
            "results": [result]}  # fmt: skip


def every_kind_call():
    data = np.arange(3, dtype=np.float32)
    return {
        "selector": "anything:",
        "args": [
            {"tensor": 0}, {"tensors": [0, 0]}, {"int": -3}, {"double": 0.5},
            {"double": "inf"}, {"double": "-inf"}, {"double": "nan"}, {"bool": True},
            {"shape": [-1, 3]}, {"ints": [0, 1]}, {"dtype": "MPSDataTypeInt32"},
            {"enum": "MPSGraphPaddingModeConstant", "value": 0},
            {"descriptor": "MPSGraphPooling2DOpDescriptor",
             "fields": {"kernelWidth": 2, "paddingStyle": "MPSGraphPaddingStyleExplicit",
                        "ceilMode": False}},
            {"constant": {"data_b64": base64.b64encode(data.tobytes()).decode(),
                          "shape": [3], "dtype": F32}},
            {"nil": True},
        ],
        "results": [1],
    }  # fmt: skip


def test_available_and_replay_selectors_come_from_the_metal_side(native):
    assert native.mpsgraph_available() == (True, "fake Metal side")
    assert native.mpsgraph_replay_selectors() == [ADD]


def test_every_argument_kind_decodes(native):
    prog = program([((2, 3), F32)], [every_kind_call()], targets=[0])
    assert isinstance(native.mpsgraph_structural_hash(prog), int)
    assert native.mpsgraph_compile(prog, False).num_feeds == 1


@pytest.mark.parametrize(
    "arg, message",
    [
        ({"double": "infinity"}, "must be inf, -inf or nan"),
        ({"int": True}, "expected an int"),
        ({"int": 1.5}, "expected an int"),
        ({"tensorz": 0}, "unknown argument kind"),
        ({"tensor": 0, "int": 1}, "unexpected keys"),
        ({"enum": "MPSGraphPaddingModeConstant"}, "unexpected keys"),
        ({"dtype": "MPSDataTypeFloat64"}, "unknown MPSDataType 'MPSDataTypeFloat64'"),
        ({"constant": {"data_b64": "*", "shape": [1], "dtype": F32}}, "not valid base64"),
        ({"descriptor": "D", "fields": {"x": [1]}}, "expected a bool, int, float"),
        ("tensor", "an argument must be a dict"),
    ],
)
def test_a_malformed_argument_is_a_value_error_naming_it(native, arg, message):
    call = {"selector": ADD, "args": [arg], "results": [1]}
    with pytest.raises(ValueError, match=message) as info:
        native.mpsgraph_compile(program([((2,), F32)], [call]), False)
    assert "calls[0]" in str(info.value) and ADD in str(info.value)


def test_a_program_of_another_format_is_refused(native):
    prog = program([((2,), F32)])
    prog["format"] = "lucid.mpsgraph/v0"
    with pytest.raises(ValueError, match="'lucid.mpsgraph/v0' is not lucid.mpsgraph/v1"):
        native.mpsgraph_compile(prog, False)
    del prog["format"]
    with pytest.raises(ValueError, match="missing key 'format'"):
        native.mpsgraph_compile(prog, False)


def test_the_structural_hash_sees_every_value_but_not_labels(native):
    base = program([((2, 3), F32)], [every_kind_call()])
    h = native.mpsgraph_structural_hash(base)
    relabelled = program([((2, 3), F32)], [every_kind_call()])
    relabelled["placeholders"][0]["role"] = "param:w"
    relabelled["checks"] = [0]
    assert native.mpsgraph_structural_hash(relabelled) == h
    nudged = program([((2, 3), F32)], [every_kind_call()])
    nudged["calls"][0]["args"][3] = {"double": float(np.nextafter(0.5, 1.0))}
    assert native.mpsgraph_structural_hash(nudged) != h
    other_constant = program([((2, 3), F32)], [every_kind_call()])
    data = base64.b64encode(np.float32([0, 1, 3]).tobytes()).decode()
    other_constant["calls"][0]["args"][13]["constant"]["data_b64"] = data
    assert native.mpsgraph_structural_hash(other_constant) != h
    assert native.mpsgraph_structural_hash(program([((2, 4), F32)], [every_kind_call()])) != h


def test_run_binds_feeds_and_returns_results(native):
    exe = native.mpsgraph_compile(program([((-1, 3), F32)] * 2, [add_call(0, 1, 2)], [2, 0]))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.ones((2, 3), np.float32)
    total, same = exe.run([x, y])
    np.testing.assert_array_equal(total, x + 1)
    np.testing.assert_array_equal(same, x)
    # -1 takes any size; a non-contiguous feed is made contiguous first.
    wide = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    total, _ = exe.run([wide, np.zeros((4, 3), np.float32)])
    np.testing.assert_array_equal(total, wide)
    del exe
    assert total.sum() == wide.sum()  # results own their memory beyond the executable


@pytest.mark.parametrize(
    "feeds, error, message",
    [
        ([np.zeros((2, 3), np.float64)], TypeError, "has dtype float64, the program expects float"),
        ([np.zeros((3, 2), np.float32)], ValueError, r"has shape \(3, 2\), the program expects"),
        ([[[0.0] * 3] * 2], TypeError, "feed 0 is not a numpy array"),
        ([], ValueError, "takes 1 feeds, got 0"),
    ],
)  # fmt: skip
def test_bad_feeds_are_refused(native, feeds, error, message):
    exe = native.mpsgraph_compile(program([((2, 3), F32)]))
    with pytest.raises(error, match=message):
        exe.run(feeds)


def test_in_place_results_are_written_back_after_the_run(native):
    exe = native.mpsgraph_compile(program([((3,), F32)] * 2, [add_call(0, 1, 2)], [2], [(0, 1)]))
    x = np.float32([1, 2, 3])
    acc = np.float32([10, 20, 30])
    (result,) = exe.run([x, acc])
    np.testing.assert_array_equal(acc, [11, 22, 33])
    np.testing.assert_array_equal(result, acc)
    strided = np.zeros(6, np.float32)[::2]
    exe.run([x, strided])
    np.testing.assert_array_equal(strided, x)
    frozen = np.float32([5, 5, 5])
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="feed 1 is written in place but its array is read-only"):
        exe.run([x, frozen])
    np.testing.assert_array_equal(frozen, [5, 5, 5])


def test_a_failed_run_writes_nothing_back(native):
    calls = [{"selector": "unknownWithTensor:name:", "args": [{"tensor": 0}, {"nil": True}],
              "results": [2]}]  # fmt: skip
    exe = native.mpsgraph_compile(program([((3,), F32)] * 2, calls, [0], [(0, 1)]))
    acc = np.float32([7, 7, 7])
    with pytest.raises(RuntimeError, match="cannot run unknownWithTensor:name:"):
        exe.run([np.float32([1, 2, 3]), acc])
    np.testing.assert_array_equal(acc, [7, 7, 7])


def test_the_cache_hits_evicts_and_can_be_bypassed(native):
    native.mpsgraph_cache_clear()
    native.mpsgraph_cache_set_capacity(2)
    progs = [program([((n,), F32)]) for n in (1, 2, 3)]
    first = native.mpsgraph_compile(progs[0], True)
    again = native.mpsgraph_compile(progs[0], True)
    assert not first.cache_hit and again.cache_hit and again.hash == first.hash
    native.mpsgraph_compile(progs[1], True)
    native.mpsgraph_compile(progs[2], True)  # evicts progs[0], the least recently used
    assert native.mpsgraph_cache_stats() == {
        "size": 2, "capacity": 2, "hits": 1, "misses": 3, "evictions": 1,
    }  # fmt: skip
    assert not native.mpsgraph_compile(progs[0], True).cache_hit
    assert not native.mpsgraph_compile(progs[1], False).cache_hit
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        native.mpsgraph_cache_set_capacity(-1)
    native.mpsgraph_cache_set_capacity(32)


def test_the_cache_capacity_comes_from_lucid_compile_max_cache(native):
    script = "import mpsgraph_binding_check as m; print(m.mpsgraph_cache_stats()['capacity'])"
    env = {**os.environ, "LUCID_COMPILE_MAX_CACHE": "5", "PYTHONPATH": str(native.folder)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "5", out.stderr


def test_serialize_and_load_check_the_program(native, tmp_path):
    prog = program([((3,), F32)] * 2, [add_call(0, 1, 2)], [2])
    path = str(tmp_path / "add.mpsgraphpackage")
    native.mpsgraph_compile(prog).serialize(path)
    bindings = Path(path + ".lucid-bindings").read_text().splitlines()
    assert bindings[0] == "lucid.mpsgraph.bindings/v1"
    assert bindings[1] == str(native.mpsgraph_structural_hash(prog))
    loaded = native.mpsgraph_load(path, prog)
    (total,) = loaded.run([np.float32([1, 2, 3]), np.float32([1, 1, 1])])
    np.testing.assert_array_equal(total, [2, 3, 4])
    with pytest.raises(RuntimeError, match="compiled from a different program"):
        native.mpsgraph_load(path, program([((4,), F32)] * 2, [add_call(0, 1, 2)], [2]))
    Path(path + ".lucid-bindings").write_text("\n".join([*bindings[:2], "0 0", "0"]) + "\n")
    with pytest.raises(RuntimeError, match="the feed order does not match the program"):
        native.mpsgraph_load(path, prog)
    with pytest.raises(RuntimeError, match="no bindings file"):
        native.mpsgraph_load(str(tmp_path / "missing.mpsgraphpackage"), prog)


# --- issue 24: the portable half of the Mac's first run ----------------------------------------
def test_1_targets_match_by_identity_and_every_slot_is_filled(native):
    assert native.match_positions([30, 10, 20], [10, 20, 30]) == [2, 0, 1]
    # MPSGraph listing a target twice, merging two, or naming a tensor it was not given.
    with pytest.raises(RuntimeError, match="lists target 0 twice"):
        native.match_positions([10, 10], [10, 20])
    with pytest.raises(RuntimeError, match="has 1 target tensors, the program 2"):
        native.match_positions([10], [10, 20])
    with pytest.raises(RuntimeError, match="did not create"):
        native.match_positions([99, 10], [10, 20])
    with pytest.raises(RuntimeError, match="names target 0 twice"):
        native.match_positions([10, 10], [10, 10])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.update(targets=[2, 2]), "target 2 is named twice"),
        (lambda p: p.update(targets=[7]), "target 7 is never defined"),
        (lambda p: p.update(targets=[]), "the program has no targets"),
        (lambda p: p["placeholders"][0].update(shape=[]), "rank 0"),
        (lambda p: p["placeholders"][0].update(shape=[0, 3]), "a dimension 0"),
    ],
)  # fmt: skip
def test_6_what_mpsgraph_would_abort_on_is_refused_before_compiling(native, change, message):
    prog = program([((3,), F32)] * 2, [add_call(0, 1, 2)], [2])
    change(prog)
    with pytest.raises(ValueError, match=message):
        native.mpsgraph_compile(prog, False)


def test_5_packages_must_be_named_mpsgraphpackage(native, tmp_path):
    exe = native.mpsgraph_compile(program([((3,), F32)]))
    for bad in ("plain", "x.mpsgraph", ".mpsgraphpackage"):
        with pytest.raises(ValueError, match=r"must end in \.mpsgraphpackage"):
            exe.serialize(str(tmp_path / bad))
        with pytest.raises(ValueError, match=r"must end in \.mpsgraphpackage"):
            native.mpsgraph_load(str(tmp_path / bad), program([((3,), F32)]))


def test_12_copy_free_binding_needs_page_aligned_writable_memory(native, tmp_path):
    page = os.sysconf("SC_PAGE_SIZE")
    exe = native.mpsgraph_compile(program([((-1,), F32)]))

    def aligned(n):
        raw = np.zeros(n + page // 4, np.float32)
        start = (-raw.ctypes.data % page) // 4
        return raw[start : start + n]

    def stats(feed):
        (out,) = exe.run([feed])
        np.testing.assert_array_equal(out, feed)
        return exe.last_run_stats["wrapped_inputs"], exe.last_run_stats["copied_inputs"]

    whole = aligned(3 * page // 4)
    assert stats(whole) == (1, 0)
    assert stats(aligned(1)) == (1, 0)  # one element, page-aligned: wrapped, length rounded up
    assert stats(whole[1:]) == (0, 1)  # a view off the page boundary is copied
    frozen = aligned(8)
    frozen.flags.writeable = False
    assert stats(frozen) == (0, 1)  # read-only memory is never wrapped
    mapped = np.memmap(tmp_path / "feed.bin", np.float32, mode="w+", shape=(page,))
    mapped[:] = 1.5
    assert stats(mapped) == (1, 0)  # a file mapping starts on a page
    readonly_map = np.memmap(tmp_path / "feed.bin", np.float32, mode="r", shape=(page,))
    assert stats(readonly_map) == (0, 1)


def test_13_per_shape_result_types_are_a_bounded_lru(native):
    hits, size = native.lru_trace(2, [1, 2, 1, 3, 2, 1])
    # 1, 2 miss; 1 hits (now most recent); 3 evicts 2; 2 misses (evicts 1); 1 misses.
    assert hits == [False, False, True, False, False, False] and size == 2
    _, size = native.lru_trace(64, list(range(1000)))
    assert size == 64


@pytest.mark.parametrize("mps, dtype", [("MPSDataTypeFloat16", np.float16),
                                        ("MPSDataTypeBFloat16", "bfloat16")])  # fmt: skip
def test_half_feeds_and_results_pass_as_they_are_and_copy_free(native, mps, dtype):
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    page = os.sysconf("SC_PAGE_SIZE")
    exe = native.mpsgraph_compile(program([((-1,), mps)]))
    raw = np.zeros(page, dtype)
    start = (-raw.ctypes.data % page) // 2
    feed = raw[start : start + 100]
    feed[:] = np.linspace(-3, 3, 100).astype(dtype)
    (out,) = exe.run([feed])
    # The same bits back in the same type: no conversion through float32 on either side.
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.view(np.uint16), feed.view(np.uint16))
    assert exe.last_run_stats["wrapped_inputs"] == 1 and exe.last_run_stats["copied_inputs"] == 0
    with pytest.raises(TypeError, match=f"has dtype float32, the program expects {dtype}"):
        exe.run([feed.astype(np.float32)])
