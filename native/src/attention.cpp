// Fused scaled-dot-product attention (the CPU-only `attention` and `attention_grad` that
// kernel_fusion.py folds attention's batched products and softmax into).
//
// Per (batch, head) and block of query rows: S = alpha * Q Kᵀ into a scratch block that stays in
// cache, the row softmax in place, then O = P V, all on one thread; (batch, head) pairs are split
// across the worker pool. The unfused program ran each step over the whole [B, H, Lq, Lk] score
// tensor in turn (three instructions, the scores written to memory and read back twice). In
// float32 on a CPU with AVX2 + FMA the products are register-tiled loops written here (below; the
// forward takes each group of six query rows through scores, softmax and P V while they are in
// L1), as 6 x 64 AVX-512 tiles where sgemm_isa() is 2 (same bits as the AVX2 6 x 16 ones; the
// causal forward of workload F's layer measured 0.85 -> 0.53 ms); in float64 and without AVX2
// they are BLAS calls.
//
// The backward, attention_grad(dO, Q, K, V, P) -> (dQ, dK, dV) (the composite prim op of that
// name), reads the weights P the training forward saved (its softmax) rather than recomputing
// them from Q and K: at workload D's sizes the recomputation (a product and an exp per score)
// cost more than reading P back (measured: the fused step's attention 10% slower with
// recomputation). Per (batch, head) it runs dP = dO Vᵀ, dS = P (dP - rowsum(dP P)) while the
// rows are in cache, and the products for dV, dQ and dK, written as three dense results or, with
// grad_cols, into one [B, L, W] slot at the columns the fused QKV projection's gradient has them,
// which replaces that gradient's concat.
//
// With `causal` (PyTorch's is_causal: query i attends to keys j <= i, top-left aligned when
// Lq != Lk) the forward computes each group of query rows' scores only up to its last row's
// last key, sets the scores past each row's own diagonal to -inf before the softmax (their
// weights are exact zeros) and contracts P V over those keys only: about half the products and
// exponentials of the unmasked kernel at Lq == Lk. The weights it writes out are zero past the
// diagonal, which is all attention_grad needs of the mask; its `causal` lets it skip the products
// over those zeros too (per group of rows in the register tiles, per query block with BLAS).
//
// Each (batch, head) is computed by one thread in a fixed order, so the results do not depend
// on the thread count.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "lucid/blas.h"
#include "lucid/gelu_avx2.h"  // exp_nonpositive8
#include "lucid/kernels.h"
#include "lucid/parallel.h"
#include "lucid/sgemm.h"  // sgemm_isa, LUCID_TARGET_AVX512

namespace lucid {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// OpenBLAS keeps a GEMM of at most 65536 * 4 multiply-adds on the calling thread (see
// batched_gemm.cpp); above that it threads the call itself, and the heads run one after another.
constexpr double kBlasSingleThreadMacs = 65536.0 * 4;
// Waking a worker costs a few microseconds: give each part at least this many multiply-adds.
constexpr double kMinMacsPerPart = 1 << 17;
// Query rows per block: the block's scores (two blocks in the backward) stay in L2.
constexpr int64_t kScoreBlockElements = 1 << 14;

// Where operand (b, h)'s [L, D] matrix lives in its slot: rows `ld` apart from
// base + b * b_stride + h * h_stride.
struct Operand {
  int slot = -1;
  int64_t B = 0, H = 0, L = 0, D = 0;
  int64_t b_stride = 0, h_stride = 0, ld = 0, base = 0;
  int64_t at(int64_t b, int64_t h) const { return base + b * b_stride + h * h_stride; }
};

const std::vector<int64_t>* optional_ints(const Instr& in, const char* name) {
  return in.attrs.count(name) ? &attr_ints(in, name) : nullptr;
}

// A [B, L, W] slot read as [B, H, L, D] through view = [H, D, col0] (heads side by side in the
// last axis, as a projection computes them), or a dense [B, H, L, D] slot without one.
Operand operand(const Program& p, int slot, const std::vector<int64_t>* view, const char* name) {
  const Shape& s = p.slots[slot].shape;
  Operand o;
  o.slot = slot;
  if (view == nullptr) {
    if (s.size() != 4) fail(std::string(name) + " needs shape [B, H, L, D], got " + shape_str(s));
    o.B = s[0]; o.H = s[1]; o.L = s[2]; o.D = s[3];
    o.ld = o.D;
    o.h_stride = o.L * o.D;
    o.b_stride = o.H * o.h_stride;
    return o;
  }
  const std::string attr = std::string(name) + "_view";
  if (view->size() != 3) fail(attr + " needs [heads, dim, col0]");
  if ((*view)[0] < 1 || (*view)[1] < 0 || (*view)[2] < 0)
    fail(attr + " needs heads >= 1, dim >= 0 and col0 >= 0");
  if (s.size() != 3) fail(attr + " needs a rank-3 slot [B, L, W], got " + shape_str(s));
  const int64_t width = checked_add(checked_mul((*view)[0], (*view)[1], "head view width"),
                                    (*view)[2], "head view width");
  if (width > s[2])
    fail(attr + " [" + std::to_string((*view)[0]) + ", " + std::to_string((*view)[1]) + ", " +
         std::to_string((*view)[2]) + "] does not fit " + shape_str(s));
  o.B = s[0]; o.H = (*view)[0]; o.L = s[1]; o.D = (*view)[1];
  o.ld = s[2];
  o.h_stride = o.D;
  o.b_stride = o.L * s[2];
  o.base = (*view)[2];
  return o;
}

struct AttentionPlan {
  bool grad = false;
  bool causal = false;  // query i attends to keys j <= i
  DType dtype = DType::F32;
  double alpha = 1.0;
  Operand q, k, v, d_out;  // d_out: the output's gradient (attention_grad only)
  Operand out, dq, dk, dv;  // out: attention's result; dq, dk, dv: attention_grad's
  int probs = -1;  // attention_grad's input, attention's optional output: the weights [B, H, Lq, Lk]
};

void check_blas(int64_t d, const char* what) {
  if (d > kMaxBlasDim) fail(std::string(what) + " " + std::to_string(d) + " exceeds 2^31-1");
}

// The keys query rows before `row_end` see: all of them, or with the causal mask those up to
// the last row's diagonal.
int64_t keys_seen(const AttentionPlan& a, int64_t row_end) {
  return a.causal ? std::min(a.k.L, row_end) : a.k.L;
}

// Scores past each row's diagonal to -inf (rows ld apart, the first being query row0), over the
// first n columns: their softmax weights are then exact zeros.
template <class T>
void mask_past_diagonal(T* s, int64_t rows, int64_t n, int64_t ld, int64_t row0) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = row0 + r + 1; j < n; ++j) s[r * ld + j] = -std::numeric_limits<T>::infinity();
}

// attention(q, k, v); attention_grad(d_out, q, k, v, probs).
AttentionPlan plan(const Program& p, const Instr& in) {
  AttentionPlan a;
  a.grad = in.op == Op::attention_grad;
  const size_t n_in = a.grad ? 5 : 3;
  if (in.in.size() != n_in)
    fail("takes " + std::to_string(n_in) + " operands, got " + std::to_string(in.in.size()));
  const DType d = p.slots[in.in[0]].dtype;
  for (int s : in.in)
    if (p.slots[s].dtype != d) fail("operands must share one dtype");
  if (!is_float(d)) fail(std::string("operand dtype ") + dtype_name(d) + " not supported; needs a float dtype");
  a.dtype = d;
  a.alpha = attr_float(in, "alpha");
  a.causal = in.attrs.count("causal") != 0 && attr_bool(in, "causal");
  const size_t first = a.grad ? 1 : 0;
  a.q = operand(p, in.in[first], optional_ints(in, "q_view"), "q");
  a.k = operand(p, in.in[first + 1], optional_ints(in, "k_view"), "k");
  a.v = operand(p, in.in[first + 2], optional_ints(in, "v_view"), "v");
  if (a.q.B != a.k.B || a.q.B != a.v.B || a.q.H != a.k.H || a.q.H != a.v.H)
    fail("q, k and v need the same batch and heads");
  if (a.q.D != a.k.D) fail("q and k need the same head dim");
  if (a.k.L != a.v.L) fail("k and v need the same length");
  for (const Operand* o : {&a.q, &a.k, &a.v}) {
    check_blas(o->L, "sequence length");
    check_blas(o->ld, "row stride");
  }
  if (!a.grad) {
    if (in.attrs.count("out_view")) {
      const auto& ov = attr_ints(in, "out_view");
      if (ov.size() != 2 || ov[0] != a.q.H || ov[1] != a.v.D)
        fail("out_view needs [heads, value dim] = [" + std::to_string(a.q.H) + ", " +
             std::to_string(a.v.D) + "]");
    }
    return a;
  }
  a.d_out = operand(p, in.in[0], optional_ints(in, "d_out_view"), "d_out");
  if (a.d_out.B != a.q.B || a.d_out.H != a.q.H || a.d_out.L != a.q.L || a.d_out.D != a.v.D)
    fail("d_out needs the output's logical shape [B, H, Lq, Dv]");
  check_blas(a.d_out.ld, "row stride");
  const Shape want{a.q.B, a.q.H, a.q.L, a.k.L};
  if (p.slots[in.in[4]].shape != want)
    fail("weights need shape " + shape_str(want) + ", got " + shape_str(p.slots[in.in[4]].shape));
  a.probs = in.in[4];
  return a;
}

// The output slots' shapes, and the places of the results in them.
std::vector<Slot> output_slots(const Program& p, const Instr& in, AttentionPlan* a) {
  const int64_t B = a->q.B, H = a->q.H, Lq = a->q.L, Lk = a->k.L, Dv = a->v.D;
  if (!a->grad) {
    if (in.attrs.count("out_view"))
      return {Slot{{B, Lq, checked_mul(H, Dv, "output width")}, a->dtype}};
    return {Slot{{B, H, Lq, Dv}, a->dtype}};
  }
  Operand* outs[3] = {&a->dq, &a->dk, &a->dv};
  const int64_t dims[3] = {a->q.D, a->k.D, a->v.D};
  const int64_t lengths[3] = {Lq, Lk, Lk};
  if (!in.attrs.count("grad_cols") && !in.attrs.count("grad_width")) {  // dense dq, dk, dv
    std::vector<Slot> slots;
    for (int i = 0; i < 3; ++i) {
      Operand& o = *outs[i];
      o.slot = in.out.size() == 3 ? in.out[i] : -1;
      o.B = B; o.H = H; o.L = lengths[i]; o.D = dims[i];
      o.ld = dims[i]; o.h_stride = lengths[i] * dims[i]; o.b_stride = H * o.h_stride;
      slots.push_back(Slot{{B, H, lengths[i], dims[i]}, a->dtype});
    }
    return slots;
  }
  if (Lq != Lk) fail("attention_grad with grad_cols needs equal query and key lengths");
  const auto& cols = attr_ints(in, "grad_cols");
  const auto& width_attr = attr_ints(in, "grad_width");
  if (cols.size() != 3 || width_attr.size() != 1)
    fail("attention_grad needs grad_cols [dq, dk, dv] and grad_width [W]");
  const int64_t width = width_attr[0];
  check_blas(width, "gradient width");
  // dQ, dK and dV must tile the output's columns: nothing else writes them.
  const int64_t widths[3] = {checked_mul(H, a->q.D, "dq width"), checked_mul(H, a->k.D, "dk width"),
                             checked_mul(H, a->v.D, "dv width")};
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int i = 0; i < 3; ++i) spans.push_back({cols[i], widths[i]});
  std::sort(spans.begin(), spans.end());
  int64_t edge = 0;
  for (auto [c, w] : spans) {
    if (c != edge) fail("grad_cols must place dq, dk and dv side by side from column 0");
    edge = checked_add(edge, w, "gradient width");
  }
  if (edge != width) fail("grad_cols cover " + std::to_string(edge) + " columns of " + std::to_string(width));
  for (int i = 0; i < 3; ++i) {
    Operand& o = *outs[i];
    o.slot = in.out.empty() ? -1 : in.out[0];
    o.B = B; o.H = H; o.L = Lq; o.D = dims[i];
    o.ld = width; o.h_stride = dims[i]; o.b_stride = Lq * width; o.base = cols[i];
  }
  return {Slot{{B, Lq, width}, a->dtype}};
}

// Zeros into the [rows, cols] matrix at dst (rows ld apart): a gradient no product writes
// (dK and dV without queries, dQ without keys).
template <class T>
void zero_rows(T* dst, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::fill(dst + r * ld, dst + r * ld + cols, T(0));
}

// The pointers of one attention_grad's operands and results (dQ, dK, dV may share one slot).
template <class T>
struct GradSlots {
  const T *q, *k, *v, *d_out, *probs;
  T *dq, *dk, *dv;
  GradSlots(const AttentionPlan& a, void* const* slots)
      : q(static_cast<const T*>(slots[a.q.slot])), k(static_cast<const T*>(slots[a.k.slot])),
        v(static_cast<const T*>(slots[a.v.slot])),
        d_out(static_cast<const T*>(slots[a.d_out.slot])),
        probs(static_cast<const T*>(slots[a.probs])), dq(static_cast<T*>(slots[a.dq.slot])),
        dk(static_cast<T*>(slots[a.dk.slot])), dv(static_cast<T*>(slots[a.dv.slot])) {}
};

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C to beta; the product of an empty contraction is zero
    if (beta == T(0))
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
    return;
  }
  blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Row softmax in place, as the softmax kernel computes it (max, exp of the difference, sum in
// double, multiply by the reciprocal); a NaN anywhere in the row makes the row NaN.
template <class T>
void softmax_rows(T* s, int64_t rows, int64_t n, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * ld;
    T m = -std::numeric_limits<T>::infinity();
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      nan |= row[j] != row[j];
      m = row[j] > m ? row[j] : m;
    }
    if (nan) m = std::numeric_limits<T>::quiet_NaN();
    if constexpr (std::is_same_v<T, float>) {
      f32_elementwise_scalar(Op::sub, row, m, false, row, n);
      f32_elementwise(Op::exp, row, nullptr, nullptr, row, n);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - m);
    }
    double total[4] = {0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
      for (int l = 0; l < 4; ++l) total[l] += static_cast<double>(row[j + l]);
    for (; j < n; ++j) total[0] += static_cast<double>(row[j]);
    const T inv = static_cast<T>(1.0 / ((total[0] + total[1]) + (total[2] + total[3])));
    for (j = 0; j < n; ++j) row[j] *= inv;
  }
}

template <class T>
T* scratch(size_t n, int which) {
  thread_local std::vector<T> buf[6];
  if (buf[which].size() < n) buf[which].resize(n);
  return buf[which].data();
}

int64_t rows_per_block(int64_t Lq, int64_t Lk) {
  return std::clamp<int64_t>(kScoreBlockElements / std::max<int64_t>(Lk, 1), 1,
                             std::max<int64_t>(Lq, 1));
}

// Runs fn(i) for i in [0, tasks): split across the pool when each task's products are small
// enough that OpenBLAS keeps them on one thread.
template <class Fn>
void for_tasks(int64_t tasks, double macs_per_task, double largest_product, const Fn& fn) {
  if (tasks < 2 || largest_product > kBlasSingleThreadMacs || parallel_threads() < 2) {
    for (int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  const int64_t per_part =
      std::max<int64_t>(1, static_cast<int64_t>(kMinMacsPerPart / std::max(macs_per_task, 1.0)));
  parallel_for(tasks, per_part, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) fn(i);
  });
}

#if defined(__x86_64__) && defined(__GNUC__)
// ---- float32 with AVX2 + FMA: register-blocked products, the row softmax vectorized ---------
//
// At attention's sizes a BLAS call (64 x 64 x 32 products in workload D) spends much of its time
// in its entry, packing and edge handling: with two calls per (batch, head) the kernel ran at
// about a third of this machine's sgemm speed (D's attention alone, one thread: 2.4 ms with BLAS,
// 1.5 ms here). Here the products run as 6 x 16 tiles held in twelve AVX registers over the whole
// contraction (K's transpose packed once per task, 8 KB in L1 for D), each group of six query
// rows goes through scores, softmax and P V while it is in L1, and the softmax's normalization
// is applied to P V's rows (Lq x Dv multiplies instead of Lq x Lk).
#ifndef LUCID_AVX2
#define LUCID_AVX2 __attribute__((target("avx2,fma")))
#endif

bool use_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

constexpr int kTileRows = 6;
constexpr int kTileVectors = 2;  // 16 columns
constexpr int64_t kTileCols = 8 * kTileVectors;
// Query rows per task: K's transpose, packed once per task, is amortized over this many rows.
constexpr int64_t kQueryBlockRows = 16 * kTileRows;

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

// C[i, j] (=, or += when accumulate) alpha_i * sum_k A[i * a_row + k * a_col] * B[k * ldb + j]
// for i < MR, j < 8 NV, alpha_i = alpha * row_scale[i] (row_scale may be null: 1). Each element's
// sum runs over k in order whatever the tile's shape, so a row's result does not depend on how
// rows are grouped into tiles.
template <int MR, int NV>
LUCID_AVX2 void tile(int64_t K, const float* A, int64_t a_row, int64_t a_col, const float* B,
                     int64_t ldb, float alpha, const float* row_scale, bool accumulate, float* C,
                     int64_t ldc) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(B + k * ldb + 8 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + i * a_row + k * a_col);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m256 scale = _mm256_set1_ps(row_scale != nullptr ? alpha * row_scale[i] : alpha);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      __m256 r = _mm256_mul_ps(acc[i][v], scale);
      if (accumulate) r = _mm256_add_ps(_mm256_loadu_ps(C + i * ldc + 8 * v), r);
      _mm256_storeu_ps(C + i * ldc + 8 * v, r);
    }
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float,
                        const float*, bool, float*, int64_t);

template <int MR>
TileFn tile_for(int nv) {
  return nv == 1 ? &tile<MR, 1> : &tile<MR, 2>;
}

TileFn pick_tile(int mr, int nv) {
  switch (mr) {
    case 1: return tile_for<1>(nv);
    case 2: return tile_for<2>(nv);
    case 3: return tile_for<3>(nv);
    case 4: return tile_for<4>(nv);
    case 5: return tile_for<5>(nv);
    default: return tile_for<6>(nv);
  }
}

// The AVX-512 form of tile() where sgemm_isa() == 2: MR x 16 NV tiles (up to 6 x 64, as
// sgemm's), the last vector's columns under `last` (loads, stores and the accumulated C read
// only those), so B is read only up to column N. Each element's sum is the same FMAs in the same
// order as tile()'s: both paths give the same bits.
template <int MR, int NV>
LUCID_TARGET_AVX512 void tile512(int64_t K, const float* A, int64_t a_row, int64_t a_col,
                                 const float* B, int64_t ldb, float alpha, const float* row_scale,
                                 bool accumulate, float* C, int64_t ldc, __mmask16 last) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      b[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : __mmask16(0xFFFF), B + k * ldb + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * a_row + k * a_col]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512 scale = _mm512_set1_ps(row_scale != nullptr ? alpha * row_scale[i] : alpha);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xFFFF);
      float* c = C + i * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(acc[i][v], scale);
      if (accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), r);
      _mm512_mask_storeu_ps(c, m, r);
    }
  }
}

using Tile512Fn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float,
                           const float*, bool, float*, int64_t, __mmask16);

template <int MR>
Tile512Fn tile512_for(int nv) {
  switch (nv) {
    case 1: return &tile512<MR, 1>;
    case 2: return &tile512<MR, 2>;
    case 3: return &tile512<MR, 3>;
    default: return &tile512<MR, 4>;
  }
}

Tile512Fn pick_tile512(int mr, int nv) {
  switch (mr) {
    case 1: return tile512_for<1>(nv);
    case 2: return tile512_for<2>(nv);
    case 3: return tile512_for<3>(nv);
    case 4: return tile512_for<4>(nv);
    case 5: return tile512_for<5>(nv);
    default: return tile512_for<6>(nv);
  }
}

LUCID_TARGET_AVX512 void product512(int64_t M, int64_t N, int64_t K, const float* A,
                                    int64_t a_row, int64_t a_col, const float* B, int64_t ldb,
                                    float alpha, const float* row_scale, bool accumulate,
                                    float* C, int64_t ldc) {
  constexpr int64_t kCols = 64;
  for (int64_t i0 = 0; i0 < M; i0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, M - i0));
    const float* a = A + i0 * a_row;
    const float* scale = row_scale != nullptr ? row_scale + i0 : nullptr;
    float* c = C + i0 * ldc;
    for (int64_t j0 = 0; j0 < N; j0 += kCols) {
      const int64_t cols = std::min(kCols, N - j0);
      const int nv = static_cast<int>((cols + 15) / 16);
      const int rest = static_cast<int>(cols - 16 * (nv - 1));
      const __mmask16 last = rest == 16 ? __mmask16(0xFFFF) : __mmask16((1u << rest) - 1);
      pick_tile512(mr, nv)(K, a, a_row, a_col, B + j0, ldb, alpha, scale, accumulate, c + j0, ldc,
                           last);
    }
  }
}

// C[M x N] (=, or +=) diag(alpha * row_scale) A[M x K] B[K x N] (row_scale may be null), A read
// through (a_row, a_col) strides, B in rows of ldb that can be read up to round8(N) columns (the
// pad columns only reach columns that are not stored).
LUCID_AVX2 void product(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row,
                        int64_t a_col, const float* B, int64_t ldb, float alpha,
                        const float* row_scale, bool accumulate, float* C, int64_t ldc) {
  if (sgemm_isa() == 2) {
    product512(M, N, K, A, a_row, a_col, B, ldb, alpha, row_scale, accumulate, C, ldc);
    return;
  }
  for (int64_t i0 = 0; i0 < M; i0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, M - i0));
    const float* a = A + i0 * a_row;
    const float* scale = row_scale != nullptr ? row_scale + i0 : nullptr;
    float* c = C + i0 * ldc;
    for (int64_t j0 = 0; j0 < N; j0 += kTileCols) {
      const int64_t cols = std::min(kTileCols, N - j0);
      const int nv = cols > 8 ? 2 : 1;
      const TileFn fn = pick_tile(mr, nv);
      if (cols == 8 * nv) {
        fn(K, a, a_row, a_col, B + j0, ldb, alpha, scale, accumulate, c + j0, ldc);
        continue;
      }
      // A partial tile: computed into a buffer, then the valid columns stored.
      alignas(32) float buf[kTileRows * kTileCols];
      fn(K, a, a_row, a_col, B + j0, ldb, alpha, scale, false, buf, kTileCols);
      for (int i = 0; i < mr; ++i)
        for (int64_t j = 0; j < cols; ++j)
          c[i * ldc + j0 + j] = accumulate ? c[i * ldc + j0 + j] + buf[i * kTileCols + j]
                                           : buf[i * kTileCols + j];
    }
  }
}

// The [rows, cols] matrix at src (rows ld apart) with its rows padded with zeros to round8(cols)
// columns, into dst; returns dst's row stride.
int64_t pack_padded(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  const int64_t width = round8(cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(src + r * ld, src + r * ld + cols, dst + r * width);
    std::fill(dst + r * width + cols, dst + (r + 1) * width, 0.0f);
  }
  return width;
}

// dst[c * width + r] = src[r * ld + c] for the [rows, cols] matrix at src, width = round8(rows),
// the pad columns zero; returns width. 8 x 8 blocks go through registers (scalar stores 256
// bytes apart cost as much as a sixth of the forward).
LUCID_AVX2 int64_t pack_transposed(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                   float* dst) {
  const int64_t width = round8(rows);
  for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * width + rows, dst + (c + 1) * width, 0.0f);
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t r = 0; r < rows8; r += 8) {
    for (int64_t c = 0; c < cols8; c += 8) {
      const float* s = src + r * ld + c;
      __m256 x[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_ps(s + i * ld);
      // 8 x 8 transpose: interleave pairs of rows, then pairs of pairs, then the 128-bit halves.
      const __m256 t0 = _mm256_unpacklo_ps(x[0], x[1]), t1 = _mm256_unpackhi_ps(x[0], x[1]);
      const __m256 t2 = _mm256_unpacklo_ps(x[2], x[3]), t3 = _mm256_unpackhi_ps(x[2], x[3]);
      const __m256 t4 = _mm256_unpacklo_ps(x[4], x[5]), t5 = _mm256_unpackhi_ps(x[4], x[5]);
      const __m256 t6 = _mm256_unpacklo_ps(x[6], x[7]), t7 = _mm256_unpackhi_ps(x[6], x[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      float* d = dst + c * width + r;
      _mm256_storeu_ps(d + 0 * width, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(d + 1 * width, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(d + 2 * width, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(d + 3 * width, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(d + 4 * width, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(d + 5 * width, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(d + 6 * width, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(d + 7 * width, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (int64_t i = r; i < r + 8; ++i)
      for (int64_t c = cols8; c < cols; ++c) dst[c * width + i] = src[i * ld + c];
  }
  for (int64_t i = rows8; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) dst[c * width + i] = src[i * ld + c];
  return width;
}

// The row softmax's exponentials in place over n columns of rows ld apart (ld >= round8(n); the
// columns past n are read and left as they are): exp(s - max) per element and 1 / sum per row
// into inv_sum, the normalization left to the product that reads the row (the softmax kernel
// multiplies each weight by the reciprocal; here P V's row is). A NaN in a row makes its sum and
// so the whole row NaN, as in the softmax kernel.
LUCID_AVX2 void softmax_exp_rows(float* s, int64_t rows, int64_t n, int64_t ld, float* inv_sum) {
  const int64_t full = n / 8 * 8;
  const int tail = static_cast<int>(n - full);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 tail_mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane));
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    __m256 mx = neg_inf;
    for (int64_t j = 0; j < full; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + j));
    if (tail) mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(row + full), tail_mask));
    __m256 m = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    // A NaN may be lost from the max (max_ps keeps one operand), but it stays in its own exp and
    // makes the sum NaN.
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < full; j += 8) {
      const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m));
      _mm256_storeu_ps(row + j, e);
      total = _mm256_add_ps(total, e);
    }
    if (tail) {
      alignas(32) float t[8];
      const __m256 e = _mm256_and_ps(
          exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(row + full), m)), tail_mask);
      _mm256_store_ps(t, e);
      for (int l = 0; l < tail; ++l) row[full + l] = t[l];
      total = _mm256_add_ps(total, e);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, total);
    const double sum = ((static_cast<double>(lanes[0]) + lanes[1]) + (lanes[2] + lanes[3])) +
                       ((static_cast<double>(lanes[4]) + lanes[5]) + (lanes[6] + lanes[7]));
    inv_sum[r] = static_cast<float>(1.0 / sum);
  }
}

// probs[j] = e[j] * inv for j < n (the weights written out, normalized as the softmax kernel does).
LUCID_AVX2 void scale_row(const float* e, int64_t n, float inv, float* probs) {
  const __m256 f = _mm256_set1_ps(inv);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(probs + j, _mm256_mul_ps(_mm256_loadu_ps(e + j), f));
  for (; j < n; ++j) probs[j] = e[j] * inv;
}

// Query rows [r0, r0 + rows) of (batch b, head h); probs (null unless the weights are an output)
// is the head's [Lq, Lk] block of P.
LUCID_AVX2 void forward_rows_avx2(const AttentionPlan& a, const float* q, const float* k,
                                  const float* v, float* out, float* probs, int64_t b, int64_t h,
                                  int64_t r0, int64_t rows) {
  const int64_t Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  if (Lk == 0) {  // no keys: P V is an empty sum (the softmax's 1/sum would make it 0 * inf)
    for (int64_t r = r0; r < r0 + rows; ++r) {
      float* o = out + a.out.at(b, h) + r * a.out.ld;
      std::fill(o, o + Dv, 0.0f);
    }
    return;
  }
  const float alpha = static_cast<float>(a.alpha);
  float* kt = scratch<float>(static_cast<size_t>(std::max<int64_t>(D * round8(Lk), 1)), 0);
  const int64_t ldk = pack_transposed(k + a.k.at(b, h), Lk, D, a.k.ld, kt);
  const float* vb = v + a.v.at(b, h);
  int64_t ldv = a.v.ld;
  if (Dv % 8 != 0) {  // the tiles read whole vectors of V's rows
    float* packed = scratch<float>(static_cast<size_t>(std::max<int64_t>(Lk * round8(Dv), 1)), 1);
    ldv = pack_padded(vb, Lk, Dv, a.v.ld, packed);
    vb = packed;
  }
  const int64_t lds = std::max<int64_t>(round8(Lk), 8);
  float* s = scratch<float>(static_cast<size_t>(kTileRows * lds), 2);
  for (int64_t i0 = 0; i0 < rows; i0 += kTileRows) {
    const int64_t m = std::min<int64_t>(kTileRows, rows - i0);
    const int64_t row = r0 + i0;
    const int64_t n = keys_seen(a, row + m);  // the keys these rows see
    float inv_sum[kTileRows];
    product(m, n, D, q + a.q.at(b, h) + row * a.q.ld, a.q.ld, 1, kt, ldk, alpha, nullptr, false,
            s, lds);
    if (a.causal) mask_past_diagonal(s, m, n, lds, row);
    softmax_exp_rows(s, m, n, lds, inv_sum);
    float* o = out + a.out.at(b, h) + row * a.out.ld;
    if (probs == nullptr) {
      product(m, Dv, n, s, lds, 1, vb, ldv, 1.0f, inv_sum, false, o, a.out.ld);
      continue;
    }
    // P V from the weights as written out, so the output is the product of the saved P.
    float* p = probs + row * Lk;
    for (int64_t i = 0; i < m; ++i) {
      scale_row(s + i * lds, n, inv_sum[i], p + i * Lk);
      std::fill(p + i * Lk + n, p + (i + 1) * Lk, 0.0f);
    }
    product(m, Dv, n, p, Lk, 1, vb, ldv, 1.0f, nullptr, false, o, a.out.ld);
  }
}

// The [rows, cols] matrix at src as a B operand of product(): itself when its rows can be read as
// whole vectors (cols a multiple of 8), else padded into scratch buffer `which`.
const float* whole_vectors(const float* src, int64_t rows, int64_t cols, int64_t ld, int which,
                           int64_t* ld_out) {
  *ld_out = ld;
  if (cols % 8 == 0) return src;
  float* packed = scratch<float>(static_cast<size_t>(std::max<int64_t>(rows * round8(cols), 1)), which);
  *ld_out = pack_padded(src, rows, cols, ld, packed);
  return packed;
}

// dS = P (dP - rowsum(dP P)) over a row's first n scores, in place of dP.
LUCID_AVX2 inline void softmax_grad_row(const float* pr, float* dr, int64_t n) {
  const int64_t full = n / 8 * 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(pr + j), _mm256_loadu_ps(dr + j), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float dot = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (int64_t j = full; j < n; ++j) dot += pr[j] * dr[j];
  const __m256 d = _mm256_set1_ps(dot);
  for (int64_t j = 0; j < full; j += 8)
    _mm256_storeu_ps(dr + j, _mm256_mul_ps(_mm256_loadu_ps(pr + j),
                                           _mm256_sub_ps(_mm256_loadu_ps(dr + j), d)));
  for (int64_t j = full; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
}

// One (batch, head)'s operands of attention_grad on the register tiles: Vᵀ packed, K, Q and dO
// with whole vectors, the gradients' blocks and the dP scratch.
struct HeadGrad {
  float *dQ, *dK, *dV, *dp;
  const float *P, *vt, *K, *Q, *dO;
  int64_t ldvt, ldk, ldq, ldo, block, lds;
  float alpha;
};

// Fills h for (batch, head) bh; false (the gradients zeroed) when there are no queries or keys.
LUCID_AVX2 bool head_grad(const AttentionPlan& a, const GradSlots<float>& s, int64_t bh,
                          HeadGrad* h) {
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  const int64_t b = bh / a.q.H, hd = bh % a.q.H;
  h->dQ = s.dq + a.dq.at(b, hd);
  h->dK = s.dk + a.dk.at(b, hd);
  h->dV = s.dv + a.dv.at(b, hd);
  if (Lq == 0 || Lk == 0) {
    zero_rows(h->dK, Lq == 0 ? Lk : 0, D, a.dk.ld);
    zero_rows(h->dV, Lq == 0 ? Lk : 0, Dv, a.dv.ld);
    zero_rows(h->dQ, Lk == 0 ? Lq : 0, D, a.dq.ld);
    return false;
  }
  h->alpha = static_cast<float>(a.alpha);
  h->P = s.probs + bh * Lq * Lk;
  float* vt = scratch<float>(static_cast<size_t>(std::max<int64_t>(Dv * round8(Lk), 1)), 0);
  h->ldvt = pack_transposed(s.v + a.v.at(b, hd), Lk, Dv, a.v.ld, vt);
  h->vt = vt;
  h->K = whole_vectors(s.k + a.k.at(b, hd), Lk, D, a.k.ld, 1, &h->ldk);
  h->Q = whole_vectors(s.q + a.q.at(b, hd), Lq, D, a.q.ld, 2, &h->ldq);
  h->dO = whole_vectors(s.d_out + a.d_out.at(b, hd), Lq, Dv, a.d_out.ld, 3, &h->ldo);
  h->block = rows_per_block(Lq, Lk);
  h->lds = round8(Lk);
  h->dp = scratch<float>(static_cast<size_t>(h->block * h->lds), 4);
  return true;
}

// attention_grad for (batch, head) bh: the BLAS path's steps (run_backward) with the products as
// register tiles; Pᵀ and dSᵀ are read in place through the tiles' strided broadcasts.
LUCID_AVX2 void backward_head_avx2(const AttentionPlan& a, const GradSlots<float>& s, int64_t bh) {
  HeadGrad h;
  if (!head_grad(a, s, bh, &h)) return;
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  for (int64_t r0 = 0; r0 < Lq; r0 += h.block) {
    const int64_t rows = std::min(h.block, Lq - r0);
    const bool more = r0 > 0;  // dK and dV sum over the query blocks
    const float* p = h.P + r0 * Lk;
    product(rows, Lk, Dv, h.dO + r0 * h.ldo, h.ldo, 1, h.vt, h.ldvt, 1.0f, nullptr, false, h.dp,
            h.lds);
    product(Lk, Dv, rows, p, 1, Lk, h.dO + r0 * h.ldo, h.ldo, 1.0f, nullptr, more, h.dV,
            a.dv.ld);
    for (int64_t r = 0; r < rows; ++r) softmax_grad_row(p + r * Lk, h.dp + r * h.lds, Lk);
    product(rows, D, Lk, h.dp, h.lds, 1, h.K, h.ldk, h.alpha, nullptr, false,
            h.dQ + r0 * a.dq.ld, a.dq.ld);
    product(Lk, D, rows, h.dp, 1, h.lds, h.Q + r0 * h.ldq, h.ldq, h.alpha, nullptr, more, h.dK,
            a.dk.ld);
  }
}

// attention_grad with the causal mask for (batch, head) bh: backward_head_avx2's steps, each
// product over the scores on or below the diagonal only (P and so dS are zero above it). Query
// rows go in groups of kTileRows with their keys up to the group's last row; the products over
// query rows (dV, dK) take each group of kTileRows keys from the first row that sees them.
LUCID_AVX2 void backward_head_causal_avx2(const AttentionPlan& a, const GradSlots<float>& s,
                                          int64_t bh) {
  HeadGrad h;
  if (!head_grad(a, s, bh, &h)) return;
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  const int64_t block = h.block, lds = h.lds, ldo = h.ldo, ldq = h.ldq, ldk = h.ldk;
  const float alpha = h.alpha;
  const float *K = h.K, *Q = h.Q, *dO = h.dO;
  float *dQ = h.dQ, *dK = h.dK, *dV = h.dV, *dp = h.dp;
  for (int64_t r0 = 0; r0 < Lq; r0 += block) {
    const int64_t rows = std::min(block, Lq - r0);
    const bool more = r0 > 0;  // dK and dV sum over the query blocks
    const float* p = h.P + r0 * Lk;
    // dP = dO Vᵀ, then dS = P (dP - rowsum(dP P)) in place, zero past each row's diagonal.
    for (int64_t c0 = 0; c0 < rows; c0 += kTileRows) {
      const int64_t m = std::min<int64_t>(kTileRows, rows - c0);
      const int64_t n = keys_seen(a, r0 + c0 + m);
      product(m, n, Dv, dO + (r0 + c0) * ldo, ldo, 1, h.vt, h.ldvt, 1.0f, nullptr, false,
              dp + c0 * lds, lds);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = keys_seen(a, r0 + r + 1);
      float* dr = dp + r * lds;
      softmax_grad_row(p + r * Lk, dr, n);
      std::fill(dr + n, dr + Lk, 0.0f);
    }
    // dQ = alpha dS K over each row group's keys.
    for (int64_t c0 = 0; c0 < rows; c0 += kTileRows) {
      const int64_t m = std::min<int64_t>(kTileRows, rows - c0);
      product(m, D, keys_seen(a, r0 + c0 + m), dp + c0 * lds, lds, 1, K, ldk, alpha, nullptr,
              false, dQ + (r0 + c0) * a.dq.ld, a.dq.ld);
    }
    // dV (+)= Pᵀ dO and dK (+)= alpha dSᵀ Q, each key group from the first row that sees it.
    for (int64_t j0 = 0; j0 < Lk; j0 += kTileRows) {
      const int64_t m = std::min<int64_t>(kTileRows, Lk - j0);
      const int64_t first = std::max<int64_t>(0, j0 - r0);
      float* dv = dV + j0 * a.dv.ld;
      float* dk = dK + j0 * a.dk.ld;
      if (first >= rows) {  // no row of this block sees these keys
        if (!more) {
          zero_rows(dv, m, Dv, a.dv.ld);
          zero_rows(dk, m, D, a.dk.ld);
        }
        continue;
      }
      const int64_t n = rows - first;
      product(m, Dv, n, p + first * Lk + j0, 1, Lk, dO + (r0 + first) * ldo, ldo, 1.0f, nullptr,
              more, dv, a.dv.ld);
      product(m, D, n, dp + first * lds + j0, 1, lds, Q + (r0 + first) * ldq, ldq, alpha,
              nullptr, more, dk, a.dk.ld);
    }
  }
}
#endif

template <class T>
void run_forward(const AttentionPlan& a, void* const* slots) {
  const T* q = static_cast<const T*>(slots[a.q.slot]);
  const T* k = static_cast<const T*>(slots[a.k.slot]);
  const T* v = static_cast<const T*>(slots[a.v.slot]);
  T* out = static_cast<T*>(slots[a.out.slot]);
  T* probs = a.probs >= 0 ? static_cast<T*>(slots[a.probs]) : nullptr;  // [B, H, Lq, Lk]
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  const int64_t block = rows_per_block(Lq, Lk);
  const int64_t blocks = (Lq + block - 1) / block;
  const T alpha = static_cast<T>(a.alpha);
  const double macs = static_cast<double>(block) * static_cast<double>(Lk) * static_cast<double>(D + Dv);
  const double largest = static_cast<double>(block) * static_cast<double>(Lk) *
                         static_cast<double>(std::max(D, Dv));
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2()) {
      // No BLAS threads to leave room for: the (batch, head, query block) tasks always split.
      const int64_t rblocks = (Lq + kQueryBlockRows - 1) / kQueryBlockRows;
      const double task_macs = static_cast<double>(std::min(Lq, kQueryBlockRows)) *
                               static_cast<double>(Lk) * static_cast<double>(D + Dv);
      for_tasks(a.q.B * a.q.H * rblocks, task_macs, 0.0, [&](int64_t task) {
        const int64_t bh = task / rblocks, r0 = (task % rblocks) * kQueryBlockRows;
        forward_rows_avx2(a, q, k, v, out, probs != nullptr ? probs + bh * Lq * Lk : nullptr,
                          bh / a.q.H, bh % a.q.H, r0, std::min(kQueryBlockRows, Lq - r0));
      });
      return;
    }
  }
#endif
  for_tasks(a.q.B * a.q.H * blocks, macs, largest, [&](int64_t task) {
    const int64_t bh = task / blocks, r0 = (task % blocks) * block;
    const int64_t b = bh / a.q.H, h = bh % a.q.H, rows = std::min(block, Lq - r0);
    // The scores, then the weights: straight in the weights' output when there is one.
    T* s = probs != nullptr ? probs + (bh * Lq + r0) * Lk
                            : scratch<T>(static_cast<size_t>(rows * Lk), 0);
    const int64_t n = keys_seen(a, r0 + rows);  // the keys this block's rows see
    gemm<T>(false, true, rows, n, D, alpha, q + a.q.at(b, h) + r0 * a.q.ld, a.q.ld,
            k + a.k.at(b, h), a.k.ld, T(0), s, Lk);
    if (a.causal) mask_past_diagonal(s, rows, n, Lk, r0);
    softmax_rows(s, rows, n, Lk);
    if (probs != nullptr)
      for (int64_t r = 0; r < rows; ++r) std::fill(s + r * Lk + n, s + (r + 1) * Lk, T(0));
    gemm<T>(false, false, rows, Dv, n, T(1), s, Lk, v + a.v.at(b, h), a.v.ld, T(0),
            out + a.out.at(b, h) + r0 * a.out.ld, a.out.ld);
  });
}

// sum_j p[j] * d[j] with independent partial sums, so the loop vectorizes.
template <class T>
T dot_run(const T* p, const T* d, int64_t n) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += p[j + l] * d[j + l];
  T total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < n; ++j) total += p[j] * d[j];
  return total;
}

template <class T>
void run_backward(const AttentionPlan& a, void* const* slots) {
  const GradSlots<T> s(a, slots);
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  const int64_t block = rows_per_block(Lq, Lk);
  const T alpha = static_cast<T>(a.alpha);
  const double macs = static_cast<double>(Lq) * static_cast<double>(Lk) *
                      static_cast<double>(2 * D + 2 * Dv);
  const double largest = static_cast<double>(block) * static_cast<double>(Lk) *
                         static_cast<double>(std::max(D, Dv));
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2()) {
      for_tasks(a.q.B * a.q.H, macs, 0.0, [&](int64_t bh) {
        if (a.causal) backward_head_causal_avx2(a, s, bh);
        else backward_head_avx2(a, s, bh);
      });
      return;
    }
  }
#endif
  for_tasks(a.q.B * a.q.H, macs, largest, [&](int64_t bh) {
    const int64_t b = bh / a.q.H, h = bh % a.q.H;
    const T* Q = s.q + a.q.at(b, h);
    const T* K = s.k + a.k.at(b, h);
    const T* V = s.v + a.v.at(b, h);
    const T* dO = s.d_out + a.d_out.at(b, h);
    const T* P = s.probs + bh * Lq * Lk;
    T* dQ = s.dq + a.dq.at(b, h);
    T* dK = s.dk + a.dk.at(b, h);
    T* dV = s.dv + a.dv.at(b, h);
    if (Lq == 0) {  // no query block runs: dK and dV are empty sums
      zero_rows(dK, Lk, D, a.dk.ld);
      zero_rows(dV, Lk, Dv, a.dv.ld);
      return;
    }
    for (int64_t r0 = 0; r0 < Lq; r0 += block) {
      const int64_t rows = std::min(block, Lq - r0);
      const T beta = r0 == 0 ? T(0) : T(1);  // dK and dV sum over the query blocks
      const T* p = P + r0 * Lk;
      T* dp = scratch<T>(static_cast<size_t>(std::max<int64_t>(rows * Lk, 1)), 0);
      const T* Qb = Q + r0 * a.q.ld;
      const T* dOb = dO + r0 * a.d_out.ld;
      // With the causal mask the block's rows see keys [0, n) only: the weights past them are
      // zero, and so are dV's and dK's rows there until a later block's rows see them.
      const int64_t n = keys_seen(a, r0 + rows);
      if (r0 == 0 && n < Lk) {
        zero_rows(dV + n * a.dv.ld, Lk - n, Dv, a.dv.ld);
        zero_rows(dK + n * a.dk.ld, Lk - n, D, a.dk.ld);
      }
      gemm<T>(false, true, rows, n, Dv, T(1), dOb, a.d_out.ld, V, a.v.ld, T(0), dp, Lk);
      gemm<T>(true, false, n, Dv, rows, T(1), p, Lk, dOb, a.d_out.ld, beta, dV, a.dv.ld);
      for (int64_t r = 0; r < rows; ++r) {
        const T* pr = p + r * Lk;
        T* dr = dp + r * Lk;
        const T dot = dot_run(pr, dr, n);
        for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
      }
      gemm<T>(false, false, rows, D, n, alpha, dp, Lk, K, a.k.ld, T(0), dQ + r0 * a.dq.ld,
              a.dq.ld);
      gemm<T>(true, false, n, D, rows, alpha, dp, Lk, Qb, a.q.ld, beta, dK, a.dk.ld);
    }
  });
}

}  // namespace

std::vector<Slot> infer_attention(const Program& p, const Instr& in) {
  AttentionPlan a = plan(p, in);
  std::vector<Slot> out = output_slots(p, in, &a);
  if (a.grad) {
    if (in.out.size() != out.size())
      fail(std::string(out.size() == 1 ? "attention_grad with grad_cols has 1 output"
                                       : "attention_grad has 3 outputs (dq, dk, dv)") +
           ", got " + std::to_string(in.out.size()));
    return out;
  }
  // attention's second output, when asked for: the weights P (the training forward saves them
  // for attention_grad, which reads P instead of recomputing it).
  if (in.out.size() > 2)
    fail("attention has 1 or 2 outputs (the result, the weights), got " +
         std::to_string(in.out.size()));
  if (in.out.size() == 2) out.push_back(Slot{{a.q.B, a.q.H, a.q.L, a.k.L}, a.dtype});
  return out;
}

int64_t attention_work(const Program& p, const Instr& in) {
  AttentionPlan a = plan(p, in);
  auto sat_mul = [](int64_t x, int64_t y) {
    int64_t r;
    return __builtin_mul_overflow(x, y, &r) ? INT64_MAX : r;
  };
  // With the causal mask, the scores on or below the diagonal: sum over rows of min(Lk, i + 1).
  const int64_t seen = std::min(a.q.L, a.k.L);
  const int64_t per_head =
      a.causal ? sat_mul(seen, seen + 1) / 2 + sat_mul(a.q.L - seen, a.k.L) : sat_mul(a.q.L, a.k.L);
  const int64_t scores = sat_mul(sat_mul(a.q.B, a.q.H), per_head);
  // Multiply-adds of the products, plus the softmax's exp per score.
  const int64_t per_score = a.grad ? 2 * a.q.D + 2 * a.v.D + 4 : a.q.D + a.v.D + 4;
  const int64_t work = sat_mul(scores, per_score);
  return work == INT64_MAX ? work : work + 1;
}

Step make_attention_step(const Program& p, const Instr& in) {
  auto a = std::make_shared<AttentionPlan>(plan(p, in));
  output_slots(p, in, a.get());
  if (!a->grad) {
    if (in.out.size() == 2) a->probs = in.out[1];
    Operand& o = a->out;
    o.slot = in.out[0];
    o.B = a->q.B; o.H = a->q.H; o.L = a->q.L; o.D = a->v.D;
    if (in.attrs.count("out_view")) {  // [B, Lq, H*Dv]
      o.ld = o.H * o.D; o.h_stride = o.D; o.b_stride = o.L * o.ld;
    } else {  // [B, H, Lq, Dv]
      o.ld = o.D; o.h_stride = o.L * o.D; o.b_stride = o.H * o.h_stride;
    }
  }
  return [a](void* const* slots) {
    if (a->dtype == DType::F32) {
      if (a->grad) run_backward<float>(*a, slots);
      else run_forward<float>(*a, slots);
    } else {
      if (a->grad) run_backward<double>(*a, slots);
      else run_forward<double>(*a, slots);
    }
  };
}

}  // namespace lucid
