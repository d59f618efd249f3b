// float32 loops of the commonest elementwise ops, compiled twice: for the baseline ISA and, on
// x86-64, for AVX2 + FMA, chosen once at run time. The package is built for the baseline (it must
// load on any x86-64), which leaves half of an AVX2 core's vector width unused on the optimizer
// updates and activation gradients that dominate small training steps.
//
// `#pragma GCC ivdep`: an output may be the same buffer as an input (in-place updates), which
// is safe element by element but makes the vectorizer fall back to scalar code after its runtime
// overlap check; the loops have no loop-carried dependence, so the check is dropped.
#include <cmath>
#include <cstdint>

#include "lucid/fastmath.h"
#include "lucid/kernels.h"

namespace lucid {

#define LUCID_EW_LOOP(expr)                      \
  _Pragma("GCC ivdep") for (int64_t i = 0; i < n; ++i) o[i] = (expr); \
  return true

// a, b: inputs (b unused by unary ops), c: a uint8 mask for select (which reads a, b by it).
#define LUCID_DEFINE_F32_KERNELS(NAME, TARGET)                                                   \
  TARGET static bool NAME(Op op, const float* a, const float* b, const uint8_t* c, float* o,     \
                          int64_t n) {                                                           \
    switch (op) {                                                                                \
      case Op::add: LUCID_EW_LOOP(a[i] + b[i]);                                                  \
      case Op::sub: LUCID_EW_LOOP(a[i] - b[i]);                                                  \
      case Op::mul: LUCID_EW_LOOP(a[i] * b[i]);                                                  \
      case Op::div: LUCID_EW_LOOP(a[i] / b[i]);                                                  \
      case Op::neg: LUCID_EW_LOOP(-a[i]);                                                        \
      case Op::square: LUCID_EW_LOOP(a[i] * a[i]);                                               \
      case Op::relu: LUCID_EW_LOOP(relu(a[i]));                                                  \
      case Op::sqrt: LUCID_EW_LOOP(__builtin_sqrtf(a[i]));                                       \
      case Op::rsqrt: LUCID_EW_LOOP(1.0f / __builtin_sqrtf(a[i]));                               \
      case Op::reciprocal: LUCID_EW_LOOP(1.0f / a[i]);                                           \
      case Op::exp: LUCID_EW_LOOP(fast_expf(a[i]));                                              \
      case Op::sigmoid: LUCID_EW_LOOP(1.0f / (1.0f + fast_expf(-a[i])));                         \
      case Op::erf: LUCID_EW_LOOP(fast_erff(a[i]));                                              \
      case Op::select: {                                                                         \
        const float* x = a + 0;                                                                  \
        _Pragma("GCC ivdep") for (int64_t i = 0; i < n; ++i) {                                   \
          float xv = x[i], yv = b[i];                                                            \
          o[i] = c[i] ? xv : yv;                                                                 \
        }                                                                                        \
        return true;                                                                             \
      }                                                                                          \
      default: return false;                                                                     \
    }                                                                                            \
  }

// A binary op with one operand a 0-d value (a learning rate, a decay, epsilon): the scalar stays
// in a register instead of being read from a filled block. `scalar_first` means s OP a[i].
#define LUCID_DEFINE_F32_SCALAR_KERNELS(NAME, TARGET)                                            \
  TARGET static bool NAME(Op op, const float* a, float s, bool scalar_first, float* o,          \
                          int64_t n) {                                                           \
    switch (op) {                                                                                \
      case Op::add: LUCID_EW_LOOP(a[i] + s);                                                     \
      case Op::mul: LUCID_EW_LOOP(a[i] * s);                                                     \
      case Op::sub:                                                                              \
        if (scalar_first) { LUCID_EW_LOOP(s - a[i]); }                                           \
        LUCID_EW_LOOP(a[i] - s);                                                                 \
      case Op::div:                                                                              \
        if (scalar_first) { LUCID_EW_LOOP(s / a[i]); }                                           \
        LUCID_EW_LOOP(a[i] / s);                                                                 \
      default: return false;                                                                     \
    }                                                                                            \
  }

LUCID_DEFINE_F32_KERNELS(f32_baseline, )
LUCID_DEFINE_F32_SCALAR_KERNELS(f32_scalar_baseline, )

#if defined(__x86_64__) && defined(__GNUC__)
LUCID_DEFINE_F32_KERNELS(f32_avx2, __attribute__((target("avx2,fma"))))
LUCID_DEFINE_F32_SCALAR_KERNELS(f32_scalar_avx2, __attribute__((target("avx2,fma"))))

static bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

bool f32_elementwise(Op op, const float* a, const float* b, const uint8_t* mask, float* out,
                     int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return f32_avx2(op, a, b, mask, out, n);
#endif
  return f32_baseline(op, a, b, mask, out, n);
}

}  // namespace lucid

namespace lucid {

bool f32_elementwise_scalar(Op op, const float* a, float s, bool scalar_first, float* out,
                            int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return f32_scalar_avx2(op, a, s, scalar_first, out, n);
#endif
  return f32_scalar_baseline(op, a, s, scalar_first, out, n);
}

}  // namespace lucid
