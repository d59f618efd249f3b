// Batches of small GEMMs (attention's per-head, per-sequence products) split across the worker
// pool. OpenBLAS runs a GEMM of few multiply-adds on the calling thread alone, so a batch of
// them otherwise leaves every core but one idle; each entry is still one BLAS call computing
// exactly what the serial loop computes, so results do not depend on the split.
#include <algorithm>
#include <type_traits>

#include "lucid/blas.h"
#include "lucid/kernels.h"
#include "lucid/parallel.h"

namespace lucid {

namespace {

// OpenBLAS keeps a GEMM with M*N*K at or below 65536 * GEMM_MULTITHREAD_THRESHOLD (4 by
// default) on one thread (interface/gemm.c); above it, it threads the call itself.
constexpr double kBlasSingleThreadMacs = 65536.0 * 4;
// Waking a worker costs a few microseconds: give each part at least this many multiply-adds.
constexpr int64_t kMinMacsPerPart = 1 << 17;

template <class T>
void gemm_one(const BatchedGemm<T>& g, int64_t i) {
  blas_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A + g.a_off[i], g.lda, g.B + g.b_off[i], g.ldb,
            g.beta, g.C + g.c_off[i], g.ldc);
}

template <class T>
bool batch_parallel(const BatchedGemm<T>& g) {
  if (g.batch < 2 || g.M <= 0 || g.N <= 0 || g.K <= 0) return false;
  const double macs = static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
  if (macs > kBlasSingleThreadMacs || parallel_threads() < 2) return false;
  const int64_t entries_per_part =
      std::max<int64_t>(1, kMinMacsPerPart / std::max<int64_t>(1, static_cast<int64_t>(macs)));
  if (g.batch < 2 * entries_per_part) return false;
  parallel_for(g.batch, entries_per_part, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) gemm_one<T>(g, i);
  });
  return true;
}

}  // namespace

bool gemm_batch_parallel(const BatchedGemm<float>& g) { return batch_parallel(g); }
bool gemm_batch_parallel(const BatchedGemm<double>& g) { return batch_parallel(g); }

}  // namespace lucid
