// GELU (erf form) per element, for float (fastmath.h's erf and exp) and double (libm): one
// definition for the gelu/gelu_grad row kernels (norm_gelu.cpp), the GEMM epilogue's tails
// (sgemm.cpp) and the activation pass after a BLAS product (linalg.cpp), so each computes the
// values the others do. The 8-lane AVX2 forms are in gelu_avx2.h.
#pragma once

#include <cmath>
#include <type_traits>

#include "lucid/fastmath.h"

namespace lucid {

constexpr double kGeluInvSqrt2 = 0.70710678118654752440;
constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;

template <class T>
inline T gelu_erf(T x) {
  if constexpr (std::is_same_v<T, float>) return fast_erff(x);
  else return std::erf(x);
}

template <class T>
inline T gelu_exp(T x) {
  if constexpr (std::is_same_v<T, float>) return fast_expf(x);
  else return std::exp(x);
}

// GELU's cdf factor Phi(x) = (1 + erf(x / sqrt 2)) / 2, computed as the lowered graph does.
template <class T>
inline T gelu_cdf(T x) {
  return (gelu_erf<T>(x * static_cast<T>(kGeluInvSqrt2)) + T(1)) * T(0.5);
}

// gelu(x) = x * Phi(x).
template <class T>
inline T gelu(T x) {
  return x * gelu_cdf(x);
}

// d gelu / dx = Phi(x) + x * phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
template <class T>
inline T gelu_slope(T x) {
  return gelu_cdf(x) + x * (gelu_exp<T>(x * x * T(-0.5)) * static_cast<T>(kGeluInvSqrt2Pi));
}

}  // namespace lucid
