// The CPU runtime: buffer planning by liveness, running the steps, and the executable cache.
#include "lucid/runtime.h"

#include <pthread.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <new>
#include <unordered_map>

#include "lucid/parallel.h"
#include "lucid/sgemm.h"

namespace lucid {

namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Best-fit allocator over one arena: freed blocks are reused and coalesced.
class ArenaPlanner {
 public:
  size_t allocate(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    if (best == free_.end()) {
      // Grow into a free block that ends the arena, if any.
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->first + it->second == end_) {
          size_t off = it->first;
          end_ = off + bytes;
          free_.erase(it);
          return off;
        }
      size_t off = end_;
      end_ += bytes;
      return off;
    }
    size_t off = best->first;
    if (best->second > bytes) { best->first += bytes; best->second -= bytes; }
    else free_.erase(best);
    return off;
  }
  void release(size_t off, size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    free_.push_back({off, bytes});
    std::sort(free_.begin(), free_.end());
    std::vector<std::pair<size_t, size_t>> merged;
    for (auto& b : free_) {
      if (!merged.empty() && merged.back().first + merged.back().second == b.first) merged.back().second += b.second;
      else merged.push_back(b);
    }
    free_ = merged;
  }
  size_t end() const { return end_; }

 private:
  std::vector<std::pair<size_t, size_t>> free_;  // (offset, size)
  size_t end_ = 0;
};

// Which in-place results can be computed straight into their feed's buffer instead of being
// copied there after the run. Safe when nothing can tell the difference: the result's instruction
// is elementwise (or a GEMM accumulating into the feed) and reads that feed only at the element
// it writes, no later instruction or copied result reads the feed, and no instruction after it
// can throw, so a failed run still leaves every feed untouched. Feeds that share memory are
// handled at run time.
std::vector<bool> plan_direct_inplace(const Program& p, const std::vector<int>& inplace_feed) {
  const int n_instr = static_cast<int>(p.instrs.size());
  std::vector<int> result_uses(p.slots.size(), 0);
  for (int s : p.results) ++result_uses[s];
  std::vector<int> def(p.slots.size(), -1), last_read(p.slots.size(), -1);
  int last_throw = -1;
  for (int k = 0; k < n_instr; ++k) {
    const Instr& in = p.instrs[k];
    for (int s : in.in) last_read[s] = k;
    for (int s : in.out) def[s] = k;
    if (may_throw_at_run_time(in.op)) last_throw = k;
  }
  std::vector<bool> feed_is_result(p.slots.size(), false);
  for (int s : p.results)
    if (def[s] < 0) feed_is_result[s] = true;
  std::vector<bool> out(p.results.size(), false);
  for (size_t j = 0; j < p.results.size(); ++j) {
    int f = inplace_feed[j];
    int s = p.results[j];
    int k = def[s];
    if (f < 0 || k < 0 || result_uses[s] != 1 || k < last_throw) continue;
    const Instr& in = p.instrs[k];
    int fs = p.feeds[f];
    if (last_read[fs] > k || feed_is_result[fs]) continue;
    bool same_element_reads = true;
    if (is_elementwise(in.op) || in.op == Op::fused) {
      for (int a : in.in)
        if (a == fs && p.slots[a].shape != p.slots[s].shape) same_element_reads = false;
    } else if (in.op == Op::matmul_accumulate) {
      // BLAS reads each accumulator element right before writing it; the factors must differ.
      for (size_t i = 0; i < in.in.size(); ++i)
        if (in.in[i] == fs && i != 2) same_element_reads = false;
    } else {
      same_element_reads = false;
    }
    out[j] = same_element_reads;
  }
  return out;
}

Step make_step(const Program& p, const Instr& in) {
  if (is_elementwise(in.op) || in.op == Op::fused) return make_elementwise_step(p, in);
  if (is_row_kernel(in.op)) return make_row_kernel_step(p, in);
  switch (in.op) {
    case Op::matmul: case Op::matmul_accumulate: case Op::gemm: case Op::conv2d:
    case Op::conv2d_data_grad:
    case Op::conv2d_weights_grad: case Op::max_pool2d: case Op::max_pool2d_grad:
    case Op::avg_pool2d: case Op::avg_pool2d_grad: case Op::conv2d_bias:
    case Op::max_pool2d_relu_grad:
      return make_linalg_step(p, in);
    case Op::reduce_sum: case Op::reduce_mean: case Op::reduce_max: case Op::reduce_min:
    case Op::reduce_prod: case Op::variance: case Op::argmax: case Op::argmin: case Op::softmax:
    case Op::log_softmax: case Op::cumsum: case Op::layer_norm:
      return make_reduce_step(p, in);
    case Op::attention: case Op::attention_grad:
      return make_attention_step(p, in);
    case Op::lstm: case Op::lstm_grad:
      return make_lstm_step(p, in);
    default:
      return make_shape_step(p, in);
  }
}

}  // namespace

// An arena input of elementwise instruction k whose buffer the output can take over: it dies at
// k and has the output's shape and element size. The evaluator reads every input element of a
// block before writing that block's output (elementwise.cpp), so writing over an input read at
// the same element is safe, and the output lands in cache lines the input just brought in
// (workload C's bias + ReLU over a conv output). Single-output instructions only; -1 if none.
// A view (see view_of_) dies with its whole group: `last` holds each group's last reader at
// its root. Returns the root slot whose buffer is taken over.
int Executable::reusable_input(const Program& p, const Instr& in, int k,
                               const std::vector<int>& last) const {
  if (!(is_elementwise(in.op) || in.op == Op::fused) || in.out.size() != 1) return -1;
  const int o = in.out[0];
  if (loc_[o] != Loc::Arena) return -1;
  const Slot& os = p.slots[o];
  for (int s : in.in)
    if (s != o && loc_[s] == Loc::Arena && last[view_of_[s]] == k &&
        p.slots[s].shape == os.shape && dtype_size(p.slots[s].dtype) == dtype_size(os.dtype))
      return view_of_[s];
  return -1;
}

// ---- fork safety ----------------------------------------------------------------------------

namespace {

// Counts the runs in progress. fork's prepare handler raises `forking`, waits for the count to
// drop to zero and holds `mu` across fork. A run enters with one atomic increment (no lock) and
// steps back to wait when it finds a fork pending; each side writes its flag before reading the
// other's (sequentially consistent), so at least one of them sees the other.
struct ForkGate {
  std::atomic<int> active{0};
  std::atomic<bool> forking{false};
  std::mutex mu;
  std::condition_variable cv;
};

ForkGate* g_fork_gate = new ForkGate;  // replaced (never freed) in a forked child

std::mutex& cache_mutex();
std::mutex& idle_arenas_mutex();

void gate_leave(ForkGate* g) {
  if (g->active.fetch_sub(1) == 1 && g->forking.load()) {
    std::lock_guard<std::mutex> lock(g->mu);
    g->cv.notify_all();
  }
}

void gate_enter(ForkGate* g) {
  for (;;) {
    g->active.fetch_add(1);
    if (!g->forking.load()) return;
    gate_leave(g);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [g] { return !g->forking.load(); });
  }
}

void before_fork() {
  ForkGate* g = g_fork_gate;
  g->forking.store(true);
  std::unique_lock<std::mutex> lock(g->mu);
  g->cv.wait(lock, [g] { return g->active.load() == 0; });
  lock.release();  // held across fork; the parent or child handler lets go
  cache_mutex().lock();
  idle_arenas_mutex().lock();
}

void after_fork_in_parent() {
  idle_arenas_mutex().unlock();
  cache_mutex().unlock();
  ForkGate* g = g_fork_gate;
  g->forking.store(false);
  g->mu.unlock();
  g->cv.notify_all();
}

void after_fork_in_child() {
  idle_arenas_mutex().unlock();
  cache_mutex().unlock();  // this thread locked it before fork
  // The condition variable may count waiters that do not exist here: start afresh.
  g_fork_gate = new ForkGate;
}

}  // namespace

void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
}

// Counts the current thread as running an executable while it is inside (see ForkGate).
class Executable::RunGate {
 public:
  RunGate() { enter(); }
  ~RunGate() {
    if (inside_) leave();
  }
  void enter() {
    gate_enter(g_fork_gate);
    inside_ = true;
  }
  void leave() {
    inside_ = false;
    gate_leave(g_fork_gate);
  }

 private:
  bool inside_ = false;
};

namespace {

// One arena's scratch memory, left as the system gives it (every slot is written before it is
// read: arenas are reused across runs, so no kernel relies on zeros). It used to be a zero-filled
// vector: a pass over megabytes that the first run then overwrites. An arena of 256 KiB or more
// is mapped with MAP_POPULATE where there is one: the first run writes all of it anyway, and
// populating the pages in one call costs less than faulting them in one at a time during the
// run (on the 2-core VM: 16 MiB in ~14 ms against ~21 ms of faults; a fresh process's first run
// of workload C or D faults in ~1000 arena pages).
class ArenaMemory {
 public:
  explicit ArenaMemory(size_t bytes) : bytes_(align_up(std::max<size_t>(bytes, 1))) {
#if defined(__linux__) && defined(MAP_POPULATE)
    if (bytes_ >= kPopulateFrom) {
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                     -1, 0);
      if (p != MAP_FAILED) {
        data_ = p;
        mapped_ = true;
        return;
      }
    }
#endif
    data_ = std::aligned_alloc(kAlign, bytes_);
    if (!data_) throw std::bad_alloc();
  }
  ~ArenaMemory() {
#if defined(__linux__) && defined(MAP_POPULATE)
    if (mapped_) {
      munmap(data_, bytes_);
      return;
    }
#endif
    std::free(data_);
  }
  ArenaMemory(const ArenaMemory&) = delete;
  ArenaMemory& operator=(const ArenaMemory&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  static constexpr size_t kPopulateFrom = size_t(256) << 10;
  size_t bytes_;
  void* data_ = nullptr;
  bool mapped_ = false;
};

}  // namespace

// Programs with at least this much work (about one unit per GEMM multiply-add; workload A's
// forward is ~13M) prime the BLAS before their first single-threaded run (parallel.cpp); smaller
// ones (workload E) would pay the priming GEMM for nothing.
constexpr int64_t kBlasPrimeWork = int64_t(1) << 20;

struct Executable::Arena {
  explicit Arena(size_t bytes) : memory(bytes) {}
  ArenaMemory memory;  // 64-byte aligned; offsets are 64-byte multiples
  std::vector<void*> ptrs;
  const Executable* owner = nullptr;
  std::list<Arena*>::iterator idle_pos;  // in IdleArenas::lru while pooled
  size_t bytes() const { return memory.size(); }
};

namespace {

// Every executable keeps the scratch arena of its last run for the next one; with the cache
// holding `capacity` executables of growing shapes, those idle arenas alone grew resident memory
// by capacity x (bytes per batch row) per new shape. One process-wide budget bounds them: past
// it, the least recently used idle arenas are freed (the most recent one is always kept, so a hot
// loop over one large executable never reallocates). One lock for all pools: acquire and release
// hold it for a few pointer moves.
struct IdleArenas {
  std::mutex mu;
  std::list<Executable::Arena*> lru;  // most recently released first
  size_t bytes = 0;
  size_t budget = initial_budget();
  size_t freed = 0;

  static size_t initial_budget() {
    const char* env = std::getenv("LUCID_ARENA_BUDGET_MB");
    if (env && *env) {
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (end && *end == '\0' && v >= 0) return static_cast<size_t>(v) << 20;
    }
    return size_t(32) << 20;
  }
};

IdleArenas& idle_arenas() {
  static IdleArenas* a = new IdleArenas;  // never destroyed, like the cache
  return *a;
}

}  // namespace

size_t Executable::trim_idle_arenas_locked(size_t budget) {
  IdleArenas& g = idle_arenas();
  while (g.bytes > budget && g.lru.size() > 1) {
    Arena* victim = g.lru.back();
    g.lru.pop_back();
    g.bytes -= victim->bytes();
    auto& pool = victim->owner->pool_;
    pool.erase(std::find(pool.begin(), pool.end(), victim));
    delete victim;
    ++g.freed;
  }
  return g.bytes;
}

void set_arena_budget(size_t bytes) {
  IdleArenas& g = idle_arenas();
  std::lock_guard<std::mutex> lock(g.mu);
  g.budget = bytes;
  Executable::trim_idle_arenas_locked(bytes);
}

ArenaStats arena_stats() {
  IdleArenas& g = idle_arenas();
  std::lock_guard<std::mutex> lock(g.mu);
  return {g.lru.size(), g.bytes, g.budget, g.freed};
}

Executable::Executable(Program program) : program_(std::move(program)) {
  validate(program_);
  key_ = structural_key(program_);
  hash_ = fnv1a(key_);
  const Program& p = program_;
  const int n = static_cast<int>(p.slots.size());
  loc_.assign(n, Loc::Arena);
  where_.assign(n, -1);
  for (size_t i = 0; i < p.feeds.size(); ++i) { loc_[p.feeds[i]] = Loc::Feed; where_[p.feeds[i]] = i; }
  // Constants are materialised once, here.
  size_t const_bytes = 0;
  for (const Instr& in : p.instrs)
    if (in.op == Op::constant) {
      loc_[in.out[0]] = Loc::Const;
      where_[in.out[0]] = const_bytes;
      const_bytes += align_up(p.slots[in.out[0]].bytes());
    }
  consts_.assign(const_bytes / sizeof(double) + 1, 0.0);
  for (const Instr& in : p.instrs)
    if (in.op == Op::constant)
      materialize_constant(in, p.slots[in.out[0]], reinterpret_cast<uint8_t*>(consts_.data()) + where_[in.out[0]]);
  inplace_feed_.assign(p.results.size(), -1);
  for (auto [r, f] : p.inplace) inplace_feed_[r] = f;
  // Results are computed straight into their output arrays unless they must be copied there.
  std::vector<bool> direct_inplace = plan_direct_inplace(p, inplace_feed_);
  std::vector<bool> seen(n, false);
  for (size_t j = 0; j < p.results.size(); ++j) {
    int s = p.results[j];
    if (direct_inplace[j]) inplace_direct_.push_back(static_cast<int>(j));
    if (loc_[s] == Loc::Arena && !seen[s] && (inplace_feed_[j] < 0 || direct_inplace[j])) {
      loc_[s] = Loc::Result;
      where_[s] = j;
      direct_.push_back({s, static_cast<int>(j)});
    } else {
      copies_.push_back({static_cast<int>(j), s});
    }
    seen[s] = true;
  }
  // In-place writes go last, so copies that read a feed see its old value.
  std::stable_sort(copies_.begin(), copies_.end(), [&](auto a, auto b) {
    return (inplace_feed_[a.first] >= 0) < (inplace_feed_[b.first] >= 0);
  });
  // A reshape of an arena slot is a view: slots are dense and row-major, so its output is the
  // input's bytes as they are. It shares the input's buffer and runs no step (a copy of 0.5-2
  // MB per reshape in a transformer's training step). view_of_ maps a slot to the slot that
  // owns its buffer (itself unless it is a view).
  const int forever = static_cast<int>(p.instrs.size());
  view_of_.resize(n);
  for (int s = 0; s < n; ++s) view_of_[s] = s;
  std::vector<bool> is_view(forever, false);
  for (int k = 0; k < forever; ++k) {
    const Instr& in = p.instrs[k];
    if (in.op != Op::reshape || loc_[in.out[0]] != Loc::Arena) continue;
    const int owner = view_of_[in.in[0]];
    if (loc_[owner] != Loc::Arena) continue;
    view_of_[in.out[0]] = owner;
    is_view[k] = true;
  }
  // Liveness: a buffer lives from its defining instruction to the last reader of any of its views.
  std::vector<int> last(n, -1);
  for (int k = 0; k < forever; ++k)
    for (int s : p.instrs[k].in) last[s] = k;
  for (auto& c : copies_) last[c.second] = forever;
  for (int s = 0; s < n; ++s) last[view_of_[s]] = std::max(last[view_of_[s]], last[s]);
  ArenaPlanner planner;
  for (int k = 0; k < forever; ++k) {
    const Instr& in = p.instrs[k];
    const int taken = is_view[k] ? -1 : reusable_input(p, in, k, last);
    for (int o : in.out)
      if (loc_[o] == Loc::Arena) {
        unplanned_bytes_ += align_up(p.slots[o].bytes());
        if (is_view[k]) where_[o] = where_[view_of_[o]];
        else where_[o] = taken >= 0 ? where_[taken] : planner.allocate(p.slots[o].bytes());
      }
    // Other inputs are freed after the outputs are placed: apart from the elementwise reuse
    // above, a kernel never reads and writes one buffer.
    std::vector<int> dead;
    for (int s : in.in) dead.push_back(view_of_[s]);
    for (int s : in.out) dead.push_back(view_of_[s]);
    std::sort(dead.begin(), dead.end());
    dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
    for (int s : dead)
      if (s != taken && loc_[s] == Loc::Arena && last[s] <= k)
        planner.release(where_[s], p.slots[s].bytes());
  }
  arena_bytes_ = planner.end();
  // A run may be abandoned until its first step that writes into a feed's buffer.
  std::vector<bool> writes_feed(n, false);
  for (int j : inplace_direct_) writes_feed[p.results[j]] = true;
  abandonable_steps_ = SIZE_MAX;
  // An elementwise output whose only reader is the next instruction, a per-channel sum, is
  // summed as it is computed (make_elementwise_reduce_step) and never written; the sum's own
  // step is then empty.
  std::vector<int> readers(n, 0);
  for (const Instr& in : p.instrs)
    for (int s : in.in) ++readers[s];
  for (int s : p.results) ++readers[s];
  bool summed_by_previous = false;
  for (int k = 0; k < forever; ++k)
    if (p.instrs[k].op != Op::constant && !is_view[k]) {
      for (int o : p.instrs[k].out)
        if (writes_feed[o]) abandonable_steps_ = std::min(abandonable_steps_, steps_.size());
      Step step;
      const Instr& in = p.instrs[k];
      if (summed_by_previous) {
        step = [](void* const*) {};
        summed_by_previous = false;
      } else if ((is_elementwise(in.op) || in.op == Op::fused) && k + 1 < forever &&
                 !is_view[k + 1] && fused_reductions_enabled()) {
        const Instr& next = p.instrs[k + 1];
        for (size_t j = 0; j < in.out.size() && !step; ++j) {
          const int s = in.out[j];
          if (next.in.size() == 1 && next.in[0] == s && readers[s] == 1 &&
              loc_[s] == Loc::Arena && view_of_[s] == s)
            step = make_elementwise_reduce_step(p, in, static_cast<int>(j), next);
        }
        summed_by_previous = static_cast<bool>(step);
        if (summed_by_previous) fused_reductions_.push_back(k + 1);
      }
      if (!step) step = make_step(p, in);
      steps_.push_back(std::move(step));
      step_instr_.push_back(k);
      step_work_.push_back(instr_work(p, p.instrs[k]));
      work_ += step_work_.back();
    }
  abandonable_steps_ = std::min(abandonable_steps_, steps_.size());
}

Executable::~Executable() {
  IdleArenas& g = idle_arenas();
  std::lock_guard<std::mutex> lock(g.mu);
  for (Arena* a : pool_) {
    g.lru.erase(a->idle_pos);
    g.bytes -= a->bytes();
    delete a;
  }
}

std::vector<int64_t> Executable::arena_offsets() const {
  std::vector<int64_t> out(loc_.size(), -1);
  for (size_t s = 0; s < loc_.size(); ++s)
    if (loc_[s] == Loc::Arena) out[s] = where_[s];
  return out;
}

Executable::Arena* Executable::acquire() const {
  {
    IdleArenas& g = idle_arenas();
    std::lock_guard<std::mutex> lock(g.mu);
    if (!pool_.empty()) {
      Arena* a = pool_.back();
      pool_.pop_back();
      g.lru.erase(a->idle_pos);
      g.bytes -= a->bytes();
      return a;
    }
  }
  auto* a = new Arena(arena_bytes_);
  a->owner = this;
  a->ptrs.assign(loc_.size(), nullptr);
  auto* base = static_cast<uint8_t*>(a->memory.data());
  auto* cbase = reinterpret_cast<uint8_t*>(const_cast<double*>(consts_.data()));
  for (size_t s = 0; s < loc_.size(); ++s) {
    if (loc_[s] == Loc::Arena) a->ptrs[s] = base + where_[s];
    else if (loc_[s] == Loc::Const) a->ptrs[s] = cbase + where_[s];
  }
  return a;
}

void Executable::release(Arena* a) const {
  IdleArenas& g = idle_arenas();
  std::lock_guard<std::mutex> lock(g.mu);
  pool_.push_back(a);
  g.lru.push_front(a);
  a->idle_pos = g.lru.begin();
  g.bytes += a->bytes();
  trim_idle_arenas_locked(g.budget);
}

void Executable::run(const std::vector<void*>& feeds, const std::vector<void*>& results,
                     std::vector<double>* step_seconds, const InterruptCheck* interrupt) const {
  RunGate gate;
  GemmRunScope gemm_run;  // GEMMs of this run may share a packed weight (sgemm.h)
  adapt_threads_to_load();
  if (work_ >= kBlasPrimeWork && parallel_threads() == 1) prime_single_thread_blas();
  Arena* a = acquire();
  struct Giveback {
    const Executable* ex;
    Arena* a;
    ~Giveback() { ex->release(a); }
  } giveback{this, a};
  void** ptrs = a->ptrs.data();
  for (size_t i = 0; i < feeds.size(); ++i) ptrs[program_.feeds[i]] = feeds[i];
  for (auto [s, j] : direct_) ptrs[s] = results[j];
  // A feed written in place that shares memory with another feed: compute into scratch and
  // copy after the run, so other feeds are never read after being overwritten.
  std::vector<std::vector<uint8_t>> staged;
  if (!inplace_direct_.empty() && writes_alias_feeds(feeds)) {
    for (int j : inplace_direct_) {
      int s = program_.results[j];
      staged.emplace_back(program_.slots[s].bytes() + 1);
      ptrs[s] = staged.back().data();
    }
  }
  if (step_seconds || interrupt) {
    using clock = std::chrono::steady_clock;
    int64_t work_since_check = 0;
    for (size_t k = 0; k < steps_.size(); ++k) {
      if (interrupt && k < abandonable_steps_ && work_since_check >= kInterruptCheckWork) {
        work_since_check = 0;
        // Between steps this run holds no lock and no worker: a fork may proceed meanwhile.
        gate.leave();
        const bool stop = (*interrupt)();
        gate.enter();
        if (stop) throw RunInterrupted();
      }
      work_since_check += step_work_[k];
      auto t0 = step_seconds ? clock::now() : clock::time_point();
      steps_[k](ptrs);
      if (step_seconds) (*step_seconds)[k] += std::chrono::duration<double>(clock::now() - t0).count();
    }
  } else {
    for (const Step& step : steps_) step(ptrs);
  }
  for (auto [j, s] : copies_) std::memmove(results[j], ptrs[s], program_.slots[s].bytes());
  for (size_t i = 0; i < staged.size(); ++i) {
    int s = program_.results[inplace_direct_[i]];
    std::memcpy(results[inplace_direct_[i]], staged[i].data(), program_.slots[s].bytes());
  }
}

bool Executable::writes_alias_feeds(const std::vector<void*>& feeds) const {
  auto range = [&](size_t i) {
    auto* b = static_cast<const uint8_t*>(feeds[i]);
    return std::make_pair(b, b + program_.slots[program_.feeds[i]].bytes());
  };
  for (int j : inplace_direct_) {
    size_t f = static_cast<size_t>(inplace_feed_[j]);
    auto [lo, hi] = range(f);
    for (size_t i = 0; i < feeds.size(); ++i) {
      if (i == f) continue;
      auto [lo2, hi2] = range(i);
      if (lo < hi2 && lo2 < hi) return true;
    }
  }
  return false;
}

// ---- the process-wide cache ---------------------------------------------------------------------

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
  std::list<std::shared_ptr<Executable>> lru;  // most recent first
  std::unordered_map<std::string, std::list<std::shared_ptr<Executable>>::iterator> index;

  void evict_to(size_t cap) {
    while (lru.size() > cap) {
      index.erase(lru.back()->key());
      lru.pop_back();
      ++evictions;
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: executables may outlive static teardown
  return *c;
}

std::mutex& cache_mutex() { return cache().mu; }
std::mutex& idle_arenas_mutex() { return idle_arenas().mu; }

}  // namespace

std::shared_ptr<Executable> cache_get_or_compile(Program program, bool* hit) {
  Cache& c = cache();
  std::string key = structural_key(program);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.index.find(key);
    if (it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.hits;
      if (hit) *hit = true;
      return *it->second;
    }
  }
  // Compile outside the lock: other threads keep hitting the cache meanwhile.
  auto ex = std::make_shared<Executable>(std::move(program));
  std::lock_guard<std::mutex> lock(c.mu);
  if (hit) *hit = false;
  auto it = c.index.find(key);
  if (it != c.index.end()) {  // another thread compiled the same program first
    ++c.hits;
    return *it->second;
  }
  ++c.misses;
  if (c.capacity == 0) return ex;
  c.lru.push_front(ex);
  c.index[key] = c.lru.begin();
  c.evict_to(c.capacity);
  return ex;
}

void cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lru.clear();
  c.index.clear();
  c.hits = c.misses = c.evictions = 0;
}

void cache_set_capacity(size_t n) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.capacity = n;
  c.evict_to(n);
}

CacheStats cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.lru.size(), c.capacity, c.hits, c.misses, c.evictions};
}

}  // namespace lucid
