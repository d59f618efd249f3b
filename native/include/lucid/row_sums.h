// Sums over a contiguous run in double with eight independent partial sums (they pipeline and
// vectorize), shared by the reductions and the row kernels so that a statistic recomputed in a
// backward kernel has the forward's bits. Always inlined: a caller compiled for AVX2 gets them
// compiled for AVX2 too.
#pragma once

#include <cstdint>

namespace lucid {

template <class T>
[[gnu::always_inline]] inline double sum_run(const T* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(x[k + l]);
  double s = 0;
  for (; k < n; ++k) s += static_cast<double>(x[k]);
  return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Sum of squared deviations from `mean`.
template <class T>
[[gnu::always_inline]] inline double sq_dev_run(const T* x, int64_t n, double mean) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) {
      double d = static_cast<double>(x[k + l]) - mean;
      acc[l] += d * d;
    }
  double s = 0;
  for (; k < n; ++k) s += (static_cast<double>(x[k]) - mean) * (static_cast<double>(x[k]) - mean);
  return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace lucid
