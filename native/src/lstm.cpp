// The LSTM recurrence of one layer and direction as one kernel (the prim composites `lstm` and
// `lstm_grad`, lucid/ir/prim/_rnn.py), forward and backpropagation through time.
//
// Float32 forward where the CPU has AVX-512 (and Lucid's GEMM runs its AVX-512 tile: sgemm_isa):
// W_hh is packed once per call into blocks of 16 hidden units whose four gates' weights sit side
// by side (64 columns per contraction step), and each step computes a block's [rows, 64] gate
// pre-activations in 24 zmm registers (6 rows x 4 gates) and finishes the cell on them there:
// the bias and the step's input projection added, the nonlinearities, the state update. A step
// is one pass over the blocks split across the worker pool; no gate goes through memory (except
// the activated gates training saves). Elsewhere (float64, AVX2 only):
//
// The recurrent product of a step, [N, H] x [H, 4H] with N (the batch) small, is computed
// transposed: gatesᵀ[4H, N] = W_hh[4H, H] hᵀ. The weight is then the GEMM's left operand, which
// Lucid's sgemm reads in place (rows along the contraction), and only the small state is packed:
// no step copies the weight (the unrolled graph packed all of W_hh once per step). The backward's
// product dhᵀ[H, N] = W_hhᵀ dpreᵀ reads a transposed copy of W_hh made once per call; the
// weight's gradient is one GEMM over all steps at the end. The gate nonlinearities and the state
// update of a step run fused, one pass per batch row, split across the worker pool.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SSE2__) || defined(__x86_64__)
#include <immintrin.h>
#endif

#include "lucid/blas.h"
#include "lucid/fastmath.h"
#include "lucid/kernels.h"
#include "lucid/parallel.h"
#include "lucid/program.h"
#include "lucid/sgemm.h"

namespace lucid {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

struct LstmPlan {
  bool grad = false, reverse = false, save = false;
  DType dtype = DType::F32;
  int64_t L = 0, N = 0, H = 0;
  bool bias = false, d_cells = false, d_gates = false;  // full operands (else 0-d)
  std::vector<int> in, out;
};

bool bool_attr(const Instr& in, const char* name) {
  return in.attrs.count(name) ? attr_bool(in, name) : false;
}

LstmPlan plan(const Program& p, const Instr& in) {
  LstmPlan a;
  a.grad = in.op == Op::lstm_grad;
  a.reverse = bool_attr(in, "reverse");
  a.in = in.in;
  a.out = in.out;
  const char* op = a.grad ? "lstm_grad" : "lstm";
  const size_t operands = a.grad ? 11 : 5;
  if (in.in.size() != operands)
    fail(std::string(op) + " takes " + std::to_string(operands) + " operands, got " +
         std::to_string(in.in.size()));
  // Operand positions of the shared ones: x (or gates), h0, c0, w_hh.
  const int xi = a.grad ? 10 : 0, h0i = a.grad ? 5 : 1, c0i = a.grad ? 6 : 2, wi = a.grad ? 7 : 3;
  const Slot& x = p.slots[in.in[xi]];
  const Slot& w = p.slots[in.in[wi]];
  a.dtype = x.dtype;
  if (!is_float(x.dtype)) fail(std::string(op) + " needs f32 or f64 operands");
  for (int s : in.in)
    if (p.slots[s].dtype != x.dtype) fail(std::string(op) + " needs operands of one dtype");
  if (x.shape.size() != 3 || w.shape.size() != 2 || w.shape[0] != 4 * w.shape[1] ||
      x.shape[2] != w.shape[0] || x.shape[0] < 1)
    fail(std::string(op) + " needs x [L >= 1, N, 4H] and w_hh [4H, H], got " +
         shape_str(x.shape) + " and " + shape_str(w.shape));
  a.L = x.shape[0], a.N = x.shape[1], a.H = w.shape[1];
  const Shape state{a.N, a.H}, seq{a.L, a.N, a.H};
  auto need = [&](int i, const Shape& s, const char* name, bool zero_d_ok) {
    const Shape& got = p.slots[in.in[i]].shape;
    if (got == s) return true;
    if (zero_d_ok && got.empty()) return false;
    fail(std::string(op) + ": " + name + " must be " + shape_str(s) +
         (zero_d_ok ? " or 0-d" : "") + ", got " + shape_str(got));
  };
  need(h0i, state, "h0", false);
  need(c0i, state, "c0", false);
  if (!a.grad) {
    a.bias = need(4, Shape{4 * a.H}, "b_hh", true);
    a.save = bool_attr(in, "save");
    const size_t outs = a.save ? 5 : 3;
    if (in.out.size() != outs)
      fail(std::string("lstm") + (a.save ? " with save" : "") + " has " + std::to_string(outs) +
           " outputs, got " + std::to_string(in.out.size()));
  } else {
    need(0, seq, "dy", false);
    need(1, state, "dh_n", false);
    need(2, state, "dc_n", false);
    a.d_cells = need(3, seq, "d_cells", true);
    a.d_gates = need(4, x.shape, "d_gates", true);
    need(8, seq, "y", false);
    need(9, seq, "cells", false);
    if (in.out.size() != 4)
      fail("lstm_grad has 4 outputs, got " + std::to_string(in.out.size()));
  }
  return a;
}

// --- math of one element

template <class T>
inline T sigmoid_of(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + fast_expf(-x));
  else return T(1) / (T(1) + std::exp(-x));
}

// tanh for float, branch-free so row loops vectorize: (1 - e) / (1 + e) with e = exp(-2|x|),
// and below |x| = 1/4 (where 1 - e would cancel) its odd Taylor series to x^9 (next term < 3e-9
// relative); about 2 ulp.
inline float fast_tanhf(float x) {
  const float ax = std::fabs(x);
  const float e = fast_expf(-2.0f * ax);
  const float big = (1.0f - e) / (1.0f + e);
  const float x2 = x * x;
  float p = 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const float small = ax + ax * x2 * p;
  const float r = ax < 0.25f ? small : big;
  return x < 0.0f ? -r : r;
}

template <class T>
inline T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) return fast_tanhf(x);
  else return std::tanh(x);
}

// C[M, N] = op(A) op(B) + beta C on Lucid's sgemm (float, AVX2) or the BLAS.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_supported()) return sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  blas_gemm<T>(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
}

template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(std::max<int64_t>(n, 1))]);
}

// The training forward's saved cells and gates (20 MB per layer of workload H) are read only by
// the backward: written past the caches (non-temporal stores) so they do not evict W_hh, which
// every step reads again.
template <class T>
inline void store_saved(T* dst, const T* src, int64_t n) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
      for (; i < n; ++i) dst[i] = src[i];
      return;
    }
  }
#endif
  std::memcpy(dst, src, sizeof(T) * static_cast<size_t>(n));
}

inline void saved_stores_done() {
#if defined(__SSE2__)
  _mm_sfence();  // the streamed stores are visible to whoever joins this part
#endif
}

// Batch rows [0, N) in parts across the pool (a row is 4H gates: about 60 ns of work each).
void for_rows(int64_t N, int64_t H, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for(N, std::max<int64_t>(1, 4096 / std::max<int64_t>(H, 1)), fn);
}

#if defined(__x86_64__) && defined(__GNUC__)

// Hidden units per block of the packed weight, and its columns per contraction step.
constexpr int64_t kUnits = 16, kBlockCols = 4 * kUnits;
// Batch rows per register tile: 6 rows x 4 gates in 24 accumulators.
constexpr int kTileRows = 6;

// A grow-only 64-byte-aligned buffer per thread (the packed weight of the last call).
struct AlignedScratch {
  float* data = nullptr;
  size_t floats = 0;
  AlignedScratch() = default;
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  ~AlignedScratch() { std::free(data); }
  float* get(size_t n) {
    if (n > floats) {
      std::free(data);
      data = nullptr;
      floats = 0;
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data == nullptr) throw std::bad_alloc();
      floats = n;
    }
    return data;
  }
};
thread_local AlignedScratch t_packed_w;

// W_hh [4H, H] into blocks of kUnits hidden units: block u, step k holds the 64 weights
// [gate q][unit j] = W[q * H + 16u + j][k] (zero for units past H). Copied 16 steps at a time,
// so the 64 columns being written (4 KB) stay in L1 while each weight row is read in order.
void pack_gate_blocks(const float* w, int64_t H, float* dst) {
  const int64_t blocks = (H + kUnits - 1) / kUnits;
  parallel_for(blocks, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* d = dst + u * H * kBlockCols;
      for (int64_t k0 = 0; k0 < H; k0 += 16) {
        const int64_t k1 = std::min(H, k0 + 16);
        for (int64_t q = 0; q < 4; ++q)
          for (int64_t j = 0; j < kUnits; ++j) {
            const int64_t unit = u * kUnits + j;
            float* col = d + q * kUnits + j;
            const float* row = unit < H ? w + (q * H + unit) * H : nullptr;
            for (int64_t k = k0; k < k1; ++k) col[k * kBlockCols] = row ? row[k] : 0.0f;
          }
      }
    }
  });
}

// exp on 16 lanes: fast_expf's Cephes polynomial (clamped; NaN passes through the clamp's
// max/min as fast_expf's select does not, so it is put back at the end).
LUCID_TARGET_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.72283905206835f), lo = _mm512_set1_ps(-86.6f);
  const __m512 c = _mm512_max_ps(lo, _mm512_min_ps(hi, x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // 2^n as 2 * 2^(n-1): n reaches 128 near the overflow bound.
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(126)), 23);
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e)), _mm512_set1_ps(2.0f));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

LUCID_TARGET_AVX512 inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// fast_tanhf on 16 lanes: (1 - e) / (1 + e) with e = exp(-2|x|), the odd series below 1/4.
LUCID_TARGET_AVX512 inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), ax));
  const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(62.0f / 2835.0f);
  p = _mm512_fmsub_ps(p, x2, _mm512_set1_ps(17.0f / 315.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmsub_ps(p, x2, _mm512_set1_ps(1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(ax, x2), p, ax);
  const __m512 r = _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.25f), _CMP_LT_OQ),
                                      small);
  // The sign of x back on (x's sign bit; NaN stays NaN through the big branch).
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}

// What one step reads and writes (rows of the batch; gate q of row n at q * H in its row).
struct StepIO {
  int64_t H, G;
  const float* h;   // the previous state [N, H]
  const float* x;   // the step's input projection [N, 4H]
  const float* b;   // b_hh [4H] or null
  float* c;         // the cell state [N, H], updated in place
  float* y;         // the step's output (the next h) [N, H]
  float* cells;     // saved cells [N, H] or null
  float* gates;     // saved activated gates [N, 4H] or null
};

// Contraction steps per pass over a block's rows: 96 steps of 64 weights (24 KB) stay in L1
// while every row tile of the batch reads them (a whole block, 128 KB at H = 512, does not).
constexpr int64_t kStepsPerPass = 96;

// Rows [n0, n0 + R) of hidden-unit block u over contraction steps [k0, k1) (`wb` at step k0):
// the gate sums in registers, resumed from and parked in `partial` (R x 64, in L1) between
// passes; after the last pass the cell on them (units past H masked off).
template <int R>
LUCID_TARGET_AVX512 void step_tile(const StepIO& s, const float* __restrict wb, int64_t n0,
                                 int64_t u, int64_t k0, int64_t k1, float* __restrict partial) {
  const int64_t H = s.H, j0 = u * kUnits;
  const bool first = k0 == 0, last = k1 == H;
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      acc[r][q] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + r * kBlockCols + 16 * q);
  if (first || last) {
    // The rows' input projections and cells, which the cell reads after the last pass: this
    // step's x (N x 4H) comes from memory, and the loads stalled the cell (a quarter of the
    // kernel's time at H = 512) before they were fetched during the passes.
    const int hint = last ? _MM_HINT_T0 : _MM_HINT_T1;
    for (int r = 0; r < R; ++r) {
      const float* xr = s.x + (n0 + r) * s.G + j0;
      for (int q = 0; q < 4; ++q)
        hint == _MM_HINT_T0 ? _mm_prefetch(reinterpret_cast<const char*>(xr + q * H), _MM_HINT_T0)
                            : _mm_prefetch(reinterpret_cast<const char*>(xr + q * H), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(s.c + (n0 + r) * H + j0), _MM_HINT_T0);
    }
  }
  const float* __restrict h = s.h + n0 * H;
#pragma GCC unroll 2
  for (int64_t k = k0; k < k1; ++k) {
    const __m512 w0 = _mm512_load_ps(wb), w1 = _mm512_load_ps(wb + 16);
    const __m512 w2 = _mm512_load_ps(wb + 32), w3 = _mm512_load_ps(wb + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 hv = _mm512_set1_ps(h[r * H + k]);
      acc[r][0] = _mm512_fmadd_ps(hv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(hv, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(hv, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(hv, w3, acc[r][3]);
    }
    wb += kBlockCols;
  }
  if (!last) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) _mm512_store_ps(partial + r * kBlockCols + 16 * q, acc[r][q]);
    return;
  }
  const int64_t units = std::min<int64_t>(kUnits, H - j0);
  const __mmask16 m = units >= kUnits ? __mmask16(0xFFFF) : __mmask16((1u << units) - 1);
  __m512 bias[4];
  for (int q = 0; q < 4; ++q)
    bias[q] = s.b != nullptr ? _mm512_maskz_loadu_ps(m, s.b + q * H + j0) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t n = n0 + r;
    const float* xr = s.x + n * s.G + j0;
    __m512 act[4];
    for (int q = 0; q < 4; ++q) {
      // x + (h W_hhᵀ + b_hh): the order the linear op and the add of the unrolled cell take.
      const __m512 pre = _mm512_add_ps(_mm512_maskz_loadu_ps(m, xr + q * H),
                                       _mm512_add_ps(acc[r][q], bias[q]));
      act[q] = q == 2 ? tanh16(pre) : sigmoid16(pre);
    }
    float* cr = s.c + n * H + j0;
    const __m512 cn = _mm512_add_ps(_mm512_mul_ps(act[0], act[2]),
                                    _mm512_mul_ps(act[1], _mm512_maskz_loadu_ps(m, cr)));
    _mm512_mask_storeu_ps(cr, m, cn);
    _mm512_mask_storeu_ps(s.y + n * H + j0, m, _mm512_mul_ps(act[3], tanh16(cn)));
    if (s.cells != nullptr) _mm512_mask_storeu_ps(s.cells + n * H + j0, m, cn);
    if (s.gates != nullptr)
      for (int q = 0; q < 4; ++q) _mm512_mask_storeu_ps(s.gates + n * s.G + q * H + j0, m, act[q]);
  }
}

// Blocks [u0, u1) of one step over all N rows, kTileRows at a time (the last tile narrower),
// kStepsPerPass contraction steps per pass over the rows.
LUCID_TARGET_AVX512 void step_blocks(const StepIO& s, const float* packed, int64_t N, int64_t u0,
                                   int64_t u1) {
  using TileFn = void (*)(const StepIO&, const float*, int64_t, int64_t, int64_t, int64_t, float*);
  static constexpr TileFn tiles[kTileRows + 1] = {nullptr,       &step_tile<1>, &step_tile<2>,
                                                  &step_tile<3>, &step_tile<4>, &step_tile<5>,
                                                  &step_tile<6>};
  thread_local AlignedScratch partials;
  const int64_t tiles_n = (N + kTileRows - 1) / kTileRows;
  float* partial = partials.get(static_cast<size_t>(tiles_n * kTileRows * kBlockCols));
  const int64_t passes = (s.H + kStepsPerPass - 1) / kStepsPerPass;
  const int64_t per_pass = (s.H + passes - 1) / passes;
  for (int64_t u = u0; u < u1; ++u) {
    const float* wb = packed + u * s.H * kBlockCols;
    for (int64_t k0 = 0; k0 < s.H; k0 += per_pass) {
      const int64_t k1 = std::min(s.H, k0 + per_pass);
      for (int64_t n0 = 0, tile = 0; n0 < N; n0 += kTileRows, ++tile)
        tiles[std::min<int64_t>(kTileRows, N - n0)](s, wb + k0 * kBlockCols, n0, u, k0, k1,
                                                    partial + tile * kTileRows * kBlockCols);
    }
  }
}

bool fused_forward_here() {
  return sgemm_isa() == 2;  // LUCID_SGEMM_ISA=avx2 (set_sgemm_isa) forces the AVX2 path
}

// The float32 forward on the fused AVX-512 step (fused_forward_here).
void run_forward_fused(const LstmPlan& a, void* const* slots) {
  const int64_t L = a.L, N = a.N, H = a.H, G = 4 * H;
  const float* x = static_cast<const float*>(slots[a.in[0]]);
  const float* h0 = static_cast<const float*>(slots[a.in[1]]);
  const float* c0 = static_cast<const float*>(slots[a.in[2]]);
  const float* w = static_cast<const float*>(slots[a.in[3]]);
  const float* b = a.bias ? static_cast<const float*>(slots[a.in[4]]) : nullptr;
  float* y = static_cast<float*>(slots[a.out[0]]);
  float* h_n = static_cast<float*>(slots[a.out[1]]);
  float* c_n = static_cast<float*>(slots[a.out[2]]);
  float* cells = a.save ? static_cast<float*>(slots[a.out[3]]) : nullptr;
  float* gates = a.save ? static_cast<float*>(slots[a.out[4]]) : nullptr;
  std::memcpy(c_n, c0, sizeof(float) * static_cast<size_t>(N * H));
  const int64_t blocks = (H + kUnits - 1) / kUnits;
  float* packed = t_packed_w.get(static_cast<size_t>(blocks * H * kBlockCols));
  pack_gate_blocks(w, H, packed);
  // A block is N * 64 * H multiply-adds: a step is split only when each thread gets ~256k.
  const int64_t threads = std::min<int64_t>(
      {parallel_threads(), blocks, std::max<int64_t>(1, blocks * N * H * 64 / (int64_t(1) << 18))});
  const float* h = h0;
  for (int64_t k = 0; k < L; ++k) {
    const int64_t t = a.reverse ? L - 1 - k : k;
    const StepIO s{H,          G,           h, x + t * N * G, b, c_n, y + t * N * H,
                   cells ? cells + t * N * H : nullptr, gates ? gates + t * N * G : nullptr};
    // Blocks claimed one at a time: a worker that wakes late (its core busy) takes what is left
    // instead of holding the step up with a fixed half.
    std::atomic<int64_t> next{0};
    parallel_for(threads, 1, [&](int64_t, int64_t) {
      for (int64_t u = next.fetch_add(1); u < blocks; u = next.fetch_add(1))
        step_blocks(s, packed, N, u, u + 1);
    });
    h = s.y;
  }
  std::memcpy(h_n, h, sizeof(float) * static_cast<size_t>(N * H));
}

#else

bool fused_forward_here() { return false; }
void run_forward_fused(const LstmPlan&, void* const*) {}

#endif

template <class T>
void run_forward(const LstmPlan& a, void* const* slots) {
  const int64_t L = a.L, N = a.N, H = a.H, G = 4 * H;
  const T* x = static_cast<const T*>(slots[a.in[0]]);
  const T* h0 = static_cast<const T*>(slots[a.in[1]]);
  const T* c0 = static_cast<const T*>(slots[a.in[2]]);
  const T* w = static_cast<const T*>(slots[a.in[3]]);
  const T* b = static_cast<const T*>(slots[a.in[4]]);
  T* y = static_cast<T*>(slots[a.out[0]]);
  T* h_n = static_cast<T*>(slots[a.out[1]]);
  T* c_n = static_cast<T*>(slots[a.out[2]]);
  T* cells = a.save ? static_cast<T*>(slots[a.out[3]]) : nullptr;
  T* gates = a.save ? static_cast<T*>(slots[a.out[4]]) : nullptr;
  // c_n holds the running cell state (each element is read and written by its own step only).
  std::memcpy(c_n, c0, sizeof(T) * static_cast<size_t>(N * H));
  if (N * H == 0) return;
  auto gt = scratch<T>(G * N);  // gatesᵀ of one step: [4H, N]
  const T zero = T(0);
  const T* h = h0;
  for (int64_t k = 0; k < L; ++k) {
    const int64_t t = a.reverse ? L - 1 - k : k;
    gemm<T>(false, true, G, N, H, w, H, h, H, T(0), gt.get(), N);
    const T* xt = x + t * N * G;
    T* yt = y + t * N * H;
    T* ct = cells ? cells + t * N * H : nullptr;
    T* at = gates ? gates + t * N * G : nullptr;
    for_rows(N, H, [&](int64_t n0, int64_t n1) {
      auto pre = scratch<T>(G);
      for (int64_t n = n0; n < n1; ++n) {
        const T* xr = xt + n * G;
        // x + (h W_hhᵀ + b_hh): the order the linear op and the add of the unrolled cell take.
        for (int64_t j = 0; j < G; ++j)
          pre[j] = xr[j] + (gt[j * N + n] + (a.bias ? b[j] : zero));
        T* __restrict c = c_n + n * H;
        T* __restrict hr = yt + n * H;
        T* __restrict q = pre.get();
        for (int64_t j = 0; j < H; ++j) {
          const T i = sigmoid_of(q[j]), f = sigmoid_of(q[H + j]);
          const T g = tanh_of(q[2 * H + j]), o = sigmoid_of(q[3 * H + j]);
          const T cn = i * g + f * c[j];
          c[j] = cn;
          hr[j] = o * tanh_of(cn);
          q[j] = i, q[H + j] = f, q[2 * H + j] = g, q[3 * H + j] = o;
        }
        if (at != nullptr) store_saved(at + n * G, q, G);
        if (ct != nullptr) store_saved(ct + n * H, c, H);
      }
      if (a.save) saved_stores_done();
    });
    h = yt;
  }
  std::memcpy(h_n, h, sizeof(T) * static_cast<size_t>(N * H));
}

// One batch row of one backward step: the pre-activation gradients dp [4H] from the activated
// gates, the cell, the previous cell and the incoming gradients; dh (the carried gradient of h,
// becomes nothing) and dc (carried, becomes dc_prev) update in place. kCells / kGates: the
// gradients of the saved cells and gates are full rows (else the 0-d values cs, gs).
template <class T, bool kCells, bool kGates>
void backward_row(int64_t H, const T* __restrict act, const T* __restrict cr,
                  const T* __restrict cp, const T* __restrict dyr, const T* __restrict dh,
                  const T* __restrict dcr, T cs, const T* __restrict dgr, T gs,
                  T* __restrict dc, T* __restrict dp) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = act[j], f = act[H + j], g = act[2 * H + j], o = act[3 * H + j];
    const T tc = tanh_of(cr[j]);
    const T dht = dyr[j] + dh[j];
    const T dct = dc[j] + (kCells ? dcr[j] : cs) + dht * o * (T(1) - tc * tc);
    dp[j] = (dct * g + (kGates ? dgr[j] : gs)) * i * (T(1) - i);
    dp[H + j] = (dct * cp[j] + (kGates ? dgr[H + j] : gs)) * f * (T(1) - f);
    dp[2 * H + j] = (dct * i + (kGates ? dgr[2 * H + j] : gs)) * (T(1) - g * g);
    dp[3 * H + j] = (dht * tc + (kGates ? dgr[3 * H + j] : gs)) * o * (T(1) - o);
    dc[j] = dct * f;
  }
}

template <class T>
void run_backward(const LstmPlan& a, void* const* slots) {
  const int64_t L = a.L, N = a.N, H = a.H, G = 4 * H;
  auto in = [&](int i) { return static_cast<const T*>(slots[a.in[i]]); };
  const T *dy = in(0), *dh_n = in(1), *dc_n = in(2), *d_cells = in(3), *d_gates = in(4);
  const T *h0 = in(5), *c0 = in(6), *w = in(7), *y = in(8), *cells = in(9), *gates = in(10);
  T* dx = static_cast<T*>(slots[a.out[0]]);
  T* dh0 = static_cast<T*>(slots[a.out[1]]);
  T* dc0 = static_cast<T*>(slots[a.out[2]]);
  T* dw = static_cast<T*>(slots[a.out[3]]);
  // The carried gradients, updated in place: dh in dh0, dc in dc0 (row n by row n's pass only).
  std::memcpy(dh0, dh_n, sizeof(T) * static_cast<size_t>(N * H));
  std::memcpy(dc0, dc_n, sizeof(T) * static_cast<size_t>(N * H));
  if (N * H == 0) {
    std::fill(dw, dw + G * H, T(0));
    return;
  }
  // W_hhᵀ [H, 4H], once: the left operand of every step's dhᵀ = W_hhᵀ dpreᵀ.
  auto wt = scratch<T>(G * H);
  constexpr int64_t kTile = 32;  // tiles of both layouts stay in L1 while they are copied
  for (int64_t r0 = 0; r0 < G; r0 += kTile)
    for (int64_t c0 = 0; c0 < H; c0 += kTile)
      for (int64_t r = r0; r < std::min(G, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(H, c0 + kTile); ++c) wt[c * G + r] = w[r * H + c];
  auto dht = scratch<T>(H * N);  // a step's dhᵀ [H, N]
  const T cs = a.d_cells ? T(0) : d_cells[0];
  const T gs = a.d_gates ? T(0) : d_gates[0];
  auto row = a.d_cells ? (a.d_gates ? &backward_row<T, true, true> : &backward_row<T, true, false>)
                       : (a.d_gates ? &backward_row<T, false, true> : &backward_row<T, false, false>);
  for (int64_t k = L - 1; k >= 0; --k) {
    const int64_t t = a.reverse ? L - 1 - k : k;
    const int64_t prev = a.reverse ? t + 1 : t - 1;  // the step before t in the forward's order
    const T* c_prev = k == 0 ? c0 : cells + prev * N * H;
    for_rows(N, H, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t r = t * N + n;
        row(H, gates + r * G, cells + r * H, c_prev + n * H, dy + r * H, dh0 + n * H,
            a.d_cells ? d_cells + r * H : nullptr, cs, a.d_gates ? d_gates + r * G : nullptr, gs,
            dc0 + n * H, dx + r * G);
      }
    });
    // dhᵀ [H, N] = W_hhᵀ [H, 4H] dpreᵀ (dpre stored [N, 4H]), then into dh0's [N, H] layout.
    gemm<T>(false, true, H, N, G, wt.get(), G, dx + t * N * G, G, T(0), dht.get(), N);
    for (int64_t j = 0; j < H; ++j)
      for (int64_t n = 0; n < N; ++n) dh0[n * H + j] = dht[j * N + n];
  }
  // dW_hh = Σ_t dpre_tᵀ h_prev(t): the first step's against h0, the others against y shifted by
  // one step (one GEMM over all of them).
  const int64_t first_t = a.reverse ? L - 1 : 0;
  gemm<T>(true, false, G, H, N, dx + first_t * N * G, G, h0, H, T(0), dw, H);
  if (L > 1) {
    const T* d_rest = dx + (a.reverse ? 0 : N * G);
    const T* h_rest = y + (a.reverse ? N * H : 0);
    gemm<T>(true, false, G, H, (L - 1) * N, d_rest, G, h_rest, H, T(1), dw, H);
  }
}

template <class T>
void run(const LstmPlan& a, void* const* slots) {
  if (a.grad) return run_backward<T>(a, slots);
  if constexpr (std::is_same_v<T, float>) {
    if (a.N * a.H > 0 && fused_forward_here()) return run_forward_fused(a, slots);
  }
  run_forward<T>(a, slots);
}

}  // namespace

std::vector<Slot> infer_lstm(const Program& p, const Instr& in) {
  const LstmPlan a = plan(p, in);
  const Shape state{a.N, a.H}, seq{a.L, a.N, a.H};
  if (a.grad)
    return {Slot{{a.L, a.N, 4 * a.H}, a.dtype}, Slot{state, a.dtype}, Slot{state, a.dtype},
            Slot{{4 * a.H, a.H}, a.dtype}};
  std::vector<Slot> out{Slot{seq, a.dtype}, Slot{state, a.dtype}, Slot{state, a.dtype}};
  if (a.save) out.push_back(Slot{seq, a.dtype}), out.push_back(Slot{{a.L, a.N, 4 * a.H}, a.dtype});
  return out;
}

int64_t lstm_work(const Program& p, const Instr& in) {
  const LstmPlan a = plan(p, in);
  auto sat_mul = [](int64_t x, int64_t y) {
    int64_t r;
    return __builtin_mul_overflow(x, y, &r) ? INT64_MAX : r;
  };
  // Per step and batch row: the recurrent GEMM's 4H * H multiply-adds (twice backward, with the
  // weight's gradient) and ~32 units per gate for the nonlinearities.
  const int64_t per_row = sat_mul(4 * a.H, (a.grad ? 2 : 1) * a.H + 32);
  const int64_t work = sat_mul(sat_mul(a.L, a.N), per_row);
  return work == INT64_MAX ? work : work + 1;
}

Step make_lstm_step(const Program& p, const Instr& in) {
  auto a = std::make_shared<LstmPlan>(plan(p, in));
  if (a->dtype == DType::F32) return [a](void* const* slots) { run<float>(*a, slots); };
  return [a](void* const* slots) { run<double>(*a, slots); };
}

}  // namespace lucid
