// Half-precision conversions (see lucid/half.h for the rounding contract).
#include "lucid/half.h"

#include <cmath>
#include <cstring>

namespace lucid {

namespace {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

constexpr uint16_t kF16Inf = 0x7c00, kBf16QuietNan = 0x7fc0, kF16QuietNan = 0x7e00;

// float64 -> float32 rounded to odd: exact when representable, else the neighbour (toward zero)
// with its last bit set. Rounding that once more to a narrower format (half: at least 13 bits
// narrower) gives the same bits as rounding the float64 directly, with no double-rounding error.
float f64_to_f32_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != d) f = float_of(bits_of(f) | 1u);
  return f;
}

// An int64 as a float64 rounded to odd (exact below 2^53), for f64_to_half.
double i64_round_to_odd(int64_t v) {
  const bool negative = v < 0;
  uint64_t m = negative ? ~static_cast<uint64_t>(v) + 1 : static_cast<uint64_t>(v);
  int drop = 0;
  while ((m >> drop) >= (uint64_t(1) << 53)) ++drop;
  uint64_t kept = m >> drop;
  if (drop && (m & ((uint64_t(1) << drop) - 1))) kept |= 1;
  const double magnitude = std::ldexp(static_cast<double>(kept), drop);
  return negative ? -magnitude : magnitude;
}

template <class S>
void ints_to_half(const S* in, DType to, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f64_to_half(i64_round_to_odd(int64_t(in[i])), to);
}

}  // namespace

// The array loops vectorise as they are; on x86-64 Linux with GCC they are also built for AVX2
// (twice the lanes), picked at load time by the CPU's features.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define LUCID_HALF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LUCID_HALF_CLONES
#endif

namespace {

__attribute__((always_inline)) inline uint16_t round_to_f16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Below the smallest normal half (2^-14): adding 0.5 leaves the value rounded (by the FPU, to
  // nearest even) to a multiple of 2^-24, the subnormal step, in the low mantissa bits.
  const uint32_t subnormal = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t payload = (a >> 13) & 0x3ffu;
  const uint32_t nan = kF16Inf | (payload ? payload : 1u);
  uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? kF16Inf : h;  // rounds past 65504
  h = a > 0x7f800000u ? nan : h;
  return static_cast<uint16_t>(h | sign);
}

}  // namespace

uint16_t f32_to_f16(float x) { return round_to_f16(x); }

uint16_t f32_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = ((u >> 16) & 0x8000u) | kBf16QuietNan;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t a = h & 0x7fffu;
  const uint32_t normal = (a << 13) + 0x38000000u;
  const uint32_t special = (a << 13) | 0x7f800000u;
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(a)) * 0x1p-24f);
  uint32_t f = a >= 0x400u ? normal : subnormal;
  f = a >= 0x7c00u ? special : f;
  return float_of(f | sign);
}

float bf16_to_f32(uint16_t h) { return float_of(uint32_t(h) << 16); }

uint16_t f64_to_half(double value, DType to) {
  if (std::isnan(value)) {
    uint64_t u;
    std::memcpy(&u, &value, 8);
    const uint16_t sign = static_cast<uint16_t>((u >> 48) & 0x8000u);
    if (to == DType::BF16) return sign | kBf16QuietNan;
    const uint16_t payload = static_cast<uint16_t>((u >> 42) & 0x3ffu);
    return sign | kF16Inf | (payload ? payload : 1);
  }
  const float f = f64_to_f32_round_to_odd(value);
  return to == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f);
}

LUCID_HALF_CLONES void f32_to_half_n(const float* in, DType to, uint16_t* out, int64_t n) {
  if (to == DType::F16) {
    for (int64_t i = 0; i < n; ++i) out[i] = round_to_f16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
  }
}

LUCID_HALF_CLONES void half_to_f32_n(const uint16_t* in, DType from, float* out, int64_t n) {
  if (from == DType::F16) {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
  }
}

void cast_to_half(const void* in, DType from, DType to, uint16_t* out, int64_t n) {
  switch (from) {
    case DType::F32: f32_to_half_n(static_cast<const float*>(in), to, out, n); return;
    case DType::F64: {
      const double* x = static_cast<const double*>(in);
      for (int64_t i = 0; i < n; ++i) out[i] = f64_to_half(x[i], to);
      return;
    }
    case DType::I32: ints_to_half(static_cast<const int32_t*>(in), to, out, n); return;
    case DType::I64: ints_to_half(static_cast<const int64_t*>(in), to, out, n); return;
    case DType::Bool: ints_to_half(static_cast<const uint8_t*>(in), to, out, n); return;
    case DType::F16: case DType::BF16: {
      const uint16_t* x = static_cast<const uint16_t*>(in);
      if (from == to) {
        std::memcpy(out, x, static_cast<size_t>(n) * 2);
        return;
      }
      // Widening is exact, so one rounding; a NaN becomes the canonical quiet NaN.
      const uint16_t quiet = to == DType::F16 ? kF16QuietNan : kBf16QuietNan;
      for (int64_t i = 0; i < n; ++i) {
        const float f = from == DType::F16 ? f16_to_f32(x[i]) : bf16_to_f32(x[i]);
        const uint16_t h = to == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f);
        out[i] = std::isnan(f) ? static_cast<uint16_t>((x[i] & 0x8000u) | quiet) : h;
      }
      return;
    }
  }
}

}  // namespace lucid
