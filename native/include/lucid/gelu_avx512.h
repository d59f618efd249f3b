// GELU (erf form) and ReLU on 16 lanes with AVX-512 F: lane for lane the operations of
// gelu_avx2.h's relu8 / gelu8 (the same constants, min/max, FMAs and division, each correctly
// rounded), so they give the same bits as the 8-lane forms. The GEMM's AVX-512 tile finishes
// its 64-column tiles with them (sgemm.cpp): half the instructions of two 8-lane passes.
#pragma once

#include "lucid/gelu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#ifndef LUCID_TARGET_AVX512
#define LUCID_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

namespace lucid {

// relu8 on 16 lanes: lanes <= 0 (ordered: NaN is not) become +0.
LUCID_TARGET_AVX512 inline __m512 relu16(__m512 x) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NLE_UQ), x);
}

LUCID_TARGET_AVX512 inline __m512 erf16(__m512 x) {
  // vminps / vmaxps return their second operand when either is NaN, as in erf8.
  const __m512 c = _mm512_max_ps(_mm512_set1_ps(-4.0f), _mm512_min_ps(_mm512_set1_ps(4.0f), x));
  const __m512 x2 = _mm512_mul_ps(c, c);
  __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.60960333262415e-02f));
  __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.42647390514189e-02f));
  return _mm512_div_ps(_mm512_mul_ps(c, p), q);
}

LUCID_TARGET_AVX512 inline __m512 gelu16(__m512 x) {
  const __m512 e = erf16(_mm512_mul_ps(x, _mm512_set1_ps(static_cast<float>(kGeluInvSqrt2))));
  const __m512 cdf = _mm512_mul_ps(_mm512_add_ps(e, _mm512_set1_ps(1.0f)), _mm512_set1_ps(0.5f));
  return _mm512_mul_ps(x, cdf);
}

}  // namespace lucid

#endif
