// The worker pool behind parallel_for. Workers sleep on a condition variable between runs: a
// spinning pool would take the cores OpenBLAS's own threads need for the next GEMM.
#include "lucid/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "lucid/kernels.h"

namespace lucid {

namespace {

class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {}

  int threads() const { return threads_; }

  // Workers are started lazily and kept; a smaller count leaves the extra ones idle.
  void set_threads(int n) {
    std::lock_guard<std::mutex> run(run_mu_);
    threads_ = std::max(1, n);
  }

  bool try_run(int parts, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock() || parts < 2 || parts > threads_) return false;
    start_workers(parts - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    work_cv_.notify_all();
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void start_workers(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      int part = static_cast<int>(workers_.size()) + 1;
      uint64_t now;
      {
        std::lock_guard<std::mutex> lock(mu_);
        now = generation_;
      }
      workers_.emplace_back([this, part, now] { loop(part, now); });
      workers_.back().detach();  // the pool lives as long as the process
    }
  }

  void loop(int part, uint64_t seen) {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (part >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      std::exception_ptr err;
      try {
        (*job)(part);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int threads_;
  std::mutex run_mu_;  // one parallel run at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
};

Pool* g_pool = nullptr;
std::once_flag g_once;

// A forked child has none of the parent's workers: give it a fresh pool (the old one is leaked,
// its mutexes may be held by threads that do not exist in the child). No job is half done at
// fork: parallel_for runs only inside Executable::run, and fork waits for every run in progress
// (runtime.cpp, ForkGate).
void reset_after_fork() {
  int n = g_pool ? g_pool->threads() : 1;
  g_pool = new Pool(n);
}

Pool& pool() {
  std::call_once(g_once, [] {
    g_pool = new Pool(blas_get_threads());
    pthread_atfork(nullptr, nullptr, reset_after_fork);
  });
  return *g_pool;
}

}  // namespace

int parallel_threads() { return pool().threads(); }

void set_parallel_threads(int n) { pool().set_threads(n); }

void parallel_for(int64_t total, int64_t min_per_part,
                  const std::function<void(int64_t, int64_t)>& fn) {
  Pool& p = pool();
  int64_t parts = std::min<int64_t>(p.threads(), total / std::max<int64_t>(min_per_part, 1));
  if (parts >= 2) {
    auto part_fn = [&](int i) {
      int64_t begin = total * i / parts, end = total * (i + 1) / parts;
      if (begin < end) fn(begin, end);
    };
    if (p.try_run(static_cast<int>(parts), part_fn)) return;
  }
  fn(0, total);
}

}  // namespace lucid
