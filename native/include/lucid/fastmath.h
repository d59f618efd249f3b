// Branch-free float math the compiler can vectorize (libm's scalar expf cannot be).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lucid {

// ReLU of one value as every kernel computes it (the relu instruction, the GEMM and convolution
// epilogues): x <= 0 gives +0, so -0 becomes +0 (numpy's maximum(x, 0), PyTorch and eager Lucid;
// 1 / relu(-0.0) is +inf) and NaN stays NaN.
template <class T>
inline T relu(T x) {
  return x <= T(0) ? T(0) : x;
}

// exp(x) for float with ~1 ulp error (Cephes polynomial); NaN propagates, overflow gives inf,
// results below about 2.4e-38 flush to 0.
inline float fast_expf(float x) {
  const float hi = 88.72283905206835f, lo = -86.6f;
  float c = x > hi ? hi : (x < lo ? lo : x);
  // Round to nearest with the 1.5 * 2^23 trick: no libm call, so the loop vectorizes.
  float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as 2 * 2^(n-1): n reaches 128 near the overflow bound, where 2^n itself is not a float.
  int32_t e = static_cast<int32_t>(n) + 126;
  int32_t bits = e << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = p * scale * 2.0f;
  y = x > hi ? INFINITY : y;
  y = x < lo ? 0.0f : y;
  return x != x ? x : y;
}

// erf(x) for float as a rational function of x (odd polynomial over even polynomial in x^2, the
// coefficients XLA and Eigen use for float erf): at most 4.2e-7 absolute error over the real line
// (checked against double erf), branch-free so loops over it vectorize; NaN propagates.
inline float fast_erff(float x) {
  float c = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
  float x2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return c * p / q;
}

}  // namespace lucid
