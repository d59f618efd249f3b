// float32 convolutions without groups as one sgemm over the batch (see conv_im2col.h): the
// shapes conv.cpp's direct kernels and phases leave (strided 3x3 and 1x1 projections, weights
// past L2 on small planes, non-finite inputs), Winograd's shapes on larger planes excepted.
// Forward and weight gradient are implicit GEMMs: the batch is copied once into zero-padded
// planes (or read as it is when no tap reads outside it), and the GEMM's packed operand (the
// im2col matrix for the forward, its transpose for the weight gradient) is gathered from it
// through two offset tables, blocks of it in parallel, into sgemm_prepacked's layout: no im2col
// matrix is written and read back. The forward's [O][N*HO*WO] product is scattered into NCHW
// through the epilogue (scale, bias, residual, ReLU). The data gradient is one GEMM into an
// im2col-shaped matrix whose columns are summed back into planes (col2im) channel by channel in
// parallel. linalg.cpp's fallback computes the same GEMMs with every copy on one thread and the
// epilogue in a pass of its own.
//
// Lucid's sgemm splits each product over blocks of rows or columns, never the contraction, and
// every copy, packed block or col2im plane is one thread's, so the results do not depend on the
// thread count (nor on the tile: the packed operand holds the values sgemm would have packed).
#include "lucid/conv_im2col.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "lucid/parallel.h"
#include "lucid/sgemm.h"

namespace lucid {

namespace {

constexpr int64_t kMaxColumnElements = int64_t(1) << 26;  // 256 MB of float32 scratch

// The output columns [lo, hi) of a kernel column shifted by `cshift` that read inside the image
// row (ow * sw + cshift in [0, W)); the others read the zero padding.
void inside_columns(const ConvShape& s, int64_t cshift, int64_t& lo, int64_t& hi) {
  lo = std::min(s.WO, cshift >= 0 ? 0 : (-cshift + s.sw - 1) / s.sw);
  hi = s.W - cshift <= 0 ? 0 : std::min(s.WO, (s.W - cshift + s.sw - 1) / s.sw);
  hi = std::max(lo, hi);
}

bool im2col_fits(const ConvShape& s) {
  const int64_t K = s.C * s.KH * s.KW, cols = s.N * s.HO * s.WO;
  return sgemm_supported() && s.G == 1 && K > 0 && cols > 0 && s.O > 0 && s.H * s.W > 0 &&
         (K + s.O) * cols <= kMaxColumnElements;
}

// dy [N][O][HO*WO] as [O][N*HO*WO]: the images side by side in each channel's row.
void gather_channels(const ConvShape& s, const float* dy, float* out) {
  const int64_t HW = s.HO * s.WO, cols = s.N * HW;
  parallel_for(s.O, std::max<int64_t>(1, 8192 / cols), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t n = 0; n < s.N; ++n)
        std::memcpy(out + o * cols + n * HW, dy + (n * s.O + o) * HW, sizeof(float) * HW);
  });
}

// The batch zero-padded so that every tap of every output pixel reads inside it: element
// (column, tap) of the im2col matrix is padded[col_at[column] + tap_at[tap]], with column
// (n, oh, ow) at n*image + oh*sh*Wp + ow*sw and tap (c, i, j) at c*plane + i*dh*Wp + j*dw.
// The implicit GEMMs gather their packed operand through these two tables: no im2col matrix
// (on workload G's 2x2 and 4x4 planes its rows were runs of 2-4 values, each a memcpy and two
// fills, and writing it took two thirds of the GEMM's time).
struct Gather {
  int64_t Hp, Wp, plane, image;
  std::vector<int64_t> col_at, tap_at;
};

Gather gather_plan(const ConvShape& s) {
  Gather g;
  g.Hp = std::max(s.pt + s.H, (s.HO - 1) * s.sh + (s.KH - 1) * s.dh + 1);
  g.Wp = std::max(s.pl + s.W, (s.WO - 1) * s.sw + (s.KW - 1) * s.dw + 1);
  g.plane = g.Hp * g.Wp;
  g.image = s.C * g.plane;
  g.col_at.resize(s.N * s.HO * s.WO);
  for (int64_t n = 0, col = 0; n < s.N; ++n)
    for (int64_t oh = 0; oh < s.HO; ++oh)
      for (int64_t ow = 0; ow < s.WO; ++ow)
        g.col_at[col++] = n * g.image + oh * s.sh * g.Wp + ow * s.sw;
  g.tap_at.resize(s.C * s.KH * s.KW);
  for (int64_t c = 0, k = 0; c < s.C; ++c)
    for (int64_t i = 0; i < s.KH; ++i)
      for (int64_t j = 0; j < s.KW; ++j) g.tap_at[k++] = c * g.plane + i * s.dh * g.Wp + j * s.dw;
  return g;
}

// True when no tap reads outside x: the gathers then read x itself (1x1 strided projections).
bool unpadded(const ConvShape& s, const Gather& g) {
  return s.pt == 0 && s.pl == 0 && g.Hp == s.H && g.Wp == s.W;
}

// Planes [N*C] of x [N][C][H][W] into `padded` [N][C][Hp][Wp], zero around them.
void pad_batch(const ConvShape& s, const Gather& g, const float* x, float* padded) {
  const int64_t HpWp = g.plane;
  parallel_for(s.N * s.C, std::max<int64_t>(1, 16384 / HpWp), [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      float* out = padded + job * HpWp;
      const float* in = x + job * s.H * s.W;
      std::fill_n(out, HpWp, 0.0f);
      for (int64_t h = 0; h < s.H; ++h)
        std::memcpy(out + (h + s.pt) * g.Wp + s.pl, in + h * s.W, sizeof(float) * s.W);
    }
  });
}

// op(B) [rows][cols] packed in `layout` for sgemm_prepacked, element (r, c) at
// src[row_at[r] + col_at[c]]: contraction blocks x column slivers across the pool. Groups of
// kRun columns whose sources are consecutive (runs along an output row of a stride-1 forward
// convolution) are copied as one vector: gathered one value at a time, packing G's 8x8 stage
// took three quarters of its GEMM's time.
constexpr int64_t kRun = 8;

void pack_gathered(const float* src, const int64_t* row_at, int64_t rows, const int64_t* col_at,
                   int64_t cols, const PackedBLayout& layout, float* packed) {
  const int64_t nr = layout.nr, kc = layout.kc;
  const int64_t blocks = (rows + kc - 1) / kc, slivers = layout.npad / nr;
  std::vector<char> run(layout.npad / kRun, 0);
  for (int64_t g = 0; g < cols / kRun; ++g) {
    const int64_t* at = col_at + g * kRun;
    bool consecutive = true;
    for (int64_t l = 1; l < kRun; ++l) consecutive = consecutive && at[l] == at[0] + l;
    run[g] = consecutive;
  }
  const int64_t per_job = kc * nr;
  const int64_t grain = std::max<int64_t>(1, 16384 / per_job);
  parallel_for(blocks * slivers, grain, [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t q = job / slivers, sl = job % slivers;
      const int64_t r0 = q * kc, kq = std::min(kc, rows - r0);
      const int64_t c0 = sl * nr, width = std::min(nr, cols - c0);
      const int64_t* at = col_at + c0;
      const char* runs = run.data() + c0 / kRun;
      float* dst = packed + r0 * layout.npad + sl * kq * nr;
      for (int64_t r = 0; r < kq; ++r, dst += nr) {
        const float* base = src + row_at[r0 + r];
        for (int64_t c = 0; c < nr; c += kRun) {
          if (runs[c / kRun]) {
            std::memcpy(dst + c, base + at[c], sizeof(float) * kRun);
            continue;
          }
          const int64_t end = std::min(c + kRun, width);
          int64_t l = c;
          for (; l < end; ++l) dst[l] = base[at[l]];
          for (; l < c + kRun; ++l) dst[l] = 0.0f;
        }
      }
    }
  });
}

// The data gradient of batches of at most this many output pixels in all (workload G's 4x4 and
// 2x2 stages: 256 and 64) computes the transposed product, below (not for 1x1 kernels: G's
// 1x1 projection onto 4x4 took 1.7x the wide path's time that way).
constexpr int64_t kMaxNarrowColumns = 256;

// For each pixel q of an input plane, the (output pixel of the image, tap) pairs whose products
// land on it, in tap order: pairs[start[q] .. start[q + 1]).
struct Landing {
  std::vector<int64_t> start;
  std::vector<std::pair<int64_t, int64_t>> pairs;
};

Landing landing_plan(const ConvShape& s) {
  Landing l;
  l.start.reserve(s.H * s.W + 1);
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t x = 0; x < s.W; ++x) {
      l.start.push_back(static_cast<int64_t>(l.pairs.size()));
      for (int64_t i = 0; i < s.KH; ++i)
        for (int64_t j = 0; j < s.KW; ++j) {
          const int64_t ph = h + s.pt - i * s.dh, pw = x + s.pl - j * s.dw;
          if (ph < 0 || pw < 0 || ph % s.sh != 0 || pw % s.sw != 0) continue;
          const int64_t oh = ph / s.sh, ow = pw / s.sw;
          if (oh < s.HO && ow < s.WO) l.pairs.emplace_back(oh * s.WO + ow, i * s.KW + j);
        }
    }
  l.start.push_back(static_cast<int64_t>(l.pairs.size()));
  return l;
}

// The data gradient of a narrow batch as col^T [N*HW][K] = dy^T [N*HW][O] @ w [O][K]: w is
// packed by rows as it is stored (the transposed product packed each 6-tap sliver of w's columns
// for a single 64-column tile, and spent about a third of its time doing so on G's 2x2 planes),
// and each pixel of dx sums the products landing on it in registers, in tap order (a scatter of
// the 2-4 value runs stalled on its own stores). Each element of col^T is the same FMA chain
// over the output channels as col's, so the bits are the wide path's.
bool narrow_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx) {
  const int64_t K = s.C * s.KH * s.KW, HW = s.HO * s.WO, cols = s.N * HW, plane = s.H * s.W;
  const int64_t taps = s.KH * s.KW;
  float* product = conv_scratch((K + s.O) * cols);
  float* dy_t = product + K * cols;
  parallel_for(s.N, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t o = 0; o < s.O; ++o) {
        const float* src = dy + (n * s.O + o) * HW;
        float* dst = dy_t + n * HW * s.O + o;
        for (int64_t p = 0; p < HW; ++p) dst[p * s.O] = src[p];
      }
  });
  sgemm(false, false, cols, K, s.O, 1.0f, dy_t, s.O, w, K, 0.0f, product, K);
  const Landing l = landing_plan(s);
  parallel_for(s.N * s.C, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, plane * taps)),
               [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t n = job / s.C, c = job % s.C;
      const float* base = product + n * HW * K + c * taps;
      float* out = dx + job * plane;
      for (int64_t q = 0; q < plane; ++q) {
        float sum = 0.0f;
        for (int64_t e = l.start[q]; e < l.start[q + 1]; ++e)
          sum += base[l.pairs[e].first * K + l.pairs[e].second];
        out[q] = sum;
      }
    }
  });
  return true;
}

// p rounded up to a 64-byte boundary (the GEMM kernels load packed B with aligned loads).
float* aligned64(float* p) {
  return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64 / sizeof(float);
}

}  // namespace

float* conv_scratch(size_t n) {
  thread_local std::vector<float> work;
  if (work.size() < n) work.resize(n);
  return work.data();
}

// The batch padded once (or read in place when no tap reaches outside it) and gathered into
// the sgemm's packed operand: taps x pixels (the forward's B) or pixels x taps (the weight
// gradient's), in this thread's scratch with `extra` floats free after it. Returns the operand.
float* gathered_operand(const ConvShape& s, const Gather& g, const float* x, bool taps_major,
                        int64_t extra) {
  const int64_t K = s.C * s.KH * s.KW, cols = s.N * s.HO * s.WO;
  const int64_t rows = taps_major ? K : cols, n = taps_major ? cols : K;
  const PackedBLayout layout = sgemm_packed_b_layout(n, rows);
  const bool in_place = unpadded(s, g);
  const int64_t pad_size = in_place ? 0 : s.N * g.image;
  float* padded = conv_scratch(pad_size + rows * layout.npad + extra + 16);
  float* packed = aligned64(padded + pad_size);
  if (!in_place) pad_batch(s, g, x, padded);
  const float* src = in_place ? x : padded;
  if (taps_major)
    pack_gathered(src, g.tap_at.data(), K, g.col_at.data(), cols, layout, packed);
  else
    pack_gathered(src, g.col_at.data(), cols, g.tap_at.data(), K, layout, packed);
  return packed;
}

bool conv_im2col_forward(const ConvShape& s, const float* x, const float* w,
                         const ConvEpilogue<float>& ep, float* y) {
  if (!im2col_fits(s) || s.pt < 0 || s.pl < 0) return false;
  const int64_t K = s.C * s.KH * s.KW, HW = s.HO * s.WO, cols = s.N * HW;
  const Gather g = gather_plan(s);
  float* packed = gathered_operand(s, g, x, /*taps_major=*/true, s.O * cols);
  float* product = packed + K * sgemm_packed_b_layout(cols, K).npad;
  // Lucid's sgemm: blocks of rows or columns per thread, so the same sums at any thread count.
  sgemm_prepacked(false, s.O, cols, K, 1.0f, w, K, packed, 0.0f, product, cols);
  parallel_for(s.N * s.O, std::max<int64_t>(1, 8192 / HW), [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t n = job / s.O, o = job % s.O;
      const float* src = product + o * cols + n * HW;
      float* dst = y + job * HW;
      const float* res = ep.residual ? ep.residual + job * HW : nullptr;
      const float a = ep.scale ? ep.scale[o] : 1.0f, b = ep.bias ? ep.bias[o] : 0.0f;
      for (int64_t p = 0; p < HW; ++p) {
        float v = ep.scale ? src[p] * a + b : src[p] + b;
        if (res) v += res[p];
        dst[p] = ep.relu && v <= 0 ? 0.0f : v;  // as lucid::relu: NaN stays NaN, -0 becomes +0
      }
    }
  });
  return true;
}

// dw [O][K] = dy [O][N*HW] @ im2col(x) [K][N*HW]^T, the transposed im2col matrix gathered
// straight into the GEMM's packed operand.
bool conv_im2col_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw) {
  if (!im2col_fits(s) || s.pt < 0 || s.pl < 0) return false;
  const int64_t K = s.C * s.KH * s.KW, cols = s.N * s.HO * s.WO;
  const Gather g = gather_plan(s);
  float* packed = gathered_operand(s, g, x, /*taps_major=*/false, s.O * cols);
  float* dy_all = packed + cols * sgemm_packed_b_layout(K, cols).npad;
  gather_channels(s, dy, dy_all);
  sgemm_prepacked(false, s.O, K, cols, 1.0f, dy_all, cols, packed, 0.0f, dw, K);
  return true;
}

// dx = col2im(w [O][K]^T @ dy [O][N*HW]): channels across the pool, each channel's tap rows
// read front to back (the planes of all images take each row's sums in tap order).
bool conv_im2col_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx) {
  if (!im2col_fits(s)) return false;
  if (s.N * s.HO * s.WO <= kMaxNarrowColumns && s.KH * s.KW > 1)
    return narrow_data_grad(s, dy, w, dx);
  const int64_t K = s.C * s.KH * s.KW, HW = s.HO * s.WO, cols = s.N * HW, plane = s.H * s.W;
  float* col = conv_scratch((K + s.O) * cols);
  float* dy_all = col + K * cols;
  gather_channels(s, dy, dy_all);
  sgemm(true, false, K, cols, s.O, 1.0f, w, K, dy_all, cols, 0.0f, col, cols);
  parallel_for(s.C, std::max<int64_t>(1, 8192 / (s.N * plane)), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t n = 0; n < s.N; ++n) std::fill_n(dx + (n * s.C + c) * plane, plane, 0.0f);
      for (int64_t i = 0; i < s.KH; ++i)
        for (int64_t j = 0; j < s.KW; ++j) {
          const int64_t cshift = j * s.dw - s.pl;
          int64_t lo, hi;
          inside_columns(s, cshift, lo, hi);
          for (int64_t n = 0; n < s.N; ++n) {
            const float* row = col + ((c * s.KH + i) * s.KW + j) * cols + n * HW;
            float* out = dx + (n * s.C + c) * plane;
            for (int64_t oh = 0; oh < s.HO; ++oh) {
              const int64_t h = oh * s.sh + i * s.dh - s.pt;
              if (h < 0 || h >= s.H) continue;
              float* dst = out + h * s.W + cshift;
              const float* src = row + oh * s.WO;
              if (s.sw == 1)
                for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += src[ow];
              else
                for (int64_t ow = lo; ow < hi; ++ow) dst[ow * s.sw] += src[ow];
            }
          }
        }
    }
  });
  return true;
}

}  // namespace lucid
