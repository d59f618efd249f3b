// float32 convolutions without groups as one sgemm over the batch's im2col matrix (see
// conv_im2col.h): the shapes conv.cpp's direct kernels, phases and Winograd leave (strided 3x3
// and 1x1 projections, 3x3 ones on planes too small for Winograd, non-finite inputs). One
// im2col matrix [C*KH*KW][N*HO*WO] for the whole batch, its rows filled in parallel; one GEMM;
// the forward's [O][N*HO*WO] product scattered into NCHW through the bias and ReLU, the data
// gradient's columns summed back into planes (col2im) channel by channel in parallel.
// linalg.cpp's fallback computes the same GEMMs with every copy on one thread (the stem's weight
// gradient spent most of its time there) and the bias in a pass of its own.
//
// Lucid's sgemm splits each product over blocks of rows or columns, never the contraction, and
// every copy or col2im plane is one thread's, so the results do not depend on the thread count.
#include "lucid/conv_im2col.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
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

// im2col rows [k0, k1) (k = (c*KH + i)*KW + j) for all images.
void im2col_rows(const ConvShape& s, const float* x, float* col, int64_t k0, int64_t k1) {
  const int64_t HW = s.HO * s.WO, cols = s.N * HW, image = s.C * s.H * s.W;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t c = k / (s.KH * s.KW), i = k / s.KW % s.KH, j = k % s.KW;
    const int64_t rshift = i * s.dh - s.pt, cshift = j * s.dw - s.pl;
    int64_t lo, hi;
    inside_columns(s, cshift, lo, hi);
    float* row = col + k * cols;
    for (int64_t n = 0; n < s.N; ++n) {
      const float* plane = x + n * image + c * s.H * s.W;
      float* dst = row + n * HW;
      for (int64_t oh = 0; oh < s.HO; ++oh, dst += s.WO) {
        const int64_t h = oh * s.sh + rshift;
        if (h < 0 || h >= s.H) {
          std::fill_n(dst, s.WO, 0.0f);
          continue;
        }
        const float* src = plane + h * s.W + cshift;
        std::fill_n(dst, lo, 0.0f);
        if (s.sw == 1) std::memcpy(dst + lo, src + lo, sizeof(float) * (hi - lo));
        else
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * s.sw];
        std::fill_n(dst + hi, s.WO - hi, 0.0f);
      }
    }
  }
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

}  // namespace

float* conv_scratch(size_t n) {
  thread_local std::vector<float> work;
  if (work.size() < n) work.resize(n);
  return work.data();
}

bool conv_im2col_forward(const ConvShape& s, const float* x, const float* w, const float* bias,
                    bool relu, float* y) {
  if (!im2col_fits(s)) return false;
  const int64_t K = s.C * s.KH * s.KW, HW = s.HO * s.WO, cols = s.N * HW;
  float* col = conv_scratch((K + s.O) * cols);
  float* product = col + K * cols;
  parallel_for(K, std::max<int64_t>(1, 8192 / cols),
               [&](int64_t k0, int64_t k1) { im2col_rows(s, x, col, k0, k1); });
  // Lucid's sgemm: blocks of rows or columns per thread, so the same sums at any thread count.
  sgemm(false, false, s.O, cols, K, 1.0f, w, K, col, cols, 0.0f, product, cols);
  parallel_for(s.N * s.O, std::max<int64_t>(1, 8192 / HW), [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t n = job / s.O, o = job % s.O;
      const float* src = product + o * cols + n * HW;
      float* dst = y + job * HW;
      const float b = bias ? bias[o] : 0.0f;
      for (int64_t p = 0; p < HW; ++p) {
        const float v = src[p] + b;
        dst[p] = relu && v <= 0 ? 0.0f : v;  // as lucid::relu: NaN stays NaN, -0 becomes +0
      }
    }
  });
  return true;
}

// dw [O][K] = dy [O][N*HW] @ im2col(x) [K][N*HW]^T.
bool conv_im2col_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw) {
  if (!im2col_fits(s)) return false;
  const int64_t K = s.C * s.KH * s.KW, cols = s.N * s.HO * s.WO;
  float* col = conv_scratch((K + s.O) * cols);
  float* dy_all = col + K * cols;
  parallel_for(K, std::max<int64_t>(1, 8192 / cols),
               [&](int64_t k0, int64_t k1) { im2col_rows(s, x, col, k0, k1); });
  gather_channels(s, dy, dy_all);
  sgemm(false, true, s.O, K, cols, 1.0f, dy_all, cols, col, cols, 0.0f, dw, K);
  return true;
}

// dx = col2im(w [O][K]^T @ dy [O][N*HW]): channels across the pool, each channel's tap rows
// read front to back (the planes of all images take each row's sums in tap order).
bool conv_im2col_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx) {
  if (!im2col_fits(s)) return false;
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
