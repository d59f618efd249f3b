// A small pool of worker threads for splitting one large kernel across cores.
#pragma once

#include <cstdint>
#include <functional>

namespace lucid {

// Runs fn(begin, end) over [0, total) split into at most `threads()` contiguous parts, the
// calling thread taking the first part; returns when every part is done. Runs serially when the
// pool has one thread, when `total` is below `min_per_part` * 2, or when another run is using
// the pool (concurrent executables never wait for each other).
void parallel_for(int64_t total, int64_t min_per_part,
                  const std::function<void(int64_t, int64_t)>& fn);

// Threads (including the caller) parallel_for may use; set with set_parallel_threads.
int parallel_threads();
void set_parallel_threads(int n);

}  // namespace lucid
