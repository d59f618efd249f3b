// Stride-1 convolutions as GEMMs over shifted views of a zero-padded image (see conv.h), and
// Winograd F(2x2, 3x3) for float32 3x3 ones with many channels (further down: why and when).
//
// With the image padded to Hp x Wp, output pixel (h, w) of tap (c, i, j) reads the padded plane of
// channel c at (h + i*dh)*Wp + w + j*dw: for a run of pixels along a row (or along the HO x Wp
// grid whose last Wp - WO columns of each row are computed and dropped, in the weight gradient)
// that is a contiguous run. So the GEMM reads its right operand straight from the padded image
// (16 KB for workload C's second conv) instead of an im2col matrix nine times the image's size,
// writes each image's output in NCHW order through the epilogue (scale, bias, residual, ReLU; see
// ConvEpilogue) while it is still in registers (no transpose of an [O, N*HW] result, no pass of its own), and images run on the
// worker pool. im2col + one BLAS GEMM for the batch spent half its time in the copies; the BLAS
// GEMM itself had K = 9 or 144.
//
// Every output element is computed by one thread in a fixed order whatever the thread count, so
// results are the same at any thread count (the weight gradient sums fixed chunks of images in
// chunk order).
#include "lucid/conv.h"
#include "lucid/conv_im2col.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <vector>

#include "lucid/parallel.h"
#include "lucid/sgemm.h"

// The kernels pass 256-bit vectors only between always-inlined functions: no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"

#define LUCID_ALWAYS_INLINE inline __attribute__((always_inline))

namespace lucid {

namespace {

// V: a register of L lanes (Bytes wide: 32 for AVX2, 64 for AVX-512); U: the same at any
// element alignment, for loads and stores (a memcpy into a V array made GCC bounce every load
// through the stack).
template <class T, int Bytes = 32>
struct Simd {
  typedef T V __attribute__((vector_size(Bytes)));
  typedef T U __attribute__((vector_size(Bytes), aligned(sizeof(T)), may_alias));
  static constexpr int L = Bytes / sizeof(T);
};
constexpr int kWide = 64;  // the AVX-512 kernels' register width in bytes

constexpr int64_t kMR = 4;  // output channels per register tile
constexpr int kQB = 3;      // taps per weight-gradient tile (a 3-wide kernel row)
// Images per weight-gradient chunk: fixed, so the summation order does not depend on threads.
constexpr int64_t kGradChunk = 4;
// Beyond these the weights or one padded image no longer sit in L2 and BLAS's blocking wins.
constexpr int64_t kMaxWeightBytes = 512 << 10;
constexpr int64_t kMaxImageBytes = 2 << 20;

template <class T, int Bytes = 32>
LUCID_ALWAYS_INLINE typename Simd<T, Bytes>::V load(const T* p) {
  return *reinterpret_cast<const typename Simd<T, Bytes>::U*>(p);
}

template <class T, int Bytes = 32>
LUCID_ALWAYS_INLINE void store(T* p, typename Simd<T, Bytes>::V v) {
  *reinterpret_cast<typename Simd<T, Bytes>::U*>(p) = v;
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

// The epilogue `e` moved on by `channels` output channels and `elements` output values.
template <class T>
LUCID_ALWAYS_INLINE ConvEpilogue<T> shifted(const ConvEpilogue<T>& e, int64_t channels,
                                            int64_t elements) {
  return {e.scale ? e.scale + channels : nullptr, e.bias ? e.bias + channels : nullptr,
          e.residual ? e.residual + elements : nullptr, e.relu};
}

// v * scale[r] + bias[r] on a register of channel r's values (the residual and ReLU follow at the
// store, where the number of real lanes is known).
template <class V, class T>
LUCID_ALWAYS_INLINE V scale_bias(V v, const ConvEpilogue<T>& e, int r) {
  if (e.scale) v *= e.scale[r];
  if (e.bias) v += e.bias[r];
  return v;
}

// Stores n values of a register (all L lanes when n == L) at o, adding res's values first when
// res is not null, then the ReLU: the residual is read only where the output is written.
template <class T, int Bytes>
LUCID_ALWAYS_INLINE void store_epilogue(T* o, typename Simd<T, Bytes>::V v, const T* res, bool relu,
                                        int64_t n) {
  using V = typename Simd<T, Bytes>::V;
  constexpr int L = Simd<T, Bytes>::L;
  if (n == L) {
    if (res) v += load<T, Bytes>(res);
    if (relu) v = v <= 0 ? V{} : v;  // as lucid::relu: v <= 0 ? +0 : v, so NaN stays NaN
    store<T, Bytes>(o, v);
    return;
  }
  // A partial segment: the residual's n values gathered into a zeroed register, then the same
  // vector steps as a full one (a per-lane branch on the signs cost C's small convolutions
  // twice their time), and n values copied out.
  T tmp[L];
  if (res) {
    for (int l = 0; l < L; ++l) tmp[l] = l < n ? res[l] : T(0);
    v += load<T, Bytes>(tmp);
  }
  if (relu) v = v <= 0 ? V{} : v;
  store<T, Bytes>(tmp, v);
  for (int64_t l = 0; l < n; ++l) o[l] = tmp[l];
}

// Output channels o0 .. o0+kMR of one output row segment (n_out <= 2 vectors of pixels):
// out[r*ldo + l] = epilogue(sum_k w[k*ldw + r] * src[off[k] + l]) for the channels r < rows;
// the epilogue's per-channel values start at channel o0's and its residual at out's position.
template <class T>
LUCID_ALWAYS_INLINE void forward_tile(const T* src, const int64_t* off, int64_t K, const T* w,
                                      int64_t ldw, const ConvEpilogue<T>& ep, int64_t rows,
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
    const V v0 = scale_bias(acc[r][0], ep, r), v1 = scale_bias(acc[r][1], ep, r);
    T* o = out + r * ldo;
    const T* res = ep.residual ? ep.residual + r * ldo : nullptr;
    store_epilogue<T, 32>(o, v0, res, ep.relu, std::min<int64_t>(n_out, L));
    if (n_out > L) store_epilogue<T, 32>(o + L, v1, res ? res + L : nullptr, ep.relu, n_out - L);
  }
}

// ---- AVX-512 forward ------------------------------------------------------------------------
// One 16-lane register covers a whole 16-pixel output row segment (two AVX2 registers did), so
// a tile takes kSegments segments (consecutive rows, usually) of kMR channels: 16 accumulators,
// each tap's kSegments loads and kMR broadcasts feed 16 FMAs. Each output pixel is still the
// sum over the taps in order, one FMA each: the same bits as the AVX2 tile.
constexpr int kSegments = 4;

// Where segment i of the output starts in the padded plane (src) and in the output plane (dst),
// and how many of its lanes are real (0 for the copies that fill a last partial tile); none
// unless `used`.
struct Segments {
  std::vector<int64_t> src, dst;
  std::vector<int> count;

  Segments(const Plan& q, int lanes, bool used) {
    if (!used) return;
    for (int64_t h = 0; h < q.HO; ++h)
      for (int64_t w0 = 0; w0 < q.WO; w0 += lanes) {
        src.push_back(h * q.Wp + w0);
        dst.push_back(h * q.WO + w0);
        count.push_back(static_cast<int>(std::min<int64_t>(lanes, q.WO - w0)));
      }
    while (src.size() % kSegments) {
      src.push_back(src.back());
      dst.push_back(dst.back());
      count.push_back(0);
    }
  }
};

template <class T>
LUCID_ALWAYS_INLINE void forward_tile_wide(const T* src, const int64_t* seg_src,
                                           const int64_t* seg_dst, const int* seg_count,
                                           const int64_t* off, int64_t K, const T* w, int64_t ldw,
                                           const ConvEpilogue<T>& ep, int64_t rows, T* out,
                                           int64_t ldo) {
  using V = typename Simd<T, kWide>::V;
  constexpr int L = Simd<T, kWide>::L;
  V acc[kMR][kSegments];
  for (int r = 0; r < kMR; ++r)
    for (int i = 0; i < kSegments; ++i) acc[r][i] = V{};
  for (int64_t k = 0; k < K; ++k) {
    const T* b = src + off[k];
    V bv[kSegments];
    for (int i = 0; i < kSegments; ++i) bv[i] = load<T, kWide>(b + seg_src[i]);
    const T* a = w + k * ldw;
    for (int r = 0; r < kMR; ++r)
      for (int i = 0; i < kSegments; ++i) acc[r][i] += a[r] * bv[i];
  }
  for (int r = 0; r < kMR && r < rows; ++r)
    for (int i = 0; i < kSegments; ++i) {
      const V v = scale_bias(acc[r][i], ep, r);
      const int64_t at = r * ldo + seg_dst[i];
      store_epilogue<T, kWide>(out + at, v, ep.residual ? ep.residual + at : nullptr, ep.relu,
                               seg_count[i]);
    }
}

// Images [n0, n1) of a direct convolution; wp holds the weights packed [G][K][ldw]. Output rows
// are computed in segments of two AVX2 vectors of pixels (or, Wide, in tiles of kSegments
// AVX-512 vectors) that leave registers through the epilogue straight into y.
template <class T, bool Wide>
LUCID_ALWAYS_INLINE void forward_images(const Plan& q, const T* x, const T* wp,
                                        const ConvEpilogue<T>& ep, T* y, int64_t n0, int64_t n1) {
  constexpr int64_t NR = 2 * Simd<T>::L;
  const Segments seg(q, Simd<T, kWide>::L, Wide);
  const int64_t segments = static_cast<int64_t>(seg.src.size());
  T* xpad = thread_buffer<T>(0, q.image);
  const int64_t out_plane = q.HO * q.WO;
  for (int64_t n = n0; n < n1; ++n) {
    pad_image(q, x + n * q.Cin * q.Hin * q.Win, xpad);
    for (int64_t gr = 0; gr < q.G; ++gr) {
      const T* src = xpad + gr * q.cin * q.plane;
      const T* wg = wp + gr * q.K * q.ldw;
      const int64_t first = (n * q.G + gr) * q.cout;  // the group's first output plane
      const ConvEpilogue<T> eg = shifted(ep, gr * q.cout, first * out_plane);
      T* yg = y + first * out_plane;
      if constexpr (Wide) {
        for (int64_t i = 0; i < segments; i += kSegments)
          for (int64_t o0 = 0; o0 < q.cout; o0 += kMR)
            forward_tile_wide(src, seg.src.data() + i, seg.dst.data() + i, seg.count.data() + i,
                              q.off.data(), q.K, wg + o0, q.ldw, shifted(eg, o0, o0 * out_plane),
                              q.cout - o0, yg + o0 * out_plane, out_plane);
      } else {
        for (int64_t h = 0; h < q.HO; ++h)
          for (int64_t w0 = 0; w0 < q.WO; w0 += NR)
            for (int64_t o0 = 0; o0 < q.cout; o0 += kMR) {
              const int64_t at = o0 * out_plane + h * q.WO + w0;
              forward_tile(src + h * q.Wp + w0, q.off.data(), q.K, wg + o0, q.ldw,
                           shifted(eg, o0, at), q.cout - o0, std::min(NR, q.WO - w0), yg + at,
                           out_plane);
            }
      }
    }
  }
}

// The sum of an AVX-512 register's lanes by halves: a few vector adds in registers (a lane loop
// over 16 lanes went through memory, and its stalls made the weight gradient slower than AVX2).
template <class T>
LUCID_ALWAYS_INLINE T lane_sum_wide(typename Simd<T, kWide>::V v) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  typedef T Half __attribute__((vector_size(kWide / 2)));
  typedef T Quarter __attribute__((vector_size(kWide / 4)));
  Half h;
  Quarter q;
  if constexpr (sizeof(T) == 4) {
    h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
        __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
    return (q[0] + q[2]) + (q[1] + q[3]);
  } else {
    h = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    q = __builtin_shufflevector(h, h, 0, 1) + __builtin_shufflevector(h, h, 2, 3);
    return q[0] + q[1];
  }
#else  // GCC before 12 has no __builtin_shufflevector: lane by lane, unrolled
  T sum = 0;
#pragma GCC unroll 16
  for (int l = 0; l < Simd<T, kWide>::L; ++l) sum += v[l];
  return sum;
#endif
}

// Bytes: the register width (32 or 64); P is a multiple of its lanes.
template <class T, int QB, int Bytes>
LUCID_ALWAYS_INLINE void grad_tile(const T* dy, int64_t ldd, int64_t dy_image, const T* x,
                                   int64_t x_image, const int64_t* off, int64_t images, int64_t P,
                                   T* out, int64_t ldo) {
  using V = typename Simd<T, Bytes>::V;
  constexpr int L = Simd<T, Bytes>::L;
  V acc[kMR][QB];
  for (int r = 0; r < kMR; ++r)
    for (int t = 0; t < QB; ++t) acc[r][t] = V{};
  for (int64_t n = 0; n < images; ++n) {
    const T* d = dy + n * dy_image;
    const T* s = x + n * x_image;
    for (int64_t p = 0; p < P; p += L) {
      V b[QB];
      for (int t = 0; t < QB; ++t) b[t] = load<T, Bytes>(s + off[t] + p);
      for (int r = 0; r < kMR; ++r) {
        V dr = load<T, Bytes>(d + r * ldd + p);
#if defined(__x86_64__)
        // One load of dy per row into a register: GCC otherwise folds it into each of the QB
        // FMAs, and the wide kernel became bound by its loads.
        if constexpr (Bytes == kWide) asm("" : "+v"(dr));
#endif
        for (int t = 0; t < QB; ++t) acc[r][t] += dr * b[t];
      }
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int t = 0; t < QB; ++t) {
      if constexpr (Bytes == kWide) {
        out[r * ldo + t] = lane_sum_wide<T>(acc[r][t]);
      } else {
        T sum = 0;
        for (int l = 0; l < L; ++l) sum += acc[r][t][l];
        out[r * ldo + t] = sum;
      }
    }
}

// The weight gradient of images [n0, n0 + images) (at most kGradChunk) into part [G*ldw][K];
// false when x holds an inf or NaN (0 * inf in a dropped column would poison the sum).
template <class T, int Bytes>
LUCID_ALWAYS_INLINE bool grad_chunk(const Plan& q, const T* x, const T* dy, int64_t n0,
                                    int64_t images, T* part) {
  const int64_t dy_image = q.G * q.ldw * q.P;
  T* xpads = thread_buffer<T>(0, q.image * kGradChunk);
  // The grid's rows start on 64-byte lines (P is a multiple of 2 registers): the wide kernel's
  // loads of dy then never straddle two lines.
  T* grid = thread_buffer<T>(1, dy_image * kGradChunk + 64 / sizeof(T));
  grid += (64 - reinterpret_cast<uintptr_t>(grid) % 64) % 64 / sizeof(T);
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
  const int64_t P = round_up(q.HO * q.Wp, Simd<T, Bytes>::L);
  for (int64_t gr = 0; gr < q.G; ++gr)
    for (int64_t o0 = 0; o0 < q.ldw; o0 += kMR) {
      const T* d = grid + (gr * q.ldw + o0) * q.P;
      const T* s = xpads + gr * q.cin * q.plane;
      T* out = part + (gr * q.ldw + o0) * q.K;
      int64_t k = 0;
      // AVX-512 has the registers for two kernel rows of taps at once (24 accumulators): dy's
      // rows are loaded once per six taps instead of three.
      constexpr int kWideQB = Bytes == kWide ? 2 * kQB : kQB;
      for (; k + kWideQB <= q.K; k += kWideQB)
        grad_tile<T, kWideQB, Bytes>(d, q.P, dy_image, s, q.image, q.off.data() + k, images, P,
                                     out + k, q.K);
      for (; k + kQB <= q.K; k += kQB)
        grad_tile<T, kQB, Bytes>(d, q.P, dy_image, s, q.image, q.off.data() + k, images, P,
                                 out + k, q.K);
      for (; k < q.K; ++k)
        grad_tile<T, 1, Bytes>(d, q.P, dy_image, s, q.image, q.off.data() + k, images, P,
                               out + k, q.K);
    }
  return true;
}

// ---- Winograd F(2x2, 3x3) -------------------------------------------------------------------
// A 3x3 stride-1 convolution with many channels as 16 GEMMs over transformed 4x4 input tiles
// (Lavin & Gray): each 2x2 output tile costs 16 multiply-adds per (input, output) channel pair
// instead of 36. The images' tiles sit side by side in the GEMMs' columns, so the later stages'
// tiny planes (8x8, 4x4) still make GEMMs wide enough for the BLAS.
//   V[xi][c][p] = (B^T d B)[xi] of input tile p (4x4, stride 2), channel c
//   U[xi][o][c] = (G g G^T)[xi] of weight g[o, c]
//   M[xi] = U[xi] @ V[xi]; output tile p of channel o = A^T M[.][o][p] A, then the epilogue.
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
// A^T = [1 1 1 0; 0 1 -1 -1]. The transforms mix a tile's values, so an inf or NaN would spread
// to outputs the direct sum keeps finite: inputs and weights with one take another path.
struct Wino {
  int64_t N, C, H, W, O, HO, WO, pt, pl, TH, TW, P;
};

// Tiles of images: each (image, channel) plane read once into its even and odd padded columns,
// then the 4x4 tiles of one tile row transformed together, a vector over the tiles of the row.
template <class T>
LUCID_ALWAYS_INLINE void wino_input(const Wino& q, const T* x, T* V, int64_t j0, int64_t j1) {
  const int64_t rows = 2 * q.TH + 2, half = q.TW + 1, tiles = q.TH * q.TW;
  T* even = thread_buffer<T>(1, 2 * rows * half + 16 * q.TW);
  T* odd = even + rows * half;
  T* t = odd + rows * half;  // [16][TW]
  for (int64_t job = j0; job < j1; ++job) {
    const int64_t n = job / q.C, c = job % q.C;
    const T* plane = x + (n * q.C + c) * q.H * q.W;
    std::fill_n(even, 2 * rows * half, T(0));
    for (int64_t h = std::max<int64_t>(0, -q.pt); h < q.H && h + q.pt < rows; ++h) {
      const T* src = plane + h * q.W;
      T *e = even + (h + q.pt) * half, *o = odd + (h + q.pt) * half;
      // Padded column pc = w + pl lands in e[pc / 2] (even pc) or o[pc / 2] (odd pc).
      for (int64_t wc = 0; wc < q.W && wc + q.pl < 2 * half; ++wc) {
        const int64_t pc = wc + q.pl;
        (pc & 1 ? o : e)[pc >> 1] = src[wc];
      }
    }
    for (int64_t ty = 0; ty < q.TH; ++ty) {
      // Columns first: per padded row, the row's B^T-combination of each tile's 4 columns.
      T col[4][4][64];  // [row][combination][tile], tiles of the row in blocks of 64
      for (int64_t x0 = 0; x0 < q.TW; x0 += 64) {
        const int64_t nx = std::min<int64_t>(64, q.TW - x0);
        for (int r = 0; r < 4; ++r) {
          const T* e = even + (2 * ty + r) * half + x0;
          const T* o = odd + (2 * ty + r) * half + x0;
          for (int64_t i = 0; i < nx; ++i) {
            col[r][0][i] = e[i] - e[i + 1];
            col[r][1][i] = o[i] + e[i + 1];
            col[r][2][i] = e[i + 1] - o[i];
            col[r][3][i] = o[i] - o[i + 1];
          }
        }
        for (int j = 0; j < 4; ++j)
          for (int64_t i = 0; i < nx; ++i) {
            t[(0 * 4 + j) * q.TW + x0 + i] = col[0][j][i] - col[2][j][i];
            t[(1 * 4 + j) * q.TW + x0 + i] = col[1][j][i] + col[2][j][i];
            t[(2 * 4 + j) * q.TW + x0 + i] = col[2][j][i] - col[1][j][i];
            t[(3 * 4 + j) * q.TW + x0 + i] = col[1][j][i] - col[3][j][i];
          }
      }
      const int64_t p0 = n * tiles + ty * q.TW;
      for (int xi = 0; xi < 16; ++xi)
        std::memcpy(V + (xi * q.C + c) * q.P + p0, t + xi * q.TW, sizeof(T) * q.TW);
    }
  }
}

// U for output channels [o0, o1): w is OIHW [O, C, 3, 3]. Each output channel's taps are first
// gathered tap-major, so the transform runs as vectors over the input channels and writes each
// U row [xi][o][.] front to back.
template <class T>
LUCID_ALWAYS_INLINE void wino_weights(const Wino& q, const T* w, T* U, int64_t o0, int64_t o1) {
  const int64_t C = q.C, OC = q.O * q.C;
  T* g = thread_buffer<T>(1, 9 * C + 12 * C);  // [9][C] taps, then G g as [4][3][C]
  T* gg = g + 9 * C;
  for (int64_t o = o0; o < o1; ++o) {
    const T* src = w + o * C * 9;
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < 9; ++k) g[k * C + c] = src[c * 9 + k];
    for (int j = 0; j < 3; ++j) {
      const T *g0 = g + j * C, *g1 = g + (3 + j) * C, *g2 = g + (6 + j) * C;
      T *r0 = gg + (0 * 3 + j) * C, *r1 = gg + (1 * 3 + j) * C;
      T *r2 = gg + (2 * 3 + j) * C, *r3 = gg + (3 * 3 + j) * C;
      for (int64_t c = 0; c < C; ++c) {
        r0[c] = g0[c];
        r1[c] = T(0.5) * (g0[c] + g1[c] + g2[c]);
        r2[c] = T(0.5) * (g0[c] - g1[c] + g2[c]);
        r3[c] = g2[c];
      }
    }
    for (int i = 0; i < 4; ++i) {
      const T *a0 = gg + (i * 3 + 0) * C, *a1 = gg + (i * 3 + 1) * C, *a2 = gg + (i * 3 + 2) * C;
      T* u = U + i * 4 * OC + o * C;
      for (int64_t c = 0; c < C; ++c) {
        u[c] = a0[c];
        u[OC + c] = T(0.5) * (a0[c] + a1[c] + a2[c]);
        u[2 * OC + c] = T(0.5) * (a0[c] - a1[c] + a2[c]);
        u[3 * OC + c] = a2[c];
      }
    }
  }
}

// Output planes (image, channel) [j0, j1) from M [16][O][P], through the epilogue (scale and
// bias as each tile row is transformed, residual and ReLU as its rows are written).
template <class T>
LUCID_ALWAYS_INLINE void wino_output(const Wino& q, const T* M, const ConvEpilogue<T>& ep,
                                     T* y, int64_t j0, int64_t j1) {
  const int64_t tiles = q.TH * q.TW, OP = q.O * q.P;
  T* out = thread_buffer<T>(2, 4 * q.TW);  // [a][b][tile] of one tile row
  for (int64_t job = j0; job < j1; ++job) {
    const int64_t n = job / q.O, o = job % q.O;
    const T a = ep.scale ? ep.scale[o] : T(1), b = ep.bias ? ep.bias[o] : T(0);
    T* plane = y + (n * q.O + o) * q.HO * q.WO;
    const T* res_plane = ep.residual ? ep.residual + (n * q.O + o) * q.HO * q.WO : nullptr;
    for (int64_t ty = 0; ty < q.TH; ++ty) {
      const T* m = M + o * q.P + n * tiles + ty * q.TW;
      for (int64_t i = 0; i < q.TW; ++i) {
        T s[2][4];  // A^T m, per column
        for (int j = 0; j < 4; ++j) {
          const T m0 = m[(0 * 4 + j) * OP + i], m1 = m[(1 * 4 + j) * OP + i];
          const T m2 = m[(2 * 4 + j) * OP + i], m3 = m[(3 * 4 + j) * OP + i];
          s[0][j] = m0 + m1 + m2;
          s[1][j] = m1 - m2 - m3;
        }
        for (int r = 0; r < 2; ++r) {
          T v0 = s[r][0] + s[r][1] + s[r][2];
          T v1 = s[r][1] - s[r][2] - s[r][3];
          if (ep.scale) {
            v0 *= a;
            v1 *= a;
          }
          out[(r * 2 + 0) * q.TW + i] = v0 + b;
          out[(r * 2 + 1) * q.TW + i] = v1 + b;
        }
      }
      for (int r = 0; r < 2 && 2 * ty + r < q.HO; ++r) {
        T* row = plane + (2 * ty + r) * q.WO;
        const T* res = res_plane ? res_plane + (2 * ty + r) * q.WO : nullptr;
        for (int64_t wcol = 0; wcol < q.WO; ++wcol) {
          T v = out[(r * 2 + (wcol & 1)) * q.TW + (wcol >> 1)];
          if (res) v += res[wcol];
          row[wcol] = ep.relu && v <= 0 ? T(0) : v;  // as lucid::relu: v <= 0 ? +0 : v
        }
      }
    }
  }
}

// The kernels compiled for the baseline ISA and for AVX2 + FMA, picked at run time.
#define LUCID_CONV_KERNELS(suffix, attr)                                                          \
  template <class T>                                                                            \
  attr void forward_##suffix(const Plan& q, const T* x, const T* wp, const ConvEpilogue<T>& ep, \
                             T* y, int64_t n0, int64_t n1) {                                    \
    forward_images<T, false>(q, x, wp, ep, y, n0, n1);                                          \
  }                                                                                             \
  template <class T>                                                                            \
  attr bool grad_##suffix(const Plan& q, const T* x, const T* dy, int64_t n0, int64_t images,   \
                          T* part) {                                                            \
    return grad_chunk<T, 32>(q, x, dy, n0, images, part);                                       \
  }                                                                                             \
  template <class T>                                                                            \
  attr void wino_input_##suffix(const Wino& q, const T* x, T* V, int64_t j0, int64_t j1) {      \
    wino_input(q, x, V, j0, j1);                                                                \
  }                                                                                             \
  template <class T>                                                                            \
  attr void wino_weights_##suffix(const Wino& q, const T* w, T* U, int64_t o0, int64_t o1) {    \
    wino_weights(q, w, U, o0, o1);                                                              \
  }                                                                                             \
  template <class T>                                                                            \
  attr void wino_output_##suffix(const Wino& q, const T* M, const ConvEpilogue<T>& ep, T* y,   \
                                 int64_t j0, int64_t j1) {                                      \
    wino_output(q, M, ep, y, j0, j1);                                                           \
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
void forward_avx2(const Plan& q, const T* x, const T* wp, const ConvEpilogue<T>& ep, T* y,
                  int64_t n0, int64_t n1) {
  forward_base(q, x, wp, ep, y, n0, n1);
}
template <class T>
bool grad_avx2(const Plan& q, const T* x, const T* dy, int64_t n0, int64_t images, T* part) {
  return grad_base(q, x, dy, n0, images, part);
}
template <class T>
void wino_input_avx2(const Wino& q, const T* x, T* V, int64_t j0, int64_t j1) {
  wino_input_base(q, x, V, j0, j1);
}
template <class T>
void wino_weights_avx2(const Wino& q, const T* w, T* U, int64_t o0, int64_t o1) {
  wino_weights_base(q, w, U, o0, o1);
}
template <class T>
void wino_output_avx2(const Wino& q, const T* M, const ConvEpilogue<T>& ep, T* y, int64_t j0,
                      int64_t j1) {
  wino_output_base(q, M, ep, y, j0, j1);
}
#endif

// The AVX-512 kernels: the shifted-view forward (which also serves the data gradient) and the
// weight gradient. The Winograd transforms stay on AVX2: they vectorize over a plane's tile
// columns (2 to 4 in workload G), and their GEMMs are the sgemm's own AVX-512 tile.
template <class T>
LUCID_TARGET_AVX512 void forward_avx512(const Plan& q, const T* x, const T* wp,
                                        const ConvEpilogue<T>& ep, T* y, int64_t n0, int64_t n1) {
  forward_images<T, true>(q, x, wp, ep, y, n0, n1);
}
template <class T>
LUCID_TARGET_AVX512 bool grad_avx512(const Plan& q, const T* x, const T* dy, int64_t n0,
                              int64_t images, T* part) {
  return grad_chunk<T, kWide>(q, x, dy, n0, images, part);
}

// Which kernels run: 2 the AVX-512 ones where Lucid's sgemm runs its AVX-512 tile (the CPU has
// AVX-512 F/VL/DQ and set_sgemm_isa / LUCID_SGEMM_ISA=avx2 does not force AVX2, so one switch
// forces both), 1 AVX2 + FMA, 0 the baseline ISA.
enum class Isa { base = 0, avx2 = 1, avx512 = 2 };
Isa conv_isa() {
  if (!has_avx2()) return Isa::base;
  return sgemm_isa() == 2 ? Isa::avx512 : Isa::avx2;
}

// The lanes of one register of the kernels `isa` picks: the plan's padding follows them.
template <class T>
int lanes(Isa isa) {
  return isa == Isa::avx512 ? Simd<T, kWide>::L : Simd<T>::L;
}

bool fits(const Plan& q, size_t elem) {
  return q.ldw * q.K * static_cast<int64_t>(elem) <= kMaxWeightBytes &&
         q.image * static_cast<int64_t>(elem) <= kMaxImageBytes && q.K > 0 && q.HO > 0 &&
         q.WO > 0;
}

template <class T>
void run_forward(Isa isa, const Plan& q, const T* x, const T* wp, const ConvEpilogue<T>& ep,
                 T* y) {
  parallel_for(q.N, 1, [&](int64_t n0, int64_t n1) {
    if (isa == Isa::avx512) forward_avx512(q, x, wp, ep, y, n0, n1);
    else if (isa == Isa::avx2) forward_avx2(q, x, wp, ep, y, n0, n1);
    else forward_base(q, x, wp, ep, y, n0, n1);
  });
}

// Winograd is worth its transforms once the GEMMs are large: at least this many channels on
// each side and this many tiles in all (the weight transform costs about as much as the
// multiply-adds saved on 16 tiles). forward() tries the shifted-view kernel first.
constexpr int64_t kWinoMinChannels = 32;
constexpr int64_t kWinoMinTiles = 64;

bool winograd_applies(const ConvShape& s) {
  return sgemm_supported() && s.KH == 3 && s.KW == 3 && s.sh == 1 && s.sw == 1 &&
         s.dh == 1 && s.dw == 1 && s.G == 1 && s.C >= kWinoMinChannels &&
         s.O >= kWinoMinChannels && s.HO > 0 && s.WO > 0 &&
         s.N * ((s.HO + 1) / 2) * ((s.WO + 1) / 2) >= kWinoMinTiles;
}

// float32 only: the float64 kernels serve the finite-difference checks, where the direct sum's
// rounding is wanted.
bool winograd_forward(const ConvShape& s, const float* x, const float* w,
                      const ConvEpilogue<float>& ep, float* y) {
  using T = float;
  if (!winograd_applies(s)) return false;
  if (!all_finite(x, s.N * s.C * s.H * s.W) || !all_finite(w, s.O * s.C * 9)) return false;
  Wino q{s.N, s.C, s.H, s.W, s.O, s.HO, s.WO, s.pt, s.pl, (s.HO + 1) / 2, (s.WO + 1) / 2, 0};
  q.P = q.N * q.TH * q.TW;
  const size_t u_size = 16 * q.O * q.C, v_size = 16 * q.C * q.P, m_size = 16 * q.O * q.P;
  T* U = conv_scratch(u_size + v_size + m_size);
  T *V = U + u_size, *M = V + v_size;
  const bool avx2 = has_avx2();
  parallel_for(q.O, std::max<int64_t>(1, 4096 / q.C), [&](int64_t o0, int64_t o1) {
    if (avx2) wino_weights_avx2(q, w, U, o0, o1);
    else wino_weights_base(q, w, U, o0, o1);
  });
  const int64_t plane = std::max<int64_t>(1, q.H * q.W);
  parallel_for(q.N * q.C, std::max<int64_t>(1, 4096 / plane), [&](int64_t j0, int64_t j1) {
    if (avx2) wino_input_avx2(q, x, V, j0, j1);
    else wino_input_base(q, x, V, j0, j1);
  });
  // Lucid's sgemm splits each product over blocks of rows or columns, never the contraction, so
  // the sums do not depend on the thread count (OpenBLAS's threaded kernels differ in the last
  // bits between 1 and 2 threads).
  for (int64_t xi = 0; xi < 16; ++xi)
    sgemm(false, false, q.O, q.P, q.C, 1.0f, U + xi * q.O * q.C, q.C, V + xi * q.C * q.P, q.P,
          0.0f, M + xi * q.O * q.P, q.P);
  const int64_t out_plane = std::max<int64_t>(1, q.HO * q.WO);
  parallel_for(q.N * q.O, std::max<int64_t>(1, 4096 / out_plane), [&](int64_t j0, int64_t j1) {
    if (avx2) wino_output_avx2(q, M, ep, y, j0, j1);
    else wino_output_base(q, M, ep, y, j0, j1);
  });
  return true;
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

// The shifted-view kernel, for stride-1 convolutions whose weights and image fit in L2.
template <class T>
bool direct_forward(const ConvShape& s, const T* x, const T* w, const ConvEpilogue<T>& ep,
                    T* y) {
  if (s.sh != 1 || s.sw != 1) return false;
  const Isa isa = conv_isa();
  Plan q = forward_plan(s, lanes<T>(isa));
  if (!fits(q, sizeof(T))) return false;
  std::vector<T> wp(q.G * q.K * q.ldw, T(0));  // [G][K][ldw]: a tap's weights side by side
  for (int64_t gr = 0; gr < q.G; ++gr)
    for (int64_t o = 0; o < q.cout; ++o)
      for (int64_t k = 0; k < q.K; ++k)
        wp[(gr * q.K + k) * q.ldw + o] = w[(gr * q.cout + o) * q.K + k];
  run_forward(isa, q, x, wp.data(), ep, y);
  return true;
}

// dx is the stride-1 convolution of dy, padded by the kernel's extent less the forward padding,
// with each group's weights transposed (in <-> out channels) and flipped in both axes.
template <class T>
bool direct_data_grad(const ConvShape& s, const T* dy, const T* w, T* dx) {
  if (s.sh != 1 || s.sw != 1) return false;
  const int64_t cg = s.C / s.G, og = s.O / s.G;
  const int64_t pb = s.HO + s.dh * (s.KH - 1) - s.H - s.pt;
  const int64_t pr = s.WO + s.dw * (s.KW - 1) - s.W - s.pl;
  Plan q{s.N, s.O, s.HO, s.WO, s.G, og, cg, s.KH, s.KW, s.dh, s.dw,
         s.dh * (s.KH - 1) - s.pt, s.dh * (s.KH - 1) - pb, s.dw * (s.KW - 1) - s.pl,
         s.dw * (s.KW - 1) - pr, s.H, s.W};
  if (q.pt < 0 || q.pb < 0 || q.pl < 0 || q.pr < 0) return false;  // a padding wider than the kernel
  const Isa isa = conv_isa();
  q.derive(lanes<T>(isa));
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
  run_forward(isa, q, dy, wp.data(), ConvEpilogue<T>{}, dx);
  return true;
}

template <class T>
bool direct_weights_grad(const ConvShape& s, const T* x, const T* dy, T* dw) {
  if (s.sh != 1 || s.sw != 1) return false;
  const Isa isa = conv_isa();
  Plan q = forward_plan(s, lanes<T>(isa));
  if (!fits(q, sizeof(T)) || s.N == 0) return false;
  const int64_t chunks = (s.N + kGradChunk - 1) / kGradChunk, rows = q.G * q.ldw;
  std::vector<T> parts(chunks * rows * q.K);
  std::vector<char> ok(chunks, 1);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * kGradChunk, images = std::min(kGradChunk, s.N - n0);
      T* part = parts.data() + c * rows * q.K;
      ok[c] = isa == Isa::avx512 ? grad_avx512(q, x, dy, n0, images, part)
              : isa == Isa::avx2 ? grad_avx2(q, x, dy, n0, images, part)
                                 : grad_base(q, x, dy, n0, images, part);
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

// ---- strided convolutions over the input's phases -------------------------------------------
// A stride-(sh, sw) convolution reads padded row sh*ho + i; with i = sh*a + p that is row ho + a
// of phase p (padded rows p, p + sh, ...). So it is the stride-1 convolution of the sh*sw phases
// of the padded image (C*sh*sw channels, no padding) with kernel taps a < ceil(KH / sh), the taps
// past the kernel zero. Workload G's stem (3 -> 64 channels, 7x7 stride 2 on 64x64) runs on the
// shifted-view kernels this way, images across the pool, with 1.3x the multiply-adds (the zero
// taps) but no 10 MB im2col matrix: at two threads that matrix made the stem slower than at one.
// Only where the zero taps cost little (first layers with few channels and large planes).
constexpr int64_t kMinPhasePixels = 256;

ConvShape phase_shape(const ConvShape& s) {
  ConvShape q = s;
  q.C = s.C * s.sh * s.sw;
  q.KH = (s.KH + s.sh - 1) / s.sh;
  q.KW = (s.KW + s.sw - 1) / s.sw;
  q.H = s.HO + q.KH - 1;
  q.W = s.WO + q.KW - 1;
  q.sh = q.sw = 1;
  q.pt = q.pl = 0;
  return q;
}

bool phases_apply(const ConvShape& s) {
  const ConvShape q = phase_shape(s);
  return (s.sh > 1 || s.sw > 1) && s.dh == 1 && s.dw == 1 && s.G == 1 && s.N > 0 &&
         s.HO * s.WO >= kMinPhasePixels && 2 * q.C * q.KH * q.KW <= 3 * s.C * s.KH * s.KW;
}

// The phases of x [N][C][H][W] as [N][C*sh*sw][HO + KH' - 1][WO + KW' - 1], in the calling
// thread's scratch; channel c's phase (p, r) is channel (c*sh + p)*sw + r.
float* make_phases(const ConvShape& s, const ConvShape& q, const float* x) {
  float* ph = conv_scratch(q.N * q.C * q.H * q.W);
  parallel_for(q.N * q.C, std::max<int64_t>(1, 4096 / (q.H * q.W)), [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t n = job / q.C, cp = job % q.C, c = cp / (s.sh * s.sw);
      const int64_t p = cp / s.sw % s.sh, r = cp % s.sw;
      const float* plane = x + (n * s.C + c) * s.H * s.W;
      float* out = ph + job * q.H * q.W;
      for (int64_t m = 0; m < q.H; ++m) {
        const int64_t h = s.sh * m + p - s.pt;
        for (int64_t l = 0; l < q.W; ++l) {
          const int64_t wc = s.sw * l + r - s.pl;
          const bool inside = h >= 0 && h < s.H && wc >= 0 && wc < s.W;
          out[m * q.W + l] = inside ? plane[h * s.W + wc] : 0.0f;
        }
      }
    }
  });
  return ph;
}

// The index in w of phase tap (o, channel cp, a, b), or -1 for a zero tap.
int64_t phase_tap(const ConvShape& s, int64_t o, int64_t cp, int64_t a, int64_t b) {
  const int64_t c = cp / (s.sh * s.sw), i = a * s.sh + cp / s.sw % s.sh, j = b * s.sw + cp % s.sw;
  return i < s.KH && j < s.KW ? ((o * s.C + c) * s.KH + i) * s.KW + j : -1;
}

bool phase_forward(const ConvShape& s, const float* x, const float* w,
                   const ConvEpilogue<float>& ep, float* y) {
  // A zero tap times an inf or NaN (or a tap times a phase's zero fill) would be NaN where the
  // reference has none: such calls take im2col.
  if (!phases_apply(s) || !all_finite(x, s.N * s.C * s.H * s.W) ||
      !all_finite(w, s.O * s.C * s.KH * s.KW))
    return false;
  const ConvShape q = phase_shape(s);
  std::vector<float> wq(q.O * q.C * q.KH * q.KW);
  for (int64_t o = 0; o < q.O; ++o)
    for (int64_t cp = 0; cp < q.C; ++cp)
      for (int64_t a = 0; a < q.KH; ++a)
        for (int64_t b = 0; b < q.KW; ++b) {
          const int64_t t = phase_tap(s, o, cp, a, b);
          wq[((o * q.C + cp) * q.KH + a) * q.KW + b] = t < 0 ? 0.0f : w[t];
        }
  return direct_forward(q, make_phases(s, q, x), wq.data(), ep, y);
}

bool phase_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw) {
  if (!phases_apply(s)) return false;
  const ConvShape q = phase_shape(s);
  std::vector<float> dwq(q.O * q.C * q.KH * q.KW);
  if (!direct_weights_grad(q, make_phases(s, q, x), dy, dwq.data())) return false;
  for (int64_t o = 0; o < q.O; ++o)
    for (int64_t cp = 0; cp < q.C; ++cp)
      for (int64_t a = 0; a < q.KH; ++a)
        for (int64_t b = 0; b < q.KW; ++b) {
          const int64_t t = phase_tap(s, o, cp, a, b);
          if (t >= 0) dw[t] = dwq[((o * q.C + cp) * q.KH + a) * q.KW + b];
        }
  return true;
}

// Output planes of at most this many pixels skip Winograd for the implicit GEMM: on workload G's
// 8x8 and 4x4 stages (128 and 256 channels) the implicit GEMM took 0.4-0.8x Winograd's time
// (its transforms and sixteen small GEMMs cost more than the multiply-adds they save).
constexpr int64_t kMaxImplicitPlane = 64;

// The shifted-view kernel where its weights and image fit in L2: it runs near the machine's FMA
// rate there, and Winograd's transform passes cost about what its GEMMs save (measured on
// workload G's 64-channel 16x16 stage; the implicit GEMM took 2x its time there). Beyond it,
// float32 strided first layers over their phases, small planes as an implicit GEMM, Winograd,
// then the implicit GEMM for the rest.
template <class T>
bool forward(const ConvShape& s, const T* x, const T* w, const ConvEpilogue<T>& ep, T* y) {
  if (direct_forward(s, x, w, ep, y)) return true;
  if constexpr (std::is_same_v<T, float>)
    return phase_forward(s, x, w, ep, y) ||
           (s.HO * s.WO <= kMaxImplicitPlane && conv_im2col_forward(s, x, w, ep, y)) ||
           winograd_forward(s, x, w, ep, y) || conv_im2col_forward(s, x, w, ep, y);
  return false;
}

// float32 shapes the direct kernels leave (strides, weights too large for them, non-finite
// values) take the batched im2col GEMM; float64 ones return to linalg.cpp's fallback.
template <class T>
bool data_grad(const ConvShape& s, const T* dy, const T* w, T* dx) {
  if (direct_data_grad(s, dy, w, dx)) return true;
  if constexpr (std::is_same_v<T, float>) return conv_im2col_data_grad(s, dy, w, dx);
  return false;
}

template <class T>
bool weights_grad(const ConvShape& s, const T* x, const T* dy, T* dw) {
  if (direct_weights_grad(s, x, dy, dw)) return true;
  if constexpr (std::is_same_v<T, float>)
    return phase_weights_grad(s, x, dy, dw) || conv_im2col_weights_grad(s, x, dy, dw);
  return false;
}

}  // namespace

bool conv2d_direct_forward(const ConvShape& s, const float* x, const float* w,
                           const ConvEpilogue<float>& ep, float* y) {
  return forward(s, x, w, ep, y);
}
bool conv2d_direct_forward(const ConvShape& s, const double* x, const double* w,
                           const ConvEpilogue<double>& ep, double* y) {
  return forward(s, x, w, ep, y);
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
