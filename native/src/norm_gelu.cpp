// Row kernels of a transformer block that kernel fusion (lucid/backends/cpu/kernel_fusion.py)
// folds out of the autodiff graph: GELU (erf form) forward, GELU's gradient, and layer norm's
// backward. Each is one pass over its rows where the prim graph made several passes over the
// whole tensor (layer norm's backward: five row reductions, a pow, eight elementwise passes and
// three column sums).
//
// Column sums (the bias gradient of the linear layer before the kernel, gamma's and beta's
// gradients) are accumulated per chunk of kChunkRows rows and the chunks' partial sums are added
// in chunk order afterwards: the chunks do not depend on the thread count, so the results are
// bit-identical on one thread or several.
//
// The loops are compiled twice, for the baseline ISA and for AVX2 + FMA (picked at run time, as
// elementwise_f32.cpp does): the package is built for the baseline x86-64.
#include <algorithm>
#include <cmath>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <cstring>
#include <vector>

#include "lucid/fastmath.h"
#include "lucid/gelu.h"
#include "lucid/gelu_avx2.h"
#include "lucid/kernels.h"
#include "lucid/parallel.h"
#include "lucid/row_sums.h"

namespace lucid {

namespace {

constexpr int64_t kChunkRows = 32;
// Below this many elements a kernel runs on the calling thread (as softmax and layer_norm).
constexpr int64_t kParallelMinElements = int64_t(1) << 16;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// ---- kernels over a range of rows ---------------------------------------------------------

template <class T>
[[gnu::always_inline]] inline void gelu_range(const T* x, T* y, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * gelu_cdf(x[i]);
}

// dx = dy * gelu'(x) over `rows` rows of n; `colsum` (n, may be null) += the column sums of dx.
template <class T>
[[gnu::always_inline]] inline void gelu_grad_rows(const T* dy, const T* x, T* dx, T* colsum,
                                                  int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * n;
    const T* xr = x + r * n;
    T* dxr = dx + r * n;
#pragma GCC ivdep
    for (int64_t k = 0; k < n; ++k) dxr[k] = dyr[k] * gelu_slope(xr[k]);
    if (colsum != nullptr) {
#pragma GCC ivdep
      for (int64_t k = 0; k < n; ++k) colsum[k] += dxr[k];
    }
  }
}

// Layer norm's backward over `rows` rows of n, statistics recomputed per row (mean and variance
// accumulated in double, as the forward kernel does): with xhat = (x - mean) * rstd and
// g = dy * gamma,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// and the column sums dgamma += dy * xhat, dbeta += dy, dxsum += dx (dxsum may be null). The
// row stays in L1 across the passes; `scratch` holds 2 n values (xhat and g of the row).
template <class T>
[[gnu::always_inline]] inline void layer_norm_grad_rows(const T* dy, const T* x, const T* gamma,
                                                        double eps, T* dx, T* dgamma, T* dbeta,
                                                        T* dxsum, T* scratch, int64_t rows,
                                                        int64_t n) {
  T* xhat = scratch;
  T* g = scratch + n;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    T* dxr = dx + r * n;
    const double mean_d = sum_run(xr, n) * inv_n;
    const T mean = static_cast<T>(mean_d);
    const double var = sq_dev_run(xr, n, mean_d);
    const T rstd = static_cast<T>(1.0 / std::sqrt(var * inv_n + eps));
#pragma GCC ivdep
    for (int64_t k = 0; k < n; ++k) {
      xhat[k] = (xr[k] - mean) * rstd;
      g[k] = dyr[k] * gamma[k];
      dgamma[k] += dyr[k] * xhat[k];
      dbeta[k] += dyr[k];
    }
    const T mean_g = static_cast<T>(sum_run(g, n) * inv_n);
    double gx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
      for (int l = 0; l < 8; ++l)
        gx[l] += static_cast<double>(g[k + l]) * static_cast<double>(xhat[k + l]);
    double sgx = 0;
    for (; k < n; ++k) sgx += static_cast<double>(g[k]) * static_cast<double>(xhat[k]);
    sgx += ((gx[0] + gx[1]) + (gx[2] + gx[3])) + ((gx[4] + gx[5]) + (gx[6] + gx[7]));
    const T mean_gx = static_cast<T>(sgx * inv_n);
#pragma GCC ivdep
    for (k = 0; k < n; ++k) dxr[k] = rstd * ((g[k] - mean_g) - xhat[k] * mean_gx);
    if (dxsum != nullptr) {
#pragma GCC ivdep
      for (k = 0; k < n; ++k) dxsum[k] += dxr[k];
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// float32 GELU and its gradient with AVX2 + FMA intrinsics (the vector functions are in
// lucid/gelu_avx2.h, shared with the GEMM's epilogue): the compiler does not contract the
// portable loops into FMAs (-ffp-contract=off), which doubled their instruction count; GELU's
// share of workload D was that of a small GEMM.
LUCID_AVX2 void gelu_avx2_f32(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, gelu8(v));
  }
  for (; i < n; ++i) y[i] = x[i] * gelu_cdf(x[i]);
}

LUCID_AVX2 void gelu_grad_avx2_f32(const float* dy, const float* x, float* dx, float* colsum,
                                   int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * n;
    const float* xr = x + r * n;
    float* dxr = dx + r * n;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
      const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(dyr + k), gelu_slope8(_mm256_loadu_ps(xr + k)));
      _mm256_storeu_ps(dxr + k, d);
      if (colsum != nullptr) _mm256_storeu_ps(colsum + k, _mm256_add_ps(_mm256_loadu_ps(colsum + k), d));
    }
    for (; k < n; ++k) {
      dxr[k] = dyr[k] * gelu_slope(xr[k]);
      if (colsum != nullptr) colsum[k] += dxr[k];
    }
  }
}
#endif

#define LUCID_ROW_KERNELS(SUFFIX, TARGET)                                                        \
  template <class T>                                                                             \
  TARGET void gelu_##SUFFIX(const T* x, T* y, int64_t n) {                                       \
    gelu_range(x, y, n);                                                                         \
  }                                                                                              \
  template <class T>                                                                             \
  TARGET void gelu_grad_##SUFFIX(const T* dy, const T* x, T* dx, T* colsum, int64_t rows,       \
                                 int64_t n) {                                                    \
    gelu_grad_rows(dy, x, dx, colsum, rows, n);                                                  \
  }                                                                                              \
  template <class T>                                                                             \
  TARGET void layer_norm_grad_##SUFFIX(const T* dy, const T* x, const T* gamma, double eps,      \
                                       T* dx, T* dgamma, T* dbeta, T* dxsum, T* scratch,         \
                                       int64_t rows, int64_t n) {                                \
    layer_norm_grad_rows(dy, x, gamma, eps, dx, dgamma, dbeta, dxsum, scratch, rows, n);        \
  }

LUCID_ROW_KERNELS(base, )
#if defined(__x86_64__) && defined(__GNUC__)
LUCID_ROW_KERNELS(avx2, __attribute__((target("avx2,fma"))))
bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#define LUCID_PICK(NAME, T, ...) \
  (use_avx2() ? NAME##_avx2<T>(__VA_ARGS__) : NAME##_base<T>(__VA_ARGS__))
#else
#define LUCID_PICK(NAME, T, ...) NAME##_base<T>(__VA_ARGS__)
#endif

// ---- drivers: rows in chunks, chunks across the worker pool -------------------------------

// Runs fn(chunk_begin, chunk_end) over the chunks of `rows` rows (kChunkRows each), split across
// the pool when the tensor is large enough.
template <class Fn>
void for_chunks(int64_t rows, int64_t n, Fn&& fn) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  if (chunks == 0) return;
  if (rows * n < kParallelMinElements || chunks < 2) return fn(int64_t(0), chunks);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) { fn(c0, c1); });
}

// Adds the chunks' partial column sums (count of them, `width` each, in `parts`) in chunk order.
template <class T>
void add_partials(const std::vector<T>& parts, int64_t count, int64_t width, int64_t offset,
                  int64_t stride, T* out) {
  for (int64_t k = 0; k < width; ++k) out[k] = T(0);
  for (int64_t c = 0; c < count; ++c) {
    const T* p = parts.data() + c * stride + offset;
    for (int64_t k = 0; k < width; ++k) out[k] += p[k];
  }
}

template <class T>
void run_gelu(const T* x, T* y, int64_t total) {
  constexpr int64_t block = 4096;
  const int64_t blocks = (total + block - 1) / block;
  auto some = [&](int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * block, i1 = std::min(total, b1 * block);
    if (i1 <= i0) return;
#if defined(__x86_64__) && defined(__GNUC__)
    if constexpr (std::is_same_v<T, float>)
      if (use_avx2()) return gelu_avx2_f32(x + i0, y + i0, i1 - i0);
#endif
    LUCID_PICK(gelu, T, x + i0, y + i0, i1 - i0);
  };
  if (total < kParallelMinElements) return some(0, blocks);
  parallel_for(blocks, 1, some);
}

template <class T>
void run_gelu_grad(const T* dy, const T* x, T* dx, T* colsum, int64_t rows, int64_t n) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  std::vector<T> parts(colsum != nullptr ? static_cast<size_t>(chunks * n) : 0, T(0));
  for_chunks(rows, n, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * kChunkRows, r1 = std::min(rows, r0 + kChunkRows);
      T* part = colsum != nullptr ? parts.data() + c * n : nullptr;
#if defined(__x86_64__) && defined(__GNUC__)
      if constexpr (std::is_same_v<T, float>)
        if (use_avx2()) {
          gelu_grad_avx2_f32(dy + r0 * n, x + r0 * n, dx + r0 * n, part, r1 - r0, n);
          continue;
        }
#endif
      LUCID_PICK(gelu_grad, T, dy + r0 * n, x + r0 * n, dx + r0 * n, part, r1 - r0, n);
    }
  });
  if (colsum != nullptr) add_partials(parts, chunks, n, 0, n, colsum);
}

template <class T>
void run_layer_norm_grad(const T* dy, const T* x, const T* gamma, double eps, T* dx, T* dgamma,
                         T* dbeta, T* dxsum, int64_t rows, int64_t n) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  // Per chunk: dgamma, dbeta, dxsum partials, then the row scratch (xhat, g).
  const int64_t stride = 5 * n;
  std::vector<T> parts(static_cast<size_t>(std::max<int64_t>(chunks, 1) * stride), T(0));
  for_chunks(rows, n, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * kChunkRows, r1 = std::min(rows, r0 + kChunkRows);
      T* p = parts.data() + c * stride;
      LUCID_PICK(layer_norm_grad, T, dy + r0 * n, x + r0 * n, gamma, eps, dx + r0 * n, p, p + n,
                 dxsum != nullptr ? p + 2 * n : nullptr, p + 3 * n, r1 - r0, n);
    }
  });
  add_partials(parts, chunks, n, 0, stride, dgamma);
  add_partials(parts, chunks, n, n, stride, dbeta);
  if (dxsum != nullptr) add_partials(parts, chunks, n, 2 * n, stride, dxsum);
}

}  // namespace

bool is_row_kernel(Op op) {
  return op == Op::gelu || op == Op::gelu_grad || op == Op::layer_norm_grad;
}

std::vector<Slot> infer_row_kernel(const Program& p, const Instr& in) {
  const char* name = op_name(in.op);
  auto arg = [&](size_t i) -> const Slot& { return p.slots[in.in[i]]; };
  const size_t operands = in.op == Op::gelu ? 1 : in.op == Op::gelu_grad ? 2 : 3;
  if (in.in.size() != operands)
    fail(std::string(name) + " takes " + std::to_string(operands) + " operand(s), got " +
         std::to_string(in.in.size()));
  const Slot& x = arg(in.op == Op::gelu ? 0 : 1);
  if (!is_float(x.dtype)) fail(std::string(name) + " needs a float dtype, got " + dtype_name(x.dtype));
  for (size_t i = 0; i < operands; ++i)
    if (arg(i).dtype != x.dtype)
      fail(std::string(name) + ": operands must share one dtype, got " + dtype_name(arg(i).dtype) +
           " and " + dtype_name(x.dtype));
  if (in.op == Op::gelu) {
    if (in.out.size() != 1) fail("gelu has 1 output, got " + std::to_string(in.out.size()));
    return {x};
  }
  if (x.shape.empty()) fail(std::string(name) + " needs an input of rank >= 1");
  if (arg(0).shape != x.shape)
    fail(std::string(name) + ": the gradient has shape " + shape_str(arg(0).shape) +
         ", the input " + shape_str(x.shape));
  const Slot column{{x.shape.back()}, x.dtype};
  if (in.op == Op::gelu_grad) {
    // dx, then optionally dx's column sums (the bias gradient of the layer before).
    if (in.out.size() != 1 && in.out.size() != 2)
      fail("gelu_grad has 1 or 2 outputs (dx, column sums of dx), got " +
           std::to_string(in.out.size()));
    std::vector<Slot> out{x};
    if (in.out.size() == 2) out.push_back(column);
    return out;
  }
  if (arg(2).shape != column.shape)
    fail("layer_norm_grad: weight needs shape " + shape_str(column.shape) + ", got " +
         shape_str(arg(2).shape));
  attr_float(in, "epsilon");
  if (in.out.size() != 3 && in.out.size() != 4)
    fail("layer_norm_grad has 3 or 4 outputs (dx, dweight, dbias, column sums of dx), got " +
         std::to_string(in.out.size()));
  std::vector<Slot> out{x, column, column};
  if (in.out.size() == 4) out.push_back(column);
  return out;
}

Step make_row_kernel_step(const Program& p, const Instr& in) {
  const DType d = p.slots[in.out[0]].dtype;
  std::vector<int> ins = in.in, outs = in.out;
  if (in.op == Op::gelu) {
    const int64_t total = p.slots[in.in[0]].size();
    return [=](void* const* s) {
      if (d == DType::F32) run_gelu(static_cast<const float*>(s[ins[0]]), static_cast<float*>(s[outs[0]]), total);
      else run_gelu(static_cast<const double*>(s[ins[0]]), static_cast<double*>(s[outs[0]]), total);
    };
  }
  const Shape& shape = p.slots[in.in[1]].shape;
  const int64_t n = shape.back(), rows = n == 0 ? 0 : numel(shape) / n;
  if (in.op == Op::gelu_grad) {
    return [=](void* const* s) {
      dispatch_dtype(d, [&](auto t) {
        using T = decltype(t);
        if constexpr (std::is_floating_point_v<T>) {
          T* colsum = outs.size() == 2 ? static_cast<T*>(s[outs[1]]) : nullptr;
          if (colsum != nullptr && rows == 0) std::fill(colsum, colsum + n, T(0));
          run_gelu_grad(static_cast<const T*>(s[ins[0]]), static_cast<const T*>(s[ins[1]]),
                        static_cast<T*>(s[outs[0]]), colsum, rows, n);
        }
      });
    };
  }
  const double eps = attr_float(in, "epsilon");
  return [=](void* const* s) {
    dispatch_dtype(d, [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_floating_point_v<T>) {
        T* dxsum = outs.size() == 4 ? static_cast<T*>(s[outs[3]]) : nullptr;
        run_layer_norm_grad(static_cast<const T*>(s[ins[0]]), static_cast<const T*>(s[ins[1]]),
                            static_cast<const T*>(s[ins[2]]), eps, static_cast<T*>(s[outs[0]]),
                            static_cast<T*>(s[outs[1]]), static_cast<T*>(s[outs[2]]), dxsum, rows,
                            n);
      }
    });
  };
}

}  // namespace lucid
