// Half-precision storage (IEEE binary16 "f16" and bfloat16 "bf16"): conversions to and from the
// other dtypes. Arithmetic never happens in half: lowering widens half values to float32 and
// rounds each result once, so the runtime only stores half values and casts them.
//
// Rounding to half is to nearest, ties to even, from the exact source value (a float64 or an
// int64 is never rounded through float32 first), with gradual underflow and overflow to
// infinity; NaN keeps its sign, and its payload as numpy (f16) and ml_dtypes (bf16) give it:
// to f16 the payload's top bits (at least one set), to bf16 and between the half formats the
// canonical quiet NaN. Widening is exact (a NaN keeps its payload).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lucid/program.h"

namespace lucid {

inline bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

uint16_t f32_to_f16(float x);
uint16_t f32_to_bf16(float x);
float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);
// `value` rounded (once) to half dtype `to`.
uint16_t f64_to_half(double value, DType to);

// Loops over n elements; they vectorise (no branches, no tables).
void f32_to_half_n(const float* in, DType to, uint16_t* out, int64_t n);
void half_to_f32_n(const uint16_t* in, DType from, float* out, int64_t n);

// n elements of dtype `from` (any dtype) rounded to half dtype `to`.
void cast_to_half(const void* in, DType from, DType to, uint16_t* out, int64_t n);

}  // namespace lucid
