// The worker pool behind parallel_for, and the thread count policy shared with the BLAS.
// Workers sleep on a condition variable between runs: a spinning pool would take the cores
// OpenBLAS's own threads need for the next GEMM. Before sleeping, a worker watches for the next
// run for a short while (kSpinNs): a compiled program runs dozens of split kernels
// back to back (workload F: ~50 per call, microseconds apart), and a sleeping worker is woken
// by a futex and, on a virtual machine, an interrupt to a halted vCPU; every run loses that
// latency of the worker's share (its parts fall to the caller).
//
// On a machine whose cores other processes keep busy, a second thread does not add a core: its
// part waits for a time slice (milliseconds) while the caller waits for it. Measured on two
// cores with one competing busy loop, a 64x784 @ 784x256 GEMM run took a median 0.43 ms and up
// to 8 ms with two BLAS threads against 0.30 ms with one. So runs watch the load of other
// processes on their cores and use only the cores left free.
#include "lucid/parallel.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "lucid/blas.h"
#include "lucid/kernels.h"

namespace lucid {

namespace {

std::atomic<int64_t> g_parts_run_by_caller{0};

// How long a worker watches for the next run before it sleeps.
constexpr int64_t kSpinNs = 50'000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Pool {
 public:
  // A part is claimed through next_part_ by the caller or a worker, whichever comes first; the
  // caller waits only for parts a worker has started (active_).
  bool try_run(int parts, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock() || parts < 2) return false;
    start_workers(parts - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      parts_ = parts;
      next_part_.store(1);
      error_ = nullptr;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    work_cv_.notify_all();
    std::exception_ptr mine;
    auto run_part = [&](int part) {
      try {
        fn(part);
      } catch (...) {
        if (!mine) mine = std::current_exception();
      }
    };
    run_part(0);
    int by_caller = 0;
    for (int part; (part = next_part_.fetch_add(1)) < parts; ++by_caller) run_part(part);
    std::exception_ptr theirs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return active_ == 0; });
      job_ = nullptr;
      theirs = error_;
    }
    if (by_caller) g_parts_run_by_caller.fetch_add(by_caller, std::memory_order_relaxed);
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
    return true;
  }

 private:
  // Workers are started lazily and kept; a smaller count leaves the extra ones idle.
  void start_workers(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      uint64_t now;
      {
        std::lock_guard<std::mutex> lock(mu_);
        now = generation_;
      }
      workers_.emplace_back([this, now] { loop(now); });
      workers_.back().detach();  // the pool lives as long as the process
    }
  }

  void loop(uint64_t seen) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (generation_ == seen) {
        lock.unlock();
        for (const int64_t until = steady_ns() + kSpinNs;
             published_.load(std::memory_order_acquire) == seen && steady_ns() < until;)
          cpu_relax();
        lock.lock();
      }
      work_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      // Claiming and counting happen under mu_, so the caller (which waits for active_ == 0
      // under mu_ after it found no part left) never returns while a claimed part runs.
      while (job_) {
        const int part = next_part_.fetch_add(1);
        if (part >= parts_) break;
        const std::function<void(int)>* job = job_;
        ++active_;
        lock.unlock();
        std::exception_ptr err;
        try {
          (*job)(part);
        } catch (...) {
          err = std::current_exception();
        }
        lock.lock();
        if (err && !error_) error_ = err;
        if (--active_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::mutex run_mu_;  // one parallel run at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0, active_ = 0;
  std::atomic<int> next_part_{0};
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, read by spinning workers without mu_
  std::exception_ptr error_;
};

// ---- the thread count policy -------------------------------------------------------------------

constexpr int64_t kSampleIntervalNs = 100'000'000;  // /proc/stat counts in 10 ms ticks
// The shortest span the first estimate after a baseline may cover (+-0.4 core of tick rounding
// on two CPUs): a run that comes sooner keeps the current count and tries again later.
constexpr int64_t kFirstEstimateNs = 50'000'000;
// Hysteresis, in cores of other processes' CPU time: a lone busy loop shows as 0.7-1.0 core
// (it yields some of its core to our threads); our own work mis-attributed by tick rounding as
// up to ~0.2.
constexpr double kContendedAbove = 0.6;
constexpr double kFreeBelow = 0.35;

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Busy ticks (user, nice, system, irq, softirq, steal) summed over the CPUs this thread may
// run on, from /proc/stat; false where there is none (not Linux) or it cannot be parsed.
bool read_busy_ticks(uint64_t* busy, int* cpus) {
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  static std::vector<char> buf(1 << 16);  // callers hold the policy's sample mutex
  int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t len = 0;
  for (;;) {
    if (len + 1 >= buf.size()) buf.resize(buf.size() * 2);
    ssize_t got = read(fd, buf.data() + len, buf.size() - 1 - len);
    if (got <= 0) break;
    len += static_cast<size_t>(got);
  }
  close(fd);
  buf[len] = '\0';
  uint64_t total = 0;
  int n = 0;
  for (const char* line = buf.data(); line && *line; ) {
    if (std::strncmp(line, "cpu", 3) != 0) break;  // the per-CPU lines come first
    if (line[3] >= '0' && line[3] <= '9') {
      char* p = nullptr;
      long cpu = std::strtol(line + 3, &p, 10);
      unsigned long long f[8] = {0};
      for (int i = 0; i < 8; ++i) f[i] = std::strtoull(p, &p, 10);
      // user nice system idle iowait irq softirq steal (guest time is inside user)
      if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &allowed)) {
        total += f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
        ++n;
      }
    }
    line = std::strchr(line, '\n');
    if (line) ++line;
  }
  if (n == 0) return false;
  *busy = total;
  *cpus = n;
  return true;
#else
  (void)busy;
  (void)cpus;
  return false;
#endif
}

bool adaptive_from_env() {
  const char* v = std::getenv("LUCID_ADAPTIVE_THREADS");
  return !(v && std::strcmp(v, "0") == 0);
}

class Policy {
 public:
  explicit Policy(int configured) : configured_(std::max(1, configured)), effective_(configured_.load()) {}
  // A forked child starts sampling afresh (the parent's mutex may not be usable there).
  explicit Policy(const Policy& parent)
      : configured_(parent.configured_.load()),
        effective_(parent.effective_.load()),
        adaptive_(parent.adaptive_.load()),
        contended_(parent.contended_),
        other_cores_(parent.other_cores_),
        allowed_cpus_(parent.allowed_cpus_) {}

  int configured() const { return configured_.load(std::memory_order_relaxed); }
  int effective() const { return effective_.load(std::memory_order_relaxed); }

  void set_configured(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    configured_.store(std::max(1, n));
    apply(decide(), /*force_blas=*/true);
  }

  void set_adaptive(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    adaptive_.store(on);
    have_base_ = false;
    if (!on) contended_ = false;
    apply(decide(), false);
    // The baseline is taken now (the native module's load sets this), not at the first run:
    // that run then already knows the load of the time since. Without it, the first runs of a
    // fresh process used every configured thread on a busy machine, waiting tens of ms per
    // GEMM for a worker's time slice (a 1 ms call of workload A took ~60 ms, twice).
    if (on && configured() >= 2) {
      const int64_t now = monotonic_ns();
      sample(now);
      next_sample_ns_.store(now + kFirstEstimateNs, std::memory_order_relaxed);
    }
  }

  void maybe_sample() {
    if (!adaptive_.load(std::memory_order_relaxed)) return;
    if (configured() < 2 && effective() == configured()) return;
    const int64_t now = monotonic_ns();
    if (now < next_sample_ns_.load(std::memory_order_relaxed)) return;
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || now < next_sample_ns_.load(std::memory_order_relaxed)) return;
    next_sample_ns_.store(now + kSampleIntervalNs, std::memory_order_relaxed);
    sample(now);
  }

  int observe(double other_cores, int allowed_cpus) {
    std::lock_guard<std::mutex> lock(mu_);
    next_sample_ns_.store(monotonic_ns() + kSampleIntervalNs);
    have_base_ = false;  // the next real sample only sets a baseline
    update(other_cores, allowed_cpus);
    return effective();
  }

  ThreadStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return ThreadStats{configured(), effective(), allowed_cpus_, adaptive_.load(), contended_,
                       other_cores_, samples_, changes_, g_parts_run_by_caller.load(),
                       sample_seconds_};
  }

 private:
  void sample(int64_t now) {
    uint64_t busy = 0;
    int cpus = 0;
    const int64_t own = process_cpu_ns();
    const bool ok = read_busy_ticks(&busy, &cpus);
    sample_seconds_ += static_cast<double>(monotonic_ns() - now) * 1e-9;
    if (!ok) {
      adaptive_.store(false);  // nothing to measure with here: keep the configured count
      return;
    }
    ++samples_;
    if (have_base_ && cpus == base_cpus_ && now > base_wall_ns_) {
      static const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
      const double wall = static_cast<double>(now - base_wall_ns_) * 1e-9;
      const double busy_s = static_cast<double>(busy - base_busy_) / ticks_per_second;
      const double own_s = static_cast<double>(own - base_own_ns_) * 1e-9;
      update(std::max(0.0, busy_s - own_s) / wall, cpus);
    }
    have_base_ = true;
    base_busy_ = busy;
    base_cpus_ = cpus;
    base_own_ns_ = own;
    base_wall_ns_ = now;
  }

  void update(double other_cores, int allowed_cpus) {
    other_cores_ = other_cores;
    allowed_cpus_ = allowed_cpus;
    if (other_cores >= kContendedAbove) contended_ = true;
    if (other_cores <= kFreeBelow) contended_ = false;
    apply(decide(), false);
  }

  int decide() const {
    const int n = configured();
    if (!adaptive_.load() || !contended_ || n < 2) return n;
    const int free_cores = static_cast<int>(std::floor(allowed_cpus_ - other_cores_));
    return std::clamp(free_cores, 1, n);
  }

  void apply(int n, bool force_blas) {
    if (n != effective()) ++changes_;
    else if (!force_blas) return;
    effective_.store(n);
    blas_set_threads(n);
  }

  std::atomic<int> configured_, effective_;
  std::atomic<bool> adaptive_{adaptive_from_env()};
  std::atomic<int64_t> next_sample_ns_{0};
  std::mutex mu_;  // sampling and changes of the counts
  bool contended_ = false, have_base_ = false;
  double other_cores_ = -1.0;
  int allowed_cpus_ = 0, base_cpus_ = 0;
  uint64_t base_busy_ = 0;
  int64_t base_own_ns_ = 0, base_wall_ns_ = 0, samples_ = 0, changes_ = 0;
  double sample_seconds_ = 0.0;
};

Pool* g_pool = nullptr;
Policy* g_policy = nullptr;
std::once_flag g_once;

// A forked child has none of the parent's workers: give it a fresh pool (the old one is leaked,
// its mutexes may be held by threads that do not exist in the child). No job is half done at
// fork: parallel_for runs only inside Executable::run, and fork waits for every run in progress
// (runtime.cpp, ForkGate).
void reset_after_fork() {
  g_pool = new Pool();
  if (g_policy) g_policy = new Policy(*g_policy);
}

void init_once() {
  std::call_once(g_once, [] {
    g_pool = new Pool();
    g_policy = new Policy(blas_get_threads());
    pthread_atfork(nullptr, nullptr, reset_after_fork);
  });
}

Pool& pool() {
  init_once();
  return *g_pool;
}

Policy& policy() {
  init_once();
  return *g_policy;
}

}  // namespace

int parallel_threads() { return policy().effective(); }

int configured_threads() { return policy().configured(); }

void set_configured_threads(int n) { policy().set_configured(n); }

void adapt_threads_to_load() { policy().maybe_sample(); }

// Measured with scipy-openblas32 0.3.34 (Haswell kernels) on the 2-core VM, and the same with
// numpy's own OpenBLAS: in a process whose GEMMs have all been single-threaded and small, a
// 64x784 @ 784x256 sgemm (workload A) takes ~2.3 ms of CPU, and ~0.8 ms for the rest of the
// process once one GEMM of at least about 64 x 128 x 512 (or a multi-threaded one) has run;
// the other GEMM shapes of workloads A-E do not change. Where the time goes: the kernel's
// prefetch instruction (perf annotate). A process whose first runs are multi-threaded gets
// there by itself; one that runs single-threaded from its first run (a busy machine seen at
// load, LUCID_NUM_THREADS=1, one core) runs such a GEMM once (8 MFLOP, ~0.7 ms of CPU here:
// repaid by A's second call). Its inputs are read-only zeros from calloc (untouched pages:
// nothing to fault in but the output).
void prime_single_thread_blas() {
#if defined(LUCID_BLAS_SET_THREADS)
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr int M = 64, K = 128, N = 512;
    void* zeros = std::calloc(size_t(K) * N, sizeof(float));  // A and B (read-only) share it
    std::vector<float> c(size_t(M) * N);
    if (!zeros) return;
    const auto* z = static_cast<const float*>(zeros);
    LUCID_SGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, z, K, z, N, 0.0f,
                c.data(), N);
    std::free(zeros);
  });
#endif
}

void set_adaptive_threads(bool on) { policy().set_adaptive(on); }

int observe_load(double other_cores, int allowed_cpus) {
  return policy().observe(other_cores, allowed_cpus);
}

ThreadStats thread_stats() { return policy().stats(); }

void parallel_for(int64_t total, int64_t min_per_part,
                  const std::function<void(int64_t, int64_t)>& fn) {
  int64_t parts = std::min<int64_t>(parallel_threads(), total / std::max<int64_t>(min_per_part, 1));
  if (parts >= 2) {
    auto part_fn = [&](int i) {
      int64_t begin = total * i / parts, end = total * (i + 1) / parts;
      if (begin < end) fn(begin, end);
    };
    if (pool().try_run(static_cast<int>(parts), part_fn)) return;
  }
  fn(0, total);
}

}  // namespace lucid
