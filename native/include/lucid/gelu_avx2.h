// float32 GELU (erf form) and its slope on 8 lanes with AVX2 + FMA intrinsics: the erf of
// fastmath.h (XLA's rational function) and a Cephes exp, with the polynomials as FMAs. Shared by
// the gelu/gelu_grad row kernels (norm_gelu.cpp) and the GEMM's epilogue (sgemm.cpp), so a fused
// gemm + GELU computes the same values as the gelu instruction.
#pragma once

#include "lucid/gelu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#ifndef LUCID_AVX2
#define LUCID_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace lucid {

// lucid::relu on 8 lanes: lanes <= 0 (an ordered compare: NaN is not) become +0. max(0, x)
// would keep -0.
LUCID_AVX2 inline __m256 relu8(__m256 x) {
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LE_OQ), x);
}

LUCID_AVX2 inline __m256 erf8(__m256 x) {
  const __m256 c = _mm256_max_ps(_mm256_set1_ps(-4.0f), _mm256_min_ps(_mm256_set1_ps(4.0f), x));
  const __m256 x2 = _mm256_mul_ps(c, c);
  __m256 p = _mm256_set1_ps(-2.72614225801306e-10f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.77068142495902e-08f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.10102402082508e-06f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-5.69250639462346e-05f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-7.34990630326855e-04f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.95459980854025e-03f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.60960333262415e-02f));
  __m256 q = _mm256_set1_ps(-1.45660718464996e-05f);
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-2.13374055278905e-04f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.68282697438203e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-7.37332916720468e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.42647390514189e-02f));
  return _mm256_div_ps(_mm256_mul_ps(c, p), q);
}

// exp(a) for a <= 0 (the Gaussian's exponent): Cephes' polynomial; below -87 the result is 0.
LUCID_AVX2 inline __m256 exp_nonpositive8(__m256 a) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 c = _mm256_max_ps(lo, a);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  // a < -87 (and a NaN: the comparison is false, so NaN passes through from the max above).
  return _mm256_andnot_ps(_mm256_cmp_ps(a, lo, _CMP_LT_OQ), y);
}

LUCID_AVX2 inline __m256 gelu_cdf8(__m256 x) {
  const __m256 e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(static_cast<float>(kGeluInvSqrt2))));
  return _mm256_mul_ps(_mm256_add_ps(e, _mm256_set1_ps(1.0f)), _mm256_set1_ps(0.5f));
}

LUCID_AVX2 inline __m256 gelu_slope8(__m256 x) {
  const __m256 a = _mm256_mul_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(-0.5f));
  const __m256 pdf = _mm256_mul_ps(exp_nonpositive8(a), _mm256_set1_ps(static_cast<float>(kGeluInvSqrt2Pi)));
  return _mm256_fmadd_ps(x, pdf, gelu_cdf8(x));
}

// gelu(x) = x * Phi(x).
LUCID_AVX2 inline __m256 gelu8(__m256 x) { return _mm256_mul_ps(x, gelu_cdf8(x)); }

}  // namespace lucid

#endif
