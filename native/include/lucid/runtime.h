// Executables (a validated program with planned buffers and one kernel step per instruction) and
// the process-wide executable cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "lucid/kernels.h"
#include "lucid/program.h"

namespace lucid {

// Asked between the steps of a run (after about kInterruptCheckWork units of work, see
// instr_work) while abandoning the run still leaves every feed untouched; returning true
// abandons it with RunInterrupted. Called outside the fork gate (it may take the GIL).
using InterruptCheck = std::function<bool()>;
constexpr int64_t kInterruptCheckWork = int64_t(1) << 22;

struct RunInterrupted : std::runtime_error {
  RunInterrupted() : std::runtime_error("run interrupted") {}
};

// fork() waits for every run in progress to finish (or reach an interrupt check) and for the
// executable cache's lock, so the child never inherits a lock, a busy worker pool or a BLAS
// call half done (OpenBLAS shuts its threads down in its own fork handler, which then finds them
// idle). Installed once, when the module loads.
void install_fork_handlers();

class Executable {
 public:
  // Validates (std::invalid_argument on a malformed program), plans buffers, builds the steps.
  explicit Executable(Program program);
  ~Executable();

  // feeds[i]: feed i's data (C-contiguous, exact dtype and shape, checked by the caller);
  // results[j]: result j's output buffer, or for an in-place result the buffer of its feed.
  // Thread-safe: concurrent runs use separate scratch arenas.
  // With step_seconds (sized like steps()), each step's wall time is added to its entry.
  // With `interrupt`, the run checks it between steps (see InterruptCheck).
  void run(const std::vector<void*>& feeds, const std::vector<void*>& results,
           std::vector<double>* step_seconds = nullptr,
           const InterruptCheck* interrupt = nullptr) const;
  // Instruction index (into program().instrs) of each step; constants and reshapes that are
  // views of their input have no step.
  const std::vector<int>& step_instrs() const { return step_instr_; }

  const Program& program() const { return program_; }
  const std::string& key() const { return key_; }
  uint64_t hash() const { return hash_; }
  size_t arena_bytes() const { return arena_bytes_; }
  // The program's work estimate (sum of instr_work; the validator caps it at kMaxWork).
  int64_t work() const { return work_; }
  // What the intermediates would take without buffer reuse.
  size_t unplanned_bytes() const { return unplanned_bytes_; }
  // Arena offset of each slot, or -1 when the slot is not in the arena.
  std::vector<int64_t> arena_offsets() const;
  // Index of the feed that result j is written into, or -1.
  int inplace_feed(int result) const { return inplace_feed_[result]; }
  // In-place results computed straight into their feed's buffer (no copy after the run).
  const std::vector<int>& direct_inplace_results() const { return inplace_direct_; }
  // Instruction indices of the per-channel sums computed by the elementwise step before them.
  const std::vector<int>& fused_reductions() const { return fused_reductions_; }

  struct Arena;  // one run's scratch memory (runtime.cpp)

 private:
  enum class Loc : uint8_t { Feed, Arena, Const, Result };
  class RunGate;
  Arena* acquire() const;
  bool writes_alias_feeds(const std::vector<void*>& feeds) const;
  int reusable_input(const Program& p, const Instr& in, int k, const std::vector<int>& last) const;
  void release(Arena* a) const;
  // Frees least recently used idle arenas (of any executable) down to `budget` bytes, keeping
  // the most recent; the idle-arena lock must be held. Returns the idle bytes left.
  static size_t trim_idle_arenas_locked(size_t budget);
  friend void set_arena_budget(size_t bytes);

  Program program_;
  std::string key_;
  uint64_t hash_ = 0;
  std::vector<Step> steps_;
  std::vector<int> step_instr_;
  std::vector<int64_t> step_work_;       // instr_work of each step
  size_t abandonable_steps_ = 0;         // steps before the first write into a feed's buffer
  int64_t work_ = 0;
  std::vector<Loc> loc_;
  std::vector<int64_t> where_;
  std::vector<int> view_of_;  // the slot owning each slot's buffer (a reshape's output is a view)
  std::vector<int> inplace_feed_;
  std::vector<std::pair<int, int>> copies_;  // (result index, source slot) copied after the run
  std::vector<std::pair<int, int>> direct_;  // (slot, result index) computed in the output array
  std::vector<int> inplace_direct_;          // in-place results among direct_ (result indices)
  std::vector<int> fused_reductions_;        // see fused_reductions()
  std::vector<double> consts_;               // 8-byte aligned storage of constant slots
  size_t arena_bytes_ = 0, unplanned_bytes_ = 0;
  mutable std::vector<Arena*> pool_;  // idle arenas; guarded by the process-wide idle-arena lock
};

// Idle scratch arenas kept across runs, over all executables: bounded by a byte budget
// (LUCID_ARENA_BUDGET_MB, default 32; the most recently used arena is always kept).
struct ArenaStats {
  size_t idle, idle_bytes, budget, freed;
};
void set_arena_budget(size_t bytes);
ArenaStats arena_stats();

struct CacheStats {
  size_t size, capacity, hits, misses, evictions;
};

// Returns the cached executable of an equal program, or compiles and caches it (LRU).
std::shared_ptr<Executable> cache_get_or_compile(Program program, bool* hit = nullptr);
void cache_clear();
void cache_set_capacity(size_t n);
CacheStats cache_stats();

}  // namespace lucid
