// Matmul and convolution on BLAS (im2col + gemm), and 2-D pooling.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "lucid/blas.h"
#include "lucid/conv.h"
#include "lucid/gelu.h"
#include "lucid/kernels.h"
#include "lucid/parallel.h"
#include "lucid/sgemm.h"

namespace lucid {

void blas_set_threads(int n) {
#ifdef LUCID_BLAS_SET_THREADS
  LUCID_BLAS_SET_THREADS(n);
#else
  (void)n;
#endif
}

int blas_get_threads() {
#ifdef LUCID_BLAS_GET_THREADS
  return LUCID_BLAS_GET_THREADS();
#else
  return 1;
#endif
}

namespace {

// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major (alpha is 1 for integers).
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, T alpha = T(1)) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = beta == T(0) ? T(0) : C[m * ldc + n] * beta;
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_chosen(ta, tb, M, N, K))
      return sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else if constexpr (std::is_same_v<T, double>) {
    blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    using UT = std::make_unsigned_t<T>;  // integer products wrap, never overflow UB
    for (int64_t m = 0; m < M; ++m) {
      UT* c = reinterpret_cast<UT*>(C + m * ldc);
      for (int64_t n = 0; n < N; ++n) c[n] = beta == T(0) ? 0 : c[n] * static_cast<UT>(beta);
      for (int64_t k = 0; k < K; ++k) {
        UT a = static_cast<UT>(ta ? A[k * lda + m] : A[m * lda + k]);
        for (int64_t n = 0; n < N; ++n)
          c[n] += a * static_cast<UT>(tb ? B[n * ldb + k] : B[k * ldb + n]);
      }
    }
  }
}

struct MatmulPlan {
  int a, b, out;
  int bias = -1;    // gemm's optional bias slot (a row added to every output row)
  int addend = -1;  // gemm's optional addend slot (the output's shape)
  double alpha = 1.0;
  GemmActivation act = GemmActivation::none;  // gemm's optional activation (after bias/addend)
  DType dtype;
  bool ta, tb;
  int64_t M, N, K, batch;
  int64_t lda, ldb, ldc;               // row strides of the stored matrices
  std::vector<int64_t> a_off, b_off, c_off;  // matrix offsets per batch entry (elements)
  bool fold_batch_into_m = false;
  GemmTypes types;  // a gemm reading or writing half values (types.has_half): gemm_mixed
  const void* shared_b = nullptr;  // gemm{share_b}: B's packing reused within a run (sgemm.h)
};

// A gemm with half operands or output: gemm_mixed per batch entry (or once, batch folded into M).
void run_mixed_matmul(const MatmulPlan& p, void* const* slots) {
  auto at = [&](int slot, GemmType t, int64_t offset) {
    return static_cast<char*>(slots[slot]) + offset * (t == GemmType::f32 ? 4 : 2);
  };
  MixedGemm g;
  g.ta = p.ta, g.tb = p.tb;
  g.M = p.fold_batch_into_m ? p.M * p.batch : p.M;
  g.N = p.N, g.K = p.K;
  g.alpha = static_cast<float>(p.alpha);
  g.a_type = p.types.a, g.b_type = p.types.b, g.c_type = p.types.out;
  g.lda = p.fold_batch_into_m ? p.K : p.lda, g.ldb = p.ldb, g.ldc = p.ldc;
  g.bias = p.bias >= 0 ? slots[p.bias] : nullptr;
  g.bias_type = p.types.bias;
  g.act = p.act;
  g.round_product = p.types.round_product;
  const int64_t entries = p.fold_batch_into_m ? 1 : p.batch;
  g.shared_b = entries == 1 ? p.shared_b : nullptr;  // one B per entry: nothing to share
  for (int64_t i = 0; i < entries; ++i) {
    g.A = at(p.a, g.a_type, p.a_off[i]);
    g.B = at(p.b, g.b_type, p.b_off[i]);
    g.C = at(p.out, g.c_type, p.c_off[i]);
    g.addend = p.addend >= 0 ? static_cast<const float*>(slots[p.addend]) + i * p.M * p.N : nullptr;
    g.ld_addend = p.N;
    gemm_mixed(g);
  }
}

// A batch of matrices with a few multiply-adds each (an adaptive average pool of 2x2 planes as
// [1, 2] @ [2, 2] products over 16 x 512 planes in workload G): one BLAS call per entry cost
// ~0.1 us of call overhead for ~4 multiply-adds, 1 ms in all; plain loops instead, split over
// entries. Each output is sum_k a[m, k] * b[k, n] in k order, times alpha, plus C (beta = 1: a
// bias or addend written there first). The sum is fused multiply-adds, as in BLAS and Lucid's
// sgemm: a product that overflows only when rounded alone (1e30 * 1e30 in float32) then keeps
// the first infinity's sign instead of meeting an infinity of the other sign (NaN).
constexpr int64_t kTinyGemmMacs = 64;

template <class T>
void tiny_gemm_batch(const MatmulPlan& p, const T* A, const T* B, T beta, T* C, T alpha) {
  const int64_t macs = std::max<int64_t>(1, p.M * p.N * std::max<int64_t>(p.K, 1));
  parallel_for(p.batch, std::max<int64_t>(1, (int64_t{1} << 15) / macs),
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i) {
                   const T* a = A + p.a_off[i];
                   const T* b = B + p.b_off[i];
                   T* c = C + p.c_off[i];
                   for (int64_t m = 0; m < p.M; ++m)
                     for (int64_t n = 0; n < p.N; ++n) {
                       T acc = T(0);
                       for (int64_t k = 0; k < p.K; ++k)
                         acc = std::fma(p.ta ? a[k * p.lda + m] : a[m * p.lda + k],
                                        p.tb ? b[n * p.ldb + k] : b[k * p.ldb + n], acc);
                       T& out = c[m * p.ldc + n];
                       out = beta == T(0) ? alpha * acc : alpha * acc + out;
                     }
                 }
               });
}

template <class T>
void run_matmul(const MatmulPlan& p, void* const* slots) {
  const T* A = static_cast<const T*>(slots[p.a]);
  const T* B = static_cast<const T*>(slots[p.b]);
  T* C = static_cast<T*>(slots[p.out]);
  const int64_t lda = p.lda, ldb = p.ldb;
  const T alpha = static_cast<T>(p.alpha);
  if constexpr (std::is_same_v<T, float>) {
    // One product over dense rows: Lucid's kernel applies bias, addend and activation to each
    // tile while it is in registers.
    const bool single = p.fold_batch_into_m || (p.batch == 1 && p.c_off[0] == 0 && p.ldc == p.N);
    const int64_t M = p.fold_batch_into_m ? p.M * p.batch : p.M;
    if (single && sgemm_chosen(p.ta, p.tb, M, p.N, p.K)) {
      GemmEpilogue ep;
      ep.bias = p.bias >= 0 ? static_cast<const float*>(slots[p.bias]) : nullptr;
      ep.addend = p.addend >= 0 ? static_cast<const float*>(slots[p.addend]) : nullptr;
      ep.ld_addend = p.N;
      ep.act = p.act;
      const int64_t lda_ = p.fold_batch_into_m ? p.K : lda;
      return sgemm(p.ta, p.tb, M, p.N, p.K, alpha, A + p.a_off[0], lda_, B + p.b_off[0], ldb,
                   0.0f, C, p.N, ep, p.shared_b);
    }
  }
  // A bias and an addend (a residual) are written into C first and accumulated onto with
  // beta = 1: BLAS would otherwise zero C itself (its beta pass), so they cost no pass over C
  // of their own.
  T beta = T(0);
  const int64_t rows = p.batch * p.M;
  if (p.addend >= 0) {
    const T* add = static_cast<const T*>(slots[p.addend]);
    if (p.bias >= 0) {
      const T* bias = static_cast<const T*>(slots[p.bias]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < p.N; ++j) C[r * p.N + j] = add[r * p.N + j] + bias[j];
    } else {
      std::memcpy(C, add, sizeof(T) * rows * p.N);
    }
    beta = T(1);
  } else if (p.bias >= 0) {
    const T* bias = static_cast<const T*>(slots[p.bias]);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(C + r * p.N, bias, sizeof(T) * p.N);
    beta = T(1);
  }
  const bool tiny = std::is_floating_point_v<T> && !p.fold_batch_into_m && p.batch >= 2 &&
                    p.M * p.N * p.K <= kTinyGemmMacs;
  if (tiny) {
    if constexpr (std::is_floating_point_v<T>) tiny_gemm_batch(p, A, B, beta, C, alpha);
  } else if (p.fold_batch_into_m) {
    gemm<T>(false, p.tb, p.M * p.batch, p.N, p.K, A, p.K, B, ldb, beta, C, p.N, alpha);
  } else {
    bool done = false;
    if constexpr (std::is_floating_point_v<T>) {
      // The pool's entries call the BLAS: only where the loop below would too (Lucid's sgemm
      // sums a float32 entry in its own order), so results do not depend on the thread count.
      bool blas_entries = true;
      if constexpr (std::is_same_v<T, float>)
        blas_entries = !sgemm_chosen(p.ta, p.tb, p.M, p.N, p.K);
      if (blas_entries) {
        const BatchedGemm<T> g{p.ta, p.tb, p.batch, p.M,    p.N,          p.K,  alpha,
                               A,    p.a_off.data(), lda, B, p.b_off.data(), ldb, beta,
                               C,    p.c_off.data(), p.ldc};
        done = gemm_batch_parallel(g);
      }
    }
    for (int64_t i = 0; i < p.batch && !done; ++i)
      gemm<T>(p.ta, p.tb, p.M, p.N, p.K, A + p.a_off[i], lda, B + p.b_off[i], ldb, beta,
              C + p.c_off[i], p.ldc, alpha);
  }
  if (p.act != GemmActivation::none) {
    // Elementwise, so over the whole output slot whatever its layout (a c_view included).
    const int64_t total = p.batch * p.M * p.N;
    if constexpr (std::is_same_v<T, float>) {
      sgemm_activation(p.act, 1, total, C, total);
    } else if constexpr (std::is_floating_point_v<T>) {
      for (int64_t i = 0; i < total; ++i)
        C[i] = p.act == GemmActivation::relu ? relu(C[i]) : gelu(C[i]);
    }
  }
}

// matmul, and the CPU-only gemm: alpha * matmul(a, b) (+ bias[N] on every row) (+ addend).
Step make_matmul(const Program& prog, const Instr& in) {
  auto p = std::make_shared<MatmulPlan>();
  // Logical shapes: a head view reads a [B, L, W] slot as [B, H, L, D] (program.h).
  const Slot a{gemm_logical_shape(prog, in, 0), DType::F32};
  const Slot b{gemm_logical_shape(prog, in, 1), DType::F32};
  const Slot o{gemm_logical_shape(prog, in, -1), prog.slots[in.out[0]].dtype};
  const HeadView views[3] = {head_view(in, -1), head_view(in, 0), head_view(in, 1)};
  p->a = in.in[0];
  p->b = in.in[1];
  p->out = in.out[0];
  if (in.op == Op::gemm) {
    p->alpha = attr_float(in, "alpha");
    p->act = gemm_activation(in);
    for (size_t i = 2; i < in.in.size(); ++i)
      (prog.slots[in.in[i]].shape.size() == 1 && i == 2 ? p->bias : p->addend) = in.in[i];
    p->types = gemm_types(prog, in);
    // The key names B's slot (and layout) in this program, which lives as long as the step.
    if (in.attrs.count("share_b") && attr_bool(in, "share_b"))
      p->shared_b = reinterpret_cast<const char*>(&prog.slots[in.in[1]]) +
                    (attr_bool(in, "transpose_b") ? 1 : 0);
  }
  p->dtype = o.dtype;
  p->ta = attr_bool(in, "transpose_a");
  p->tb = attr_bool(in, "transpose_b");
  size_t r = o.shape.size();
  p->M = o.shape[r - 2];
  p->N = o.shape[r - 1];
  p->K = p->ta ? a.shape[a.shape.size() - 2] : a.shape.back();
  Shape batch(o.shape.begin(), o.shape.end() - 2);
  p->batch = numel(batch);
  // Offset of each batch entry's matrix and the stored row stride, for a dense operand or a
  // head view ((b, h) at b*L*W + h*D + col0, rows W apart).
  auto offsets = [&](const Shape& s, const HeadView& v, int64_t slot_width, int64_t* ld) {
    Shape bs(s.begin(), s.end() - 2);
    std::vector<int64_t> own = contiguous_strides(bs), st(batch.size(), 0), off;
    for (int64_t& x : own) x *= s[s.size() - 2] * s.back();
    int64_t base = 0;
    *ld = s.back();
    if (v.heads > 0) {  // logical [B, H, L, D] of a [B, L, W] slot
      own = {s[2] * slot_width, v.dim};
      base = v.col0;
      *ld = slot_width;
    }
    for (size_t d = 0; d < bs.size(); ++d)
      st[batch.size() - bs.size() + d] = bs[d] == 1 ? 0 : own[d];
    for (int64_t i = 0; i < p->batch; ++i) {
      int64_t o_ = base, rem = i;
      for (size_t d = batch.size(); d-- > 0;) {
        o_ += (rem % batch[d]) * st[d];
        rem /= batch[d];
      }
      off.push_back(o_);
    }
    return off;
  };
  auto width = [&](int slot) { return prog.slots[slot].shape.back(); };
  p->a_off = offsets(a.shape, views[1], width(p->a), &p->lda);
  p->b_off = offsets(b.shape, views[2], width(p->b), &p->ldb);
  p->c_off = offsets(o.shape, views[0], width(p->out), &p->ldc);
  p->fold_batch_into_m = !p->ta && numel(Shape(b.shape.begin(), b.shape.end() - 2)) == 1 &&
                         numel(Shape(a.shape.begin(), a.shape.end() - 2)) == p->batch &&
                         views[0].heads == 0 && views[1].heads == 0 && views[2].heads == 0;
  return [p](void* const* slots) {
    if (p->types.has_half) return run_mixed_matmul(*p, slots);
    dispatch_dtype(p->dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (!std::is_same_v<T, uint8_t>) run_matmul<T>(*p, slots);
    });
  };
}

// out = c + alpha * op(a) @ op(b): BLAS with beta = 1 on out, after copying c there unless the
// runtime placed out in c's own buffer (an in-place weight update).
Step make_matmul_accumulate(const Program& prog, const Instr& in) {
  const Slot &a = prog.slots[in.in[0]], &o = prog.slots[in.out[0]];
  const bool ta = attr_bool(in, "transpose_a"), tb = attr_bool(in, "transpose_b");
  const int64_t M = o.shape[0], N = o.shape[1], K = ta ? a.shape[0] : a.shape[1];
  const int ia = in.in[0], ib = in.in[1], ic = in.in[2], ialpha = in.in[3], iout = in.out[0];
  const DType dtype = o.dtype;
  const size_t bytes = o.bytes();
  return [=](void* const* slots) {
    if (slots[iout] != slots[ic]) std::memcpy(slots[iout], slots[ic], bytes);
    dispatch_dtype(dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_floating_point_v<T>) {
        const T alpha = *static_cast<const T*>(slots[ialpha]);
        const T* A = static_cast<const T*>(slots[ia]);
        const T* B = static_cast<const T*>(slots[ib]);
        T* C = static_cast<T*>(slots[iout]);
        if (M == 0 || N == 0 || K == 0) return;
        // gemm(): float32 on Lucid's kernel where the shape rule picks it (a weight gradient
        // accumulated with beta = 1), OpenBLAS otherwise.
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        gemm<T>(ta, tb, M, N, K, A, lda, B, ldb, T(1), C, N, alpha);
      }
    });
  };
}

// ---- convolution -------------------------------------------------------------------------------

struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, HO, WO, G, sh, sw, dh, dw, pt, pl;
  int64_t cg() const { return C / G; }
  int64_t og() const { return O / G; }
  int64_t ckk() const { return cg() * KH * KW; }
  int64_t howo() const { return HO * WO; }
  ConvShape shape() const { return {N, C, H, W, O, KH, KW, HO, WO, G, sh, sw, dh, dw, pt, pl}; }
};

ConvGeom conv_geom(const Instr& in, const Shape& x, const Shape& w, const Shape& y) {
  const auto &st = attr_ints(in, "strides"), &dl = attr_ints(in, "dilation"),
             &pd = attr_ints(in, "padding");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], attr_int(in, "groups"),
          st[0], st[1], dl[0], dl[1], pd[0], pd[2]};
}

// ceil(a / b) for b > 0 and any sign of a.
inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// For one kernel tap along one axis (input index = output index * stride + shift), the output
// indices whose input lies inside [0, in_size): [lo, hi).
struct Inside {
  int64_t lo, hi;
};
inline Inside inside(int64_t shift, int64_t stride, int64_t in_size, int64_t out_size) {
  const int64_t lo = std::min(out_size, std::max<int64_t>(0, ceil_div(-shift, stride)));
  return {lo, std::max(lo, std::min(out_size, ceil_div(in_size - shift, stride)))};
}

// col[(c*KH + i)*KW + j][n*HO*WO + oh*WO + ow] = x[n, c, oh*sh - pt + i*dh, ow*sw - pl + j*dw]
// (0 outside) for the `images` images starting at x; ld is the distance between col rows. Each
// col row is written front to back across the images: row-by-row per image instead would write
// 144 rows tens of KB apart in turn (4.5 ms instead of ~1 ms for workload C's second conv).
// The in-bounds rows and columns of each tap are computed once, so the copy loops have no bounds
// checks (with stride 1 the inner loop is a contiguous copy).
template <class T>
void im2col(const ConvGeom& g, const T* x, T* col, int64_t ld = 0, int64_t images = 1) {
  if (ld == 0) ld = g.howo();
  const int64_t HO = g.HO, WO = g.WO, sw = g.sw, image = g.C * g.H * g.W;
  for (int64_t c = 0; c < g.cg(); ++c)
    for (int64_t i = 0; i < g.KH; ++i) {
      const int64_t rshift = i * g.dh - g.pt;
      const auto [oh_lo, oh_hi] = inside(rshift, g.sh, g.H, HO);
      for (int64_t j = 0; j < g.KW; ++j) {
        const int64_t shift = j * g.dw - g.pl;
        const auto [lo, hi] = inside(shift, sw, g.W, WO);
        for (int64_t n = 0; n < images; ++n) {
          T* row = col + ((c * g.KH + i) * g.KW + j) * ld + n * g.howo();
          const T* plane = x + n * image + c * g.H * g.W;
          std::fill_n(row, oh_lo * WO, T(0));
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
            T* dst = row + oh * WO;
            const T* src = plane + (oh * g.sh + rshift) * g.W + shift;
            for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = T(0);
            if (sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * sw];
            }
            for (int64_t ow = hi; ow < WO; ++ow) dst[ow] = T(0);
          }
          std::fill_n(row + oh_hi * WO, (HO - oh_hi) * WO, T(0));
        }
      }
    }
}

// The adjoint of im2col: dx[n, c, ...] += col[...] over the `images` images, rows walked front to
// back across the batch as in im2col. Each element's taps are still added in (i, j) order, so
// the sums are the same, bit for bit, as image by image.
template <class T>
void col2im(const ConvGeom& g, const T* col, T* x, int64_t ld = 0, int64_t images = 1) {
  if (ld == 0) ld = g.howo();
  const int64_t image = g.C * g.H * g.W;
  for (int64_t c = 0; c < g.cg(); ++c)
    for (int64_t i = 0; i < g.KH; ++i) {
      const int64_t rshift = i * g.dh - g.pt;
      const auto [oh_lo, oh_hi] = inside(rshift, g.sh, g.H, g.HO);
      for (int64_t j = 0; j < g.KW; ++j) {
        const int64_t shift = j * g.dw - g.pl;
        const auto [lo, hi] = inside(shift, g.sw, g.W, g.WO);
        for (int64_t n = 0; n < images; ++n) {
          const T* row = col + ((c * g.KH + i) * g.KW + j) * ld + n * g.howo();
          T* plane = x + n * image + c * g.H * g.W;
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
            T* dst = plane + (oh * g.sh + rshift) * g.W + shift;
            const T* src = row + oh * g.WO;
            if (g.sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += src[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow * g.sw] += src[ow];
            }
          }
        }
      }
    }
}

bool is_pointwise(const ConvGeom& g) {
  return g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 &&
         g.HO == g.H && g.WO == g.W;
}

template <class T>
T* scratch(size_t n) {
  thread_local std::vector<double> buf;
  size_t words = (n * sizeof(T) + sizeof(double) - 1) / sizeof(double);
  if (buf.size() < words) buf.resize(words);
  return reinterpret_cast<T*>(buf.data());
}

// conv2d_bias's epilogue after an im2col + BLAS convolution (see ConvEpilogue).
template <class T>
void apply_epilogue(const ConvGeom& g, const ConvEpilogue<T>& ep, T* y) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o) {
      const int64_t at = (n * g.O + o) * g.howo();
      T* p = y + at;
      const T* res = ep.residual ? ep.residual + at : nullptr;
      const T a = ep.scale ? ep.scale[o] : T(1), b = ep.bias ? ep.bias[o] : T(0);
      for (int64_t i = 0; i < g.howo(); ++i) {
        T v = ep.scale ? p[i] * a + b : p[i] + b;
        if (res) v += res[i];
        p[i] = ep.relu ? lucid::relu(v) : v;
      }
    }
}

template <class T>
void conv_forward_im2col(const ConvGeom& g, const T* x, const T* w, T* y);

// y = epilogue(conv(x, w)) (conv2d_bias's scale, bias, residual and ReLU; none for conv2d).
template <class T>
void conv_forward(const ConvGeom& g, const T* x, const T* w, T* y,
                  const ConvEpilogue<T>& ep = {}) {
  if (conv2d_direct_forward(g.shape(), x, w, ep, y)) return;
  conv_forward_im2col(g, x, w, y);
  if (ep.scale || ep.bias || ep.residual || ep.relu) apply_epilogue(g, ep, y);
}

template <class T>
void conv_forward_im2col(const ConvGeom& g, const T* x, const T* w, T* y) {
  if (g.G == 1 && g.N > 1) {
    // All images side by side in one im2col matrix: one large GEMM instead of N small ones
    // (better BLAS efficiency and threading), then the [O, N, HW] result is put back as NCHW.
    const int64_t cols = g.N * g.howo();
    T* col = scratch<T>(g.ckk() * cols + g.O * cols);
    T* tmp = col + g.ckk() * cols;
    im2col(g, x, col, cols, g.N);
    gemm<T>(false, false, g.O, cols, g.ckk(), w, g.ckk(), col, cols, T(0), tmp, cols);
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t o = 0; o < g.O; ++o)
        std::memcpy(y + (n * g.O + o) * g.howo(), tmp + o * cols + n * g.howo(), g.howo() * sizeof(T));
    return;
  }
  T* col = is_pointwise(g) ? nullptr : scratch<T>(g.ckk() * g.howo());
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t gr = 0; gr < g.G; ++gr) {
      const T* xg = x + (n * g.C + gr * g.cg()) * g.H * g.W;
      const T* src = xg;
      if (col) { im2col(g, xg, col); src = col; }
      gemm<T>(false, false, g.og(), g.howo(), g.ckk(), w + gr * g.og() * g.ckk(), g.ckk(), src,
              g.howo(), T(0), y + (n * g.O + gr * g.og()) * g.howo(), g.howo());
    }
}

// dy as [O, N*HW]: the images side by side, for one GEMM over the whole batch.
template <class T>
void gather_images(const ConvGeom& g, const T* dy, T* out) {
  const int64_t cols = g.N * g.howo();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      std::memcpy(out + o * cols + n * g.howo(), dy + (n * g.O + o) * g.howo(), g.howo() * sizeof(T));
}

template <class T>
void conv_data_grad(const ConvGeom& g, const T* dy, const T* w, T* dx) {
  if (conv2d_direct_data_grad(g.shape(), dy, w, dx)) return;
  std::fill_n(dx, g.N * g.C * g.H * g.W, T(0));
  if (g.G == 1 && g.N > 1) {
    const int64_t cols = g.N * g.howo();
    T* col = scratch<T>(g.ckk() * cols + g.O * cols);
    T* dy_all = col + g.ckk() * cols;
    gather_images(g, dy, dy_all);
    gemm<T>(true, false, g.ckk(), cols, g.O, w, g.ckk(), dy_all, cols, T(0), col, cols);
    col2im(g, col, dx, cols, g.N);
    return;
  }
  T* col = scratch<T>(g.ckk() * g.howo());
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t gr = 0; gr < g.G; ++gr) {
      gemm<T>(true, false, g.ckk(), g.howo(), g.og(), w + gr * g.og() * g.ckk(), g.ckk(),
              dy + (n * g.O + gr * g.og()) * g.howo(), g.howo(), T(0), col, g.howo());
      col2im(g, col, dx + (n * g.C + gr * g.cg()) * g.H * g.W);
    }
}

template <class T>
void conv_weights_grad(const ConvGeom& g, const T* x, const T* dy, T* dw) {
  if (conv2d_direct_weights_grad(g.shape(), x, dy, dw)) return;
  if (g.G == 1 && g.N > 1) {
    const int64_t cols = g.N * g.howo();
    T* col = scratch<T>(g.ckk() * cols + g.O * cols);
    T* dy_all = col + g.ckk() * cols;
    im2col(g, x, col, cols, g.N);
    gather_images(g, dy, dy_all);
    gemm<T>(false, true, g.O, g.ckk(), cols, dy_all, cols, col, cols, T(0), dw, g.ckk());
    return;
  }
  std::fill_n(dw, g.O * g.ckk(), T(0));
  T* col = scratch<T>(g.ckk() * g.howo());
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t gr = 0; gr < g.G; ++gr) {
      im2col(g, x + (n * g.C + gr * g.cg()) * g.H * g.W, col);
      gemm<T>(false, true, g.og(), g.ckk(), g.howo(), dy + (n * g.O + gr * g.og()) * g.howo(),
              g.howo(), col, g.howo(), T(1), dw + gr * g.og() * g.ckk(), g.ckk());
    }
}

Step make_conv(const Program& p, const Instr& in) {
  int a = in.in[0], b = in.in[1], o = in.out[0];
  // conv2d_bias(x, w, bias[, scale[, residual]]).
  const bool fused = in.op == Op::conv2d_bias;
  const int bias = fused ? in.in[2] : -1;
  const int scale = fused && in.in.size() > 3 ? in.in[3] : -1;
  const int residual = fused && in.in.size() > 4 ? in.in[4] : -1;
  const bool relu = fused && attr_bool(in, "relu");
  DType d = p.slots[o].dtype;
  ConvGeom g;
  if (in.op == Op::conv2d || in.op == Op::conv2d_bias) g = conv_geom(in, p.slots[a].shape, p.slots[b].shape, p.slots[o].shape);
  else if (in.op == Op::conv2d_data_grad)
    g = conv_geom(in, p.slots[o].shape, p.slots[b].shape, p.slots[a].shape);
  else g = conv_geom(in, p.slots[a].shape, p.slots[o].shape, p.slots[b].shape);
  Op op = in.op;
  auto epilogue = [=](void* const* s, auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    ConvEpilogue<T> ep;
    ep.bias = static_cast<const T*>(s[bias]);
    if (scale >= 0) ep.scale = static_cast<const T*>(s[scale]);
    if (residual >= 0) ep.residual = static_cast<const T*>(s[residual]);
    ep.relu = relu;
    return ep;
  };
  return [=](void* const* s) {
    if (d == DType::F32) {
      auto* x = static_cast<const float*>(s[a]);
      auto* y = static_cast<const float*>(s[b]);
      auto* out = static_cast<float*>(s[o]);
      if (op == Op::conv2d_bias) conv_forward(g, x, y, out, epilogue(s, static_cast<float*>(nullptr)));
      else if (op == Op::conv2d) conv_forward(g, x, y, out);
      else if (op == Op::conv2d_data_grad) conv_data_grad(g, x, y, out);
      else conv_weights_grad(g, x, y, out);
    } else {
      auto* x = static_cast<const double*>(s[a]);
      auto* y = static_cast<const double*>(s[b]);
      auto* out = static_cast<double*>(s[o]);
      if (op == Op::conv2d_bias) conv_forward(g, x, y, out, epilogue(s, static_cast<double*>(nullptr)));
      else if (op == Op::conv2d) conv_forward(g, x, y, out);
      else if (op == Op::conv2d_data_grad) conv_data_grad(g, x, y, out);
      else conv_weights_grad(g, x, y, out);
    }
  };
}

// ---- pooling -------------------------------------------------------------------------------------

struct PoolGeom {
  int64_t NC, H, W, HO, WO, KH, KW, sh, sw, dh, dw, pt, pl;
  bool include_pad;
};

PoolGeom pool_geom(const Instr& in, const Shape& x, const Shape& y) {
  const auto &k = attr_ints(in, "kernel"), &st = attr_ints(in, "strides"),
             &pd = attr_ints(in, "padding");
  bool is_max = in.op == Op::max_pool2d || in.op == Op::max_pool2d_grad ||
                in.op == Op::max_pool2d_relu_grad;
  std::vector<int64_t> dl = is_max ? attr_ints(in, "dilation") : std::vector<int64_t>{1, 1};
  bool include = is_max ? true : attr_bool(in, "count_include_pad");
  return {x[0] * x[1], x[2], x[3], y[2], y[3], k[0], k[1], st[0], st[1], dl[0], dl[1],
          pd[0], pd[2], include};
}

// Index (in the plane) of the window's winner: the first maximum in row-major tap order; a padded
// tap counts as -inf and gives -1.
template <class T>
int64_t max_tap(const PoolGeom& g, const T* x, int64_t oh, int64_t ow, T* best_out) {
  T best = -std::numeric_limits<T>::infinity();
  int64_t arg = -1;
  bool first = true;
  for (int64_t i = 0; i < g.KH; ++i) {
    int64_t ih = oh * g.sh - g.pt + i * g.dh;
    for (int64_t j = 0; j < g.KW; ++j) {
      int64_t iw = ow * g.sw - g.pl + j * g.dw;
      bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
      T v = inside ? x[ih * g.W + iw] : -std::numeric_limits<T>::infinity();
      // The first maximum wins ties; a NaN tap always takes over (PyTorch's CPU rule, and eager
      // Lucid's), so the gradient goes to the last NaN of a window.
      if (first || v > best || v != v) {
        best = v;
        arg = inside ? ih * g.W + iw : -1;
      }
      first = false;
    }
  }
  *best_out = best;
  return arg;
}

template <class T>
T avg_divisor(const PoolGeom& g, int64_t oh, int64_t ow) {
  if (g.include_pad) return T(g.KH * g.KW);
  int64_t h0 = oh * g.sh - g.pt, w0 = ow * g.sw - g.pl;
  int64_t rows = std::min(h0 + g.KH, g.H) - std::max<int64_t>(h0, 0);
  int64_t cols = std::min(w0 + g.KW, g.W) - std::max<int64_t>(w0, 0);
  return T(std::max<int64_t>(std::max<int64_t>(rows, 0) * std::max<int64_t>(cols, 0), 1));
}

// The running max of a window: a NaN tap makes it NaN and it stays NaN (as max_tap). Written as
// a select of loaded values so it compiles without a branch: on real data the comparison is a
// coin flip, and a mispredicted branch per tap made pooling 10x slower than the memory traffic.
template <class T>
inline T max_nan(T best, T v) {
  return (v > best || v != v) ? v : best;
}

// max_pool2d with every tap inside the plane (no padding, dilation 1): the common case, without
// per-tap bounds checks; 2x2 windows at stride 2 (the usual downsampling) unrolled.
// Planes per part when a pooling kernel is split across the worker pool: at least 2^16 input
// elements each, so waking a worker pays. Each plane is computed as one thread would: the same
// bits at any thread count.
inline int64_t planes_per_part(const PoolGeom& g) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, g.H * g.W));
}

template <class T>
void max_pool_unpadded(const PoolGeom& g, const T* x, T* out, int64_t nc0, int64_t nc1) {
  const int64_t plane = g.H * g.W, oplane = g.HO * g.WO;
  const bool two_by_two = g.KH == 2 && g.KW == 2 && g.sh == 2 && g.sw == 2;
  for (int64_t nc = nc0; nc < nc1; ++nc) {
    const T* xp = x + nc * plane;
    T* yp = out + nc * oplane;
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      const T* top = xp + oh * g.sh * g.W;
      T* y = yp + oh * g.WO;
      if (two_by_two) {
        const T* bottom = top + g.W;
        for (int64_t ow = 0; ow < g.WO; ++ow)
          y[ow] = max_nan(max_nan(max_nan(top[2 * ow], top[2 * ow + 1]), bottom[2 * ow]),
                          bottom[2 * ow + 1]);
        continue;
      }
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        const T* w = top + ow * g.sw;
        T best = w[0];
        for (int64_t i = 0; i < g.KH; ++i)
          for (int64_t j = 0; j < g.KW; ++j) best = max_nan(best, w[i * g.W + j]);
        y[ow] = best;
      }
    }
  }
}

// Max pooling with padding or dilation (a ResNet stem's 3x3/2 pool with padding 1), and the
// gradient of any max pool but the 2x2/2 one. Each plane is first copied into a scratch plane
// whose border holds the padding as -inf, so no loop checks bounds. A window's maximum is then
// separable: every padded row's maximum over each output column's taps (and which tap won) is
// taken once, and an output row is the running maximum of its window's rows, both contiguous
// loops of selects that the compiler vectorizes. Rows first, in row order, each row left to
// right, is max_tap's row-major scan regrouped: max_nan keeps the first of equal values and the
// last NaN, so values and winners are max_tap's bit for bit (signed zeros and NaN payloads
// included; a padded tap wins only as the first tap of an all -inf window, as in max_tap).
//
// The gradient adds each output's gradient at its winner's place in a padded scratch plane,
// in output order from +0 (the order and the float additions of the scalar kernel); winners in
// the padding fall into the border and are dropped when the plane's inside is copied out. With
// `Relu` (max_pool2d_relu_grad) a winner <= 0 or NaN sends its gradient to a sink element
// after the plane instead: the padding is -inf, so `best > 0` is ReLU's mask and bounds at once.
struct PaddedPool {
  int64_t Hp, Wp;  // the padded plane: every tap of every window
};

inline PaddedPool padded_pool(const PoolGeom& g) {
  return {(g.HO - 1) * g.sh + (g.KH - 1) * g.dh + 1, (g.WO - 1) * g.sw + (g.KW - 1) * g.dw + 1};
}

template <class T>
[[gnu::always_inline]] inline void pad_plane(const PoolGeom& g, const PaddedPool& pp,
                                             const T* xp, T* padded) {
  const T lowest = -std::numeric_limits<T>::infinity();
  const int64_t left = std::min(g.pl, pp.Wp);
  const int64_t cols = std::clamp<int64_t>(pp.Wp - g.pl, 0, g.W);
  for (int64_t r = 0; r < pp.Hp; ++r) {
    T* row = padded + r * pp.Wp;
    const int64_t ih = r - g.pt;
    if (ih < 0 || ih >= g.H) {
      std::fill_n(row, pp.Wp, lowest);
      continue;
    }
    std::fill_n(row, left, lowest);
    std::copy_n(xp + ih * g.W, cols, row + left);
    std::fill(row + left + cols, row + pp.Wp, lowest);
  }
}

// Per padded row and output column: the maximum of the window's taps in the row and which tap
// (0..KW-1) won. `SW`: the column stride when known at compile time (0: g.sw), so a stride of 2
// becomes a pair of vector loads and a permute instead of a gather.
template <int SW, class T, class I>
[[gnu::always_inline]] inline void row_max_taps_at(const PoolGeom& g, const PaddedPool& pp,
                                                   const T* padded, T* row_best, I* row_tap) {
  const int64_t sw = SW ? SW : g.sw;
  for (int64_t r = 0; r < pp.Hp; ++r) {
    const T* p = padded + r * pp.Wp;
    T* best = row_best + r * g.WO;
    I* tap = row_tap + r * g.WO;
    for (int64_t ow = 0; ow < g.WO; ++ow) {
      best[ow] = p[ow * sw];
      tap[ow] = 0;
    }
    for (int64_t j = 1; j < g.KW; ++j) {
      const T* q = p + j * g.dw;
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        const T v = q[ow * sw];
        const bool take = v > best[ow] || v != v;
        best[ow] = take ? v : best[ow];
        tap[ow] = take ? I(j) : tap[ow];
      }
    }
  }
}

template <class T, class I>
[[gnu::always_inline]] inline void row_max_taps(const PoolGeom& g, const PaddedPool& pp,
                                                const T* padded, T* row_best, I* row_tap) {
  if (g.sw == 1) row_max_taps_at<1>(g, pp, padded, row_best, row_tap);
  else if (g.sw == 2) row_max_taps_at<2>(g, pp, padded, row_best, row_tap);
  else row_max_taps_at<0>(g, pp, padded, row_best, row_tap);
}

template <class T>
[[gnu::always_inline]] inline void max_pool_padded_body(const PoolGeom& g, const T* x, T* out,
                                                        int64_t nc0, int64_t nc1) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  const PaddedPool pp = padded_pool(g);
  std::vector<T> padded(pp.Hp * pp.Wp), row_best(pp.Hp * g.WO);
  std::vector<I> row_tap(pp.Hp * g.WO);
  for (int64_t nc = nc0; nc < nc1; ++nc) {
    pad_plane(g, pp, x + nc * g.H * g.W, padded.data());
    row_max_taps(g, pp, padded.data(), row_best.data(), row_tap.data());
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      T* y = out + nc * g.HO * g.WO + oh * g.WO;
      const T* first = row_best.data() + oh * g.sh * g.WO;
      std::copy_n(first, g.WO, y);
      for (int64_t i = 1; i < g.KH; ++i) {
        const T* h = first + i * g.dh * g.WO;
        for (int64_t ow = 0; ow < g.WO; ++ow) y[ow] = max_nan(y[ow], h[ow]);
      }
    }
  }
}

template <bool Relu, class T>
[[gnu::always_inline]] inline void max_pool_grad_padded_body(const PoolGeom& g, const T* dy,
                                                             const T* x, T* out, int64_t nc0,
                                                             int64_t nc1) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  const PaddedPool pp = padded_pool(g);
  const int64_t padded_size = pp.Hp * pp.Wp;
  // The gradient's padded plane has one more element: the sink of ReLU-masked winners.
  std::vector<T> padded(padded_size), row_best(pp.Hp * g.WO), best(g.WO), grad(padded_size + 1);
  std::vector<I> row_tap(pp.Hp * g.WO), win_row(g.WO), win_tap(g.WO), place(g.WO);
  const I sink = static_cast<I>(padded_size);
  const int64_t rows = std::clamp<int64_t>(pp.Hp - g.pt, 0, g.H);
  const int64_t cols = std::clamp<int64_t>(pp.Wp - g.pl, 0, g.W);
  for (int64_t nc = nc0; nc < nc1; ++nc) {
    pad_plane(g, pp, x + nc * g.H * g.W, padded.data());
    row_max_taps(g, pp, padded.data(), row_best.data(), row_tap.data());
    std::fill(grad.begin(), grad.end(), T(0));
    const T* dyp = dy + nc * g.HO * g.WO;
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      const T* first = row_best.data() + oh * g.sh * g.WO;
      const I* first_tap = row_tap.data() + oh * g.sh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        best[ow] = first[ow];
        win_row[ow] = 0;
        win_tap[ow] = first_tap[ow];
      }
      for (int64_t i = 1; i < g.KH; ++i) {
        const T* h = first + i * g.dh * g.WO;
        const I* t = first_tap + i * g.dh * g.WO;
        for (int64_t ow = 0; ow < g.WO; ++ow) {
          const T v = h[ow];
          const bool take = v > best[ow] || v != v;
          best[ow] = take ? v : best[ow];
          win_row[ow] = take ? I(i) : win_row[ow];
          win_tap[ow] = take ? t[ow] : win_tap[ow];
        }
      }
      const I row0 = static_cast<I>(oh * g.sh * pp.Wp);
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        const I at = row0 + win_row[ow] * I(g.dh * pp.Wp) + I(ow * g.sw) + win_tap[ow] * I(g.dw);
        if constexpr (Relu) place[ow] = best[ow] > T(0) ? at : sink;
        else place[ow] = at;
      }
      // The scatter: sequential, as windows that share a winner add to the same element.
      const T* gy = dyp + oh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ++ow) grad[place[ow]] += gy[ow];
    }
    T* o = out + nc * g.H * g.W;
    for (int64_t ih = 0; ih < g.H; ++ih) {
      T* orow = o + ih * g.W;
      if (ih >= rows) {
        std::fill_n(orow, g.W, T(0));
        continue;
      }
      std::copy_n(grad.data() + (ih + g.pt) * pp.Wp + g.pl, cols, orow);
      std::fill(orow + cols, orow + g.W, T(0));
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The float32 AVX-512 passes: 16 output columns per register, the last ones under a mask, the
// winner picked with mask moves (GCC turned the scalar loops' selects into branches and left
// rows of 16 columns to them).
namespace pool512 {

LUCID_TARGET_AVX512 inline __mmask16 tail(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// Taps p[ow * sw] for the 16 columns from ow0 (`lanes` of them); the loads never go past the
// last tap of the row's last window.
LUCID_TARGET_AVX512 inline __m512 taps(const float* p, int64_t sw, int64_t lanes, __mmask16 m,
                                       __m512i gather_index) {
  if (sw == 1) return _mm512_maskz_loadu_ps(m, p);
  if (sw == 2) {
    const int64_t span = 2 * lanes - 1;  // elements from p[0] to the last tap
    const __m512 lo = _mm512_maskz_loadu_ps(tail(span), p);
    const __m512 hi = _mm512_maskz_loadu_ps(span > 16 ? tail(span - 16) : 0, p + 16);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    return _mm512_permutex2var_ps(lo, even, hi);
  }
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, gather_index, p, 4);
}

// max_tap's step: v takes over where it is greater or NaN.
LUCID_TARGET_AVX512 inline __mmask16 takes(__m512 v, __m512 best) {
  return _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}

// Copies and fills of a plane's short rows (32 floats in G) in registers: as library calls
// (memmove per row, two per row and plane) they cost more than the pooling around them.
LUCID_TARGET_AVX512 inline void copy_row(const float* src, int64_t n, float* dst) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = tail(n - c);
    _mm512_mask_storeu_ps(dst + c, m, _mm512_maskz_loadu_ps(m, src + c));
  }
}
LUCID_TARGET_AVX512 inline void fill_row(float v, int64_t n, float* dst) {
  const __m512 value = _mm512_set1_ps(v);
  for (int64_t c = 0; c < n; c += 16) _mm512_mask_storeu_ps(dst + c, tail(n - c), value);
}

LUCID_TARGET_AVX512 void pad_plane(const PoolGeom& g, const PaddedPool& pp, const float* xp,
                                   float* padded) {
  const float lowest = -std::numeric_limits<float>::infinity();
  const int64_t left = std::min(g.pl, pp.Wp);
  const int64_t cols = std::clamp<int64_t>(pp.Wp - g.pl, 0, g.W);
  for (int64_t r = 0; r < pp.Hp; ++r) {
    float* row = padded + r * pp.Wp;
    const int64_t ih = r - g.pt;
    if (ih < 0 || ih >= g.H) {
      fill_row(lowest, pp.Wp, row);
      continue;
    }
    fill_row(lowest, left, row);
    copy_row(xp + ih * g.W, cols, row + left);
    fill_row(lowest, pp.Wp - left - cols, row + left + cols);
  }
}

LUCID_TARGET_AVX512 void row_max_taps(const PoolGeom& g, const PaddedPool& pp,
                                      const float* padded, float* row_best, int32_t* row_tap) {
  const __m512i gather_index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(g.sw)));
  for (int64_t r = 0; r < pp.Hp; ++r) {
    const float* p = padded + r * pp.Wp;
    for (int64_t ow = 0; ow < g.WO; ow += 16) {
      const int64_t lanes = std::min<int64_t>(16, g.WO - ow);
      const __mmask16 m = tail(lanes);
      const float* q = p + ow * g.sw;
      __m512 best = taps(q, g.sw, lanes, m, gather_index);
      __m512i tap = _mm512_setzero_si512();
      for (int64_t j = 1; j < g.KW; ++j) {
        const __m512 v = taps(q + j * g.dw, g.sw, lanes, m, gather_index);
        const __mmask16 t = takes(v, best);
        best = _mm512_mask_mov_ps(best, t, v);
        tap = _mm512_mask_mov_epi32(tap, t, _mm512_set1_epi32(static_cast<int32_t>(j)));
      }
      _mm512_mask_storeu_ps(row_best + r * g.WO + ow, m, best);
      _mm512_mask_storeu_epi32(row_tap + r * g.WO + ow, m, tap);
    }
  }
}

LUCID_TARGET_AVX512 void max_pool(const PoolGeom& g, const float* x, float* out, int64_t nc0,
                                  int64_t nc1) {
  const PaddedPool pp = padded_pool(g);
  std::vector<float> padded(pp.Hp * pp.Wp), row_best(pp.Hp * g.WO);
  std::vector<int32_t> row_tap(pp.Hp * g.WO);
  for (int64_t nc = nc0; nc < nc1; ++nc) {
    pad_plane(g, pp, x + nc * g.H * g.W, padded.data());
    row_max_taps(g, pp, padded.data(), row_best.data(), row_tap.data());
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      float* y = out + nc * g.HO * g.WO + oh * g.WO;
      const float* first = row_best.data() + oh * g.sh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ow += 16) {
        const __mmask16 m = tail(g.WO - ow);
        __m512 best = _mm512_maskz_loadu_ps(m, first + ow);
        for (int64_t i = 1; i < g.KH; ++i) {
          const __m512 v = _mm512_maskz_loadu_ps(m, first + i * g.dh * g.WO + ow);
          best = _mm512_mask_mov_ps(best, takes(v, best), v);
        }
        _mm512_mask_storeu_ps(y + ow, m, best);
      }
    }
  }
}

template <bool Relu>
LUCID_TARGET_AVX512 void max_pool_grad(const PoolGeom& g, const float* dy, const float* x,
                                       float* out, int64_t nc0, int64_t nc1) {
  const PaddedPool pp = padded_pool(g);
  const int64_t padded_size = pp.Hp * pp.Wp;
  std::vector<float> padded(padded_size), row_best(pp.Hp * g.WO), grad(padded_size + 1);
  std::vector<int32_t> row_tap(pp.Hp * g.WO), place(g.WO);
  const __m512i sink = _mm512_set1_epi32(static_cast<int32_t>(padded_size));
  const __m512i row_step = _mm512_set1_epi32(static_cast<int32_t>(g.dh * pp.Wp));
  const __m512i tap_step = _mm512_set1_epi32(static_cast<int32_t>(g.dw));
  const __m512i lane_col = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int32_t>(g.sw)));
  const int64_t rows = std::clamp<int64_t>(pp.Hp - g.pt, 0, g.H);
  const int64_t cols = std::clamp<int64_t>(pp.Wp - g.pl, 0, g.W);
  for (int64_t nc = nc0; nc < nc1; ++nc) {
    pad_plane(g, pp, x + nc * g.H * g.W, padded.data());
    row_max_taps(g, pp, padded.data(), row_best.data(), row_tap.data());
    fill_row(0.0f, padded_size + 1, grad.data());
    const float* dyp = dy + nc * g.HO * g.WO;
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      const float* first = row_best.data() + oh * g.sh * g.WO;
      const int32_t* first_tap = row_tap.data() + oh * g.sh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ow += 16) {
        const __mmask16 m = tail(g.WO - ow);
        __m512 best = _mm512_maskz_loadu_ps(m, first + ow);
        __m512i win_row = _mm512_setzero_si512();
        __m512i win_tap = _mm512_maskz_loadu_epi32(m, first_tap + ow);
        for (int64_t i = 1; i < g.KH; ++i) {
          const __m512 v = _mm512_maskz_loadu_ps(m, first + i * g.dh * g.WO + ow);
          const __mmask16 t = takes(v, best);
          best = _mm512_mask_mov_ps(best, t, v);
          win_row = _mm512_mask_mov_epi32(win_row, t, _mm512_set1_epi32(static_cast<int32_t>(i)));
          win_tap = _mm512_mask_mov_epi32(win_tap, t,
                                          _mm512_maskz_loadu_epi32(m, first_tap + i * g.dh * g.WO + ow));
        }
        const int32_t origin = static_cast<int32_t>(oh * g.sh * pp.Wp + ow * g.sw);
        __m512i at = _mm512_add_epi32(_mm512_set1_epi32(origin), lane_col);
        at = _mm512_add_epi32(at, _mm512_mullo_epi32(win_row, row_step));
        at = _mm512_add_epi32(at, _mm512_mullo_epi32(win_tap, tap_step));
        if constexpr (Relu)
          at = _mm512_mask_mov_epi32(sink, _mm512_cmp_ps_mask(best, _mm512_setzero_ps(), _CMP_GT_OQ),
                                     at);
        _mm512_mask_storeu_epi32(place.data() + ow, m, at);
      }
      // The scatter: sequential, as windows that share a winner add to the same element.
      const float* gy = dyp + oh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ++ow) grad[place[ow]] += gy[ow];
    }
    float* o = out + nc * g.H * g.W;
    for (int64_t ih = 0; ih < g.H; ++ih) {
      float* orow = o + ih * g.W;
      if (ih >= rows) {
        fill_row(0.0f, g.W, orow);
        continue;
      }
      copy_row(grad.data() + (ih + g.pt) * pp.Wp + g.pl, cols, orow);
      fill_row(0.0f, g.W - cols, orow + cols);
    }
  }
}

}  // namespace pool512
#endif

template <class T>
void max_pool_padded_base(const PoolGeom& g, const T* x, T* out, int64_t nc0, int64_t nc1) {
  max_pool_padded_body(g, x, out, nc0, nc1);
}
template <class T>
LUCID_TARGET_AVX512 void max_pool_padded_avx512(const PoolGeom& g, const T* x, T* out,
                                                int64_t nc0, int64_t nc1) {
  max_pool_padded_body(g, x, out, nc0, nc1);
}
template <bool Relu, class T>
void max_pool_grad_padded_base(const PoolGeom& g, const T* dy, const T* x, T* out, int64_t nc0,
                               int64_t nc1) {
  max_pool_grad_padded_body<Relu>(g, dy, x, out, nc0, nc1);
}
template <bool Relu, class T>
LUCID_TARGET_AVX512 void max_pool_grad_padded_avx512(const PoolGeom& g, const T* dy, const T* x,
                                                     T* out, int64_t nc0, int64_t nc1) {
  max_pool_grad_padded_body<Relu>(g, dy, x, out, nc0, nc1);
}

#if defined(__x86_64__) && defined(__GNUC__)
// Where there is no AVX-512: the same source vectorized for AVX2 (the package's baseline ISA has
// half the width and no blend).
template <class T>
__attribute__((target("avx2,fma"))) void max_pool_padded_avx2(const PoolGeom& g, const T* x,
                                                              T* out, int64_t nc0, int64_t nc1) {
  max_pool_padded_body(g, x, out, nc0, nc1);
}
template <bool Relu, class T>
__attribute__((target("avx2,fma"))) void max_pool_grad_padded_avx2(const PoolGeom& g,
                                                                   const T* dy, const T* x,
                                                                   T* out, int64_t nc0,
                                                                   int64_t nc1) {
  max_pool_grad_padded_body<Relu>(g, dy, x, out, nc0, nc1);
}
inline bool pool_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

template <class T>
void max_pool_padded(const PoolGeom& g, const T* x, T* out, int64_t nc0, int64_t nc1) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>)
    if (sgemm_isa() == 2) return pool512::max_pool(g, x, out, nc0, nc1);
  if (sgemm_isa() == 2) return max_pool_padded_avx512(g, x, out, nc0, nc1);
  if (pool_has_avx2()) return max_pool_padded_avx2(g, x, out, nc0, nc1);
#endif
  max_pool_padded_base(g, x, out, nc0, nc1);
}
template <bool Relu, class T>
void max_pool_grad_padded(const PoolGeom& g, const T* dy, const T* x, T* out, int64_t nc0,
                          int64_t nc1) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>)
    if (sgemm_isa() == 2) return pool512::max_pool_grad<Relu>(g, dy, x, out, nc0, nc1);
  if (sgemm_isa() == 2) return max_pool_grad_padded_avx512<Relu>(g, dy, x, out, nc0, nc1);
  if (pool_has_avx2()) return max_pool_grad_padded_avx2<Relu>(g, dy, x, out, nc0, nc1);
#endif
  max_pool_grad_padded_base<Relu>(g, dy, x, out, nc0, nc1);
}

// c ? x : y through bit masks: GCC turns a float ?: into a branch here, and on real data the
// condition is a coin flip.
template <class T>
inline T pick(bool c, T x, T y) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U m = U(0) - U(c);
  U ux, uy;
  std::memcpy(&ux, &x, sizeof(T));
  std::memcpy(&uy, &y, sizeof(T));
  const U r = (ux & m) | (uy & ~m);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

// max_pool2d_grad for 2x2 windows at stride 2 without padding: windows do not overlap, so each
// input element receives its window's gradient or 0, written once, and the winner (max_tap's
// rule: first maximum, last NaN) is picked with selects instead of branches. With `Relu`
// (max_pool2d_relu_grad) the winner gets it only where it is > 0: ReLU's gradient, when the pool
// reads a ReLU's output.
template <bool Relu, class T>
void max_pool_grad_2x2(const PoolGeom& g, const T* dy, const T* x, T* out, int64_t nc0,
                       int64_t nc1) {
  const int64_t plane = g.H * g.W, oplane = g.HO * g.WO;
  if (g.H != 2 * g.HO || g.W != 2 * g.WO)  // odd edges
    std::fill(out + nc0 * plane, out + nc1 * plane, T(0));
  for (int64_t nc = nc0; nc < nc1; ++nc)
    for (int64_t oh = 0; oh < g.HO; ++oh) {
      const T* r0 = x + nc * plane + 2 * oh * g.W;
      const T* r1 = r0 + g.W;
      T* o0 = out + nc * plane + 2 * oh * g.W;
      T* o1 = o0 + g.W;
      const T* gy = dy + nc * oplane + oh * g.WO;
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        const T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        const bool tb = (b > a) | (b != b);
        const T m1 = pick(tb, b, a);
        const bool tc = (c > m1) | (c != c);
        const T m2 = pick(tc, c, m1);
        const bool td = (d > m2) | (d != d);
        bool wd = td, wc = tc & !td, wb = tb & !tc & !td, wa = !(tb | tc | td);
        if constexpr (Relu) {
          wa &= a > 0;
          wb &= b > 0;
          wc &= c > 0;
          wd &= d > 0;
        }
        const T v = gy[ow];
        o0[2 * ow] = pick(wa, v, T(0));
        o0[2 * ow + 1] = pick(wb, v, T(0));
        o1[2 * ow] = pick(wc, v, T(0));
        o1[2 * ow + 1] = pick(wd, v, T(0));
      }
    }
}

// `relu` (max_pool2d_relu_grad, with op max_pool2d_grad): only winners > 0 get the gradient.
template <class T>
void pool(Op op, const PoolGeom& g, const T* a, const T* b, T* out, bool relu = false) {
  const int64_t plane = g.H * g.W, oplane = g.HO * g.WO;
  if (op == Op::max_pool2d_grad && g.KH == 2 && g.KW == 2 && g.sh == 2 && g.sw == 2 &&
      g.pt == 0 && g.pl == 0 && g.dh == 1 && g.dw == 1 && 2 * g.HO <= g.H && 2 * g.WO <= g.W) {
    parallel_for(g.NC, planes_per_part(g), [&](int64_t nc0, int64_t nc1) {
      if (relu) max_pool_grad_2x2<true>(g, a, b, out, nc0, nc1);
      else max_pool_grad_2x2<false>(g, a, b, out, nc0, nc1);
    });
    return;
  }
  if (op == Op::max_pool2d && g.pt == 0 && g.pl == 0 && g.dh == 1 && g.dw == 1 &&
      (g.HO - 1) * g.sh + g.KH <= g.H && (g.WO - 1) * g.sw + g.KW <= g.W) {
    parallel_for(g.NC, planes_per_part(g),
                 [&](int64_t nc0, int64_t nc1) { max_pool_unpadded(g, a, out, nc0, nc1); });
    return;
  }
  const PaddedPool pp = padded_pool(g);
  const bool small_planes = g.HO > 0 && g.WO > 0 &&
                            pp.Hp * pp.Wp < std::numeric_limits<int32_t>::max();
  if (op == Op::max_pool2d && small_planes) {
    parallel_for(g.NC, planes_per_part(g),
                 [&](int64_t nc0, int64_t nc1) { max_pool_padded(g, a, out, nc0, nc1); });
    return;
  }
  if (op == Op::max_pool2d_grad && small_planes) {
    parallel_for(g.NC, planes_per_part(g), [&](int64_t nc0, int64_t nc1) {
      if (relu) max_pool_grad_padded<true>(g, a, b, out, nc0, nc1);
      else max_pool_grad_padded<false>(g, a, b, out, nc0, nc1);
    });
    return;
  }
  if (op == Op::max_pool2d_grad || op == Op::avg_pool2d_grad)
    std::fill_n(out, g.NC * plane, T(0));
  for (int64_t nc = 0; nc < g.NC; ++nc)
    for (int64_t oh = 0; oh < g.HO; ++oh)
      for (int64_t ow = 0; ow < g.WO; ++ow) {
        int64_t o = nc * oplane + oh * g.WO + ow;
        if (op == Op::max_pool2d) {
          max_tap(g, a + nc * plane, oh, ow, &out[o]);
        } else if (op == Op::max_pool2d_grad) {  // a = grad, b = x
          T best;
          int64_t arg = max_tap(g, b + nc * plane, oh, ow, &best);
          if (arg >= 0 && (!relu || b[nc * plane + arg] > 0)) out[nc * plane + arg] += a[o];
        } else {
          int64_t h0 = oh * g.sh - g.pt, w0 = ow * g.sw - g.pl;
          T div = avg_divisor<T>(g, oh, ow), sum = 0;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + g.KH, g.H); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + g.KW, g.W); ++iw) {
              if (op == Op::avg_pool2d) sum += a[nc * plane + ih * g.W + iw];
              else out[nc * plane + ih * g.W + iw] += a[o] / div;
            }
          if (op == Op::avg_pool2d) out[o] = sum / div;
        }
      }
}

Step make_pool(const Program& p, const Instr& in) {
  const bool relu = in.op == Op::max_pool2d_relu_grad;
  Op op = relu ? Op::max_pool2d_grad : in.op;
  int a = in.in[0], b = in.in.size() > 1 ? in.in[1] : in.in[0], o = in.out[0];
  const Shape& xs = (op == Op::max_pool2d || op == Op::avg_pool2d) ? p.slots[a].shape
                    : p.slots[o].shape;
  const Shape& ys = (op == Op::max_pool2d || op == Op::avg_pool2d) ? p.slots[o].shape
                    : p.slots[a].shape;
  PoolGeom g = pool_geom(in, xs, ys);
  DType d = p.slots[o].dtype;
  return [=](void* const* s) {
    if (d == DType::F32)
      pool<float>(op, g, static_cast<const float*>(s[a]), static_cast<const float*>(s[b]),
                  static_cast<float*>(s[o]), relu);
    else
      pool<double>(op, g, static_cast<const double*>(s[a]), static_cast<const double*>(s[b]),
                   static_cast<double*>(s[o]), relu);
  };
}

}  // namespace

Step make_linalg_step(const Program& p, const Instr& in) {
  switch (in.op) {
    case Op::matmul: case Op::gemm: return make_matmul(p, in);
    case Op::matmul_accumulate: return make_matmul_accumulate(p, in);
    case Op::conv2d: case Op::conv2d_bias: case Op::conv2d_data_grad:
    case Op::conv2d_weights_grad:
      return make_conv(p, in);
    default: return make_pool(p, in);
  }
}

}  // namespace lucid
