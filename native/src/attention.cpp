// Fused scaled-dot-product attention (the CPU-only `attention` and `attention_grad` that
// kernel_fusion.py folds attention's batched products and softmax into).
//
// Per (batch, head) and block of query rows: S = alpha * Q Kᵀ into a scratch block that stays in
// cache, the row softmax in place, then O = P V, all on one thread; (batch, head) pairs are split
// across the worker pool. The unfused program ran each step over the whole [B, H, Lq, Lk] score
// tensor in turn (three instructions, the scores written to memory and read back twice). The
// products stay BLAS calls: at attention's sizes (64 x 64 x 32 in workload D) OpenBLAS's kernels
// are faster than anything simple written here, and a call costs about a microsecond.
//
// The backward reads the weights P the training forward saved (its softmax) rather than
// recomputing them from Q and K: at workload D's sizes the recomputation (a product and an exp
// per score) cost more than reading P back (measured: the fused step's attention 10% slower
// with recomputation). Per (batch, head) it runs dP = dO Vᵀ, dS = P (dP - rowsum(dP P)) while the
// rows are in cache, and the products for dV, dQ and dK, written into one [B, L, W] slot at the
// columns the fused QKV projection's gradient has them, which replaces that gradient's concat.
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
#include "lucid/kernels.h"
#include "lucid/parallel.h"

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
  DType dtype = DType::F32;
  double alpha = 1.0;
  Operand q, k, v, d_out;  // d_out: the output's gradient (attention_grad only)
  Operand out, dq, dk, dv;  // out: attention's result; dq, dk, dv: attention_grad's (one slot)
  int probs = -1;           // attention_grad: the softmax weights [B, H, L, L]
};

void check_blas(int64_t d, const char* what) {
  if (d > kMaxBlasDim) fail(std::string(what) + " " + std::to_string(d) + " exceeds 2^31-1");
}

AttentionPlan plan(const Program& p, const Instr& in) {
  AttentionPlan a;
  a.grad = in.op == Op::attention_grad;
  const size_t n_in = 3;
  if (in.in.size() != n_in)
    fail("takes " + std::to_string(n_in) + " operands, got " + std::to_string(in.in.size()));
  const DType d = p.slots[in.in[0]].dtype;
  for (int s : in.in)
    if (p.slots[s].dtype != d) fail("operands must share one dtype");
  if (!is_float(d)) fail(std::string("operand dtype ") + dtype_name(d) + " not supported; needs a float dtype");
  a.dtype = d;
  a.alpha = attr_float(in, "alpha");
  const int qkv = in.in[0];
  a.q = operand(p, qkv, optional_ints(in, "q_view"), "q");
  a.k = operand(p, a.grad ? qkv : in.in[1], optional_ints(in, "k_view"), "k");
  a.v = operand(p, a.grad ? qkv : in.in[2], optional_ints(in, "v_view"), "v");
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
  a.d_out = operand(p, in.in[1], optional_ints(in, "d_out_view"), "d_out");
  if (a.d_out.B != a.q.B || a.d_out.H != a.q.H || a.d_out.L != a.q.L || a.d_out.D != a.v.D)
    fail("d_out needs the output's logical shape [B, H, Lq, Dv]");
  if (a.q.L != a.k.L) fail("attention_grad needs equal query and key lengths");
  check_blas(a.d_out.ld, "row stride");
  const Shape want{a.q.B, a.q.H, a.q.L, a.k.L};
  if (p.slots[in.in[2]].shape != want)
    fail("weights need shape " + shape_str(want) + ", got " + shape_str(p.slots[in.in[2]].shape));
  a.probs = in.in[2];
  return a;
}

// The output slot's shape, and the places of the results in it.
Slot output_slot(const Program& p, const Instr& in, AttentionPlan* a) {
  const int64_t B = a->q.B, H = a->q.H, Lq = a->q.L, Dv = a->v.D;
  if (!a->grad) {
    if (in.attrs.count("out_view"))
      return Slot{{B, Lq, checked_mul(H, Dv, "output width")}, a->dtype};
    return Slot{{B, H, Lq, Dv}, a->dtype};
  }
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
  Operand* outs[3] = {&a->dq, &a->dk, &a->dv};
  const int64_t dims[3] = {a->q.D, a->k.D, a->v.D};
  for (int i = 0; i < 3; ++i) {
    Operand& o = *outs[i];
    o.slot = in.out.empty() ? -1 : in.out[0];
    o.B = B; o.H = H; o.L = Lq; o.D = dims[i];
    o.ld = width; o.h_stride = dims[i]; o.b_stride = Lq * width; o.base = cols[i];
  }
  return Slot{{B, Lq, width}, a->dtype};
}

template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C to beta; the product of an empty contraction is zero
    if (beta == T(0))
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
    return;
  }
  auto A_ = ta ? CblasTrans : CblasNoTrans;
  auto B_ = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    LUCID_SGEMM(CblasRowMajor, A_, B_, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    LUCID_DGEMM(CblasRowMajor, A_, B_, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Row softmax in place, as the softmax kernel computes it (max, exp of the difference, sum in
// double, multiply by the reciprocal); a NaN anywhere in the row makes the row NaN.
template <class T>
void softmax_rows(T* s, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * n;
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
  thread_local std::vector<T> buf[2];
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

template <class T>
void run_forward(const AttentionPlan& a, void* const* slots) {
  const T* q = static_cast<const T*>(slots[a.q.slot]);
  const T* k = static_cast<const T*>(slots[a.k.slot]);
  const T* v = static_cast<const T*>(slots[a.v.slot]);
  T* out = static_cast<T*>(slots[a.out.slot]);
  const int64_t Lq = a.q.L, Lk = a.k.L, D = a.q.D, Dv = a.v.D;
  const int64_t block = rows_per_block(Lq, Lk);
  const int64_t blocks = (Lq + block - 1) / block;
  const T alpha = static_cast<T>(a.alpha);
  const double macs = static_cast<double>(block) * static_cast<double>(Lk) * static_cast<double>(D + Dv);
  const double largest = static_cast<double>(block) * static_cast<double>(Lk) *
                         static_cast<double>(std::max(D, Dv));
  for_tasks(a.q.B * a.q.H * blocks, macs, largest, [&](int64_t task) {
    const int64_t bh = task / blocks, r0 = (task % blocks) * block;
    const int64_t b = bh / a.q.H, h = bh % a.q.H, rows = std::min(block, Lq - r0);
    T* s = scratch<T>(static_cast<size_t>(rows * Lk), 0);
    gemm<T>(false, true, rows, Lk, D, alpha, q + a.q.at(b, h) + r0 * a.q.ld, a.q.ld,
            k + a.k.at(b, h), a.k.ld, T(0), s, Lk);
    softmax_rows(s, rows, Lk);
    gemm<T>(false, false, rows, Dv, Lk, T(1), s, Lk, v + a.v.at(b, h), a.v.ld, T(0),
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
  const T* qkv = static_cast<const T*>(slots[a.q.slot]);
  const T* d_out = static_cast<const T*>(slots[a.d_out.slot]);
  const T* probs = static_cast<const T*>(slots[a.probs]);
  T* grad = static_cast<T*>(slots[a.dq.slot]);
  const int64_t L = a.q.L, D = a.q.D, Dv = a.v.D;
  const int64_t block = rows_per_block(L, L);
  const T alpha = static_cast<T>(a.alpha);
  const double macs = static_cast<double>(L) * static_cast<double>(L) *
                      static_cast<double>(2 * D + 2 * Dv);
  const double largest = static_cast<double>(block) * static_cast<double>(L) *
                         static_cast<double>(std::max(D, Dv));
  for_tasks(a.q.B * a.q.H, macs, largest, [&](int64_t bh) {
    const int64_t b = bh / a.q.H, h = bh % a.q.H;
    const T* Q = qkv + a.q.at(b, h);
    const T* K = qkv + a.k.at(b, h);
    const T* V = qkv + a.v.at(b, h);
    const T* dO = d_out + a.d_out.at(b, h);
    const T* P = probs + bh * L * L;
    T* dQ = grad + a.dq.at(b, h);
    T* dK = grad + a.dk.at(b, h);
    T* dV = grad + a.dv.at(b, h);
    if (L == 0) return;
    for (int64_t r0 = 0; r0 < L; r0 += block) {
      const int64_t rows = std::min(block, L - r0);
      const T beta = r0 == 0 ? T(0) : T(1);  // dK and dV sum over the query blocks
      const T* p = P + r0 * L;
      T* dp = scratch<T>(static_cast<size_t>(rows * L), 0);
      const T* Qb = Q + r0 * a.q.ld;
      const T* dOb = dO + r0 * a.d_out.ld;
      gemm<T>(false, true, rows, L, Dv, T(1), dOb, a.d_out.ld, V, a.v.ld, T(0), dp, L);
      gemm<T>(true, false, L, Dv, rows, T(1), p, L, dOb, a.d_out.ld, beta, dV, a.dv.ld);
      for (int64_t r = 0; r < rows; ++r) {
        const T* pr = p + r * L;
        T* dr = dp + r * L;
        const T dot = dot_run(pr, dr, L);
        for (int64_t j = 0; j < L; ++j) dr[j] = pr[j] * (dr[j] - dot);
      }
      gemm<T>(false, false, rows, D, L, alpha, dp, L, K, a.k.ld, T(0), dQ + r0 * a.dq.ld, a.dq.ld);
      gemm<T>(true, false, L, D, rows, alpha, dp, L, Qb, a.q.ld, beta, dK, a.dk.ld);
    }
  });
}

}  // namespace

Slot infer_attention(const Program& p, const Instr& in) {
  AttentionPlan a = plan(p, in);
  return output_slot(p, in, &a);
}

int64_t attention_work(const Program& p, const Instr& in) {
  AttentionPlan a = plan(p, in);
  auto sat_mul = [](int64_t x, int64_t y) {
    int64_t r;
    return __builtin_mul_overflow(x, y, &r) ? INT64_MAX : r;
  };
  const int64_t scores = sat_mul(sat_mul(a.q.B, a.q.H), sat_mul(a.q.L, a.k.L));
  // Multiply-adds of the products, plus the softmax's exp per score.
  const int64_t per_score = a.grad ? 2 * a.q.D + 2 * a.v.D + 4 : a.q.D + a.v.D + 4;
  const int64_t work = sat_mul(scores, per_score);
  return work == INT64_MAX ? work : work + 1;
}

Step make_attention_step(const Program& p, const Instr& in) {
  auto a = std::make_shared<AttentionPlan>(plan(p, in));
  output_slot(p, in, a.get());
  if (!a->grad) {
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
