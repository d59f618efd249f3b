// One name for each BLAS routine whichever BLAS the build links, and the GEMM call every kernel
// makes through it.
#pragma once
#if defined(LUCID_BLAS_ACCELERATE)
#include <Accelerate/Accelerate.h>
#define LUCID_SGEMM cblas_sgemm
#define LUCID_DGEMM cblas_dgemm
#define LUCID_BLAS_NAME "Accelerate"
#else
#include <cblas.h>
#define LUCID_SGEMM scipy_cblas_sgemm
#define LUCID_DGEMM scipy_cblas_dgemm
#define LUCID_BLAS_SET_THREADS scipy_openblas_set_num_threads
#define LUCID_BLAS_GET_THREADS scipy_openblas_get_num_threads
#define LUCID_BLAS_NAME "scipy-openblas32"
#endif

#include <cstdint>
#include <type_traits>
#include <vector>

namespace lucid {

// C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major, on the BLAS (float or double; C not
// read when beta == 0, as BLAS does). With alpha == 0 a BLAS returns beta * C without reading A
// and B, but alpha * (an infinite or NaN product) is NaN (IEEE, numpy, the prim reference: a
// `gemm{alpha = 0}` is `mul(matmul(a, b), 0)`), so that case computes the product into scratch
// and scales it.
template <class T>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const auto A_ = ta ? CblasTrans : CblasNoTrans;
  const auto B_ = tb ? CblasTrans : CblasNoTrans;
  auto call = [&](T al, T be, T* c, int64_t ldc_) {
    if constexpr (std::is_same_v<T, float>)
      LUCID_SGEMM(CblasRowMajor, A_, B_, M, N, K, al, A, lda, B, ldb, be, c, ldc_);
    else
      LUCID_DGEMM(CblasRowMajor, A_, B_, M, N, K, al, A, lda, B, ldb, be, c, ldc_);
  };
  if (alpha != T(0) || M <= 0 || N <= 0 || K <= 0) return call(alpha, beta, C, ldc);
  std::vector<T> product(static_cast<size_t>(M) * static_cast<size_t>(N));
  call(T(1), T(0), product.data(), N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T& c = C[i * ldc + j];
      c = (beta == T(0) ? T(0) : beta * c) + alpha * product[i * N + j];
    }
}

}  // namespace lucid
