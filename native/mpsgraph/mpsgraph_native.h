// The native MPSGraph backend's C++ face: a recorded program ("lucid.mpsgraph/v1", built by
// lucid/backends/mpsgraph) as plain structs, and the runtime that replays, compiles, caches, runs
// and serializes it. No Objective-C and no pybind11 here: bind_mpsgraph.cpp fills the structs from
// Python objects, mpsgraph_program.cpp implements the portable part (structural key, cache,
// bindings file), mpsgraph_runtime.mm and mpsgraph_replay.mm the MPSGraph part. Built only on
// macOS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lucid::mpsgraph {

inline constexpr const char* kProgramFormat = "lucid.mpsgraph/v1";

// One argument of a recorded call; `kind` says which fields hold its value.
enum class ArgKind {
  Tensor,      // tensor id
  Tensors,     // NSArray<MPSGraphTensor *>
  Int,         // NSInteger / NSUInteger
  Double,      // double (also float arguments)
  Bool,        // BOOL
  Shape,       // MPSShape *
  Ints,        // NSArray<NSNumber *> (axes, permutations, ...)
  DType,       // MPSDataType, by name
  Enum,        // an MPSGraph enum: name and value
  Descriptor,  // an op descriptor: class name and fields
  Constant,    // NSData + shape + dtype for constantWithData:shape:dataType:
  NilObject,   // nil (the name: argument, an absent optional tensor)
};

const char* arg_kind_name(ArgKind kind);

struct Field;

struct Arg {
  ArgKind kind = ArgKind::NilObject;
  int64_t tensor = -1;          // Tensor
  std::vector<int64_t> ids;     // Tensors
  int64_t integer = 0;          // Int, Bool (0/1), Enum value
  double real = 0.0;            // Double
  std::vector<int64_t> ints;    // Shape, Ints, Constant shape
  std::string name;             // DType name, Enum name, Descriptor class, Constant dtype
  std::vector<Field> fields;    // Descriptor fields, in the recorded order
  std::string bytes;            // Constant data (decoded)
};

struct Field {
  std::string name;
  Arg value;  // Int, Double, Bool, DType or Enum
};

struct Call {
  std::string selector;          // the full Objective-C selector
  std::vector<Arg> args;         // in selector order
  std::vector<int64_t> results;  // tensor ids this call defines
};

struct Placeholder {
  int64_t id = -1;
  std::vector<int64_t> shape;  // -1 = resolved at run time
  std::string dtype;           // "MPSDataTypeFloat32", ...
  std::string role;            // informational ("input:0", "param:w", ...)
};

struct Program {
  std::vector<Placeholder> placeholders;  // feed order
  std::vector<Call> calls;
  std::vector<int64_t> targets;  // result tensors, in result order
  std::vector<std::pair<int64_t, int64_t>> inplace;  // result index -> feed index
};

// The canonical text of everything that shapes the compiled executable (the cache key), and its
// 64-bit FNV-1a hash.
std::string structural_key(const Program& program);
uint64_t structural_hash(const Program& program);

// Bytes per element of an MPSDataType name; throws std::invalid_argument for unknown names.
size_t dtype_size(const std::string& dtype);

// A feed as host memory (a C-contiguous numpy buffer; the caller keeps it alive during run()).
struct HostTensor {
  void* data = nullptr;
  size_t nbytes = 0;
  std::vector<int64_t> shape;
  std::string dtype;
  bool writable = false;  // read-only memory is copied, never wrapped
};

// One result: a shared-storage Metal buffer (or host memory) the caller may wrap without a copy.
class ResultBuffer {
 public:
  virtual ~ResultBuffer() = default;
  virtual void* data() = 0;
  size_t nbytes = 0;
  std::vector<int64_t> shape;
  std::string dtype;
};

// Refuses (std::invalid_argument, naming the problem) a program MPSGraph would abort() on rather
// than throw: no targets, a target named twice or never defined, a placeholder of rank 0 (an
// empty MPSShape; the emitter spells rank 0 as [1]) or with a dimension below -1 or of 0, an
// in-place pair out of range.
void validate_program(const Program& program);

inline constexpr const char* kPackageExtension = ".mpsgraphpackage";
// Throws std::invalid_argument unless `path` ends in .mpsgraphpackage (Apple's examples all do).
void check_package_path(const std::string& path);
// The name a package is first written under, beside `path`, before it is moved into place.
std::string temporary_package_path(const std::string& path);

// Whether a feed can become a Metal buffer without a copy (newBufferWithBytesNoCopy: wants
// page-aligned, writable memory; the length is rounded up to whole pages).
bool can_wrap_without_copy(const HostTensor& tensor, size_t page_size);

// Where each tensor of the executable's order (its feedTensors or targetTensors) sits in the
// program's order, matched by identity. Every executable entry must match exactly one program
// entry and every program entry must be matched exactly once; a program naming a tensor twice
// is refused (MPSGraph would merge the two, or a result slot would stay empty).
std::vector<size_t> match_positions(const std::vector<const void*>& executable_order,
                                    const std::vector<const void*>& program_order,
                                    const char* what);

// A map keeping at most `capacity` entries, dropping the least recently used: the per-shape
// result types of a symbolic-batch executable (one entry per distinct feed-shape set).
template <typename Key, typename Value>
class BoundedLru {
 public:
  explicit BoundedLru(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}
  // The value for `key`, made most recent; nullptr when absent.
  Value* find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Inserts (or replaces) `key` as the most recent entry; evicts beyond the capacity.
  Value& put(const Key& key, Value value) {
    if (Value* old = find(key)) {
      *old = std::move(value);
      return *old;
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<Key, Value>> order_;  // most recent first
  std::map<Key, typename std::list<std::pair<Key, Value>>::iterator> index_;
};

// How many per-shape result-type sets one symbolic-batch executable keeps.
inline constexpr size_t kResultTypesCapacity = 64;

struct RunStats {
  size_t wrapped_inputs = 0;  // bound copy-free (page-aligned host memory)
  size_t copied_inputs = 0;   // bound through one copy
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Binds `feeds` (program feed order) and runs synchronously. Thread-safe; runs of one
  // executable are serialized. Throws std::runtime_error when MPSGraph reports a failure.
  virtual std::vector<std::shared_ptr<ResultBuffer>> run(const std::vector<HostTensor>& feeds,
                                                         RunStats* stats) = 0;
  // Writes an .mpsgraphpackage at `path` and the feed/result order beside it (path +
  // kBindingsSuffix), which a package does not carry.
  virtual void serialize(const std::string& path) = 0;
  virtual uint64_t hash() const = 0;
  virtual const std::vector<Placeholder>& feeds() const = 0;
  virtual size_t num_results() const = 0;
  virtual const std::vector<std::pair<int64_t, int64_t>>& inplace() const = 0;
};

inline constexpr const char* kBindingsSuffix = ".lucid-bindings";

// What a serialized package does not carry: where each program feed and result sits in the
// executable's own order. Written beside the package with the program's structural hash.
struct Bindings {
  std::vector<size_t> feed_order;    // executable input position -> program feed index
  std::vector<size_t> result_order;  // executable result position -> program result index
};
void write_bindings(const std::string& path, uint64_t hash, const Bindings& bindings);
// Reads a bindings file; throws std::runtime_error when it is missing, malformed, or was written
// for a program with another structural hash.
Bindings read_bindings(const std::string& path, const Program& program);

struct Availability {
  bool available = false;
  std::string reason;  // why not, or what was found
};

// A Metal device is present and macOS is at least 14.0.
Availability availability();

// Replays `program` into an MPSGraph and compiles it (through the LRU when use_cache).
std::shared_ptr<Executable> compile(const Program& program, bool use_cache, bool* cache_hit);
// The same without the cache (the Metal side, mpsgraph_runtime.mm).
std::shared_ptr<Executable> compile_uncached(const Program& program);

// Loads an executable serialized by Executable::serialize; `program` must be the one it was
// compiled from (checked against the recorded structural hash).
std::shared_ptr<Executable> load(const std::string& path, const Program& program);

// The selectors the replay table handles.
std::vector<std::string> replay_selectors();

struct CacheStats {
  size_t size = 0, capacity = 0, hits = 0, misses = 0, evictions = 0;
};
CacheStats cache_stats();
void cache_clear();
void cache_set_capacity(size_t capacity);

}  // namespace lucid::mpsgraph
