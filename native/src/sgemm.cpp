// Lucid's float32 GEMM (lucid/sgemm.h), in the BLIS layout:
//
//   for each block of kNC output columns
//     for each block of kc contraction steps (kc from K alone, at most kMaxKC)
//       pack B's kc x nc panel into 16- (or 64-) column slivers (zero-padded)   -> L2
//       for each block of kMC output rows
//         A transposed: pack its mc x kc block into 6-row slivers; otherwise read A in place
//         (rows lda apart) and pack only a bottom sliver of fewer than 6 rows (zero-padded)
//         for each column sliver, for each 6-row sliver: the 6x16 (or 6x64) kernel (a sliver
//         of B stays in L1 or L2 while the A slivers stream past it)
//
// Two register tiles, picked per call (run_problem): 6x64 in 24 AVX-512 registers where the CPU
// has AVX-512 (B packed in 64-column slivers), else 6x16 in 12 AVX registers; both sum each
// element over the same contraction blocks in the same order, so they give the same bits.
// A full tile whose block needs nothing beyond alpha (no beta term, no epilogue yet) is stored
// straight from the registers; otherwise the sums go through a tile-sized scratch in L1 to a
// finisher compiled for the epilogue (alpha, beta, bias
// row, addend, ReLU/GELU), masked at the right edge. A tile at the bottom or right edge is
// computed whole on the zero-padded slivers, so an element gets the same arithmetic whichever
// tile holds it.
//
// Threads: the output is cut into chunks of rows (or columns) handed out one at a time; every
// element's sum runs over the same contraction blocks in the same order whichever thread
// computes its chunk, so the result is bit-identical at any thread count.
#include "lucid/sgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lucid/blas.h"
#include "lucid/fastmath.h"
#include "lucid/gelu_avx2.h"
#include "lucid/gelu_avx512.h"
#include "lucid/half.h"
#include "lucid/parallel.h"

namespace lucid {

namespace {

int mode_from_env() {
  const char* v = std::getenv("LUCID_SGEMM");
  if (v == nullptr) return 0;
  const std::string s(v);
  return s == "lucid" ? 1 : s == "blas" ? 2 : 0;
}

std::atomic<int> g_mode{mode_from_env()};

// The run a GemmRunScope opened on this thread (0: none), and the next run's number.
std::atomic<uint64_t> g_next_run{1};
thread_local uint64_t t_run = 0;
thread_local SharedPackStats t_shared_stats;

}  // namespace

GemmRunScope::GemmRunScope() : outer_(t_run) { t_run = g_next_run.fetch_add(1); }
GemmRunScope::~GemmRunScope() { t_run = outer_; }
SharedPackStats shared_pack_stats() { return t_shared_stats; }

GemmTypes gemm_types(const Program& p, const Instr& in) {
  GemmTypes t;
  auto has = [&](const char* name) { return in.attrs.find(name) != in.attrs.end(); };
  auto half_or_f32 = [&](DType d, const char* what) {
    if (d == DType::F16) return GemmType::f16;
    if (d == DType::BF16) return GemmType::bf16;
    if (d != DType::F32)
      throw std::invalid_argument(std::string("a gemm with half values takes f32, f16 or bf16 ") +
                                  what + ", got " + dtype_name(d));
    return GemmType::f32;
  };
  for (int s : in.in) t.has_half = t.has_half || is_half(p.slots[s].dtype);
  if (in.op != Op::gemm || !(t.has_half || has("dtype") || has("round_product"))) return {};
  t.has_half = true;
  t.a = half_or_f32(p.slots[in.in[0]].dtype, "operands");
  t.b = half_or_f32(p.slots[in.in[1]].dtype, "operands");
  for (size_t i = 2; i < in.in.size(); ++i) {
    const Slot& e = p.slots[in.in[i]];
    if (i == 2 && e.shape.size() == 1) t.bias = half_or_f32(e.dtype, "bias rows");
    else if (e.dtype != DType::F32)
      throw std::invalid_argument(std::string("a gemm's addend must be f32, got ") +
                                  dtype_name(e.dtype) + shape_str(e.shape));
  }
  if (has("dtype")) t.out = half_or_f32(attr_dtype(in, "dtype"), "outputs");
  t.out_dtype = t.out == GemmType::f16 ? DType::F16 : t.out == GemmType::bf16 ? DType::BF16 : DType::F32;
  if (has("round_product")) {
    t.round_product = half_or_f32(attr_dtype(in, "round_product"), "round_product");
    if (t.out == GemmType::f32 || t.round_product == GemmType::f32)
      throw std::invalid_argument("round_product needs f16 or bf16 and a half output");
  }
  return t;
}

void set_sgemm_mode(int mode) { g_mode.store(mode < 0 || mode > 2 ? 0 : mode); }
int sgemm_mode() { return g_mode.load(); }

namespace {

// gemm_mixed on any CPU: the operands widened into float32 copies, the BLAS, the epilogue and
// the rounding as separate passes (lucid/half.h's scalar conversions: the same values as the
// converting kernel).
void widen_into(const void* src, GemmType type, int64_t rows, int64_t cols, int64_t ld,
                std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (type == GemmType::f32) {
      std::memcpy(dst.data() + r * cols, static_cast<const float*>(src) + r * ld,
                  sizeof(float) * static_cast<size_t>(cols));
    } else {
      half_to_f32_n(static_cast<const uint16_t*>(src) + r * ld,
                    type == GemmType::f16 ? DType::F16 : DType::BF16, dst.data() + r * cols, cols);
    }
  }
}

float rounded_to(float x, GemmType type) {
  if (type == GemmType::f16) return f16_to_f32(f32_to_f16(x));
  if (type == GemmType::bf16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

void gemm_mixed_portable(const MixedGemm& g) {
  std::vector<float> a, b, c(static_cast<size_t>(g.M * g.N)), bias;
  widen_into(g.A, g.a_type, g.ta ? g.K : g.M, g.ta ? g.M : g.K, g.lda, a);
  widen_into(g.B, g.b_type, g.tb ? g.N : g.K, g.tb ? g.K : g.N, g.ldb, b);
  if (g.bias != nullptr) widen_into(g.bias, g.bias_type, 1, g.N, g.N, bias);
  if (g.K > 0)
    blas_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, a.data(), g.ta ? g.M : g.K, b.data(),
              g.tb ? g.K : g.N, 0.0f, c.data(), g.N);
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      float x = c[i * g.N + j];
      if (g.bias != nullptr) x += bias[j];
      if (g.addend != nullptr) x += g.addend[i * g.ld_addend + j];
      x = rounded_to(x, g.round_product);
      if (g.act == GemmActivation::relu) x = relu(x);
      else if (g.act == GemmActivation::gelu) x = gelu(x);
      if (g.c_type == GemmType::f32) static_cast<float*>(g.C)[i * g.ldc + j] = x;
      else
        static_cast<uint16_t*>(g.C)[i * g.ldc + j] =
            g.c_type == GemmType::f16 ? f32_to_f16(x) : f32_to_bf16(x);
    }
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__)

namespace {

// The AVX2 tile (also the shape rule's smallest product, sgemm_chosen).
constexpr int64_t kMR = 6, kNR = 16;
// Block sizes (measured on a 2-core Zen 1 EPYC: kc 256, 384 and 512 and A packed or read in
// place were within noise of each other; docs/backend-cpu.md). kc is the same for both tiles
// (from K alone): each element then sums the same products in the same order on either path.
// On the 2-core Zen 5 at two threads, kc 512 ran workload F's K = 512 products 3-9% faster
// than 256 (one pass over C instead of two; F's 512x512 @ 512x8192 head writes a 16 MB C) and
// its K = 2048 one 0-5% faster. A 6x64 sliver is then 128 KB (in L2), a 6x16 one 32 KB.
constexpr int64_t kMaxKC = 512;  // contraction block: a 16-column sliver of B is kc * 64 bytes
// Waking a worker costs a few microseconds: a product is split only with at least this many
// multiply-adds per thread.
constexpr int64_t kMinMacsPerPart = int64_t(1) << 18;
// The units handed to threads: blocks of output rows (M >= N) or columns.
constexpr int64_t kRowChunk = 96;
constexpr int64_t kColChunk = 64;
// Wide products get wider column chunks: each chunk reads all of A again (in place, from L2 or
// L3), and a 256-column chunk reuses each block of A rows from L2 across four 64-column slivers
// (workload F's 512x8192 head, 512x2048, 512x1536) while still leaving six or more chunks.
constexpr int64_t kWideColChunk = 256, kWideColMinN = 1536;
// Outputs of at least this many floats (8 MB, a quarter of the 32 MB L3) written by one
// contraction block are stored non-temporally (compute_range).
constexpr double kStreamMinFloats = double(int64_t(1) << 21);

// A grow-only 64-byte-aligned buffer per thread for the packed panels.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(data_); }
  float* get(int64_t floats) {
    const size_t need = static_cast<size_t>(floats + 16) * sizeof(float);
    if (need > bytes_) {
      std::free(data_);
      data_ = nullptr;
      bytes_ = 0;
      const size_t rounded = (need + 4095) & ~size_t(4095);
      data_ = static_cast<float*>(std::aligned_alloc(64, rounded));
      if (data_ == nullptr) throw std::bad_alloc();
      bytes_ = rounded;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

// A half output's partial sums over the contraction blocks before the last (float32).
thread_local Scratch t_pack_a, t_pack_b, t_partial;
// All of op(B) packed once for a product split by rows (run_problem_on).
thread_local Scratch t_whole_b;

// The packing and driver code also reads half operands: F16C converts float16 (every x86-64
// CPU with AVX2 has it; gemm_mixed_native checks), bfloat16 is a 16-bit shift.
#define LUCID_GEMM_ISA __attribute__((target("avx2,fma,f16c")))

template <GemmType T>
using Elem = std::conditional_t<T == GemmType::f32, float, uint16_t>;

// 8 consecutive elements of type T widened to float32.
template <GemmType T>
LUCID_GEMM_ISA inline __m256 load8_wide(const Elem<T>* p) {
  if constexpr (T == GemmType::f32) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (T == GemmType::f16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <GemmType T>
LUCID_GEMM_ISA inline float load1_wide(const Elem<T>* p) {
  if constexpr (T == GemmType::f32) return *p;
  else if constexpr (T == GemmType::f16) return _cvtsh_ss(*p);
  else return bf16_to_f32(*p);
}

// 8 float32 lanes rounded to nearest even as lucid/half.h rounds (F16C's conversion for
// float16: the same bits, NaN payloads included, for the quiet NaNs arithmetic produces).
LUCID_GEMM_ISA inline __m128i round8_half(__m256 x, GemmType to) {
  if (to == GemmType::f16) return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                         _mm256_set1_epi32(0x8000)),
                                        _mm256_set1_epi32(0x7fc0));
  r = _mm256_blendv_epi8(r, quiet, nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

LUCID_GEMM_ISA inline __m256 widen8_half(__m128i h, GemmType from) {
  if (from == GemmType::f16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The epilogue of one contraction block's store.
struct TileStore {
  float alpha, beta;
  bool first;  // the first contraction block: C is scaled by beta (not read when beta == 0)
  bool last;   // the last: bias, addend and activation follow
  const float* bias;
  const float* addend;
  int64_t ld_addend;
  GemmActivation act;
  // No beta term to read and nothing after the sums: the first block stores alpha * sums,
  // later ones add them.
  bool plain;
  // A plain store of the only block into a large C (rows 64-byte aligned): the AVX-512 tile
  // writes it with non-temporal stores and does not fetch C's lines first.
  bool stream = false;
};

LUCID_AVX2 inline __m256 load8(const float* p, __m256i mask, bool masked) {
  return masked ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p);
}

// The 6x16 kernel: sums over kc steps of A (row i of step k at a[i * rs + k * cs]: packed, or A
// itself when its rows are contiguous along the contraction) and packed B (16 per step). A full
// tile with a plain store goes straight from the registers into C (row i at c + i * ldc; true
// returned); otherwise the sums go to `scratch` (6 x 16, in L1) for finish_tile.
LUCID_AVX2 bool kernel_6x16(int64_t kc, const float* __restrict a, int64_t rs, int64_t cs,
                            const float* __restrict b, float* c, int64_t ldc, bool full,
                            const TileStore& e, float* scratch) {
  const float* __restrict a3 = a + 3 * rs;
  if (full) {
    // The tile's rows of C, fetched while the sums are computed (their first touch otherwise
    // stalls the stores at the end).
    for (int i = 0; i < kMR; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kNR - 1), _MM_HINT_T0);
    }
  }
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + rs);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2 * rs);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a3 + rs);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a3 + 2 * rs);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
    a += cs;
    a3 += cs;
    b += kNR;
  }
  if (full && e.plain) {  // C = alpha * sums, or C += alpha * sums: no epilogue beyond that
    const __m256 al = _mm256_set1_ps(e.alpha);
    __m256* rows[2 * kMR] = {&c00, &c01, &c10, &c11, &c20, &c21,
                             &c30, &c31, &c40, &c41, &c50, &c51};
    if (e.alpha != 1.0f)
      for (__m256* r : rows) *r = _mm256_mul_ps(*r, al);
    if (e.first) {
      for (int i = 0; i < kMR; ++i) {
        _mm256_storeu_ps(c + i * ldc, *rows[2 * i]);
        _mm256_storeu_ps(c + i * ldc + 8, *rows[2 * i + 1]);
      }
    } else {
      for (int i = 0; i < kMR; ++i) {
        _mm256_storeu_ps(c + i * ldc, _mm256_add_ps(_mm256_loadu_ps(c + i * ldc), *rows[2 * i]));
        _mm256_storeu_ps(c + i * ldc + 8,
                         _mm256_add_ps(_mm256_loadu_ps(c + i * ldc + 8), *rows[2 * i + 1]));
      }
    }
    return true;
  }
  _mm256_store_ps(scratch + 0, c00), _mm256_store_ps(scratch + 8, c01);
  _mm256_store_ps(scratch + 16, c10), _mm256_store_ps(scratch + 24, c11);
  _mm256_store_ps(scratch + 32, c20), _mm256_store_ps(scratch + 40, c21);
  _mm256_store_ps(scratch + 48, c30), _mm256_store_ps(scratch + 56, c31);
  _mm256_store_ps(scratch + 64, c40), _mm256_store_ps(scratch + 72, c41);
  _mm256_store_ps(scratch + 80, c50), _mm256_store_ps(scratch + 88, c51);
  return false;
}

// The AVX-512 kernel: an MR x (16 * NV) tile in MR * NV zmm accumulators, on the same
// operands as kernel_6x16 (B packed 16 * NV per step). Each accumulator lane runs the same FMA
// chain over k as kernel_6x16's, so both kernels give the same bits.
template <int MR, int NV>
LUCID_TARGET_AVX512 bool kernel_avx512(int64_t kc, const float* __restrict a, int64_t rs, int64_t cs,
                                const float* __restrict b, float* c, int64_t ldc, bool full,
                                const TileStore& e, float* scratch) {
  constexpr int NR = 16 * NV;
  if (full && !e.stream) {
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * v), _MM_HINT_T0);
  }
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
    a += cs;
    b += NR;
  }
  if (full && e.plain) {  // C = alpha * sums, or C += alpha * sums (as kernel_6x16)
    const __m512 al = _mm512_set1_ps(e.alpha);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        __m512 x = e.alpha != 1.0f ? _mm512_mul_ps(acc[i][v], al) : acc[i][v];
        float* ci = c + i * ldc + 16 * v;
        if (!e.first) x = _mm512_add_ps(_mm512_loadu_ps(ci), x);
        if (e.stream) _mm512_stream_ps(ci, x);
        else _mm512_storeu_ps(ci, x);
      }
    return true;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_store_ps(scratch + i * NR + 16 * v, acc[i][v]);
  return false;
}

LUCID_AVX2 inline __m256i lane_mask(int64_t valid) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), lanes);
}

// The `rows` x `cols` corner of a tile of sums (NR wide, the kernel's scratch) into C with the
// epilogue, compiled per (narrower than NR columns, bias, addend, activation) so the loop over
// the tile has no per-vector tests of them: at K = 128 (one contraction block) a tile's sums
// take ~1500 cycles, and a generic epilogue cost 7-12% of that. Both kernels' tiles go through
// these 8-lane steps, so the epilogue (GELU included) gives the same bits on either path.
template <int NR, bool kMasked, bool kBias, bool kAddend, GemmActivation kAct>
LUCID_AVX2 void finish_tile(const float* tile, int64_t rows, int64_t cols, float* c,
                            int64_t ldc, const float* bias, const float* addend,
                            int64_t ld_addend, const TileStore& e) {
  constexpr int kVecs = NR / 8;
  __m256i m[kVecs];
  for (int v = 0; v < kVecs; ++v) m[v] = kMasked ? lane_mask(cols - 8 * v) : _mm256_set1_epi32(-1);
  const __m256 alpha = _mm256_set1_ps(e.alpha), beta = _mm256_set1_ps(e.beta);
  // How C enters: added (a later contraction block), scaled by beta (first block), or not read.
  const int c_term = !e.first ? 1 : e.beta != 0.0f ? 2 : 0;
  const bool last = e.last;
  __m256 b[kVecs];
  for (int v = 0; v < kVecs; ++v)
    b[v] = kBias && last ? load8(bias + 8 * v, m[v], kMasked) : _mm256_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      if (kMasked && 8 * v >= cols) break;
      __m256 x = _mm256_mul_ps(_mm256_load_ps(tile + i * NR + 8 * v), alpha);
      if (c_term == 1) x = _mm256_add_ps(x, load8(ci + 8 * v, m[v], kMasked));
      else if (c_term == 2) x = _mm256_fmadd_ps(beta, load8(ci + 8 * v, m[v], kMasked), x);
      if (last) {
        if (kBias) x = _mm256_add_ps(x, b[v]);
        if (kAddend) x = _mm256_add_ps(x, load8(addend + i * ld_addend + 8 * v, m[v], kMasked));
        if (kAct == GemmActivation::relu) x = relu8(x);
        else if (kAct == GemmActivation::gelu) x = gelu8(x);
      }
      if (kMasked) _mm256_maskstore_ps(ci + 8 * v, m[v], x);
      else _mm256_storeu_ps(ci + 8 * v, x);
    }
  }
}

LUCID_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 mask, bool masked) {
  return masked ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
}

// finish_tile for the AVX-512 tile's 64-column tiles: the same steps lane for lane on 16 lanes
// (gelu_avx512.h), so the same bits in half the instructions. GELU's ~20 vector operations per
// vector of outputs were about 5% of workload F's 512 x 2048 x 512 up projection on 8 lanes.
template <bool kMasked, bool kBias, bool kAddend, GemmActivation kAct>
LUCID_TARGET_AVX512 void finish_tile_avx512(const float* tile, int64_t rows, int64_t cols,
                                            float* c, int64_t ldc, const float* bias,
                                            const float* addend, int64_t ld_addend,
                                            const TileStore& e) {
  constexpr int kNR = 64, kVecs = 4;
  __mmask16 m[kVecs];
  for (int v = 0; v < kVecs; ++v) {
    const int64_t n = kMasked ? std::clamp<int64_t>(cols - 16 * v, 0, 16) : 16;
    m[v] = static_cast<__mmask16>((uint32_t(1) << n) - 1);
  }
  const __m512 alpha = _mm512_set1_ps(e.alpha), beta = _mm512_set1_ps(e.beta);
  const int c_term = !e.first ? 1 : e.beta != 0.0f ? 2 : 0;
  const bool last = e.last;
  __m512 b[kVecs];
  for (int v = 0; v < kVecs; ++v)
    b[v] = kBias && last ? load16(bias + 16 * v, m[v], kMasked) : _mm512_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      if (kMasked && 16 * v >= cols) break;
      __m512 x = _mm512_mul_ps(_mm512_load_ps(tile + i * kNR + 16 * v), alpha);
      if (c_term == 1) x = _mm512_add_ps(x, load16(ci + 16 * v, m[v], kMasked));
      else if (c_term == 2) x = _mm512_fmadd_ps(beta, load16(ci + 16 * v, m[v], kMasked), x);
      if (last) {
        if (kBias) x = _mm512_add_ps(x, b[v]);
        if (kAddend) x = _mm512_add_ps(x, load16(addend + i * ld_addend + 16 * v, m[v], kMasked));
        if (kAct == GemmActivation::relu) x = relu16(x);
        else if (kAct == GemmActivation::gelu) x = gelu16(x);
      }
      if (kMasked) _mm512_mask_storeu_ps(ci + 16 * v, m[v], x);
      else _mm512_storeu_ps(ci + 16 * v, x);
    }
  }
}

using FinishFn = void (*)(const float*, int64_t, int64_t, float*, int64_t, const float*,
                          const float*, int64_t, const TileStore&);

template <int NR, bool kMasked, bool kBias, bool kAddend>
FinishFn pick_act(GemmActivation act) {
  using Act = GemmActivation;
  if constexpr (NR == 64) {
    switch (act) {
      case Act::relu: return &finish_tile_avx512<kMasked, kBias, kAddend, Act::relu>;
      case Act::gelu: return &finish_tile_avx512<kMasked, kBias, kAddend, Act::gelu>;
      default: return &finish_tile_avx512<kMasked, kBias, kAddend, Act::none>;
    }
  } else {
    switch (act) {
      case Act::relu: return &finish_tile<NR, kMasked, kBias, kAddend, Act::relu>;
      case Act::gelu: return &finish_tile<NR, kMasked, kBias, kAddend, Act::gelu>;
      default: return &finish_tile<NR, kMasked, kBias, kAddend, Act::none>;
    }
  }
}

template <int NR, bool kMasked>
FinishFn pick_extras(const TileStore& e) {
  const bool bias = e.bias != nullptr, addend = e.addend != nullptr;
  if (bias && addend) return pick_act<NR, kMasked, true, true>(e.act);
  if (bias) return pick_act<NR, kMasked, true, false>(e.act);
  if (addend) return pick_act<NR, kMasked, false, true>(e.act);
  return pick_act<NR, kMasked, false, false>(e.act);
}

template <int NR>
FinishFn pick_finish(bool masked, const TileStore& e) {
  return masked ? pick_extras<NR, true>(e) : pick_extras<NR, false>(e);
}

// The two register tiles: the AVX2 6x16 and the AVX-512 6x64 (sgemm_isa picks one per call).
// MC rows of A per block (a multiple of MR), NC columns of B packed at once (of NR). On the
// 2-core Zen 4 EPYC, 6x64 ran at or above 12x32, 14x32 and 8x48 on workload F/H shapes and
// wastes no rows of a 16-row product (docs/performance.md).
struct Avx2Tile {
  static constexpr int64_t MR = kMR, NR = kNR, MC = 96, NC = 4096;
  static constexpr auto kernel = &kernel_6x16;
};
struct Avx512Tile {
  static constexpr int64_t MR = 6, NR = 64, MC = 96, NC = 4096;
  static constexpr auto kernel = &kernel_avx512<6, 4>;
};

// 8x8 transpose of r0..r7 in place.
LUCID_AVX2 inline void transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4,
                                  __m256& r5, __m256& r6, __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(s0, s4, 0x20);
  r1 = _mm256_permute2f128_ps(s1, s5, 0x20);
  r2 = _mm256_permute2f128_ps(s2, s6, 0x20);
  r3 = _mm256_permute2f128_ps(s3, s7, 0x20);
  r4 = _mm256_permute2f128_ps(s0, s4, 0x31);
  r5 = _mm256_permute2f128_ps(s1, s5, 0x31);
  r6 = _mm256_permute2f128_ps(s2, s6, 0x31);
  r7 = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Packs `rows` (<= W) source rows, each contiguous along the contraction (row r at src + r * ld),
// kc steps, into dst[k * W + r] (widened to float32) with rows >= `rows` zero. W is 6, 12, 16
// or 32. The 8x8 transposes write 8 floats per step; when W is not a multiple of 8 the last
// group's extra lanes land where the next step's first group goes, which is written after them
// (groups run last to first; dst has slack for the final step's).
//
// One group of 8 rows is read over all kc steps before the next: rows ld apart fall in few L1
// sets (ld = 2 KB: 2 of 64, ld = 8 KB: 1), and 64 rows read side by side (workload F's
// weights) evicted each other's lines between the two steps that read each one, so the pack ran
// at 7-13 GB/s from L3 or DRAM. Each row's line kPackAhead elements ahead is asked for once
// per line (8 rows side by side are few enough streams for the hardware prefetcher, not enough
// to keep DRAM busy); past the end of its rows, the next group's (or those of `next`: next_rows
// rows, ld apart, the sliver packed after this one) first lines are asked for instead.
template <int W, GemmType T = GemmType::f32>
LUCID_GEMM_ISA void pack_rows(const Elem<T>* src, int64_t ld, int64_t rows, int64_t kc,
                              float* dst, const Elem<T>* next = nullptr, int64_t next_rows = 0) {
  constexpr int kGroups = (W + 7) / 8;
  constexpr int64_t kPackAhead = 64, kLine = 64 / sizeof(Elem<T>);
  const auto in_group = [](int64_t n, int64_t g) { return std::clamp<int64_t>(n - g, 0, 8); };
  for (int g = 8 * (kGroups - 1); g >= 0; g -= 8) {
    const int64_t here = in_group(rows, g);
    const Elem<T>* after = nullptr;
    int64_t after_rows = 0;
    if (g > 0) after = src + (g - 8) * ld, after_rows = in_group(rows, g - 8);
    else if (next != nullptr)
      after = next + 8 * (kGroups - 1) * ld, after_rows = in_group(next_rows, 8 * (kGroups - 1));
    for (int64_t k = 0; k + 8 <= kc; k += 8) {
      if (k % kLine == 0) {
        const int64_t ahead = k + kPackAhead;
        if (ahead < kc) {
          for (int64_t i = 0; i < here; ++i)
            _mm_prefetch(reinterpret_cast<const char*>(src + (g + i) * ld + ahead), _MM_HINT_T0);
        } else if (ahead - kc < kc) {
          for (int64_t i = 0; i < after_rows; ++i)
            _mm_prefetch(reinterpret_cast<const char*>(after + i * ld + ahead - kc), _MM_HINT_T0);
        }
      }
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = i < here ? load8_wide<T>(src + (g + i) * ld + k) : _mm256_setzero_ps();
      transpose8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
      if (W % 16 == 0) {
        for (int t = 0; t < 8; ++t) _mm256_store_ps(dst + (k + t) * W + g, r[t]);
      } else {
        for (int t = 0; t < 8; ++t) _mm256_storeu_ps(dst + (k + t) * W + g, r[t]);
      }
    }
  }
  for (int64_t k = kc - kc % 8; k < kc; ++k)
    for (int r = 0; r < W; ++r) dst[k * W + r] = r < rows ? load1_wide<T>(src + r * ld + k) : 0.0f;
}

// Packs `cols` (<= W) contiguous values per contraction step (step k at src + k * ld) into
// dst[k * W + c] (widened to float32), zero beyond `cols`.
template <int W, GemmType T = GemmType::f32>
LUCID_GEMM_ISA void pack_cols(const Elem<T>* src, int64_t ld, int64_t cols, int64_t kc,
                              float* dst) {
  if (cols == W && (W % 8 == 0 || T == GemmType::f32)) {
    for (int64_t k = 0; k < kc; ++k) {
      const Elem<T>* from = src + k * ld;
      float* to = dst + k * W;
      int c = 0;
      for (; c + 8 <= W; c += 8) _mm256_storeu_ps(to + c, load8_wide<T>(from + c));
      if constexpr (T == GemmType::f32) {
        // The rest as 4 + 2: nothing read or written beyond them.
        if (W % 8 >= 4) _mm_storeu_ps(to + c, _mm_loadu_ps(from + c)), c += 4;
        if (W % 4 >= 2)
          _mm_storel_pi(reinterpret_cast<__m64*>(to + c),
                        _mm_loadl_pi(_mm_setzero_ps(), reinterpret_cast<const __m64*>(from + c)));
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k)
    for (int c = 0; c < W; ++c) dst[k * W + c] = c < cols ? load1_wide<T>(src + k * ld + c) : 0.0f;
}

struct Problem {
  bool ta, tb;
  int64_t M, N, K;
  float alpha;
  const void* A;  // Elem<a_type>
  int64_t lda;
  const void* B;  // Elem<b_type>
  int64_t ldb;
  float beta;
  void* C;  // float, or uint16_t when c_type is half (then beta is 0)
  int64_t ldc;
  GemmEpilogue ep;
  GemmType c_type = GemmType::f32;
  // Half output: the product is rounded to this (when half) before the activation.
  GemmType round_product = GemmType::f32;
  const void* shared_b = nullptr;  // GemmRunScope's key
  // All of op(B) packed (pack_b_slivers's layout), or null: each block packs its own panel.
  const float* packed_b = nullptr;
};

// A finished rows x cols tile of float32 sums (`src`, rows lds apart) into the half output:
// rounded to the product's format and widened (when asked), the activation, rounded to the
// output's format.
LUCID_GEMM_ISA void store_half_tile(const float* src, int64_t lds, int64_t rows, int64_t cols,
                                    uint16_t* dst, int64_t ldd, GemmType to, GemmActivation act,
                                    GemmType round_product) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; j += 8) {
      const int64_t n = std::min<int64_t>(8, cols - j);
      const float* from = src + i * lds + j;
      __m256 x = n == 8 ? _mm256_loadu_ps(from) : _mm256_maskload_ps(from, lane_mask(n));
      if (round_product != GemmType::f32)
        x = widen8_half(round8_half(x, round_product), round_product);
      if (act == GemmActivation::relu) x = relu8(x);
      else if (act == GemmActivation::gelu) x = gelu8(x);
      const __m128i h = round8_half(x, to);
      uint16_t* out = dst + i * ldd + j;
      if (n == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
      } else {
        alignas(16) uint16_t lanes[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(lanes), h);
        std::memcpy(out, lanes, sizeof(uint16_t) * static_cast<size_t>(n));
      }
    }
  }
}

// kc for a contraction of K: the fewest blocks of at most kMaxKC, evened out (from K alone).
int64_t block_kc(int64_t K) {
  const int64_t blocks = (K + kMaxKC - 1) / kMaxKC;
  return (K + blocks - 1) / blocks;
}

// Slivers [s0, s1) of op(B) for every contraction block, in the layout compute_range's panels
// have: block q (kc steps) at q * kcb * npad, its sliver s (NR columns) at s * kc * NR in it.
template <GemmType TB, class Tile>
LUCID_GEMM_ISA void pack_b_slivers(const Problem& p, float* dst, int64_t s0, int64_t s1) {
  const Elem<TB>* B = static_cast<const Elem<TB>*>(p.B);
  const int64_t kcb = block_kc(p.K), npad = (p.N + Tile::NR - 1) / Tile::NR * Tile::NR;
  for (int64_t pc = 0; pc < p.K; pc += kcb) {
    const int64_t kc = std::min(kcb, p.K - pc);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t j = s * Tile::NR, cols = std::min(Tile::NR, p.N - j);
      float* d = dst + pc * npad + s * kc * Tile::NR;
      if (p.tb) {
        // The sliver packed next: the following one of this block, else the first of the next
        // block (whose first kc steps are what pack_rows asks for ahead).
        const int64_t next_s = s + 1 < s1 ? s + 1 : s0, next_pc = s + 1 < s1 ? pc : pc + kc;
        const bool has_next = next_pc < p.K;
        const int64_t next_j = next_s * Tile::NR;
        pack_rows<Tile::NR, TB>(B + j * p.ldb + pc, p.ldb, cols, kc, d,
                                has_next ? B + next_j * p.ldb + next_pc : nullptr,
                                has_next ? std::min(Tile::NR, p.N - next_j) : 0);
      } else {
        pack_cols<Tile::NR, TB>(B + pc * p.ldb + j, p.ldb, cols, kc, d);
      }
    }
  }
}

// Output rows [m0, m1) x columns [n0, n1) on the calling thread. kHalfOut: p.c_type is half
// (a template parameter, so the float32 product's loop carries none of its code).
template <GemmType TA, GemmType TB, bool kHalfOut, class Tile>
LUCID_GEMM_ISA void compute_range(const Problem& p, int64_t m0, int64_t m1, int64_t n0,
                                  int64_t n1) {
  const Elem<TA>* A = static_cast<const Elem<TA>*>(p.A);
  const Elem<TB>* B = static_cast<const Elem<TB>*>(p.B);
  const int64_t kcb = block_kc(p.K);
  const int64_t nc_max = std::min(Tile::NC, ((n1 - n0 + Tile::NR - 1) / Tile::NR) * Tile::NR);
  const int64_t mc_max = std::min(Tile::MC, ((m1 - m0 + Tile::MR - 1) / Tile::MR) * Tile::MR);
  float* bp = p.packed_b != nullptr ? nullptr : t_pack_b.get(kcb * nc_max);
  const int64_t npad = (p.N + Tile::NR - 1) / Tile::NR * Tile::NR;
  // A float32 A is read in place when its rows run along the contraction (not transposed):
  // only a bottom sliver of fewer than MR rows is packed (zero-padded). A transposed or half A
  // is packed whole.
  const bool pack_a_whole = p.ta || TA != GemmType::f32;
  float* ap = t_pack_a.get(kcb * (pack_a_whole ? mc_max : Tile::MR));
  // A half output holds its partial sums in float32 (rows m0.., nc_max apart) until the last
  // contraction block, whose finished tiles are rounded into C.
  constexpr bool half_out = kHalfOut;
  float* partial = half_out && kcb < p.K ? t_partial.get((m1 - m0) * nc_max) : nullptr;
  // C larger than about a quarter of L3 (workload F's 512 x 8192 head: 16 MB) and written
  // once: stored past the caches, without first reading each of its lines from DRAM.
  const bool stream_c = !half_out && Tile::NR == 64 && kcb >= p.K &&
                        static_cast<double>(p.M) * static_cast<double>(p.N) >= kStreamMinFloats &&
                        reinterpret_cast<uintptr_t>(p.C) % 64 == 0 && p.ldc % 16 == 0;
  alignas(64) float tile[Tile::MR * Tile::NR];
  alignas(32) float finished[half_out ? Tile::MR * Tile::NR : 1];
  for (int64_t jc = n0; jc < n1; jc += Tile::NC) {
    const int64_t nc = std::min(Tile::NC, n1 - jc);
    for (int64_t pc = 0; pc < p.K; pc += kcb) {
      const int64_t kc = std::min(kcb, p.K - pc);
      const float* panel = bp;
      if (p.packed_b != nullptr) {
        panel = p.packed_b + pc * npad + jc * kc;  // jc is a whole number of slivers
      } else {
        for (int64_t jr = 0; jr < nc; jr += Tile::NR) {
          const int64_t cols = std::min(Tile::NR, nc - jr), j = jc + jr;
          float* dst = bp + jr * kc;
          if (p.tb) {
            const int64_t next_j = j + Tile::NR;  // the panel's next sliver
            pack_rows<Tile::NR, TB>(B + j * p.ldb + pc, p.ldb, cols, kc, dst,
                                    B + next_j * p.ldb + pc,
                                    jr + Tile::NR < nc ? std::min(Tile::NR, n1 - next_j) : 0);
          } else {
            pack_cols<Tile::NR, TB>(B + pc * p.ldb + j, p.ldb, cols, kc, dst);
          }
        }
      }
      const bool first = pc == 0, last = pc + kc == p.K;
      const bool extras = p.ep.bias != nullptr || p.ep.addend != nullptr ||
                          p.ep.act != GemmActivation::none || half_out;
      const bool plain = !(first && p.beta != 0.0f) && !(last && extras);
      // A half output gets its activation after the rounding (store_half_tile).
      const GemmActivation act = half_out ? GemmActivation::none : p.ep.act;
      TileStore e{p.alpha,     p.beta,         first, last, p.ep.bias,
                  p.ep.addend, p.ep.ld_addend, act,   plain};
      e.stream = stream_c && first && last && plain;
      const FinishFn finish_full = pick_finish<Tile::NR>(false, e),
                     finish_edge = pick_finish<Tile::NR>(true, e);
      for (int64_t ic = m0; ic < m1; ic += Tile::MC) {
        const int64_t mc = std::min(Tile::MC, m1 - ic);
        if (p.ta) {
          for (int64_t ir = 0; ir < mc; ir += Tile::MR)
            pack_cols<Tile::MR, TA>(A + pc * p.lda + ic + ir, p.lda, std::min(Tile::MR, mc - ir), kc,
                               ap + ir * kc);
        } else if (pack_a_whole) {
          for (int64_t ir = 0; ir < mc; ir += Tile::MR)
            pack_rows<Tile::MR, TA>(A + (ic + ir) * p.lda + pc, p.lda, std::min(Tile::MR, mc - ir), kc,
                               ap + ir * kc);
        } else if (mc % Tile::MR != 0) {
          const int64_t ir = mc - mc % Tile::MR;
          pack_rows<Tile::MR, TA>(A + (ic + ir) * p.lda + pc, p.lda, mc - ir, kc, ap);
        }
        for (int64_t jr = 0; jr < nc; jr += Tile::NR) {
          const int64_t cols = std::min(Tile::NR, nc - jr), j = jc + jr;
          const float* bias = e.last && p.ep.bias != nullptr ? p.ep.bias + j : nullptr;
          for (int64_t ir = 0; ir < mc; ir += Tile::MR) {
            const int64_t rows = std::min(Tile::MR, mc - ir), i = ic + ir;
            const float* addend = e.last && p.ep.addend != nullptr
                                      ? p.ep.addend + i * p.ep.ld_addend + j
                                      : nullptr;
            const float* a;
            int64_t rs, cs;
            if (pack_a_whole) a = ap + ir * kc, rs = 1, cs = Tile::MR;
            else if (rows < Tile::MR) a = ap, rs = 1, cs = Tile::MR;
            else a = reinterpret_cast<const float*>(A) + i * p.lda + pc, rs = p.lda, cs = 1;
            // Where the tile's float32 values go: C, or for a half output its partial sums
            // (or, when one block is all, the `finished` tile) before their rounding into C.
            float* c;
            int64_t ldc;
            if constexpr (half_out) {
              if (partial == nullptr) c = finished, ldc = Tile::NR;
              else c = partial + (i - m0) * nc_max + jr, ldc = nc_max;
            } else {
              c = static_cast<float*>(p.C) + i * p.ldc + j, ldc = p.ldc;
            }
            const bool full = rows == Tile::MR && cols == Tile::NR;
            if (!Tile::kernel(kc, a, rs, cs, panel + jr * kc, c, ldc, full, e, tile))
              (cols == Tile::NR ? finish_full : finish_edge)(tile, rows, cols, c, ldc, bias, addend,
                                                        p.ep.ld_addend, e);
            if constexpr (half_out) {
              if (last)
                store_half_tile(c, ldc, rows, cols, static_cast<uint16_t*>(p.C) + i * p.ldc + j,
                                p.ldc, p.c_type, p.ep.act, p.round_product);
            }
          }
        }
      }
    }
  }
  // Non-temporal stores are weakly ordered: make them visible before the caller (or the pool's
  // join) says the range is done.
  if (stream_c) _mm_sfence();
}

LUCID_AVX2 void activation_avx2(GemmActivation act, int64_t M, int64_t N, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    int64_t j = 0;
    for (; j + 8 <= N; j += 8) {
      const __m256 x = _mm256_loadu_ps(c + j);
      _mm256_storeu_ps(c + j, act == GemmActivation::relu ? relu8(x) : gelu8(x));
    }
    for (; j < N; ++j) c[j] = act == GemmActivation::relu ? relu(c[j]) : gelu(c[j]);
  }
}

// The threaded driver of compute_range<TA, TB> on the tile sgemm_isa picks (below, after the
// entry points).
template <GemmType TA, GemmType TB>
void run_problem(const Problem& p);

bool avx512_supported() {
  static const bool yes = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
}

int isa_from_env() {
  const char* v = std::getenv("LUCID_SGEMM_ISA");
  if (v == nullptr) return 0;
  const std::string s(v);
  return s == "avx2" ? 1 : s == "avx512" ? 2 : 0;
}

std::atomic<int> g_isa{isa_from_env()};

}  // namespace

void set_sgemm_isa(int isa) { g_isa.store(isa < 0 || isa > 2 ? 0 : isa); }

int sgemm_isa() {
  const int asked = g_isa.load(std::memory_order_relaxed);
  return avx512_supported() && asked != 1 ? 2 : 1;
}

bool sgemm_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

bool sgemm_chosen(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  (void)ta, (void)tb;  // measured alike for every transpose
  const int mode = g_mode.load(std::memory_order_relaxed);
  if (mode == 2 || !sgemm_supported() || M <= 0 || N <= 0 || K <= 0) return false;
  if (mode == 1) return true;
  // Measured (docs/backend-cpu.md): from single-thread parity on large products to 2-3x
  // faster on workload A's 64x784x256 (OpenBLAS's small-product path) and ahead at two
  // threads. Products narrower than one 16-column sliver or shorter than one 6-row sliver,
  // and tiny ones (under ~0.26M multiply-adds: 64x256x10, 10x64x256) stay with the BLAS, whose
  // edge kernels waste less there.
  return N >= kNR && M >= kMR && static_cast<double>(M) * N * K >= double(int64_t(1) << 18);
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const GemmEpilogue& epilogue, const void* shared_b) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // No products: the epilogue over beta * C (C not read when beta == 0).
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float x = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        if (epilogue.bias != nullptr) x += epilogue.bias[j];
        if (epilogue.addend != nullptr) x += epilogue.addend[i * epilogue.ld_addend + j];
        C[i * ldc + j] = x;
      }
    if (epilogue.act != GemmActivation::none) sgemm_activation(epilogue.act, M, N, C, ldc);
    return;
  }
  Problem p{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue};
  p.shared_b = shared_b;
  run_problem<GemmType::f32, GemmType::f32>(p);
}

bool gemm_mixed_native() {
  static const bool yes = sgemm_supported() && __builtin_cpu_supports("f16c");
  return yes;
}

void gemm_mixed(const MixedGemm& g) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K <= 0 || !gemm_mixed_native()) return gemm_mixed_portable(g);
  thread_local std::vector<float> bias;
  GemmEpilogue ep;
  if (g.bias != nullptr && g.bias_type != GemmType::f32) {
    widen_into(g.bias, g.bias_type, 1, g.N, g.N, bias);
    ep.bias = bias.data();
  } else {
    ep.bias = static_cast<const float*>(g.bias);
  }
  ep.addend = g.addend;
  ep.ld_addend = g.ld_addend;
  ep.act = g.act;
  Problem p{g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, 0.0f, g.C, g.ldc, ep};
  p.c_type = g.c_type;
  p.shared_b = g.shared_b;
  p.round_product = g.c_type == GemmType::f32 ? GemmType::f32 : g.round_product;
  if (g.c_type == GemmType::f32 && g.round_product != GemmType::f32)
    throw std::invalid_argument("gemm_mixed: round_product needs a half output");
  constexpr GemmType f32 = GemmType::f32, f16 = GemmType::f16, bf16 = GemmType::bf16;
  auto with_b = [&](auto a_tag) {
    constexpr GemmType TA = decltype(a_tag)::value;
    switch (g.b_type) {
      case f16: return run_problem<TA, f16>(p);
      case bf16: return run_problem<TA, bf16>(p);
      default: return run_problem<TA, f32>(p);
    }
  };
  switch (g.a_type) {
    case f16: return with_b(std::integral_constant<GemmType, f16>{});
    case bf16: return with_b(std::integral_constant<GemmType, bf16>{});
    default: return with_b(std::integral_constant<GemmType, f32>{});
  }
}

namespace {

// A whole op(B) packed once per run for GEMMs that share it (GemmRunScope), per thread.
struct SharedPack {
  uint64_t run = 0;
  const void* src = nullptr;
  bool tb = false;
  int64_t K = 0, N = 0, ldb = 0;
  GemmType type = GemmType::f32;
  int64_t nr = 0;  // the sliver width of the layout (the tile's)
  const float* packed = nullptr;
  Scratch data;
};
thread_local std::unordered_map<const void*, SharedPack> t_shared;

// The packed op(B) of this run for p.shared_b: made by the first GEMM of the run that asks for
// it, reused while B's address and layout match.
template <GemmType TB, class Tile>
const float* shared_packed_b(const Problem& p) {
  if (t_shared.size() > 64) {  // keys of finished runs and of executables gone
    for (auto it = t_shared.begin(); it != t_shared.end();)
      it = it->second.run != t_run ? t_shared.erase(it) : std::next(it);
  }
  SharedPack& e = t_shared[p.shared_b];
  if (e.run == t_run && e.src == p.B && e.tb == p.tb && e.K == p.K && e.N == p.N &&
      e.ldb == p.ldb && e.type == TB && e.nr == Tile::NR) {
    ++t_shared_stats.reused;
    return e.packed;
  }
  const int64_t slivers = (p.N + Tile::NR - 1) / Tile::NR;
  float* dst = e.data.get(slivers * Tile::NR * p.K);
  e.run = 0;  // not valid until packed (pack_b_slivers does not throw; the guard costs nothing)
  if (p.N * p.K >= kMinMacsPerPart) {
    parallel_for(slivers, 4, [&](int64_t s0, int64_t s1) { pack_b_slivers<TB, Tile>(p, dst, s0, s1); });
  } else {
    pack_b_slivers<TB, Tile>(p, dst, 0, slivers);
  }
  e.run = t_run, e.src = p.B, e.tb = p.tb, e.K = p.K, e.N = p.N, e.ldb = p.ldb, e.type = TB;
  e.nr = Tile::NR;
  e.packed = dst;
  ++t_shared_stats.packed;
  return dst;
}

template <GemmType TA, GemmType TB, class Tile>
void run_problem_on(const Problem& given) {
  Problem p = given;
  if (p.shared_b != nullptr && t_run != 0) p.packed_b = shared_packed_b<TB, Tile>(p);
  const int64_t M = p.M, N = p.N, K = p.K;
  // Chunks of output rows (by_rows: each packs all of B, about 1% of its work) or of
  // output columns (each packs only its own columns of B; A is read in place), handed out
  // one at a time: a worker that wakes late finds the chunks already taken instead of holding
  // up the call with a fixed half.
  // A square product (workload F's 512 x 512 x 512 and x 2048) is split by columns when A is
  // read in place and B is not packed yet: each chunk packs its own weight rows while the other
  // thread computes, instead of both packing all of a cold B first (3-5% faster at two threads).
  const bool by_rows =
      M > N || (M == N && (p.ta || TA != GemmType::f32 || p.packed_b != nullptr));
  const int64_t dim = by_rows ? M : N, unit = by_rows ? Tile::MR : Tile::NR;
  // About kRowChunk / kColChunk each, evened out (M = 128 is two chunks of 66 and 62 rows, not
  // 96 and 32), in whole slivers.
  const int64_t target = by_rows ? kRowChunk : N >= kWideColMinN ? kWideColChunk : kColChunk;
  const int64_t units = (dim + unit - 1) / unit;
  const int64_t chunks = std::min(units, (dim + target - 1) / target);
  // Chunk c: units [c * base + min(c, extra), ...), the first `extra` one unit larger. Equal
  // sizes rounded up instead (M = 512: five chunks of 90 rows and one of 62) left one of two
  // threads 28 rows (5%) behind the other on workload F's 512 x 512 products.
  const int64_t base = units / chunks, extra = units % chunks;
  const auto chunk_bounds = [&](int64_t c) {
    const int64_t lo = (c * base + std::min(c, extra)) * unit;
    return std::pair<int64_t, int64_t>{lo, std::min(dim, lo + (base + (c < extra)) * unit)};
  };
  const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const int threads = parallel_threads();
  const auto range = p.c_type == GemmType::f32 ? &compute_range<TA, TB, false, Tile>
                                               : &compute_range<TA, TB, true, Tile>;
  if (threads < 2 || chunks < 2 || macs < 2.0 * kMinMacsPerPart) {
    range(p, 0, M, 0, N);
    return;
  }
  if (by_rows && p.packed_b == nullptr && chunks > threads) {
    // Every chunk of rows would pack all of B again: at M = 512, N = 512, K = 2048 (workload F's
    // second feed-forward product) the six chunks' packing cost a third of the product. B is
    // packed once instead, its slivers split across the pool.
    const int64_t slivers = (N + Tile::NR - 1) / Tile::NR;
    float* dst = t_whole_b.get(slivers * Tile::NR * K);
    parallel_for(slivers, 1, [&](int64_t s0, int64_t s1) { pack_b_slivers<TB, Tile>(p, dst, s0, s1); });
    p.packed_b = dst;
  }
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(threads, chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      const auto [lo, hi] = chunk_bounds(c);
      if (by_rows) range(p, lo, hi, 0, N);
      else range(p, 0, M, lo, hi);
    }
  });
}

// The AVX-512 tile where it runs, unless the product is so narrow that padding its columns to
// 64 costs more than the wider tile gains (about 2x per column: N <= 32 stays on the 6x16 one).
// Either tile gives the same bits, so the choice is free per call.
bool wide_tile(int64_t N) {
  const auto padded = [&](int64_t nr) { return (N + nr - 1) / nr * nr; };
  const bool forced = g_isa.load(std::memory_order_relaxed) == 2;
  return sgemm_isa() == 2 && (forced || padded(Avx512Tile::NR) < 2 * padded(Avx2Tile::NR));
}

template <GemmType TA, GemmType TB>
void run_problem(const Problem& p) {
  if (wide_tile(p.N)) run_problem_on<TA, TB, Avx512Tile>(p);
  else run_problem_on<TA, TB, Avx2Tile>(p);
}

}  // namespace

PackedBLayout sgemm_packed_b_layout(int64_t N, int64_t K) {
  const int64_t nr = wide_tile(N) ? Avx512Tile::NR : Avx2Tile::NR;
  return {nr, block_kc(K), (N + nr - 1) / nr * nr};
}

void sgemm_prepacked(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                     int64_t lda, const float* packed_b, float beta, float* C, int64_t ldc,
                     const GemmEpilogue& epilogue) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  Problem p{ta, false, M, N, K, alpha, A, lda, nullptr, 0, beta, C, ldc, epilogue};
  p.packed_b = packed_b;
  constexpr GemmType f32 = GemmType::f32;
  if (wide_tile(N)) run_problem_on<f32, f32, Avx512Tile>(p);
  else run_problem_on<f32, f32, Avx2Tile>(p);
}

void sgemm_activation(GemmActivation act, int64_t M, int64_t N, float* C, int64_t ldc) {
  if (act == GemmActivation::none) return;
  if (sgemm_supported()) return activation_avx2(act, M, N, C, ldc);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float& c = C[i * ldc + j];
      c = act == GemmActivation::relu ? relu(c) : gelu(c);
    }
}

#else  // no x86-64 AVX2 build: the BLAS does every product

void set_sgemm_isa(int) {}
int sgemm_isa() { return 0; }

bool sgemm_supported() { return false; }
bool gemm_mixed_native() { return false; }
void gemm_mixed(const MixedGemm& g) {
  if (g.M > 0 && g.N > 0) gemm_mixed_portable(g);
}
bool sgemm_chosen(bool, bool, int64_t, int64_t, int64_t) { return false; }
void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
           int64_t, float, float*, int64_t, const GemmEpilogue&, const void*) {
  throw std::logic_error("Lucid's sgemm needs x86-64 with AVX2 and FMA");
}
PackedBLayout sgemm_packed_b_layout(int64_t, int64_t) { return {0, 0, 0}; }
void sgemm_prepacked(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                     float, float*, int64_t, const GemmEpilogue&) {
  throw std::logic_error("Lucid's sgemm needs x86-64 with AVX2 and FMA");
}
void sgemm_activation(GemmActivation act, int64_t M, int64_t N, float* C, int64_t ldc) {
  if (act == GemmActivation::none) return;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float& c = C[i * ldc + j];
      c = act == GemmActivation::relu ? relu(c) : gelu(c);
    }
}

#endif

}  // namespace lucid
