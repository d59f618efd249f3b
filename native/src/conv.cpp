// Stride-1 convolutions as GEMMs over shifted views of a zero-padded image (see conv.h).
//
// With the image padded to Hp x Wp, output pixel (h, w) of tap (c, i, j) reads the padded plane of
// channel c at (h + i*dh)*Wp + w + j*dw: for a run of pixels along a row (or along the HO x Wp
// grid whose last Wp - WO columns of each row are computed and dropped, in the weight gradient)
// that is a contiguous run. So the GEMM reads its right operand straight from the padded image
// (16 KB for workload C's second conv) instead of an im2col matrix nine times the image's size,
// writes each image's output in NCHW order through the epilogue (bias, ReLU) while it is still in
// registers (no transpose of an [O, N*HW] result, no pass of its own), and images run on the
// worker pool. im2col + one BLAS GEMM for the batch spent half its time in the copies; the BLAS
// GEMM itself had K = 9 or 144.
//
// Every output element is computed by one thread in a fixed order whatever the thread count, so
// results are the same at any thread count (the weight gradient sums fixed chunks of images in
// chunk order).
#include "lucid/conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <vector>

#include "lucid/parallel.h"

// The kernels pass 256-bit vectors only between always-inlined functions: no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"

#define LUCID_ALWAYS_INLINE inline __attribute__((always_inline))

namespace lucid {

namespace {

template <class T>
struct Simd;
// V: a register of L lanes; U: the same at any element alignment, for loads and stores (a
// memcpy into a V array made GCC bounce every load through the stack).
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(32)));
  typedef float U __attribute__((vector_size(32), aligned(4), may_alias));
  static constexpr int L = 8;
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(32)));
  typedef double U __attribute__((vector_size(32), aligned(8), may_alias));
  static constexpr int L = 4;
};

constexpr int64_t kMR = 4;  // output channels per register tile
constexpr int kQB = 3;      // taps per weight-gradient tile (a 3-wide kernel row)
// Images per weight-gradient chunk: fixed, so the summation order does not depend on threads.
constexpr int64_t kGradChunk = 4;
// Beyond these the weights or one padded image no longer sit in L2 and BLAS's blocking wins.
constexpr int64_t kMaxWeightBytes = 512 << 10;
constexpr int64_t kMaxImageBytes = 2 << 20;

template <class T>
LUCID_ALWAYS_INLINE typename Simd<T>::V load(const T* p) {
  return *reinterpret_cast<const typename Simd<T>::U*>(p);
}

template <class T>
LUCID_ALWAYS_INLINE void store(T* p, typename Simd<T>::V v) {
  *reinterpret_cast<typename Simd<T>::U*>(p) = v;
}


inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// One direct convolution: G groups of cin input -> cout output channels over padded planes.
struct Plan {
  int64_t N, Cin, Hin, Win, G, cin, cout, KH, KW, dh, dw, pt, pb, pl, pr, HO, WO;
  int64_t Hp, Wp, plane, slack, image, P, K, ldw;
  std::vector<int64_t> off;  // per tap k = (c*KH + i)*KW + j of a group: c*plane + i*dh*Wp + j*dw

  void derive(int64_t lanes) {
    Hp = Hin + pt + pb;
    Wp = Win + pl + pr;
    plane = Hp * Wp;
    slack = 2 * lanes + Wp;  // reads past the last plane: tile round-up and dropped columns
    image = Cin * plane + slack;
    P = round_up(HO * Wp, 2 * lanes);
    K = cin * KH * KW;
    ldw = round_up(cout, kMR);
    off.resize(K);
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t i = 0; i < KH; ++i)
        for (int64_t j = 0; j < KW; ++j) off[(c * KH + i) * KW + j] = c * plane + i * dh * Wp + j * dw;
  }
};

template <class T>
T* thread_buffer(int which, size_t n) {
  thread_local std::vector<T> bufs[3];
  std::vector<T>& b = bufs[which];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Copies image x [Cin, Hin, Win] into its zero-padded planes.
template <class T>
LUCID_ALWAYS_INLINE void pad_image(const Plan& q, const T* x, T* xpad) {
  std::fill_n(xpad, q.image, T(0));
  for (int64_t c = 0; c < q.Cin; ++c)
    for (int64_t h = 0; h < q.Hin; ++h)
      std::memcpy(xpad + c * q.plane + (h + q.pt) * q.Wp + q.pl, x + (c * q.Hin + h) * q.Win,
                  sizeof(T) * q.Win);
}

// True when x[0 .. n) holds no inf or NaN (all exponent bits set), in integer ops that vectorize.
template <class T>
LUCID_ALWAYS_INLINE bool all_finite(const T* x, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits exponent = sizeof(T) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  const Bits* b = reinterpret_cast<const Bits*>(x);
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= Bits((b[i] & exponent) == exponent);
  return bad == 0;
}

// Output channels o0 .. o0+kMR of one output row segment (n_out <= 2 vectors of pixels):
// out[r*ldo + l] = epilogue(sum_k w[k*ldw + r] * src[off[k] + l]) for the channels r < rows;
// bias points at channel o0's.
template <class T>
LUCID_ALWAYS_INLINE void forward_tile(const T* src, const int64_t* off, int64_t K, const T* w,
                                      int64_t ldw, const T* bias, bool relu, int64_t rows,
                                      int64_t n_out, T* out, int64_t ldo) {
  using V = typename Simd<T>::V;
  constexpr int L = Simd<T>::L;
  V acc[kMR][2];
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = V{};
  for (int64_t k = 0; k < K; ++k) {
    const T* b = src + off[k];
    const V b0 = load(b), b1 = load(b + L);
    const T* a = w + k * ldw;
    for (int r = 0; r < kMR; ++r) {
      acc[r][0] += a[r] * b0;
      acc[r][1] += a[r] * b1;
    }
  }
  for (int r = 0; r < kMR && r < rows; ++r) {
    V v0 = acc[r][0], v1 = acc[r][1];
    if (bias) {
      v0 += bias[r];
      v1 += bias[r];
    }
    if (relu) {  // as lucid::relu: v <= 0 ? +0 : v, so NaN stays NaN and -0 becomes +0
      v0 = v0 <= 0 ? V{} : v0;
      v1 = v1 <= 0 ? V{} : v1;
    }
    T* o = out + r * ldo;
    if (n_out == 2 * L) {
      store(o, v0);
      store(o + L, v1);
    } else {
      T tmp[2 * L];
      store(tmp, v0);
      store(tmp + L, v1);
      for (int64_t l = 0; l < n_out; ++l) o[l] = tmp[l];
    }
  }
}

// Images [n0, n1) of a direct convolution; wp holds the weights packed [G][K][ldw]. Output rows
// are computed in segments of two vectors of pixels that leave registers through the epilogue
// straight into y.
template <class T>
LUCID_ALWAYS_INLINE void forward_images(const Plan& q, const T* x, const T* wp, const T* bias,
                                        bool relu, T* y, int64_t n0, int64_t n1) {
  constexpr int64_t NR = 2 * Simd<T>::L;
  T* xpad = thread_buffer<T>(0, q.image);
  const int64_t out_plane = q.HO * q.WO;
  for (int64_t n = n0; n < n1; ++n) {
    pad_image(q, x + n * q.Cin * q.Hin * q.Win, xpad);
    for (int64_t gr = 0; gr < q.G; ++gr) {
      const T* src = xpad + gr * q.cin * q.plane;
      const T* wg = wp + gr * q.K * q.ldw;
      T* yg = y + (n * q.G + gr) * q.cout * out_plane;
      for (int64_t h = 0; h < q.HO; ++h)
        for (int64_t w0 = 0; w0 < q.WO; w0 += NR)
          for (int64_t o0 = 0; o0 < q.cout; o0 += kMR)
            forward_tile(src + h * q.Wp + w0, q.off.data(), q.K, wg + o0, q.ldw,
                         bias ? bias + gr * q.cout + o0 : nullptr, relu, q.cout - o0,
                         std::min(NR, q.WO - w0), yg + o0 * out_plane + h * q.WO + w0, out_plane);
    }
  }
}

// out[r*ldo + t] = sum over images and p < P of dy[r][p] * x[off[t] + p], r < kMR, t < QB.
template <class T, int QB>
LUCID_ALWAYS_INLINE void grad_tile(const T* dy, int64_t ldd, int64_t dy_image, const T* x,
                                   int64_t x_image, const int64_t* off, int64_t images, int64_t P,
                                   T* out, int64_t ldo) {
  using V = typename Simd<T>::V;
  constexpr int L = Simd<T>::L;
  V acc[kMR][QB];
  for (int r = 0; r < kMR; ++r)
    for (int t = 0; t < QB; ++t) acc[r][t] = V{};
  for (int64_t n = 0; n < images; ++n) {
    const T* d = dy + n * dy_image;
    const T* s = x + n * x_image;
    for (int64_t p = 0; p < P; p += L) {
      V b[QB];
      for (int t = 0; t < QB; ++t) b[t] = load(s + off[t] + p);
      for (int r = 0; r < kMR; ++r) {
        const V dr = load(d + r * ldd + p);
        for (int t = 0; t < QB; ++t) acc[r][t] += dr * b[t];
      }
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int t = 0; t < QB; ++t) {
      T sum = 0;
      for (int l = 0; l < L; ++l) sum += acc[r][t][l];
      out[r * ldo + t] = sum;
    }
}

// The weight gradient of images [n0, n0 + images) (at most kGradChunk) into part [G*ldw][K];
// false when x holds an inf or NaN (0 * inf in a dropped column would poison the sum).
template <class T>
LUCID_ALWAYS_INLINE bool grad_chunk(const Plan& q, const T* x, const T* dy, int64_t n0,
                                    int64_t images, T* part) {
  const int64_t dy_image = q.G * q.ldw * q.P;
  T* xpads = thread_buffer<T>(0, q.image * kGradChunk);
  T* grid = thread_buffer<T>(1, dy_image * kGradChunk);
  bool finite = true;
  for (int64_t i = 0; i < images; ++i) {
    const int64_t n = n0 + i;
    const T* xn = x + n * q.Cin * q.Hin * q.Win;
    finite &= all_finite(xn, q.Cin * q.Hin * q.Win);
    pad_image(q, xn, xpads + i * q.image);
    T* gi = grid + i * dy_image;
    std::fill_n(gi, dy_image, T(0));
    for (int64_t gr = 0; gr < q.G; ++gr)
      for (int64_t o = 0; o < q.cout; ++o) {
        const T* src = dy + ((n * q.G + gr) * q.cout + o) * q.HO * q.WO;
        T* row = gi + (gr * q.ldw + o) * q.P;
        for (int64_t h = 0; h < q.HO; ++h) std::memcpy(row + h * q.Wp, src + h * q.WO, sizeof(T) * q.WO);
      }
  }
  if (!finite) return false;
  const int64_t P = round_up(q.HO * q.Wp, Simd<T>::L);
  for (int64_t gr = 0; gr < q.G; ++gr)
    for (int64_t o0 = 0; o0 < q.ldw; o0 += kMR) {
      const T* d = grid + (gr * q.ldw + o0) * q.P;
      const T* s = xpads + gr * q.cin * q.plane;
      T* out = part + (gr * q.ldw + o0) * q.K;
      int64_t k = 0;
      for (; k + kQB <= q.K; k += kQB)
        grad_tile<T, kQB>(d, q.P, dy_image, s, q.image, q.off.data() + k, images, P, out + k, q.K);
      for (; k < q.K; ++k)
        grad_tile<T, 1>(d, q.P, dy_image, s, q.image, q.off.data() + k, images, P, out + k, q.K);
    }
  return true;
}

// The kernels compiled for the baseline ISA and for AVX2 + FMA, picked at run time.
#define LUCID_CONV_KERNELS(suffix, attr)                                                          \
  template <class T>                                                                            \
  attr void forward_##suffix(const Plan& q, const T* x, const T* wp, const T* bias, bool relu,  \
                             T* y, int64_t n0, int64_t n1) {                                    \
    forward_images(q, x, wp, bias, relu, y, n0, n1);                                            \
  }                                                                                             \
  template <class T>                                                                            \
  attr bool grad_##suffix(const Plan& q, const T* x, const T* dy, int64_t n0, int64_t images,   \
                          T* part) {                                                            \
    return grad_chunk(q, x, dy, n0, images, part);                                              \
  }

LUCID_CONV_KERNELS(base, )
#if defined(__x86_64__) && defined(__GNUC__)
LUCID_CONV_KERNELS(avx2, __attribute__((target("avx2,fma"))))
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
bool has_avx2() { return false; }
template <class T>
void forward_avx2(const Plan& q, const T* x, const T* wp, const T* bias, bool relu, T* y,
                  int64_t n0, int64_t n1) {
  forward_base(q, x, wp, bias, relu, y, n0, n1);
}
template <class T>
bool grad_avx2(const Plan& q, const T* x, const T* dy, int64_t n0, int64_t images, T* part) {
  return grad_base(q, x, dy, n0, images, part);
}
#endif

bool fits(const Plan& q, size_t elem) {
  return q.ldw * q.K * static_cast<int64_t>(elem) <= kMaxWeightBytes &&
         q.image * static_cast<int64_t>(elem) <= kMaxImageBytes && q.K > 0 && q.HO > 0 &&
         q.WO > 0;
}

template <class T>
void run_forward(const Plan& q, const T* x, const T* wp, const T* bias, bool relu, T* y) {
  const bool avx2 = has_avx2();
  parallel_for(q.N, 1, [&](int64_t n0, int64_t n1) {
    if (avx2) forward_avx2(q, x, wp, bias, relu, y, n0, n1);
    else forward_base(q, x, wp, bias, relu, y, n0, n1);
  });
}

// The plan of the forward convolution over `s` (the weight gradient walks the same windows):
// the bottom and right padding are what the stride-1 output extent needs.
Plan forward_plan(const ConvShape& s, int64_t lanes) {
  Plan q{s.N, s.C, s.H, s.W, s.G, s.C / s.G, s.O / s.G, s.KH, s.KW, s.dh, s.dw, s.pt,
         0, s.pl, 0, s.HO, s.WO};
  q.pb = s.HO + s.dh * (s.KH - 1) - s.H - s.pt;
  q.pr = s.WO + s.dw * (s.KW - 1) - s.W - s.pl;
  q.derive(lanes);
  return q;
}

template <class T>
bool forward(const ConvShape& s, const T* x, const T* w, const T* bias, bool relu, T* y) {
  if (s.sh != 1 || s.sw != 1) return false;
  Plan q = forward_plan(s, Simd<T>::L);
  if (!fits(q, sizeof(T))) return false;
  std::vector<T> wp(q.G * q.K * q.ldw, T(0));  // [G][K][ldw]: a tap's weights side by side
  for (int64_t gr = 0; gr < q.G; ++gr)
    for (int64_t o = 0; o < q.cout; ++o)
      for (int64_t k = 0; k < q.K; ++k)
        wp[(gr * q.K + k) * q.ldw + o] = w[(gr * q.cout + o) * q.K + k];
  run_forward(q, x, wp.data(), bias, relu, y);
  return true;
}

// dx is the stride-1 convolution of dy, padded by the kernel's extent less the forward padding,
// with each group's weights transposed (in <-> out channels) and flipped in both axes.
template <class T>
bool data_grad(const ConvShape& s, const T* dy, const T* w, T* dx) {
  if (s.sh != 1 || s.sw != 1) return false;
  const int64_t cg = s.C / s.G, og = s.O / s.G;
  const int64_t pb = s.HO + s.dh * (s.KH - 1) - s.H - s.pt;
  const int64_t pr = s.WO + s.dw * (s.KW - 1) - s.W - s.pl;
  Plan q{s.N, s.O, s.HO, s.WO, s.G, og, cg, s.KH, s.KW, s.dh, s.dw,
         s.dh * (s.KH - 1) - s.pt, s.dh * (s.KH - 1) - pb, s.dw * (s.KW - 1) - s.pl,
         s.dw * (s.KW - 1) - pr, s.H, s.W};
  if (q.pt < 0 || q.pb < 0 || q.pl < 0 || q.pr < 0) return false;  // a padding wider than the kernel
  q.derive(Simd<T>::L);
  if (!fits(q, sizeof(T))) return false;
  std::vector<T> wp(q.G * q.K * q.ldw, T(0));
  for (int64_t gr = 0; gr < s.G; ++gr)
    for (int64_t o = 0; o < og; ++o)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t i = 0; i < s.KH; ++i)
          for (int64_t j = 0; j < s.KW; ++j) {
            const T v = w[(((gr * og + o) * cg + c) * s.KH + i) * s.KW + j];
            const int64_t k = (o * s.KH + (s.KH - 1 - i)) * s.KW + (s.KW - 1 - j);
            wp[(gr * q.K + k) * q.ldw + c] = v;
          }
  // A padded zero of dy times an infinite weight would be NaN where the reference has none.
  if (!all_finite(w, s.O * cg * s.KH * s.KW)) return false;
  run_forward(q, dy, wp.data(), static_cast<const T*>(nullptr), false, dx);
  return true;
}

template <class T>
bool weights_grad(const ConvShape& s, const T* x, const T* dy, T* dw) {
  if (s.sh != 1 || s.sw != 1) return false;
  Plan q = forward_plan(s, Simd<T>::L);
  if (!fits(q, sizeof(T)) || s.N == 0) return false;
  const int64_t chunks = (s.N + kGradChunk - 1) / kGradChunk, rows = q.G * q.ldw;
  std::vector<T> parts(chunks * rows * q.K);
  std::vector<char> ok(chunks, 1);
  const bool avx2 = has_avx2();
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * kGradChunk, images = std::min(kGradChunk, s.N - n0);
      T* part = parts.data() + c * rows * q.K;
      ok[c] = avx2 ? grad_avx2(q, x, dy, n0, images, part) : grad_base(q, x, dy, n0, images, part);
    }
  });
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return false;
  for (int64_t gr = 0; gr < q.G; ++gr)
    for (int64_t o = 0; o < q.cout; ++o) {
      T* dst = dw + (gr * q.cout + o) * q.K;
      for (int64_t k = 0; k < q.K; ++k) {
        T sum = 0;
        for (int64_t c = 0; c < chunks; ++c) sum += parts[(c * rows + gr * q.ldw + o) * q.K + k];
        dst[k] = sum;
      }
    }
  return true;
}

}  // namespace

bool conv2d_direct_forward(const ConvShape& s, const float* x, const float* w, const float* bias,
                           bool relu, float* y) {
  return forward(s, x, w, bias, relu, y);
}
bool conv2d_direct_forward(const ConvShape& s, const double* x, const double* w,
                           const double* bias, bool relu, double* y) {
  return forward(s, x, w, bias, relu, y);
}
bool conv2d_direct_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx) {
  return data_grad(s, dy, w, dx);
}
bool conv2d_direct_data_grad(const ConvShape& s, const double* dy, const double* w, double* dx) {
  return data_grad(s, dy, w, dx);
}
bool conv2d_direct_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw) {
  return weights_grad(s, x, dy, dw);
}
bool conv2d_direct_weights_grad(const ConvShape& s, const double* x, const double* dy,
                                double* dw) {
  return weights_grad(s, x, dy, dw);
}

}  // namespace lucid
