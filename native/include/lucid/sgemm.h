// Lucid's own float32 GEMM (sgemm.cpp): BLIS-style packing and an AVX2 + FMA 6x16 register
// tile, split across the worker pool over blocks of output rows or columns (never over the
// contraction, so the result does not depend on the thread count), with an epilogue (bias row,
// residual addend, ReLU or GELU) applied to each output tile while it is still in registers.
#pragma once

#include <cstdint>

namespace lucid {

enum class GemmActivation : int8_t { none = 0, relu = 1, gelu = 2 };

struct Instr;
// A gemm instruction's `activation` attribute ("relu" or "gelu"; none when absent); throws
// std::invalid_argument on another value (program.cpp).
GemmActivation gemm_activation(const Instr& in);

// Applied to each output element after its last product, in this order:
//   out = act(alpha * op(A) op(B) + beta * C + bias[j] + addend[i, j]).
struct GemmEpilogue {
  const float* bias = nullptr;    // [N], added to every row (or null)
  const float* addend = nullptr;  // M rows, ld_addend apart (or null)
  int64_t ld_addend = 0;
  GemmActivation act = GemmActivation::none;
};

// True when the CPU has AVX2 and FMA (the kernel's only ISA).
bool sgemm_supported();

// Whether gemm() runs this f32 product on Lucid's kernel: the measured shape rule (linalg.cpp's
// caller passes the shape), overridden by set_sgemm_mode.
bool sgemm_chosen(bool ta, bool tb, int64_t M, int64_t N, int64_t K);

// 0: the shape rule (default), 1: Lucid's kernel for every f32 GEMM, 2: the BLAS for every one.
// For benchmarks and tests; also LUCID_SGEMM=auto|lucid|blas at start.
void set_sgemm_mode(int mode);
int sgemm_mode();

// C[M, N] (rows ldc apart) = epilogue(alpha * op(A) @ op(B) + beta * C), row-major; op(A) is
// [M, K] (A stored [K, M] when ta), op(B) is [K, N] (B stored [N, K] when tb). With beta == 0
// C is not read. Needs sgemm_supported().
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const GemmEpilogue& epilogue = {});

// The activation alone over C (the epilogue's last step), for products the BLAS computed.
void sgemm_activation(GemmActivation act, int64_t M, int64_t N, float* C, int64_t ldc);

}  // namespace lucid
