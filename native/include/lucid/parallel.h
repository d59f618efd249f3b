// A small pool of worker threads for splitting one large kernel across cores, and the thread
// count policy shared with the BLAS: a configured count, lowered while other processes keep the
// cores busy.
#pragma once

#include <cstdint>
#include <functional>

namespace lucid {

// Runs fn(begin, end) over [0, total) split into at most `parallel_threads()` contiguous parts,
// the calling thread taking the first part; returns when every part is done. Runs serially when
// the pool has one thread, when `total` is below `min_per_part` * 2, or when another run is using
// the pool (concurrent executables never wait for each other). A part no worker has picked up by
// the time the caller finishes its own is run by the caller: a worker slow to wake (its core is
// busy) never holds the run up. The split does not depend on which thread runs a part.
void parallel_for(int64_t total, int64_t min_per_part,
                  const std::function<void(int64_t, int64_t)>& fn);

// Threads (including the caller) kernels may use now: the configured count, or fewer while
// the cores are contended (adapt_threads_to_load).
int parallel_threads();
// The configured count (set_num_threads / LUCID_NUM_THREADS; the BLAS default at start).
int configured_threads();
// Sets the configured count of both the worker pool and the BLAS.
void set_configured_threads(int n);

// Called at the start of every run: at most every 100 ms, compares the CPU time the allowed
// cores spent busy (/proc/stat) with this process's own CPU time. While other processes use
// more than about 0.6 of a core, kernels and the BLAS use only the cores left free (at least
// one); below about 0.35 of a core the configured count comes back. A few nanoseconds between
// samples; a no-op when adaptation is off or one thread is configured.
void adapt_threads_to_load();
void set_adaptive_threads(bool on);  // LUCID_ADAPTIVE_THREADS=0 turns it off at start

// Once per process, before the first single-threaded run with GEMMs worth it: brings the BLAS
// out of a slow single-thread start state (parallel.cpp says what was measured).
void prime_single_thread_blas();

// Feeds one observation (other processes' load in cores, allowed cores) to the policy as a
// sample would, and applies the result; for tests and for diagnosing the policy.
int observe_load(double other_cores, int allowed_cpus);

struct ThreadStats {
  int configured, effective, allowed_cpus;
  bool adaptive, contended;
  double other_cores;  // last estimate of other processes' load (cores), -1 before the first
  int64_t samples, changes, parts_run_by_caller;
  double sample_seconds;  // total time spent sampling
};
ThreadStats thread_stats();

}  // namespace lucid
