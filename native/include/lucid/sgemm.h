// Lucid's own float32 GEMM (sgemm.cpp): BLIS-style packing and an AVX2 + FMA 6x16 register
// tile (an AVX-512 6x64 one where the CPU has it: sgemm_isa), split across the worker pool over blocks of output rows or columns (never over the
// contraction, so the result does not depend on the thread count), with an epilogue (bias row,
// residual addend, ReLU or GELU) applied to each output tile while it is still in registers.
#pragma once

#include <cstdint>

#include "lucid/program.h"

namespace lucid {

enum class GemmActivation : int8_t { none = 0, relu = 1, gelu = 2 };

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

// Which micro-kernel sgemm and gemm_mixed run: 2 the AVX-512 6x64 tile (where the CPU has
// AVX-512 F/VL/DQ; products at most 32 columns wide still take the 6x16 one), 1 the AVX2 6x16
// tile, 0 neither (no x86-64 build). Both give the same bits: the same contraction blocks,
// each element's products in order with one FMA each.
int sgemm_isa();
// 0: the CPU's best (default), 1: the AVX2 tile even where AVX-512 runs (tests, benchmarks),
// 2: the AVX-512 tile for every width where the CPU has it (tests). Also
// LUCID_SGEMM_ISA=auto|avx2|avx512 at start.
void set_sgemm_isa(int isa);

// The target of a kernel that runs only where sgemm_isa() == 2: the features that check makes
// sure of. Every AVX-512 kernel (GEMM tile, convolutions, LSTM step, softmax rows) dispatches on
// sgemm_isa(), so LUCID_SGEMM_ISA=avx2 / set_sgemm_isa(1) forces all of them to AVX2 at once.
#if defined(__x86_64__) && defined(__GNUC__)
#define LUCID_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma,f16c")))
#else
#define LUCID_TARGET_AVX512
#endif

// Whether gemm() runs this f32 product on Lucid's kernel: the measured shape rule (linalg.cpp's
// caller passes the shape), overridden by set_sgemm_mode.
bool sgemm_chosen(bool ta, bool tb, int64_t M, int64_t N, int64_t K);

// 0: the shape rule (default), 1: Lucid's kernel for every f32 GEMM, 2: the BLAS for every one.
// For benchmarks and tests; also LUCID_SGEMM=auto|lucid|blas at start.
void set_sgemm_mode(int mode);
int sgemm_mode();

// C[M, N] (rows ldc apart) = epilogue(alpha * op(A) @ op(B) + beta * C), row-major; op(A) is
// [M, K] (A stored [K, M] when ta), op(B) is [K, N] (B stored [N, K] when tb). With beta == 0
// C is not read. Needs sgemm_supported(). `shared_b`: see GemmRunScope (null: B packed anew).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const GemmEpilogue& epilogue = {}, const void* shared_b = nullptr);

// A whole op(B) [K, N] packed by the caller (conv.cpp's implicit GEMMs gather it straight from
// a padded image instead of writing an im2col matrix first), in the layout sgemm_prepacked
// reads for this N and K: contraction block q covers steps [q*kc, min(K, (q+1)*kc)); its kc'
// steps of column sliver s (nr columns, zero past N) start at q*kc*npad + s*kc'*nr, step k's nr
// values side by side. The product then gives the same bits as sgemm over the same op(B).
struct PackedBLayout {
  int64_t nr, kc, npad;
};
PackedBLayout sgemm_packed_b_layout(int64_t N, int64_t K);
void sgemm_prepacked(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                     int64_t lda, const float* packed_b, float beta, float* C, int64_t ldc,
                     const GemmEpilogue& epilogue = {});

// Packed B reused across the GEMMs of one program run. While a GemmRunScope lives on a thread
// (Executable::run holds one), a GEMM given a non-null `shared_b` key keeps the packed form of
// its whole B (a thread-local copy, tagged with the run, B's address and layout) and a later
// GEMM of the same run with the same key, address and layout reads it instead of packing B
// again: an LSTM's recurrent weight is packed once per run, not once per time step. The key
// names one value of the program (linalg.cpp passes the address of its slot), which
// stays unchanged while it is read; a nested run gets a scope of its own, and nothing is
// reused across runs (weights change between them).
class GemmRunScope {
 public:
  GemmRunScope();
  ~GemmRunScope();
  GemmRunScope(const GemmRunScope&) = delete;
  GemmRunScope& operator=(const GemmRunScope&) = delete;

 private:
  uint64_t outer_;
};
// How many times this thread packed a whole shared B, and how many GEMMs reused one (tests).
struct SharedPackStats {
  int64_t packed = 0, reused = 0;
};
SharedPackStats shared_pack_stats();

// The activation alone over C (the epilogue's last step), for products the BLAS computed.
void sgemm_activation(GemmActivation act, int64_t M, int64_t N, float* C, int64_t ldc);

// How a GEMM operand or output is stored: float32, or IEEE float16 / bfloat16 (lucid/half.h).
enum class GemmType : int8_t { f32 = 0, f16 = 1, bf16 = 2 };

// A GEMM over operands and an output that may be stored in half precision. Half operands are
// widened while they are packed (no pass of their own, no float32 copy of a weight), the sums
// and the epilogue run in float32, and a half output is rounded once, to nearest even, as
// lucid/half.h rounds:
//   out = round(act(r(alpha * op(A) op(B) + bias[j] + addend[i, j])))
// where r rounds to `round_product` and widens back (nothing when it is f32): a half model
// computes a layer and its activation as two ops, each rounded.
struct MixedGemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;
  GemmType a_type = GemmType::f32;
  int64_t lda = 0;
  const void* B = nullptr;
  GemmType b_type = GemmType::f32;
  int64_t ldb = 0;
  void* C = nullptr;
  GemmType c_type = GemmType::f32;
  int64_t ldc = 0;
  const void* bias = nullptr;  // [N] (or null)
  GemmType bias_type = GemmType::f32;
  const float* addend = nullptr;  // M rows, ld_addend apart (or null)
  int64_t ld_addend = 0;
  GemmActivation act = GemmActivation::none;
  GemmType round_product = GemmType::f32;
  const void* shared_b = nullptr;  // see GemmRunScope
};

// The storage types of a gemm instruction that reads or writes half values: operands a and b,
// its bias row (f32 when it has none), its output (attribute `dtype`, default f32) and the
// product's rounding before the activation (attribute `round_product`, needs a half output).
// Its addend stays f32. has_half is false for an all-f32/f64 gemm (the other fields unset).
// Throws std::invalid_argument on types the kernel does not take (the validator's message).
struct GemmTypes {
  bool has_half = false;
  GemmType a = GemmType::f32, b = GemmType::f32, bias = GemmType::f32, out = GemmType::f32;
  GemmType round_product = GemmType::f32;
  DType out_dtype = DType::F32;  // `out` as the output slot's dtype
};
GemmTypes gemm_types(const Program& p, const Instr& in);

// Whether gemm_mixed converts while packing here (AVX2, FMA and F16C); elsewhere it widens the
// operands into float32 copies and calls the BLAS (the same values, slower).
bool gemm_mixed_native();

// C = the MixedGemm formula above. Any M, N, K >= 0.
void gemm_mixed(const MixedGemm& g);

}  // namespace lucid
