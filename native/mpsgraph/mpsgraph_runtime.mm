// The native MPSGraph runtime: compiles a replayed program into an MPSGraphExecutable (the cache
// in mpsgraph_program.cpp keeps them), runs them on Metal buffers in shared storage, and
// serializes them to .mpsgraphpackage (macOS 14).

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <MetalPerformanceShaders/MetalPerformanceShaders.h>
#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#import "mpsgraph_replay.h"

namespace lucid::mpsgraph {

// ---- device ------------------------------------------------------------------------------------

namespace {

struct Device {
  id<MTLDevice> device = nil;
  id<MTLCommandQueue> queue = nil;
  MPSGraphDevice* graph_device = nil;
  std::string problem;  // empty when usable
};

std::string os_version_text() {
  NSOperatingSystemVersion v = [[NSProcessInfo processInfo] operatingSystemVersion];
  return std::to_string(v.majorVersion) + "." + std::to_string(v.minorVersion) + "." +
         std::to_string(v.patchVersion);
}

const Device& device() {
  static Device* shared = [] {
    auto* d = new Device;  // never destroyed: executables may outlive static teardown
    @autoreleasepool {
      NSOperatingSystemVersion minimum = {14, 0, 0};
      if (![[NSProcessInfo processInfo] isOperatingSystemAtLeastVersion:minimum]) {
        d->problem = "macOS " + os_version_text() + " is older than 14.0";
        return d;
      }
      d->device = MTLCreateSystemDefaultDevice();
      if (d->device == nil) {
        d->problem = "no Metal device (MTLCreateSystemDefaultDevice returned nil)";
        return d;
      }
      d->queue = [d->device newCommandQueue];
      if (d->queue == nil) {
        d->problem = "the Metal device gave no command queue";
        return d;
      }
      d->graph_device = [MPSGraphDevice deviceWithMTLDevice:d->device];
    }
    return d;
  }();
  return *shared;
}

const Device& usable_device() {
  const Device& d = device();
  if (!d.problem.empty()) throw std::runtime_error("MPSGraph is not available: " + d.problem);
  return d;
}

std::string ns_error_text(NSException* e) {
  std::string text = e.name ? e.name.UTF8String : "NSException";
  if (e.reason) text += std::string(": ") + e.reason.UTF8String;
  return text;
}

std::string ns_error_text(NSError* e) {
  if (e == nil) return "an unknown error";
  NSString* text = e.localizedDescription;
  return text ? std::string(text.UTF8String) : std::string("an NSError without a description");
}

std::string hash_text(uint64_t hash) {
  char text[17];
  snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// Runs `body` in an autorelease pool. A C++ exception is caught inside and rethrown after the
// pool is drained: unwinding through @autoreleasepool would leave the pool undrained.
template <typename Body>
void in_autorelease_pool(Body&& body) {
  std::exception_ptr error;
  @autoreleasepool {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

Availability availability() {
  const Device& d = device();
  if (!d.problem.empty()) return {false, d.problem};
  std::string name = d.device.name ? d.device.name.UTF8String : "a Metal device";
  return {true, name + ", macOS " + os_version_text()};
}

// ---- executables -------------------------------------------------------------------------------

namespace {

// A result living in a shared-storage Metal buffer: the CPU reads it in place.
class MetalResult : public ResultBuffer {
 public:
  explicit MetalResult(id<MTLBuffer> buffer) : buffer_(buffer) {}
  void* data() override { return buffer_.contents; }

 private:
  id<MTLBuffer> buffer_;
};

size_t element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

NSArray<NSNumber*>* ns_shape(const std::vector<int64_t>& shape) {
  NSMutableArray<NSNumber*>* out = [NSMutableArray arrayWithCapacity:shape.size()];
  for (int64_t d : shape) [out addObject:[NSNumber numberWithLongLong:d]];
  return out;
}

std::vector<int64_t> shape_vector(NSArray<NSNumber*>* shape) {
  std::vector<int64_t> out;
  for (NSNumber* d in shape) out.push_back(d.longLongValue);
  return out;
}

bool has_dynamic_dims(const std::vector<Placeholder>& placeholders) {
  for (const Placeholder& p : placeholders) {
    for (int64_t d : p.shape) {
      if (d < 0) return true;
    }
  }
  return false;
}

class MetalExecutable : public Executable {
 public:
  MetalExecutable(const Program& program, MPSGraph* graph, MPSGraphExecutable* executable,
                  std::vector<size_t> feed_order, std::vector<size_t> result_order)
      : feeds_(program.placeholders),
        inplace_(program.inplace),
        num_results_(program.targets.size()),
        hash_(structural_hash(program)),
        graph_(graph),
        executable_(executable),
        feed_order_(std::move(feed_order)),
        result_order_(std::move(result_order)),
        dynamic_(has_dynamic_dims(program.placeholders)),
        result_types_(kResultTypesCapacity) {}

  std::vector<std::shared_ptr<ResultBuffer>> run(const std::vector<HostTensor>& feeds,
                                                 RunStats* stats) override;
  void serialize(const std::string& path) override;
  uint64_t hash() const override { return hash_; }
  const std::vector<Placeholder>& feeds() const override { return feeds_; }
  size_t num_results() const override { return num_results_; }
  const std::vector<std::pair<int64_t, int64_t>>& inplace() const override { return inplace_; }

  const std::vector<size_t>& feed_order() const { return feed_order_; }
  const std::vector<size_t>& result_order() const { return result_order_; }

 private:
  struct ResultType {
    std::vector<int64_t> shape;
    MPSDataType type;
  };
  // Result shapes and types (executable order) for concrete feed shapes (program order).
  const std::vector<ResultType>& result_types(const std::vector<HostTensor>& feeds);

  std::vector<Placeholder> feeds_;
  std::vector<std::pair<int64_t, int64_t>> inplace_;
  size_t num_results_;
  uint64_t hash_;
  // Retained for the executable's lifetime: executables may refer to storage of their graph.
  [[maybe_unused]] MPSGraph* graph_;
  MPSGraphExecutable* executable_;
  std::vector<size_t> feed_order_;    // executable input position -> program feed index
  std::vector<size_t> result_order_;  // executable result position -> program result index
  bool dynamic_;
  std::mutex mu_;  // one run at a time per executable
  // Per feed-shape set (one entry for a static program), bounded: a service seeing many batch
  // sizes would otherwise grow it forever.
  BoundedLru<std::vector<std::vector<int64_t>>, std::vector<ResultType>> result_types_;
};

const std::vector<MetalExecutable::ResultType>& MetalExecutable::result_types(
    const std::vector<HostTensor>& feeds) {
  std::vector<std::vector<int64_t>> key;
  // Static programs have one set of result types; -1 dimensions need one per feed shape.
  if (dynamic_) {
    for (const HostTensor& t : feeds) key.push_back(t.shape);
  }
  if (const std::vector<ResultType>* known = result_types_.find(key)) return *known;
  NSMutableArray<MPSGraphType*>* input_types = [NSMutableArray arrayWithCapacity:feeds.size()];
  for (size_t position = 0; position < feed_order_.size(); ++position) {
    const HostTensor& t = feeds[feed_order_[position]];
    [input_types addObject:[[MPSGraphShapedType alloc] initWithShape:ns_shape(t.shape)
                                                           dataType:mps_data_type(t.dtype)]];
  }
  NSArray<MPSGraphShapedType*>* types =
      [executable_ getOutputTypesWithDevice:usable_device().graph_device
                                 inputTypes:input_types
                      compilationDescriptor:nil];
  if (types == nil || types.count != result_order_.size()) {
    throw std::runtime_error("MPSGraph could not infer the result types of the executable");
  }
  std::vector<ResultType> out;
  for (MPSGraphShapedType* type in types) {
    ResultType r{shape_vector(type.shape), type.dataType};
    for (int64_t d : r.shape) {
      if (d < 0) throw std::runtime_error("MPSGraph left a result dimension unresolved (-1)");
    }
    out.push_back(std::move(r));
  }
  return result_types_.put(key, std::move(out));
}

std::vector<std::shared_ptr<ResultBuffer>> MetalExecutable::run(
    const std::vector<HostTensor>& feeds, RunStats* stats) {
  const Device& dev = usable_device();
  if (feeds.size() != feeds_.size()) {
    throw std::invalid_argument("the executable takes " + std::to_string(feeds_.size()) +
                                " feeds, got " + std::to_string(feeds.size()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ResultBuffer>> results(num_results_);
  in_autorelease_pool([&] {
    const size_t page = static_cast<size_t>(getpagesize());
    NSMutableArray<MPSGraphTensorData*>* inputs = [NSMutableArray arrayWithCapacity:feeds.size()];
    for (size_t position = 0; position < feed_order_.size(); ++position) {
      const HostTensor& t = feeds[feed_order_[position]];
      size_t length = t.nbytes == 0 ? 1 : t.nbytes;
      id<MTLBuffer> buffer = nil;
      if (can_wrap_without_copy(t, page)) {
        // Copy-free: the page-aligned host memory becomes the buffer. The mapping is rounded
        // up to whole pages (mapped, being the rest of the last page); the tensor reads nbytes.
        size_t rounded = (t.nbytes + page - 1) / page * page;
        buffer = [dev.device newBufferWithBytesNoCopy:t.data
                                               length:rounded
                                              options:MTLResourceStorageModeShared
                                          deallocator:nil];
        if (buffer != nil && stats) ++stats->wrapped_inputs;
      }
      if (buffer == nil) {
        buffer = t.nbytes > 0 ? [dev.device newBufferWithBytes:t.data
                                                        length:t.nbytes
                                                       options:MTLResourceStorageModeShared]
                              : [dev.device newBufferWithLength:length
                                                        options:MTLResourceStorageModeShared];
        if (stats) ++stats->copied_inputs;
      }
      if (buffer == nil) {
        throw std::runtime_error("Metal could not allocate a " + std::to_string(length) +
                                 "-byte buffer for feed " + std::to_string(feed_order_[position]));
      }
      [inputs addObject:[[MPSGraphTensorData alloc] initWithMTLBuffer:buffer
                                                                shape:ns_shape(t.shape)
                                                             dataType:mps_data_type(t.dtype)]];
    }

    const std::vector<ResultType>& types = result_types(feeds);
    NSMutableArray<MPSGraphTensorData*>* outputs = [NSMutableArray arrayWithCapacity:types.size()];
    std::vector<id<MTLBuffer>> output_buffers;
    for (size_t position = 0; position < types.size(); ++position) {
      const ResultType& type = types[position];
      std::string dtype = mps_data_type_name(type.type);
      size_t nbytes = element_count(type.shape) * dtype_size(dtype);
      // Fresh buffers: an output never aliases an input (MPSGraph does not order such accesses).
      id<MTLBuffer> buffer = [dev.device newBufferWithLength:(nbytes == 0 ? 1 : nbytes)
                                                     options:MTLResourceStorageModeShared];
      if (buffer == nil) {
        throw std::runtime_error("Metal could not allocate a " + std::to_string(nbytes) +
                                 "-byte result buffer");
      }
      output_buffers.push_back(buffer);
      [outputs addObject:[[MPSGraphTensorData alloc] initWithMTLBuffer:buffer
                                                                 shape:ns_shape(type.shape)
                                                              dataType:type.type]];
      auto result = std::make_shared<MetalResult>(buffer);
      result->nbytes = nbytes;
      result->shape = type.shape;
      result->dtype = dtype;
      results[result_order_[position]] = std::move(result);
    }

    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i]) {
        throw std::runtime_error("MPSGraph executable " + hash_text(hash_) + ": result " +
                                 std::to_string(i) + " has no target in the executable");
      }
    }

    // GPU-side failures (out of memory, command-buffer faults, timeouts) are reported only to
    // the completion handler's NSError (MPSGraphExecutable.h); runWithMTLCommandQueue: itself
    // returns nothing and throws nothing for them.
    auto reported = std::make_shared<std::promise<std::string>>();
    std::future<std::string> gpu_error = reported->get_future();
    MPSGraphExecutableExecutionDescriptor* execution = [MPSGraphExecutableExecutionDescriptor new];
    [execution setWaitUntilCompleted:YES];
    [execution setCompletionHandler:^(NSArray<MPSGraphTensorData*>* _Nonnull, NSError* error) {
      try {  // on Metal's thread: nothing may escape (a second call would throw)
        reported->set_value(error == nil ? std::string() : ns_error_text(error));
      } catch (...) {
      }
    }];
    @try {
      [executable_ runWithMTLCommandQueue:dev.queue
                              inputsArray:inputs
                             resultsArray:outputs
                      executionDescriptor:execution];
    } @catch (NSException* e) {
      throw std::runtime_error("MPSGraph executable " + hash_text(hash_) +
                               ": run failed: " + ns_error_text(e));
    }
    // The run returns once the GPU is done ("synchronous and will return on completion of
    // execution"); the handler follows on Metal's thread. Should it ever not fire, the run still
    // completed: stop waiting for it (this run after a few seconds, later runs not at all).
    static std::atomic<bool> handler_fires{true};
    auto patience = handler_fires.load() ? std::chrono::seconds(5) : std::chrono::seconds(0);
    std::string error;
    if (gpu_error.wait_for(patience) == std::future_status::ready) {
      error = gpu_error.get();
    } else {
      handler_fires.store(false);
    }
    if (!error.empty()) {
      throw std::runtime_error("MPSGraph executable " + hash_text(hash_) +
                               ": the GPU reported an error: " + error);
    }
  });
  return results;
}

void MetalExecutable::serialize(const std::string& path) {
  check_package_path(path);
  in_autorelease_pool([&] {
    MPSGraphExecutableSerializationDescriptor* descriptor =
        [MPSGraphExecutableSerializationDescriptor new];
    [descriptor setDeploymentPlatform:MPSGraphDeploymentPlatformMacOS];
    [descriptor setMinimumDeploymentTarget:@"14.0"];
    NSFileManager* files = [NSFileManager defaultManager];
    NSString* ns_path = [NSString stringWithUTF8String:path.c_str()];
    // Written under a fresh name, then moved into place: serialization reports nothing, so a
    // stale package at `path` must not pass for this one.
    std::string fresh = temporary_package_path(path);
    NSString* ns_fresh = [NSString stringWithUTF8String:fresh.c_str()];
    [files removeItemAtPath:ns_fresh error:nil];
    std::lock_guard<std::mutex> lock(mu_);
    @try {
      [executable_ serializeToMPSGraphPackageAtURL:[NSURL fileURLWithPath:ns_fresh]
                                        descriptor:descriptor];
    } @catch (NSException* e) {
      [files removeItemAtPath:ns_fresh error:nil];
      throw std::runtime_error("MPSGraph could not serialize to " + path + ": " + ns_error_text(e));
    }
    if (![files fileExistsAtPath:ns_fresh]) {
      throw std::runtime_error("MPSGraph wrote no package for " + path);
    }
    NSError* error = nil;
    if ([files fileExistsAtPath:ns_path] && ![files removeItemAtPath:ns_path error:&error]) {
      [files removeItemAtPath:ns_fresh error:nil];
      throw std::runtime_error("could not replace " + path + ": " + ns_error_text(error));
    }
    if (![files moveItemAtPath:ns_fresh toPath:ns_path error:&error]) {
      throw std::runtime_error("could not move the package to " + path + ": " +
                               ns_error_text(error));
    }
  });
  write_bindings(path + kBindingsSuffix, hash_, {feed_order_, result_order_});
}

// Where each placeholder / target of the program sits in the executable's own order, by
// identity (match_positions: no "last match wins", every slot filled exactly once).
std::vector<size_t> positions_in(NSArray<MPSGraphTensor*>* executable_order,
                                 const std::vector<MPSGraphTensor*>& program_order,
                                 const char* what) {
  std::vector<const void*> executable_ids, program_ids;
  for (MPSGraphTensor* tensor in executable_order) {
    executable_ids.push_back((__bridge const void*)tensor);
  }
  for (MPSGraphTensor* tensor : program_order) {
    program_ids.push_back((__bridge const void*)tensor);
  }
  return match_positions(executable_ids, program_ids, what);
}

// The executable's result count for the program's placeholder types (in executable order):
// what a package loaded from disk can be checked with, having no feed or target tensors.
size_t result_count(MPSGraphExecutable* executable, const Program& program,
                    const std::vector<size_t>& feed_order) {
  NSMutableArray<MPSGraphType*>* input_types = [NSMutableArray arrayWithCapacity:feed_order.size()];
  for (size_t feed : feed_order) {
    const Placeholder& p = program.placeholders[feed];
    [input_types addObject:[[MPSGraphShapedType alloc] initWithShape:ns_shape(p.shape)
                                                           dataType:mps_data_type(p.dtype)]];
  }
  NSArray<MPSGraphShapedType*>* types =
      [executable getOutputTypesWithDevice:usable_device().graph_device
                                inputTypes:input_types
                     compilationDescriptor:nil];
  return types == nil ? 0 : types.count;
}

}  // namespace

std::shared_ptr<Executable> compile_uncached(const Program& program) {
  const Device& dev = usable_device();
  // What MPSGraph would abort() on (not throw) is refused here, before any graph is built.
  validate_program(program);
  std::shared_ptr<MetalExecutable> out;
  in_autorelease_pool([&] {
    ReplayedGraph replayed = replay(program);
    NSMutableDictionary<MPSGraphTensor*, MPSGraphShapedType*>* feeds =
        [NSMutableDictionary dictionaryWithCapacity:program.placeholders.size()];
    for (size_t i = 0; i < program.placeholders.size(); ++i) {
      const Placeholder& p = program.placeholders[i];
      feeds[replayed.placeholders[i]] =
          [[MPSGraphShapedType alloc] initWithShape:ns_shape(p.shape)
                                           dataType:mps_data_type(p.dtype)];
    }
    MPSGraphExecutable* executable = nil;
    @try {
      executable = [replayed.graph compileWithDevice:dev.graph_device
                                               feeds:feeds
                                       targetTensors:replayed.targets
                                    targetOperations:nil
                               compilationDescriptor:[MPSGraphCompilationDescriptor new]];
    } @catch (NSException* e) {
      throw std::runtime_error("MPSGraph compilation failed: " + ns_error_text(e));
    }
    if (executable == nil) throw std::runtime_error("MPSGraph compilation returned nil");
    std::vector<MPSGraphTensor*> targets;
    for (MPSGraphTensor* t in replayed.targets) targets.push_back(t);
    std::vector<size_t> feed_order = positions_in(executable.feedTensors, replayed.placeholders,
                                                  "feed");
    std::vector<size_t> result_order = positions_in(executable.targetTensors, targets, "target");
    out = std::make_shared<MetalExecutable>(program, replayed.graph, executable,
                                            std::move(feed_order), std::move(result_order));
  });
  return out;
}

std::shared_ptr<Executable> load(const std::string& path, const Program& program) {
  check_package_path(path);
  validate_program(program);
  usable_device();  // fails early, with the reason, where MPSGraph cannot run
  Bindings bindings = read_bindings(path + kBindingsSuffix, program);
  std::vector<size_t> feed_order = std::move(bindings.feed_order);
  std::vector<size_t> result_order = std::move(bindings.result_order);
  std::shared_ptr<Executable> out;
  in_autorelease_pool([&] {
    NSString* ns_path = [NSString stringWithUTF8String:path.c_str()];
    if (![[NSFileManager defaultManager] fileExistsAtPath:ns_path]) {
      throw std::runtime_error("no MPSGraph package at " + path);
    }
    MPSGraphExecutable* executable = nil;
    @try {
      executable = [[MPSGraphExecutable alloc]
          initWithMPSGraphPackageAtURL:[NSURL fileURLWithPath:ns_path]
                 compilationDescriptor:[MPSGraphCompilationDescriptor new]];
    } @catch (NSException* e) {
      throw std::runtime_error("MPSGraph could not load " + path + ": " + ns_error_text(e));
    }
    if (executable == nil) throw std::runtime_error("MPSGraph could not load " + path);
    // feedTensors/targetTensors are documented for executables built from a graph (and are
    // nullable): a package has none, so the order comes from the bindings file and the arity
    // from the result types the executable infers for the program's placeholders.
    NSUInteger listed_feeds = executable.feedTensors.count;
    NSUInteger listed_targets = executable.targetTensors.count;
    if ((listed_feeds != 0 && listed_feeds != feed_order.size()) ||
        (listed_targets != 0 && listed_targets != result_order.size())) {
      throw std::runtime_error(path + " lists " + std::to_string(listed_feeds) + " feeds and " +
                               std::to_string(listed_targets) + " results, the program " +
                               std::to_string(feed_order.size()) + " and " +
                               std::to_string(result_order.size()));
    }
    if (!has_dynamic_dims(program.placeholders)) {
      size_t results = result_count(executable, program, feed_order);
      if (results != result_order.size()) {
        throw std::runtime_error(path + " gives " + std::to_string(results) +
                                 " results for the program's feeds, the program has " +
                                 std::to_string(result_order.size()));
      }
    }
    out = std::make_shared<MetalExecutable>(program, nil, executable, std::move(feed_order),
                                            std::move(result_order));
  });
  return out;
}

}  // namespace lucid::mpsgraph
