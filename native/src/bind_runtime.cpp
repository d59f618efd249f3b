// Python bindings of the program model, the CPU runtime and the executable cache.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pthread.h>
#include <structmember.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "lucid/optim.h"
#include "lucid/parallel.h"
#include "lucid/runtime.h"

namespace py = pybind11;

namespace lucid {

namespace {

// numpy's byte-order character of a dtype whose bytes are swapped relative to this machine.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr char kForeignByteOrder = '<';
#else
constexpr char kForeignByteOrder = '>';
#endif

[[noreturn]] void bad(const std::string& msg) { throw py::value_error(msg); }

AttrValue parse_attr(const std::string& name, const py::handle& v) {
  AttrValue a;
  if (py::isinstance<py::bool_>(v)) { a.kind = AttrValue::Bool; a.b = v.cast<bool>(); return a; }
  if (py::isinstance<py::int_>(v)) {
    a.kind = AttrValue::Int;
    try { a.i = v.cast<int64_t>(); } catch (const py::cast_error&) { bad("attribute '" + name + "': int out of range"); }
    return a;
  }
  if (py::isinstance<py::float_>(v)) { a.kind = AttrValue::Float; a.f = v.cast<double>(); return a; }
  if (py::isinstance<py::str>(v)) { a.kind = AttrValue::Str; a.s = v.cast<std::string>(); return a; }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
    if (seq.size() == 0) { a.kind = AttrValue::EmptyList; return a; }
    py::handle first = seq[0];
    bool is_str = py::isinstance<py::str>(first);
    bool is_float = py::isinstance<py::float_>(first);
    for (py::handle e : seq) {
      bool ok = is_str ? py::isinstance<py::str>(e)
                : is_float ? (py::isinstance<py::float_>(e) || py::isinstance<py::int_>(e))
                           : (py::isinstance<py::int_>(e) && !py::isinstance<py::bool_>(e));
      if (!ok) bad("attribute '" + name + "': list mixes element types");
      if (is_str) a.strs.push_back(e.cast<std::string>());
      else if (is_float) a.floats.push_back(e.cast<double>());
      else {
        try { a.ints.push_back(e.cast<int64_t>()); } catch (const py::cast_error&) { bad("attribute '" + name + "': int out of range"); }
      }
    }
    a.kind = is_str ? AttrValue::Strs : is_float ? AttrValue::Floats : AttrValue::Ints;
    return a;
  }
  bad("attribute '" + name + "' has unsupported type " + std::string(py::str(py::type::of(v))));
}

// What a value of the description is, for an error message: "<kind> <index><part>" ("slot 3
// shape", "instruction 7 inputs") or just "<part>" ("feeds"). Spelled out only when something
// is wrong: building the string for every slot and instruction of a valid description (thousands
// of them) cost more than the parse itself.
struct Where {
  const char* kind;  // nullptr: no kind and index
  size_t index;
  const char* part;  // "" for none
  std::string str() const {
    if (kind == nullptr) return part;
    return std::string(kind) + " " + std::to_string(index) + part;
  }
};

std::vector<int64_t> parse_ints(const py::handle& v, const Where& what) {
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v)) bad(what.str() + " must be a list of ints");
  std::vector<int64_t> out;
  for (py::handle e : py::reinterpret_borrow<py::sequence>(v)) {
    if (!py::isinstance<py::int_>(e) || py::isinstance<py::bool_>(e)) bad(what.str() + " must hold ints");
    try {
      out.push_back(e.cast<int64_t>());
    } catch (const py::cast_error&) {
      bad(what.str() + ": " + std::string(py::repr(e)) + " does not fit in 64 bits");
    }
  }
  return out;
}

std::vector<int> parse_slots(const py::handle& v, const Where& what) {
  std::vector<int> out;
  for (int64_t s : parse_ints(v, what)) {
    if (s < INT32_MIN || s > INT32_MAX) bad(what.str() + ": slot " + std::to_string(s) + " out of range");
    out.push_back(static_cast<int>(s));
  }
  return out;
}

py::sequence sequence_at(const py::dict& desc, const char* key) {
  py::object v = desc[key];
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v))
    bad(std::string("program description: '") + key + "' must be a list");
  return py::reinterpret_borrow<py::sequence>(v);
}

// The field names of the Python program model's objects (lucid/backends/cpu/program.py), as
// interned strings made once: PyObject_GetAttrString makes a new string per call.
struct FieldNames {
  py::str op{"op"}, inputs{"inputs"}, outputs{"outputs"}, attrs{"attrs"}, nodes{"nodes"},
      out_nodes{"out_nodes"}, args{"args"}, dtype{"dtype"}, shape{"shape"};
};

const FieldNames& field_names() {
  static const FieldNames* names = new FieldNames();  // never freed: outlives the interpreter's exit
  return *names;
}

// A field of one of those objects, read in place; `expected` says what the value should have
// been when it has no such field.
py::object field(const py::handle& obj, const py::str& name, const Where& where, const char* expected) {
  PyObject* v = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (v == nullptr) {
    PyErr_Clear();
    bad(where.str() + " must be " + expected + " (it has no '" + name.cast<std::string>() + "')");
  }
  return py::reinterpret_steal<py::object>(v);
}

constexpr const char* kInstrExpected = "(opcode, inputs, outputs, attrs) or an Instr";
constexpr const char* kNodeExpected = "a FusedNode";

// A fused instruction's nodes (FusedNode: op, args, dtype, attrs) as the `sub_*` attributes a
// description spells out (Program._fused_attrs), and `sub_outputs` from its out_nodes.
void fused_node_attrs(const py::handle& ins, const Where& where, Attrs* attrs) {
  AttrValue ops, args, dtypes, floats;
  ops.kind = dtypes.kind = AttrValue::Strs;
  args.kind = AttrValue::Ints;
  floats.kind = AttrValue::Floats;
  const FieldNames& f = field_names();
  py::object nodes = field(ins, f.nodes, where, kInstrExpected);
  if (!py::isinstance<py::sequence>(nodes)) bad(where.str() + ": nodes must be a sequence");
  for (py::handle node : py::reinterpret_borrow<py::sequence>(nodes)) {
    py::object op = field(node, f.op, where, kNodeExpected), dtype = field(node, f.dtype, where, kNodeExpected);
    if (!py::isinstance<py::str>(op) || !py::isinstance<py::str>(dtype))
      bad(where.str() + ": a node's op and dtype must be strings");
    ops.strs.push_back(op.cast<std::string>());
    dtypes.strs.push_back(dtype.cast<std::string>());
    for (int64_t a : parse_ints(field(node, f.args, where, kNodeExpected), Where{"instruction", where.index, " node args"}))
      args.ints.push_back(a);
    py::object node_attrs = field(node, f.attrs, where, kNodeExpected);
    if (!py::isinstance<py::dict>(node_attrs)) bad(where.str() + ": a node's attrs must be a dict");
    py::dict d = py::reinterpret_borrow<py::dict>(node_attrs);
    double eps = 0.0;
    if (d.contains("epsilon")) {
      py::handle e = d["epsilon"];
      if (!py::isinstance<py::float_>(e) && !py::isinstance<py::int_>(e))
        bad(where.str() + ": a node's epsilon must be a number");
      eps = e.cast<double>();
    }
    floats.floats.push_back(eps);
  }
  if (ops.strs.empty()) ops.kind = dtypes.kind = args.kind = floats.kind = AttrValue::EmptyList;
  else if (args.ints.empty()) args.kind = AttrValue::EmptyList;
  (*attrs)["sub_ops"] = std::move(ops);
  (*attrs)["sub_args"] = std::move(args);
  (*attrs)["sub_dtypes"] = std::move(dtypes);
  (*attrs)["sub_floats"] = std::move(floats);
  py::object out_nodes = field(ins, f.out_nodes, where, kInstrExpected);
  if (!out_nodes.is_none()) {
    AttrValue outs;
    outs.ints = parse_ints(out_nodes, Where{"instruction", where.index, " out_nodes"});
    outs.kind = outs.ints.empty() ? AttrValue::EmptyList : AttrValue::Ints;
    (*attrs)["sub_outputs"] = std::move(outs);
  }
}

// desc: {"slots": [(shape, dtype)], "instrs": [(opcode, inputs, outputs, attrs)],
//        "feeds": [slot], "results": [slot], "inplace": {result index: feed index}}
// A slot may also be an object with `shape` and `dtype` (an Aval), and an instruction the
// program model's Instr (`op`, `inputs`, `outputs`, `attrs`; a fused one's `nodes` and
// `out_nodes`): the backend hands its program over as it is, with no description built
// (one tuple per slot and instruction, and a fused instruction's node lists, all garbage once
// parsed: on a large training step that walk and its freeing were a few percent of the backend).
Program parse_program(const py::dict& desc) {
  Program p;
  for (const char* key : {"slots", "instrs", "feeds", "results"})
    if (!desc.contains(key)) bad(std::string("program description lacks '") + key + "'");
  const FieldNames& names = field_names();
  size_t i = 0;
  for (py::handle s : sequence_at(desc, "slots")) {
    const Where where{"slot", i++, ""};
    py::object shape, dtype;
    if (py::isinstance<py::tuple>(s) || py::isinstance<py::list>(s)) {
      if (py::len(s) != 2) bad(where.str() + " must be (shape, dtype)");
      py::sequence pair = py::reinterpret_borrow<py::sequence>(s);
      shape = pair[0];
      dtype = pair[1];
    } else {
      shape = field(s, names.shape, where, "(shape, dtype) or an Aval");
      dtype = field(s, names.dtype, where, "(shape, dtype) or an Aval");
    }
    Slot slot;
    slot.shape = parse_ints(shape, Where{"slot", where.index, " shape"});
    if (!py::isinstance<py::str>(dtype) || !parse_dtype(dtype.cast<std::string>(), &slot.dtype))
      bad(where.str() + ": unknown dtype " + std::string(py::repr(dtype)) + " (expected f32, f64, i32, i64, bool)");
    p.slots.push_back(slot);
  }
  i = 0;
  for (py::handle t : sequence_at(desc, "instrs")) {
    const Where where{"instruction", i++, ""};
    py::object opcode, inputs, outputs, attrs;
    bool model = false;  // the program model's Instr, not a 4-tuple
    if (py::isinstance<py::tuple>(t) || py::isinstance<py::list>(t)) {
      if (py::len(t) != 4) bad(where.str() + " must be (opcode, inputs, outputs, attrs)");
      py::sequence parts = py::reinterpret_borrow<py::sequence>(t);
      opcode = parts[0];
      inputs = parts[1];
      outputs = parts[2];
      attrs = parts[3];
    } else {
      model = true;
      opcode = field(t, names.op, where, kInstrExpected);
      inputs = field(t, names.inputs, where, kInstrExpected);
      outputs = field(t, names.outputs, where, kInstrExpected);
      attrs = field(t, names.attrs, where, kInstrExpected);
    }
    Instr in;
    if (!py::isinstance<py::str>(opcode)) bad(where.str() + ": opcode must be a string");
    std::string name = opcode.cast<std::string>();
    if (!parse_op(name, &in.op)) bad(where.str() + ": unknown opcode '" + name + "'");
    in.in = parse_slots(inputs, Where{"instruction", where.index, " inputs"});
    in.out = parse_slots(outputs, Where{"instruction", where.index, " outputs"});
    if (!py::isinstance<py::dict>(attrs)) bad(where.str() + ": attrs must be a dict");
    for (auto kv : py::reinterpret_borrow<py::dict>(attrs)) {
      if (!py::isinstance<py::str>(kv.first)) bad(where.str() + ": attribute names must be strings");
      std::string an = kv.first.cast<std::string>();
      try {
        in.attrs[an] = parse_attr(an, kv.second);
      } catch (const py::value_error& e) {
        bad(where.str() + " (" + name + "): " + e.what());
      }
    }
    if (model && name == "fused") fused_node_attrs(t, where, &in.attrs);
    p.instrs.push_back(std::move(in));
  }
  p.feeds = parse_slots(desc["feeds"], Where{nullptr, 0, "feeds"});
  p.results = parse_slots(desc["results"], Where{nullptr, 0, "results"});
  if (desc.contains("inplace")) {
    py::object inplace = desc["inplace"];
    if (!py::isinstance<py::dict>(inplace)) bad("inplace must be a dict {result index: feed index}");
    for (auto kv : inplace.cast<py::dict>()) {
      std::vector<int> pair = parse_slots(py::make_tuple(kv.first, kv.second), Where{nullptr, 0, "inplace entry"});
      p.inplace.push_back({pair[0], pair[1]});
    }
  }
  return p;
}

// The thread Python runs signal handlers on (the thread that forked, in a forked child).
std::atomic<unsigned long> g_main_thread{0};

void main_thread_is_this_one() { g_main_thread = PyThread_get_thread_ident(); }

// Lets a run on the main thread be interrupted (Ctrl-C): between steps, at most every 100 ms, it
// takes the GIL and runs pending signal handlers; an exception they raise abandons the run
// (feeds untouched) and is raised from run(). Not more often: taking the GIL from a busy Python
// thread can wait for its switch interval (5 ms).
class SignalCheck {
 public:
  bool operator()() {
    auto now = std::chrono::steady_clock::now();  // first call: after kInterruptCheckWork
    if (now < next_) return false;
    next_ = now + std::chrono::milliseconds(100);
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    raised_ = std::make_unique<py::error_already_set>();
    return true;
  }
  [[noreturn]] void rethrow() {
    if (raised_) throw *raised_;
    throw std::runtime_error("run interrupted without a Python exception");
  }

 private:
  std::chrono::steady_clock::time_point next_{};
  std::unique_ptr<py::error_already_set> raised_;
};

py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::F32: return py::dtype::of<float>();
    case DType::F64: return py::dtype::of<double>();
    case DType::I32: return py::dtype::of<int32_t>();
    case DType::I64: return py::dtype::of<int64_t>();
    case DType::Bool: return py::dtype::of<bool>();
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
  }
  return py::dtype::of<float>();
}

// Runs whose work estimate (instr_work units) is below this keep the GIL: releasing and taking
// it back costs more than such a run (workload E's 8x16x16 GEMM with bias and ReLU: ~0.1 us of
// kernels) and hands the time slice to another thread in between. Nothing a run does needs the
// GIL (kernels, worker pool and BLAS threads never take it), and a fork from Python cannot begin
// while this thread holds it, so holding it cannot deadlock the fork gate.
constexpr int64_t kKeepGilWork = int64_t(1) << 16;

// The Python face of an executable: numpy dtypes and shapes prepared once, so a run only checks
// the feeds, allocates the results and calls into C++ (with the GIL released unless it is short).
struct PyExecutable {
  std::shared_ptr<Executable> ex;
  bool cache_hit = false;
  std::vector<py::dtype> feed_dtypes, result_dtypes;
  std::vector<int> feed_type_nums;
  std::vector<std::vector<py::ssize_t>> feed_shapes, result_shapes;

  explicit PyExecutable(std::shared_ptr<Executable> e, bool hit) : ex(std::move(e)), cache_hit(hit) {
    const Program& p = ex->program();
    for (int s : p.feeds) {
      feed_dtypes.push_back(numpy_dtype(p.slots[s].dtype));
      feed_type_nums.push_back(feed_dtypes.back().num());
      feed_shapes.emplace_back(p.slots[s].shape.begin(), p.slots[s].shape.end());
    }
    for (int s : p.results) {
      result_dtypes.push_back(numpy_dtype(p.slots[s].dtype));
      result_shapes.emplace_back(p.slots[s].shape.begin(), p.slots[s].shape.end());
    }
  }

  size_t num_feeds() const { return feed_dtypes.size(); }
  size_t num_results() const { return result_dtypes.size(); }

  py::list run(const py::sequence& feeds) const { return run_timed(feeds, nullptr); }

  // Runs `repeats` times; returns (instruction index, opcode, mean seconds) per step.
  py::list profile(const py::sequence& feeds, int repeats) const {
    if (repeats < 1) bad("repeats must be >= 1");
    std::vector<double> seconds(ex->step_instrs().size(), 0.0);
    for (int r = 0; r < repeats; ++r) run_timed(feeds, &seconds);
    py::list rows;
    const Program& p = ex->program();
    for (size_t k = 0; k < seconds.size(); ++k) {
      int i = ex->step_instrs()[k];
      rows.append(py::make_tuple(i, op_name(p.instrs[i].op), seconds[k] / repeats));
    }
    return rows;
  }

  // Feed i's data after checking `h`: a numpy array of feed i's dtype (native byte order) and
  // shape, C-contiguous. Read through numpy's struct layout, no reference taken: this runs for
  // every feed of every call.
  void* feed_data(size_t i, PyObject* h) const {
    if (!py::detail::npy_api::get().PyArray_Check_(h))
      throw py::type_error("feed " + std::to_string(i) + " must be a numpy array, got " +
                           std::string(py::str(py::type::handle_of(h))));
    const auto* arr = py::detail::array_proxy(h);
    const auto* descr = py::detail::array_descriptor_proxy(arr->descr);
    if (descr->type_num != feed_type_nums[i])
      throw py::type_error("feed " + std::to_string(i) + " has dtype " +
                           std::string(py::str(py::handle(arr->descr))) + ", expected " +
                           std::string(py::str(feed_dtypes[i])));
    // A byte-swapped array has the same type number; its bytes would be read as native.
    if (descr->byteorder == kForeignByteOrder)
      bad("feed " + std::to_string(i) + " has non-native byte order (dtype " +
          std::string(py::str(py::handle(arr->descr))) +
          "); convert it with arr.astype(arr.dtype.newbyteorder('='))");
    const std::vector<py::ssize_t>& want = feed_shapes[i];
    bool shape_ok = arr->nd == static_cast<int>(want.size());
    for (int d = 0; shape_ok && d < arr->nd; ++d) shape_ok = arr->dimensions[d] == want[d];
    if (!shape_ok) {
      std::vector<py::ssize_t> got(arr->dimensions, arr->dimensions + arr->nd);
      bad("feed " + std::to_string(i) + " has shape " + std::string(py::str(py::cast(got))) +
          ", expected " + std::string(py::str(py::cast(want))));
    }
    if (!(arr->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
      bad("feed " + std::to_string(i) + " must be C-contiguous (use numpy.ascontiguousarray)");
    return arr->data;
  }

  // A new C-ordered result array j (uninitialised: the run writes all of it).
  py::object new_result(size_t j, void** data) const {
    auto& api = py::detail::npy_api::get();
    const std::vector<py::ssize_t>& shape = result_shapes[j];
    PyObject* descr = result_dtypes[j].ptr();
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    PyObject* r = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, static_cast<int>(shape.size()),
                                            shape.data(), nullptr, nullptr, 0, nullptr);
    if (!r) throw py::error_already_set();
    *data = py::detail::array_proxy(r)->data;
    return py::reinterpret_steal<py::object>(r);
  }

  // Result j: a new array, or for an in-place result the array of its feed (held[f]).
  py::object result(size_t j, const std::vector<py::object>& held, const std::vector<void*>& fptr,
                    void** data) const {
    int f = ex->inplace_feed(static_cast<int>(j));
    if (f < 0) return new_result(j, data);
    if (!py::reinterpret_borrow<py::array>(held[f]).writeable())
      bad("feed " + std::to_string(f) + " is updated in place but is read-only");
    *data = fptr[f];
    return held[f];
  }

  // Runs the executable on checked pointers; the caller holds the GIL.
  void execute(const std::vector<void*>& fptr, const std::vector<void*>& rptr,
               std::vector<double>* step_seconds) const {
    if (ex->work() < kKeepGilWork && !step_seconds) {
      ex->run(fptr, rptr);
      return;
    }
    // Runs too short to reach an interrupt check, or off the main thread, skip the checks.
    if (ex->work() < kInterruptCheckWork || PyThread_get_thread_ident() != g_main_thread) {
      py::gil_scoped_release release;
      ex->run(fptr, rptr, step_seconds);
      return;
    }
    SignalCheck signals;
    InterruptCheck check = [&signals] { return signals(); };
    try {
      py::gil_scoped_release release;
      ex->run(fptr, rptr, step_seconds, &check);
    } catch (const RunInterrupted&) {
      signals.rethrow();
    }
  }

  py::list run_timed(const py::sequence& feeds, std::vector<double>* step_seconds) const {
    const size_t nf = num_feeds();
    // A list or tuple is read in place (borrowed items); another sequence is copied once.
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(feeds.ptr(), "feeds must be a sequence"));
    if (!seq) throw py::error_already_set();
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr())) != nf)
      bad("expected " + std::to_string(nf) + " feed(s), got " +
          std::to_string(PySequence_Fast_GET_SIZE(seq.ptr())));
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    std::vector<void*> fptr(nf);
    // Held for the run: with the GIL released another thread may change `feeds`.
    std::vector<py::object> held(nf);
    for (size_t i = 0; i < nf; ++i) {
      fptr[i] = feed_data(i, items[i]);
      held[i] = py::reinterpret_borrow<py::object>(items[i]);
    }
    const size_t nr = num_results();
    std::vector<void*> rptr(nr);
    py::list out(nr);
    for (size_t j = 0; j < nr; ++j) {
      py::object r = result(j, held, fptr, &rptr[j]);
      PyList_SET_ITEM(out.ptr(), j, r.release().ptr());
    }
    execute(fptr, rptr, step_seconds);
    return out;
  }
};

// Makes the Tensors a BoundCall returns, as ``Tensor._wrap(array)`` does, without a Python call:
// a new instance of the template's class whose slots hold the template's values (lists copied,
// so every tensor gets its own ``_version`` counter) and the array in ``_data``. The template is
// ``Tensor._wrap(None)``; the slots are read from the class's member descriptors, so a slot added
// to Tensor and set by ``_wrap`` is copied too. Refuses a template holding other mutable values
// or an instance ``__dict__`` (the caller then wraps in Python).
class TensorFactory {
 public:
  TensorFactory(const py::object& tmpl, const std::string& data_slot) {
    PyTypeObject* type = Py_TYPE(tmpl.ptr());
    type_ = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(type));
    py::object mro = type_.attr("__mro__");
    for (py::handle base : mro) {
      PyTypeObject* t = reinterpret_cast<PyTypeObject*>(base.ptr());
      if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || t->tp_members == nullptr) continue;
      for (PyMemberDef* m = t->tp_members; m->name != nullptr; ++m) {
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) continue;
        PyObject* value = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(tmpl.ptr()) + m->offset);
        if (m->name == data_slot) {
          data_offset_ = m->offset;
          continue;
        }
        if (value == nullptr) continue;  // unset in the template: left unset
        bool is_list = PyList_CheckExact(value);
        if (!is_list && (PyDict_Check(value) || PySet_Check(value) || PyByteArray_Check(value) ||
                         PyList_Check(value)))
          bad(std::string("tensor template: slot '") + m->name + "' holds a mutable " +
              Py_TYPE(value)->tp_name);
        slots_.push_back({m->offset, py::reinterpret_borrow<py::object>(value), is_list});
      }
    }
    if (data_offset_ < 0) bad("tensor template: no slot named '" + data_slot + "'");
    py::object inst_dict = py::getattr(tmpl, "__dict__", py::none());
    if (!inst_dict.is_none() && py::len(inst_dict) != 0)
      bad("tensor template: instance attributes outside the slots");
    no_args_ = py::reinterpret_steal<py::object>(PyTuple_New(0));
  }

  py::object make(py::object array) const {
    PyTypeObject* type = reinterpret_cast<PyTypeObject*>(type_.ptr());
    // object.__new__(type), as Tensor._wrap starts.
    PyObject* t = PyBaseObject_Type.tp_new(type, no_args_.ptr(), nullptr);
    if (!t) throw py::error_already_set();
    py::object out = py::reinterpret_steal<py::object>(t);
    char* base = reinterpret_cast<char*>(t);
    for (const SlotValue& s : slots_) {
      PyObject* v = s.copy_list ? PyList_GetSlice(s.value.ptr(), 0, PY_SSIZE_T_MAX) : s.value.inc_ref().ptr();
      if (!v) throw py::error_already_set();
      *reinterpret_cast<PyObject**>(base + s.offset) = v;
    }
    *reinterpret_cast<PyObject**>(base + data_offset_) = array.release().ptr();
    return out;
  }

 private:
  struct SlotValue {
    Py_ssize_t offset;
    py::object value;
    bool copy_list;
  };
  py::object type_, no_args_;
  std::vector<SlotValue> slots_;
  Py_ssize_t data_offset_ = -1;
};

// One cache entry's whole call in C++ (lucid.compile's hit path): reads ``args[p]._data`` for
// each input position and ``t._data`` for each bound tensor (parameters, buffers), checks them as
// Executable.run does, runs, and wraps the results as Tensors: the Tensor itself when the model
// returns one, else a list. Only for programs without in-place results (no buffer updates).
struct BoundCall {
  py::object exe_obj;  // keeps the executable alive
  const PyExecutable* exe;
  std::vector<Py_ssize_t> positions;
  std::vector<py::object> tensors;
  TensorFactory factory;
  bool single;
  py::object data_name;
  double last_run_ms = 0.0;

  BoundCall(py::object executable, std::vector<Py_ssize_t> pos, std::vector<py::object> bound,
            const py::object& tmpl, bool one)
      : exe_obj(std::move(executable)),
        exe(exe_obj.cast<const PyExecutable*>()),
        positions(std::move(pos)),
        tensors(std::move(bound)),
        factory(tmpl, "_data"),
        single(one),
        data_name(py::reinterpret_steal<py::object>(PyUnicode_InternFromString("_data"))) {
    if (positions.size() + tensors.size() != exe->num_feeds())
      bad("BoundCall: " + std::to_string(positions.size()) + " inputs and " +
          std::to_string(tensors.size()) + " bound tensors for " + std::to_string(exe->num_feeds()) +
          " feed(s)");
    for (Py_ssize_t p : positions)
      if (p < 0) bad("BoundCall: negative argument position");
    for (size_t j = 0; j < exe->num_results(); ++j)
      if (exe->ex->inplace_feed(static_cast<int>(j)) >= 0) bad("BoundCall: the program updates a feed in place");
    if (single && exe->num_results() != 1) bad("BoundCall: one output asked, the program has " +
                                               std::to_string(exe->num_results()));
  }

  py::object call(const py::tuple& args, const py::handle&) {
    auto t0 = std::chrono::steady_clock::now();
    const size_t nf = exe->num_feeds(), npos = positions.size();
    std::vector<void*> fptr(nf);
    std::vector<py::object> held(nf);  // the _data arrays, alive for the run
    const Py_ssize_t nargs = PyTuple_GET_SIZE(args.ptr());
    for (size_t i = 0; i < nf; ++i) {
      PyObject* owner;
      if (i < npos) {
        if (positions[i] >= nargs)
          throw py::type_error("expected an argument at position " + std::to_string(positions[i]));
        owner = PyTuple_GET_ITEM(args.ptr(), positions[i]);
      } else {
        owner = tensors[i - npos].ptr();
      }
      PyObject* data = PyObject_GetAttr(owner, data_name.ptr());
      if (!data) throw py::error_already_set();
      held[i] = py::reinterpret_steal<py::object>(data);
      fptr[i] = exe->feed_data(i, data);
    }
    const size_t nr = exe->num_results();
    std::vector<void*> rptr(nr);
    std::vector<py::object> arrays(nr);
    for (size_t j = 0; j < nr; ++j) arrays[j] = exe->new_result(j, &rptr[j]);
    exe->execute(fptr, rptr, nullptr);
    py::object out;
    if (single) {
      out = factory.make(std::move(arrays[0]));
    } else {
      py::list outs(nr);
      for (size_t j = 0; j < nr; ++j) PyList_SET_ITEM(outs.ptr(), j, factory.make(std::move(arrays[j])).release().ptr());
      out = std::move(outs);
    }
    last_run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
};

// BoundCall's tp_call: a cache hit is a call of a few microseconds, and pybind11's generic
// dispatch (looking up __call__, loading each argument's caster) was a tenth of it. The common
// form, call(args) or call(args, kwargs) with a tuple, goes straight to BoundCall::call; any other
// goes through the bound __call__ (its argument errors). C++ exceptions become Python ones by
// pybind11's own translators, as in a bound method.
PyObject* bound_call_tp_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (kwargs != nullptr || n < 1 || n > 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(args, 0))) {
    PyObject* method = PyObject_GetAttrString(self, "__call__");
    if (!method) return nullptr;
    PyObject* out = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return out;
  }
  try {
    auto* call = py::cast<BoundCall*>(py::handle(self));
    return call->call(py::reinterpret_borrow<py::tuple>(PyTuple_GET_ITEM(args, 0)), py::none())
        .release()
        .ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    py::detail::try_translate_exceptions();
  }
  return nullptr;
}

py::dict stats_dict() {
  CacheStats s = cache_stats();
  py::dict d;
  d["size"] = s.size;
  d["capacity"] = s.capacity;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  ArenaStats a = arena_stats();
  d["idle_arenas"] = a.idle;
  d["idle_arena_bytes"] = a.idle_bytes;
  d["arena_budget"] = a.budget;
  d["arenas_freed"] = a.freed;
  return d;
}

}  // namespace

void init_runtime(py::module_& m) {
  g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  install_fork_handlers();
  pthread_atfork(nullptr, nullptr, main_thread_is_this_one);
  py::class_<PyExecutable>(m, "Executable", "A compiled program: run(feeds) -> list of arrays.")
      .def("run", &PyExecutable::run, py::arg("feeds"),
           "Run on a sequence of numpy arrays (C-contiguous, exact dtype and shape; not copied). "
           "Returns new arrays, or the feed array itself for an in-place result.")
      .def("profile", &PyExecutable::profile, py::arg("feeds"), py::arg("repeats") = 100,
           "Run `repeats` times timing each step; returns (instruction index, opcode, mean "
           "seconds) per non-constant instruction. In-place results are written on every run.")
      .def_property_readonly("hash", [](const PyExecutable& e) { return e.ex->hash(); },
                             "Structural hash of the program (ops, attributes, shapes, dtypes).")
      .def_property_readonly("cache_hit", [](const PyExecutable& e) { return e.cache_hit; },
                             "Whether compile() found this executable in the cache.")
      .def_property_readonly("arena_bytes", [](const PyExecutable& e) { return e.ex->arena_bytes(); },
                             "Scratch bytes of one run after buffer reuse.")
      .def_property_readonly("work", [](const PyExecutable& e) { return e.ex->work(); },
                             "The program's work estimate (about one unit per GEMM multiply-add; "
                             "at most 2^42).")
      .def_property_readonly("unplanned_bytes", [](const PyExecutable& e) { return e.ex->unplanned_bytes(); },
                             "Scratch bytes the intermediates would take without reuse.")
      .def_property_readonly("arena_offsets", [](const PyExecutable& e) { return e.ex->arena_offsets(); },
                             "Arena offset of each slot (-1 when not in the arena).")
      .def_property_readonly("direct_inplace_results",
                             [](const PyExecutable& e) { return e.ex->direct_inplace_results(); },
                             "In-place results written straight into their feed (no copy).")
      .def_property_readonly("fused_reductions",
                             [](const PyExecutable& e) { return e.ex->fused_reductions(); },
                             "Instruction indices of per-channel sums computed by the elementwise "
                             "instruction before them (its summed output is never written).")
      .def_property_readonly("num_feeds", [](const PyExecutable& e) { return e.feed_dtypes.size(); })
      .def_property_readonly("num_results", [](const PyExecutable& e) { return e.result_dtypes.size(); })
      .def("dump", [](const PyExecutable& e) { return dump(e.ex->program()); },
           "The program as readable text.")
      .def_property_readonly("update_kernels", [](const PyExecutable& e) {
            const Program& p = e.ex->program();
            std::vector<std::string> names;
            for (const Instr& in : p.instrs) names.push_back(update_kernel_name(p, in));
            return names;
          },
          "Per instruction, the optimizer update kernel that runs it in one pass ('adam', "
          "'rmsprop', 'adagrad'), "
          "or '' (the generic evaluator or another kernel).");

  py::class_<BoundCall> bound_call(m, "BoundCall",
                        "One cache entry's call (lucid.compile's hit path): call(args, kwargs=None) "
                        "reads args[p]._data for each input position and t._data for each bound "
                        "tensor, runs the executable and returns its results as Tensors (the "
                        "Tensor itself with single=True, else a list).");
  bound_call
      .def(py::init<py::object, std::vector<Py_ssize_t>, std::vector<py::object>, const py::object&, bool>(),
           py::arg("executable"), py::arg("positions"), py::arg("tensors"), py::arg("template"),
           py::arg("single"))
      .def("__call__", &BoundCall::call, py::arg("args"), py::arg("kwargs") = py::none())
      .def_readwrite("last_run_ms", &BoundCall::last_run_ms,
                     "Wall time of the last call, binding and wrapping included (ms).");
  reinterpret_cast<PyTypeObject*>(bound_call.ptr())->tp_call = bound_call_tp_call;

  m.def("compile", [](const py::dict& desc, bool use_cache) {
        Program p = parse_program(desc);
        std::shared_ptr<Executable> ex;
        bool hit = false;
        {
          py::gil_scoped_release release;
          if (use_cache) ex = cache_get_or_compile(std::move(p), &hit);
          else ex = std::make_shared<Executable>(std::move(p));
        }
        return PyExecutable(ex, hit);
      }, py::arg("program"), py::arg("cache") = true,
      "Validate and compile a program description (ValueError names what is malformed); "
      "with cache=True an equal program already compiled is reused.");
  m.def("validate", [](const py::dict& desc) { validate(parse_program(desc)); }, py::arg("program"),
        "Raise ValueError if the program description is malformed.");
  m.def("structural_hash", [](const py::dict& desc) { return fnv1a(structural_key(parse_program(desc))); },
        py::arg("program"), "The cache key's hash of a program description.");
  m.def("dump_program", [](const py::dict& desc) { return dump(parse_program(desc)); }, py::arg("program"));
  m.def("op_names", []() {
        std::vector<std::string> names;
        for (int i = 0; i < static_cast<int>(Op::kCount); ++i) names.push_back(op_name(static_cast<Op>(i)));
        return names;
      }, "Opcodes the CPU runtime implements.");
  m.def("cache_stats", &stats_dict, "Executable cache: size, capacity, hits, misses, evictions; idle scratch arenas: "
        "idle_arenas, idle_arena_bytes, arena_budget, arenas_freed.");
  m.def("cache_size", []() { return cache_stats().size; });
  m.def("cache_clear", &cache_clear, "Drop every cached executable and reset the counters.");
  m.def("cache_set_capacity", [](py::ssize_t n) {
        if (n < 0) bad("cache capacity must be >= 0");
        cache_set_capacity(static_cast<size_t>(n));
      }, py::arg("capacity"), "Change the LRU cap (evicts down to it).");
  m.def("set_fused_reductions", &set_fused_reductions, py::arg("on"),
        "Let executables compiled from now on sum an elementwise output read only by the next "
        "instruction's per-channel sum as it is computed (on unless LUCID_FUSED_REDUCTIONS=0).");
  m.def("set_arena_budget", [](py::ssize_t n) {
        if (n < 0) bad("arena budget must be >= 0 bytes");
        set_arena_budget(static_cast<size_t>(n));
      }, py::arg("bytes"),
      "Bytes of idle scratch arenas kept across runs over all executables (least recently used "
      "freed past it; the most recent is always kept).");
  m.def("set_num_threads", [](int n) {
        if (n < 1) bad("number of threads must be >= 1");
        set_configured_threads(n);
      }, py::arg("n"), "Threads the native kernels (BLAS GEMM, large elementwise ops) may use.");
  m.def("get_num_threads", &configured_threads, "The configured thread count (set_num_threads).");
  m.def("set_adaptive_threads", &set_adaptive_threads, py::arg("on"),
        "Use fewer threads while other processes keep the cores busy (on unless "
        "LUCID_ADAPTIVE_THREADS=0).");
  m.def("observe_load", [](double other_cores, int allowed_cpus) {
        if (!(other_cores >= 0) || allowed_cpus < 1) bad("other_cores must be >= 0 and allowed_cpus >= 1");
        return observe_load(other_cores, allowed_cpus);
      }, py::arg("other_cores"), py::arg("allowed_cpus"),
      "Apply the thread policy to one load observation as a sample would; returns the threads "
      "runs use now (tests, diagnosis).");
  m.def("thread_stats", []() {
        ThreadStats s = thread_stats();
        py::dict d;
        d["configured"] = s.configured;
        d["effective"] = s.effective;
        d["blas_threads"] = blas_get_threads();
        d["adaptive"] = s.adaptive;
        d["contended"] = s.contended;
        d["other_cores"] = s.other_cores;
        d["allowed_cpus"] = s.allowed_cpus;
        d["samples"] = s.samples;
        d["changes"] = s.changes;
        d["parts_run_by_caller"] = s.parts_run_by_caller;
        d["sample_seconds"] = s.sample_seconds;
        return d;
      }, "The thread policy's state: configured and effective counts, the BLAS's own count, the "
      "last estimate of other processes' load (cores, -1 before the first), sampling counters.");
}

}  // namespace lucid
