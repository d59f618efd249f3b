// The portable part of the native MPSGraph backend: the program's structural key, the executable
// cache, and the bindings file written beside a serialized package. Plain C++ (no Objective-C):
// the Metal side (mpsgraph_runtime.mm) supplies compile_uncached().

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "mpsgraph_native.h"

namespace lucid::mpsgraph {

namespace {

constexpr const char* kBindingsMagic = "lucid.mpsgraph.bindings/v1";

struct DTypeSize {
  const char* name;
  size_t size;
};

const DTypeSize kDTypeSizes[] = {
    {"MPSDataTypeFloat32", 4}, {"MPSDataTypeFloat16", 2}, {"MPSDataTypeBFloat16", 2},
    {"MPSDataTypeInt8", 1},    {"MPSDataTypeInt16", 2},   {"MPSDataTypeInt32", 4},
    {"MPSDataTypeInt64", 8},   {"MPSDataTypeUInt8", 1},   {"MPSDataTypeUInt16", 2},
    {"MPSDataTypeUInt32", 4},  {"MPSDataTypeUInt64", 8},  {"MPSDataTypeBool", 1},
};

}  // namespace

size_t dtype_size(const std::string& dtype) {
  for (const DTypeSize& entry : kDTypeSizes) {
    if (dtype == entry.name) return entry.size;
  }
  throw std::invalid_argument("unknown MPSDataType '" + dtype + "'");
}

const char* arg_kind_name(ArgKind kind) {
  switch (kind) {
    case ArgKind::Tensor: return "tensor";
    case ArgKind::Tensors: return "tensors";
    case ArgKind::Int: return "int";
    case ArgKind::Double: return "double";
    case ArgKind::Bool: return "bool";
    case ArgKind::Shape: return "shape";
    case ArgKind::Ints: return "ints";
    case ArgKind::DType: return "dtype";
    case ArgKind::Enum: return "enum";
    case ArgKind::Descriptor: return "descriptor";
    case ArgKind::Constant: return "constant";
    case ArgKind::NilObject: return "nil";
  }
  return "?";
}

// ---- structural key ----------------------------------------------------------------------------

namespace {

void put_ints(std::ostringstream& out, const std::vector<int64_t>& values) {
  out << '[';
  for (int64_t v : values) out << v << ',';
  out << ']';
}

void put_arg(std::ostringstream& out, const Arg& arg) {
  out << arg_kind_name(arg.kind) << '(';
  switch (arg.kind) {
    case ArgKind::Tensor: out << arg.tensor; break;
    case ArgKind::Tensors: put_ints(out, arg.ids); break;
    case ArgKind::Int:
    case ArgKind::Bool: out << arg.integer; break;
    case ArgKind::Double: {
      // Bit-exact: two programs differing in the last bit of a constant are different programs.
      uint64_t bits = 0;
      std::memcpy(&bits, &arg.real, sizeof bits);
      out << std::hex << bits << std::dec;
      break;
    }
    case ArgKind::Shape:
    case ArgKind::Ints: put_ints(out, arg.ints); break;
    case ArgKind::DType: out << arg.name; break;
    case ArgKind::Enum: out << arg.name << '=' << arg.integer; break;
    case ArgKind::Descriptor:
      out << arg.name;
      for (const Field& field : arg.fields) {
        out << ';' << field.name << ':';
        put_arg(out, field.value);
      }
      break;
    case ArgKind::Constant:
      out << arg.name;
      put_ints(out, arg.ints);
      out << arg.bytes.size() << ':';
      out.write(arg.bytes.data(), static_cast<std::streamsize>(arg.bytes.size()));
      break;
    case ArgKind::NilObject: break;
  }
  out << ')';
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

std::string structural_key(const Program& program) {
  std::ostringstream out;
  out << kProgramFormat << '\n';
  for (const Placeholder& p : program.placeholders) {
    // The role is a label only; it does not change the executable.
    out << "p" << p.id << ':' << p.dtype;
    put_ints(out, p.shape);
    out << '\n';
  }
  for (const Call& call : program.calls) {
    out << call.selector << '(';
    for (const Arg& arg : call.args) put_arg(out, arg);
    out << ")->";
    put_ints(out, call.results);
    out << '\n';
  }
  out << "targets";
  put_ints(out, program.targets);
  out << "\ninplace";
  for (const auto& [result, feed] : program.inplace) out << result << '>' << feed << ',';
  return out.str();
}

uint64_t structural_hash(const Program& program) { return fnv1a(structural_key(program)); }

// ---- checks before MPSGraph sees a program -----------------------------------------------------

void validate_program(const Program& program) {
  if (program.targets.empty()) throw std::invalid_argument("the program has no targets");
  std::vector<int64_t> defined;
  for (const Placeholder& p : program.placeholders) {
    std::string where = "placeholder " + std::to_string(p.id);
    if (p.shape.empty()) {
      throw std::invalid_argument(where + " has rank 0 (an empty MPSShape): spell it [1]");
    }
    for (int64_t d : p.shape) {
      if (d < -1 || d == 0) {
        throw std::invalid_argument(where + " has a dimension " + std::to_string(d));
      }
    }
    defined.push_back(p.id);
  }
  for (const Call& call : program.calls) {
    defined.insert(defined.end(), call.results.begin(), call.results.end());
  }
  for (size_t i = 0; i < program.targets.size(); ++i) {
    int64_t t = program.targets[i];
    for (size_t j = 0; j < i; ++j) {
      if (program.targets[j] == t) {
        throw std::invalid_argument("target " + std::to_string(t) + " is named twice");
      }
    }
    bool known = false;
    for (int64_t id : defined) known = known || id == t;
    if (!known) throw std::invalid_argument("target " + std::to_string(t) + " is never defined");
  }
  for (const auto& [result, feed] : program.inplace) {
    if (result < 0 || static_cast<size_t>(result) >= program.targets.size() || feed < 0 ||
        static_cast<size_t>(feed) >= program.placeholders.size()) {
      throw std::invalid_argument("in-place pair (" + std::to_string(result) + ", " +
                                  std::to_string(feed) + ") is out of range");
    }
  }
}

void check_package_path(const std::string& path) {
  const std::string extension = kPackageExtension;
  size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.size() <= extension.size() ||
      name.compare(name.size() - extension.size(), extension.size(), extension) != 0) {
    throw std::invalid_argument("an MPSGraph package path must end in " + extension + ": " +
                                path);
  }
}

std::string temporary_package_path(const std::string& path) {
  std::string stem = path.substr(0, path.size() - std::string(kPackageExtension).size());
  return stem + ".partial-" + std::to_string(static_cast<long long>(getpid())) +
         kPackageExtension;
}

// ---- binding feeds and results -----------------------------------------------------------------

bool can_wrap_without_copy(const HostTensor& tensor, size_t page_size) {
  uintptr_t address = reinterpret_cast<uintptr_t>(tensor.data);
  return tensor.writable && tensor.nbytes > 0 && page_size > 0 && address % page_size == 0;
}

std::vector<size_t> match_positions(const std::vector<const void*>& executable_order,
                                    const std::vector<const void*>& program_order,
                                    const char* what) {
  const size_t none = program_order.size();
  for (size_t i = 0; i < program_order.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (program_order[i] == program_order[j]) {
        throw std::runtime_error(std::string("the program names ") + what + " " +
                                 std::to_string(j) + " twice (also as " + std::to_string(i) +
                                 ")");
      }
    }
  }
  if (executable_order.size() != program_order.size()) {
    throw std::runtime_error(std::string("the executable has ") +
                             std::to_string(executable_order.size()) + " " + what +
                             " tensors, the program " + std::to_string(program_order.size()));
  }
  std::vector<size_t> out;
  std::vector<bool> matched(program_order.size(), false);
  for (const void* tensor : executable_order) {
    size_t found = none;
    for (size_t i = 0; i < program_order.size() && found == none; ++i) {
      if (program_order[i] == tensor) found = i;
    }
    if (found == none) {
      throw std::runtime_error(std::string("the executable has a ") + what +
                               " tensor the program did not create");
    }
    if (matched[found]) {
      throw std::runtime_error(std::string("the executable lists ") + what + " " +
                               std::to_string(found) + " twice");
    }
    matched[found] = true;
    out.push_back(found);
  }
  return out;
}

// ---- bindings beside a package -----------------------------------------------------------------

void write_bindings(const std::string& path, uint64_t hash, const Bindings& bindings) {
  std::ofstream out(path, std::ios::trunc);
  out << kBindingsMagic << "\n" << hash << "\n";
  for (size_t f : bindings.feed_order) out << f << ' ';
  out << "\n";
  for (size_t r : bindings.result_order) out << r << ' ';
  out << "\n";
  if (!out) throw std::runtime_error("could not write " + path);
}

namespace {

std::vector<size_t> read_index_line(std::istream& in, size_t expected, const std::string& what,
                                    const std::string& path) {
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line);
  std::vector<size_t> out;
  size_t value = 0;
  while (fields >> value) out.push_back(value);
  std::vector<bool> seen(expected, false);
  bool permutation = out.size() == expected;
  for (size_t v : out) {
    if (v >= expected || seen[v]) permutation = false;
    if (v < expected) seen[v] = true;
  }
  if (!permutation) {
    throw std::runtime_error(path + ": the " + what + " order does not match the program (" +
                             std::to_string(expected) + " expected)");
  }
  return out;
}

}  // namespace

Bindings read_bindings(const std::string& path, const Program& program) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("no bindings file " + path + " beside the package");
  std::string magic, hash_line;
  std::getline(in, magic);
  std::getline(in, hash_line);
  if (magic != kBindingsMagic) {
    throw std::runtime_error(path + " is not a Lucid MPSGraph bindings file");
  }
  std::string expected = std::to_string(structural_hash(program));
  if (hash_line != expected) {
    throw std::runtime_error(path + ": the package was compiled from a different program " +
                             "(structural hash " + hash_line + ", this program's is " + expected +
                             ")");
  }
  Bindings bindings;
  bindings.feed_order = read_index_line(in, program.placeholders.size(), "feed", path);
  bindings.result_order = read_index_line(in, program.targets.size(), "result", path);
  return bindings;
}

// ---- the cache ---------------------------------------------------------------------------------

namespace {

size_t initial_capacity() {
  const char* env = std::getenv("LUCID_COMPILE_MAX_CACHE");
  if (env && *env) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 0) return static_cast<size_t>(v);
  }
  return 32;
}

struct Cache {
  std::mutex mu;
  size_t capacity = initial_capacity();
  size_t hits = 0, misses = 0, evictions = 0;
  using Entry = std::pair<std::string, std::shared_ptr<Executable>>;
  std::list<Entry> lru;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index;

  void evict_to(size_t cap) {
    while (lru.size() > cap) {
      index.erase(lru.back().first);
      lru.pop_back();
      ++evictions;
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: executables may outlive static teardown
  return *c;
}

}  // namespace

std::shared_ptr<Executable> compile(const Program& program, bool use_cache, bool* cache_hit) {
  if (cache_hit) *cache_hit = false;
  validate_program(program);
  if (!use_cache) return compile_uncached(program);
  Cache& c = cache();
  // The full key, not only its hash: a hash collision must never return another program.
  std::string key = structural_key(program);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.index.find(key);
    if (it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.hits;
      if (cache_hit) *cache_hit = true;
      return it->second->second;
    }
  }
  // Compile outside the lock: other threads keep hitting the cache meanwhile.
  std::shared_ptr<Executable> executable = compile_uncached(program);
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.index.find(key);
  if (it != c.index.end()) {  // another thread compiled the same program first
    ++c.hits;
    if (cache_hit) *cache_hit = true;
    return it->second->second;
  }
  ++c.misses;
  if (c.capacity == 0) return executable;
  c.lru.emplace_front(std::move(key), executable);
  c.index[c.lru.front().first] = c.lru.begin();
  c.evict_to(c.capacity);
  return executable;
}

CacheStats cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.lru.size(), c.capacity, c.hits, c.misses, c.evictions};
}

void cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lru.clear();
  c.index.clear();
  c.hits = c.misses = c.evictions = 0;
}

void cache_set_capacity(size_t capacity) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.capacity = capacity;
  c.evict_to(capacity);
}

}  // namespace lucid::mpsgraph
