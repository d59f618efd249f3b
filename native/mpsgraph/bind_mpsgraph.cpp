// Python bindings of the native MPSGraph backend (macOS only): converts the recorded program
// (Python dicts and lists, format "lucid.mpsgraph/v1", documented in lucid/backends/mpsgraph)
// into the plain structs of mpsgraph_native.h, and numpy arrays into host tensors. The
// Objective-C++ side never sees a Python object.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mpsgraph_native.h"

namespace py = pybind11;

namespace lucid::mpsgraph {
namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw py::value_error("MPSGraph program: " + where + ": " + what);
}

int64_t to_int(const py::handle& value, const std::string& where) {
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
    bad(where, "expected an int, got " + std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  return value.cast<int64_t>();
}

std::vector<int64_t> to_ints(const py::handle& value, const std::string& where) {
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
    bad(where, "expected a list of ints");
  }
  std::vector<int64_t> out;
  size_t i = 0;
  for (const py::handle& item : value) out.push_back(to_int(item, where + "[" + std::to_string(i++) + "]"));
  return out;
}

std::string to_str(const py::handle& value, const std::string& where) {
  if (!py::isinstance<py::str>(value)) bad(where, "expected a string");
  return value.cast<std::string>();
}

// A dtype name the backend knows, or a ValueError saying where the unknown one is.
std::string to_dtype(const py::handle& value, const std::string& where) {
  std::string name = to_str(value, where);
  try {
    dtype_size(name);
  } catch (const std::invalid_argument& e) {
    bad(where, e.what());
  }
  return name;
}

py::object get(const py::dict& d, const char* key, const std::string& where) {
  if (!d.contains(key)) bad(where, std::string("missing key '") + key + "'");
  return d[key];
}

Arg parse_arg(const py::handle& value, const std::string& where);

// A descriptor field: a bool, an int, an enum constant's name, or an encoded argument.
Arg parse_field_value(const py::handle& value, const std::string& where) {
  Arg arg;
  if (py::isinstance<py::str>(value)) {
    arg.kind = ArgKind::Enum;
    arg.name = value.cast<std::string>();
    arg.integer = -1;  // resolved by name on the native side
  } else if (py::isinstance<py::bool_>(value)) {
    arg.kind = ArgKind::Bool;
    arg.integer = value.cast<bool>() ? 1 : 0;
  } else if (py::isinstance<py::int_>(value)) {
    arg.kind = ArgKind::Int;
    arg.integer = value.cast<int64_t>();
  } else if (py::isinstance<py::float_>(value)) {
    arg.kind = ArgKind::Double;
    arg.real = value.cast<double>();
  } else if (py::isinstance<py::dict>(value)) {
    arg = parse_arg(value, where);
    if (arg.kind != ArgKind::Int && arg.kind != ArgKind::Double && arg.kind != ArgKind::Bool &&
        arg.kind != ArgKind::Enum && arg.kind != ArgKind::DType) {
      bad(where, std::string("a descriptor field cannot be a ") + arg_kind_name(arg.kind));
    }
  } else {
    bad(where, "expected a bool, int, float, enum constant name or an encoded argument");
  }
  return arg;
}

// One argument, encoded as a single-key object (the enum kind adds "value", the descriptor kind
// "fields").
Arg parse_arg(const py::handle& value, const std::string& where) {
  if (!py::isinstance<py::dict>(value)) bad(where, "an argument must be a dict");
  py::dict d = py::reinterpret_borrow<py::dict>(value);
  Arg arg;
  auto only = [&](std::initializer_list<const char*> keys) {
    if (d.size() != keys.size()) {
      std::string names;
      for (const auto& item : d) names += std::string(py::str(item.first)) + " ";
      bad(where, "unexpected keys in argument: " + names);
    }
    for (const char* key : keys) get(d, key, where);
  };
  if (d.contains("tensor")) {
    only({"tensor"});
    arg.kind = ArgKind::Tensor;
    arg.tensor = to_int(d["tensor"], where + ".tensor");
  } else if (d.contains("tensors")) {
    only({"tensors"});
    arg.kind = ArgKind::Tensors;
    arg.ids = to_ints(d["tensors"], where + ".tensors");
  } else if (d.contains("int")) {
    only({"int"});
    arg.kind = ArgKind::Int;
    arg.integer = to_int(d["int"], where + ".int");
  } else if (d.contains("double")) {
    only({"double"});
    py::handle v = d["double"];
    arg.kind = ArgKind::Double;
    if (py::isinstance<py::str>(v)) {  // JSON has no infinity or NaN: they are spelled out
      std::string text = v.cast<std::string>();
      if (text == "inf") {
        arg.real = std::numeric_limits<double>::infinity();
      } else if (text == "-inf") {
        arg.real = -std::numeric_limits<double>::infinity();
      } else if (text == "nan") {
        arg.real = std::numeric_limits<double>::quiet_NaN();
      } else {
        bad(where, "a double string must be inf, -inf or nan, got '" + text + "'");
      }
    } else if (py::isinstance<py::float_>(v) ||
               (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v))) {
      arg.real = v.cast<double>();
    } else {
      bad(where, "expected a number");
    }
  } else if (d.contains("bool")) {
    only({"bool"});
    if (!py::isinstance<py::bool_>(d["bool"])) bad(where, "expected a bool");
    arg.kind = ArgKind::Bool;
    arg.integer = d["bool"].cast<bool>() ? 1 : 0;
  } else if (d.contains("shape")) {
    only({"shape"});
    arg.kind = ArgKind::Shape;
    arg.ints = to_ints(d["shape"], where + ".shape");
  } else if (d.contains("ints")) {
    only({"ints"});
    arg.kind = ArgKind::Ints;
    arg.ints = to_ints(d["ints"], where + ".ints");
  } else if (d.contains("dtype")) {
    only({"dtype"});
    arg.kind = ArgKind::DType;
    arg.name = to_dtype(d["dtype"], where + ".dtype");
  } else if (d.contains("enum")) {
    only({"enum", "value"});
    arg.kind = ArgKind::Enum;
    arg.name = to_str(d["enum"], where + ".enum");
    arg.integer = to_int(d["value"], where + ".value");
  } else if (d.contains("descriptor")) {
    only({"descriptor", "fields"});
    arg.kind = ArgKind::Descriptor;
    arg.name = to_str(d["descriptor"], where + ".descriptor");
    py::handle fields = d["fields"];
    if (!py::isinstance<py::dict>(fields)) bad(where, "descriptor fields must be a dict");
    for (const auto& item : py::reinterpret_borrow<py::dict>(fields)) {
      std::string name = to_str(item.first, where + ".fields");
      arg.fields.push_back({name, parse_field_value(item.second, where + "." + name)});
    }
  } else if (d.contains("constant")) {
    only({"constant"});
    py::handle c = d["constant"];
    if (!py::isinstance<py::dict>(c)) bad(where, "constant must be a dict");
    py::dict cd = py::reinterpret_borrow<py::dict>(c);
    arg.kind = ArgKind::Constant;
    arg.ints = to_ints(get(cd, "shape", where), where + ".constant.shape");
    arg.name = to_dtype(get(cd, "dtype", where), where + ".constant.dtype");
    std::string b64 = to_str(get(cd, "data_b64", where), where + ".constant.data_b64");
    py::bytes raw;
    try {
      raw = py::module_::import("base64").attr("b64decode")(b64, py::arg("validate") = true);
    } catch (const py::error_already_set& e) {
      bad(where, std::string("constant data is not valid base64: ") + e.what());
    }
    arg.bytes = std::string(raw);
  } else if (d.contains("nil")) {
    only({"nil"});
    arg.kind = ArgKind::NilObject;
  } else {
    std::string names;
    for (const auto& item : d) names += std::string(py::str(item.first)) + " ";
    bad(where, "unknown argument kind (keys: " + names + ")");
  }
  return arg;
}

Program parse_program(const py::dict& desc) {
  Program program;
  std::string format = to_str(get(desc, "format", "program"), "program.format");
  if (format != kProgramFormat) {
    bad("program.format", "'" + format + "' is not " + kProgramFormat);
  }
  size_t i = 0;
  for (const py::handle& item : get(desc, "placeholders", "program")) {
    std::string where = "placeholders[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(item)) bad(where, "expected a dict");
    py::dict p = py::reinterpret_borrow<py::dict>(item);
    Placeholder ph;
    ph.id = to_int(get(p, "id", where), where + ".id");
    ph.shape = to_ints(get(p, "shape", where), where + ".shape");
    ph.dtype = to_dtype(get(p, "dtype", where), where + ".dtype");
    if (p.contains("role")) ph.role = to_str(p["role"], where + ".role");
    program.placeholders.push_back(std::move(ph));
  }
  i = 0;
  for (const py::handle& item : get(desc, "calls", "program")) {
    std::string where = "calls[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(item)) bad(where, "expected a dict");
    py::dict c = py::reinterpret_borrow<py::dict>(item);
    Call call;
    call.selector = to_str(get(c, "selector", where), where + ".selector");
    where += " (" + call.selector + ")";
    size_t a = 0;
    for (const py::handle& arg : get(c, "args", where)) {
      call.args.push_back(parse_arg(arg, where + ".args[" + std::to_string(a++) + "]"));
    }
    call.results = to_ints(get(c, "results", where), where + ".results");
    program.calls.push_back(std::move(call));
  }
  program.targets = to_ints(get(desc, "targets", "program"), "program.targets");
  if (desc.contains("inplace")) {
    i = 0;
    for (const py::handle& pair : desc["inplace"]) {
      std::vector<int64_t> rf = to_ints(pair, "inplace[" + std::to_string(i++) + "]");
      if (rf.size() != 2) bad("inplace", "each entry is [result index, feed index]");
      program.inplace.emplace_back(rf[0], rf[1]);
    }
  }
  return program;
}

py::dtype numpy_dtype(const std::string& mps) {
  static const std::pair<const char*, const char*> table[] = {
      {"MPSDataTypeFloat32", "float32"}, {"MPSDataTypeFloat16", "float16"},
      {"MPSDataTypeInt8", "int8"},       {"MPSDataTypeInt16", "int16"},
      {"MPSDataTypeInt32", "int32"},     {"MPSDataTypeInt64", "int64"},
      {"MPSDataTypeUInt8", "uint8"},     {"MPSDataTypeUInt16", "uint16"},
      {"MPSDataTypeUInt32", "uint32"},   {"MPSDataTypeUInt64", "uint64"},
      {"MPSDataTypeBool", "bool"},
  };
  for (const auto& [name, np] : table) {
    if (mps == name) return py::dtype(np);
  }
  if (mps == "MPSDataTypeBFloat16") {
    // numpy has no bfloat16: ml_dtypes' (a dependency of Lucid) has the same 2-byte layout as
    // MPSDataTypeBFloat16, so feeds and results pass as they are, copy-free like float32. Built
    // once and never freed: a static py::object would be destroyed after the interpreter.
    static py::dtype* bfloat16 = new py::dtype(
        py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16")));
    return *bfloat16;
  }
  throw py::type_error(mps + " has no numpy counterpart for feeds and results");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

struct PyExecutable {
  std::shared_ptr<Executable> executable;
  bool cache_hit = false;
  RunStats last_stats;

  py::list run(const py::list& feed_list) {
    const std::vector<Placeholder>& specs = executable->feeds();
    if (feed_list.size() != specs.size()) {
      throw py::value_error("MPSGraph executable takes " + std::to_string(specs.size()) +
                            " feeds, got " + std::to_string(feed_list.size()));
    }
    std::vector<py::array> originals, bound;  // bound keeps copies alive through the run
    std::vector<HostTensor> feeds;
    for (size_t i = 0; i < specs.size(); ++i) {
      py::handle item = feed_list[i];
      if (!py::isinstance<py::array>(item)) {
        throw py::type_error("feed " + std::to_string(i) + " is not a numpy array");
      }
      py::array array = py::reinterpret_borrow<py::array>(item);
      py::dtype want = numpy_dtype(specs[i].dtype);
      if (!array.dtype().is(want) && !array.dtype().equal(want)) {
        throw py::type_error("feed " + std::to_string(i) + " (" + specs[i].role + ") has dtype " +
                             std::string(py::str(array.dtype())) + ", the program expects " +
                             std::string(py::str(want)));
      }
      std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
      bool shape_ok = shape.size() == specs[i].shape.size();
      for (size_t d = 0; shape_ok && d < shape.size(); ++d) {
        shape_ok = specs[i].shape[d] < 0 || specs[i].shape[d] == shape[d];
      }
      if (!shape_ok) {
        throw py::value_error("feed " + std::to_string(i) + " (" + specs[i].role + ") has shape " +
                              shape_text(shape) + ", the program expects " +
                              shape_text(specs[i].shape));
      }
      originals.push_back(array);
      bool contiguous = (array.flags() & py::array::c_style) != 0;
      py::array data =
          contiguous ? array
                     : py::module_::import("numpy").attr("ascontiguousarray")(array).cast<py::array>();
      HostTensor t;
      t.data = const_cast<void*>(data.data());
      t.nbytes = static_cast<size_t>(data.nbytes());
      t.shape = std::move(shape);
      t.dtype = specs[i].dtype;
      t.writable = data.writeable();
      bound.push_back(data);
      feeds.push_back(std::move(t));
    }
    for (const auto& [result, feed] : executable->inplace()) {
      if (!originals[static_cast<size_t>(feed)].writeable()) {
        throw py::value_error("feed " + std::to_string(feed) +
                              " is written in place but its array is read-only");
      }
      (void)result;
    }

    std::vector<std::shared_ptr<ResultBuffer>> results;
    RunStats stats;
    {
      py::gil_scoped_release release;
      results = executable->run(feeds, &stats);
    }
    last_stats = stats;

    py::list out;
    for (size_t i = 0; i < results.size(); ++i) {
      const std::shared_ptr<ResultBuffer>& r = results[i];
      if (!r) {  // never dereference an empty slot (a target MPSGraph merged or dropped)
        throw std::runtime_error("MPSGraph result " + std::to_string(i) + " was not produced");
      }
      auto* owner = new std::shared_ptr<ResultBuffer>(r);
      py::capsule keep_alive(owner, [](void* p) { delete static_cast<std::shared_ptr<ResultBuffer>*>(p); });
      std::vector<py::ssize_t> shape(r->shape.begin(), r->shape.end());
      out.append(py::array(numpy_dtype(r->dtype), shape, r->data(), keep_alive));
    }
    // In-place results go back into their feeds only now, after the whole run succeeded; all
    // pairs are checked before any is written, so a mismatch leaves every feed untouched.
    for (const auto& [result, feed] : executable->inplace()) {
      py::array target = originals[static_cast<size_t>(feed)];
      py::array value = out[static_cast<size_t>(result)].cast<py::array>();
      std::vector<int64_t> ts(target.shape(), target.shape() + target.ndim());
      std::vector<int64_t> vs(value.shape(), value.shape() + value.ndim());
      if (ts != vs) {
        throw py::value_error("in-place result " + std::to_string(result) + " has shape " +
                              shape_text(vs) + ", its feed " + std::to_string(feed) + " " +
                              shape_text(ts) + "; no feed was written");
      }
    }
    py::object copyto = py::module_::import("numpy").attr("copyto");
    for (const auto& [result, feed] : executable->inplace()) {
      py::array target = originals[static_cast<size_t>(feed)];
      py::array value = out[static_cast<size_t>(result)].cast<py::array>();
      if ((target.flags() & py::array::c_style) && target.nbytes() == value.nbytes()) {
        std::memcpy(target.mutable_data(), value.data(), static_cast<size_t>(value.nbytes()));
      } else {
        copyto(target, value);
      }
    }
    return out;
  }
};

py::dict stats_dict(const CacheStats& s) {
  py::dict d;
  d["size"] = s.size;
  d["capacity"] = s.capacity;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  return d;
}

}  // namespace

void init_mpsgraph(py::module_& m) {
  py::class_<PyExecutable>(m, "MPSGraphExecutable",
                           "A compiled MPSGraph program (an MPSGraphExecutable and its bindings).")
      .def("run", &PyExecutable::run, py::arg("feeds"),
           "Runs on the GPU: feeds in program order (numpy arrays of the program's dtypes), "
           "results in target order; in-place results are written into their feeds afterwards.")
      .def("serialize", [](PyExecutable& e, const std::string& path) {
             check_package_path(path);
             py::gil_scoped_release release;
             e.executable->serialize(path);
           }, py::arg("path"),
           "Writes an .mpsgraphpackage at path (and path + '.lucid-bindings' beside it).")
      .def_property_readonly("hash", [](const PyExecutable& e) { return e.executable->hash(); },
                             "Structural hash of the program it was compiled from.")
      .def_property_readonly("cache_hit", [](const PyExecutable& e) { return e.cache_hit; },
                             "Whether mpsgraph_compile found it in the cache.")
      .def_property_readonly("num_feeds", [](const PyExecutable& e) {
        return e.executable->feeds().size();
      })
      .def_property_readonly("num_results", [](const PyExecutable& e) {
        return e.executable->num_results();
      })
      .def_property_readonly("last_run_stats", [](const PyExecutable& e) {
        py::dict d;
        d["wrapped_inputs"] = e.last_stats.wrapped_inputs;
        d["copied_inputs"] = e.last_stats.copied_inputs;
        return d;
      }, "How the last run bound its feeds: copy-free (page-aligned) or through one copy.");

  m.def("mpsgraph_available", []() {
    Availability a = availability();
    return py::make_tuple(a.available, a.reason);
  }, "(available, reason): a Metal device is present and macOS is 14.0 or later.");
  m.def("mpsgraph_compile", [](const py::dict& program, bool cache) {
    Program p = parse_program(program);
    PyExecutable out;
    {
      py::gil_scoped_release release;
      out.executable = compile(p, cache, &out.cache_hit);
    }
    return out;
  }, py::arg("program"), py::arg("cache") = true,
     "Replays a recorded program into an MPSGraph and compiles it (through the native LRU).");
  m.def("mpsgraph_load", [](const std::string& path, const py::dict& program) {
    check_package_path(path);
    Program p = parse_program(program);
    PyExecutable out;
    {
      py::gil_scoped_release release;
      out.executable = load(path, p);
    }
    return out;
  }, py::arg("path"), py::arg("program"),
     "Loads an executable serialized by MPSGraphExecutable.serialize (macOS 14).");
  m.def("mpsgraph_structural_hash", [](const py::dict& program) {
    return structural_hash(parse_program(program));
  }, py::arg("program"), "The cache key's hash of a recorded program.");
  m.def("mpsgraph_replay_selectors", &replay_selectors,
        "The selectors the native replay table handles.");
  m.def("mpsgraph_cache_stats", []() { return stats_dict(cache_stats()); },
        "MPSGraph executable cache: size, capacity, hits, misses, evictions.");
  m.def("mpsgraph_cache_clear", &cache_clear);
  m.def("mpsgraph_cache_set_capacity", [](py::ssize_t n) {
    if (n < 0) throw py::value_error("capacity must be >= 0");
    cache_set_capacity(static_cast<size_t>(n));
  }, py::arg("capacity"));
}

}  // namespace lucid::mpsgraph
