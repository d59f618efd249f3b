// The elementwise evaluator: one pass over blocks of output elements evaluates an expression tree
// (a single op, or a `fused` chain) over broadcasting inputs, so intermediates stay in cache.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "lucid/fastmath.h"
#include "lucid/half.h"
#include "lucid/kernels.h"
#include "lucid/optim.h"
#include "lucid/parallel.h"
#include "lucid/row_sums.h"
#include "lucid/sgemm.h"

namespace lucid {

namespace {

constexpr int64_t kBlock = 1024;
// Below this many output elements a second thread's wake-up costs more than it saves. Only
// chains with an op that is slow per element are split: a chain of adds and multiplies is bound
// by memory bandwidth, and a second thread there only slows the GEMMs around it (measured on
// workload A's SGD step: 0.73 -> 1.05 ms).
constexpr int64_t kParallelMinElements = 1 << 16;
// A memory-bound chain this large is split too: one core streams well below the memory
// bandwidth (workload G's momentum update of its 2.36M-element convolution weights, ~47 MB of
// traffic, ran at ~12 GB/s on one thread), and at this size a worker's wake-up is noise. Workload
// A's largest update (200k elements) stays on one thread.
constexpr int64_t kParallelMemoryBoundMinElements = 1 << 18;
constexpr int kMaxDims = 16;
// Inputs of one instruction whose broadcast views may be expanded per period (more stay with
// load_block).
constexpr size_t kMaxInputs = 32;

template <class T>
using U = std::make_unsigned_t<T>;

// Signed integer overflow wraps (two's complement) instead of being undefined.
template <class T>
inline T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U<T>>(a) + static_cast<U<T>>(b));
  else return a + b;
}
template <class T>
inline T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U<T>>(a) - static_cast<U<T>>(b));
  else return a - b;
}
template <class T>
inline T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<U<T>>(a) * static_cast<U<T>>(b));
  else return a * b;
}

template <class T>
void unary_numeric(Op op, const T* a, T* o, int64_t n) {
  switch (op) {
    case Op::neg: for (int64_t i = 0; i < n; ++i) o[i] = wrap_sub(T(0), a[i]); break;
    // abs and sign of -0 are +0 (numpy, PyTorch, eager Lucid): 1 / abs(-0.0) is +inf.
    case Op::abs:
      if constexpr (std::is_floating_point_v<T>) for (int64_t i = 0; i < n; ++i) o[i] = std::fabs(a[i]);
      else for (int64_t i = 0; i < n; ++i) o[i] = a[i] < 0 ? wrap_sub(T(0), a[i]) : a[i];
      break;
    case Op::sign:  // NaN stays NaN
      for (int64_t i = 0; i < n; ++i)
        o[i] = a[i] > 0 ? T(1) : (a[i] < 0 ? T(-1) : (a[i] == 0 ? T(0) : a[i]));
      break;
    case Op::square: for (int64_t i = 0; i < n; ++i) o[i] = wrap_mul(a[i], a[i]); break;
    case Op::relu: for (int64_t i = 0; i < n; ++i) o[i] = relu(a[i]); break;
    default: throw std::logic_error("unary op not handled");
  }
}

template <class T>
void unary_float(Op op, const T* a, void* out, int64_t n) {
  T* o = static_cast<T*>(out);
  uint8_t* ob = static_cast<uint8_t*>(out);
  switch (op) {
    case Op::exp:
      if constexpr (std::is_same_v<T, float>) for (int64_t i = 0; i < n; ++i) o[i] = fast_expf(a[i]);
      else for (int64_t i = 0; i < n; ++i) o[i] = std::exp(a[i]);
      break;
    case Op::expm1: for (int64_t i = 0; i < n; ++i) o[i] = std::expm1(a[i]); break;
    case Op::log: for (int64_t i = 0; i < n; ++i) o[i] = std::log(a[i]); break;
    case Op::log1p: for (int64_t i = 0; i < n; ++i) o[i] = std::log1p(a[i]); break;
    case Op::sqrt: for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(a[i]); break;
    case Op::rsqrt: for (int64_t i = 0; i < n; ++i) o[i] = T(1) / std::sqrt(a[i]); break;
    case Op::reciprocal: for (int64_t i = 0; i < n; ++i) o[i] = T(1) / a[i]; break;
    case Op::sin: for (int64_t i = 0; i < n; ++i) o[i] = std::sin(a[i]); break;
    case Op::cos: for (int64_t i = 0; i < n; ++i) o[i] = std::cos(a[i]); break;
    case Op::tan: for (int64_t i = 0; i < n; ++i) o[i] = std::tan(a[i]); break;
    case Op::tanh: for (int64_t i = 0; i < n; ++i) o[i] = std::tanh(a[i]); break;
    case Op::sigmoid:
      if constexpr (std::is_same_v<T, float>)
        for (int64_t i = 0; i < n; ++i) o[i] = 1.0f / (1.0f + fast_expf(-a[i]));
      else for (int64_t i = 0; i < n; ++i) o[i] = T(1) / (T(1) + std::exp(-a[i]));
      break;
    case Op::erf:
      if constexpr (std::is_same_v<T, float>) for (int64_t i = 0; i < n; ++i) o[i] = fast_erff(a[i]);
      else for (int64_t i = 0; i < n; ++i) o[i] = std::erf(a[i]);
      break;
    case Op::floor: for (int64_t i = 0; i < n; ++i) o[i] = std::floor(a[i]); break;
    case Op::ceil: for (int64_t i = 0; i < n; ++i) o[i] = std::ceil(a[i]); break;
    case Op::round: for (int64_t i = 0; i < n; ++i) o[i] = std::nearbyint(a[i]); break;
    case Op::isnan: for (int64_t i = 0; i < n; ++i) ob[i] = std::isnan(a[i]); break;
    case Op::isinf: for (int64_t i = 0; i < n; ++i) ob[i] = std::isinf(a[i]); break;
    case Op::isfinite: for (int64_t i = 0; i < n; ++i) ob[i] = std::isfinite(a[i]); break;
    default: unary_numeric<T>(op, a, o, n);
  }
}

// Python's (and numpy's, and PyTorch's) float divmod: the remainder from fmod, carrying the sign
// of b, and the quotient (a - remainder) / b snapped to the nearest integer. floor(a / b) rounds
// the quotient first: 1 // 0.1 would be 10 (9 in eager Lucid), -1 // inf -0 (-1), inf // 2 -inf
// (NaN: fmod(inf, 2) is NaN).
template <class T>
inline T float_divmod(T a, T b, T* remainder) {
  T mod = std::fmod(a, b);
  if (b == 0) {  // IEEE: a / b, and the NaN of fmod
    *remainder = mod;
    return a / b;
  }
  T div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= T(1);
    }
  } else {
    mod = std::copysign(T(0), b);
  }
  T floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
  } else {
    floordiv = std::copysign(T(0), a / b);
  }
  *remainder = mod;
  return floordiv;
}

template <class T>
inline T floor_div(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if (b == -1) return wrap_sub(T(0), a);
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  } else {
    T mod;
    return float_divmod(a, b, &mod);
  }
}

template <class T>
inline T py_mod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0 || b == -1) return 0;
    T r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  } else {
    T mod;
    float_divmod(a, b, &mod);
    return mod;
  }
}

template <class T>
inline T nan_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}
template <class T>
inline T nan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

template <class T>
void binary(Op op, const T* a, const T* b, void* out, int64_t n) {
  T* o = static_cast<T*>(out);
  uint8_t* ob = static_cast<uint8_t*>(out);
  switch (op) {
    case Op::add: for (int64_t i = 0; i < n; ++i) o[i] = wrap_add(a[i], b[i]); return;
    case Op::sub: for (int64_t i = 0; i < n; ++i) o[i] = wrap_sub(a[i], b[i]); return;
    case Op::mul: for (int64_t i = 0; i < n; ++i) o[i] = wrap_mul(a[i], b[i]); return;
    case Op::maximum: for (int64_t i = 0; i < n; ++i) o[i] = nan_max(a[i], b[i]); return;
    case Op::minimum: for (int64_t i = 0; i < n; ++i) o[i] = nan_min(a[i], b[i]); return;
    case Op::floor_divide: for (int64_t i = 0; i < n; ++i) o[i] = floor_div(a[i], b[i]); return;
    case Op::remainder: for (int64_t i = 0; i < n; ++i) o[i] = py_mod(a[i], b[i]); return;
    case Op::eq: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] == b[i]; return;
    case Op::ne: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] != b[i]; return;
    case Op::lt: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] < b[i]; return;
    case Op::le: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] <= b[i]; return;
    case Op::gt: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] > b[i]; return;
    case Op::ge: for (int64_t i = 0; i < n; ++i) ob[i] = a[i] >= b[i]; return;
    case Op::logical_and: for (int64_t i = 0; i < n; ++i) ob[i] = (a[i] != 0) & (b[i] != 0); return;
    case Op::logical_or: for (int64_t i = 0; i < n; ++i) ob[i] = (a[i] != 0) | (b[i] != 0); return;
    case Op::logical_xor: for (int64_t i = 0; i < n; ++i) ob[i] = (a[i] != 0) ^ (b[i] != 0); return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case Op::div: for (int64_t i = 0; i < n; ++i) o[i] = a[i] / b[i]; return;
      case Op::pow: for (int64_t i = 0; i < n; ++i) o[i] = std::pow(a[i], b[i]); return;
      case Op::atan2: for (int64_t i = 0; i < n; ++i) o[i] = std::atan2(a[i], b[i]); return;
      default: break;
    }
  }
  throw std::logic_error("binary op not handled");
}

template <class S, class D>
inline D convert(S x) {
  if constexpr (std::is_same_v<D, uint8_t>) {
    return x != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    // NaN -> 0 and saturation: defined results where a plain C++ cast is undefined.
    constexpr double hi = static_cast<double>(std::numeric_limits<D>::max());
    constexpr double lo = static_cast<double>(std::numeric_limits<D>::min());
    double v = static_cast<double>(x);
    if (v != v) return 0;
    if (v >= hi) return std::numeric_limits<D>::max();
    if (v <= lo) return std::numeric_limits<D>::min();
    return static_cast<D>(v);
  } else {
    return static_cast<D>(x);
  }
}

template <class S>
void cast_from(const S* a, DType to, void* out, int64_t n) {
  dispatch_dtype(to, [&](auto d) {
    using D = decltype(d);
    D* o = static_cast<D*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = convert<S, D>(a[i]);
  });
}

// A cast from or to half: through float32 in blocks (widening half is exact; rounding to half
// reads the source's exact value).
void cast_half(DType from, const void* a, DType to, void* out, int64_t n) {
  if (is_half(to)) return cast_to_half(a, from, to, static_cast<uint16_t*>(out), n);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  if (to == DType::F32) return half_to_f32_n(x, from, static_cast<float*>(out), n);
  if (to == DType::F64 && from == DType::F16) {
    // Bit by bit, as numpy widens float16: the hardware float32 -> float64 conversion would
    // quiet a signaling NaN (which ml_dtypes does for bfloat16, so that one goes through it).
    double* o = static_cast<double*>(out);
    for (int64_t i = 0; i < n; ++i) {
      const float f = from == DType::F16 ? f16_to_f32(x[i]) : bf16_to_f32(x[i]);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint64_t nan = (uint64_t(u >> 31) << 63) | (uint64_t(0x7ff) << 52) |
                           (uint64_t(u & 0x7fffffu) << 29);
      double d = f;
      if (std::isnan(f)) std::memcpy(&d, &nan, 8);
      o[i] = d;
    }
    return;
  }
  constexpr int64_t kBlock = 256;
  float wide[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    half_to_f32_n(x + i, from, wide, m);
    cast_from<float>(wide, to, static_cast<uint8_t*>(out) + i * dtype_size(to), m);
  }
}

template <class T>
void select_bytes(const uint8_t* c, const void* a, const void* b, void* out, int64_t n) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
  // Both values are loaded unconditionally so the compiler emits a blend, not a branch: a
  // data-dependent branch (a ReLU mask) mispredicts half the time.
  for (int64_t i = 0; i < n; ++i) {
    T xv = x[i], yv = y[i];
    o[i] = c[i] ? xv : yv;
  }
}

template <class T>
[[gnu::always_inline]] inline void normalize_body(const void* const* a, T eps, void* out,
                                                  int64_t n) {
  const T *x = static_cast<const T*>(a[0]), *m = static_cast<const T*>(a[1]),
          *v = static_cast<const T*>(a[2]), *g = static_cast<const T*>(a[3]),
          *b = static_cast<const T*>(a[4]);
  T* o = static_cast<T*>(out);
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) o[i] = (x[i] - m[i]) / std::sqrt(v[i] + eps) * g[i] + b[i];
}

template <class T>
void normalize_baseline(const void* const* a, T eps, void* out, int64_t n) {
  normalize_body(a, eps, out, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
// BatchNorm's forward: a square root and a division per element, which the baseline build does
// four floats at a time. The AVX2 and AVX-512 copies compile the same source (no FMA
// contraction; square root and division are correctly rounded), so they give the same bits.
template <class T>
__attribute__((target("avx2,fma"))) void normalize_avx2(const void* const* a, T eps, void* out,
                                                        int64_t n) {
  normalize_body(a, eps, out, n);
}
template <class T>
LUCID_TARGET_AVX512 void normalize_avx512(const void* const* a, T eps, void* out, int64_t n) {
  normalize_body(a, eps, out, n);
}
#endif

template <class T>
void normalize(const void* const* a, T eps, void* out, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (sgemm_isa() == 2) return normalize_avx512(a, eps, out, n);
  if (avx2) return normalize_avx2(a, eps, out, n);
#endif
  normalize_baseline(a, eps, out, n);
}

// arg_scalar[j]: argument j is a 0-d input (its block holds copies of one value).
void eval_node(const ExprNode& node, const DType* arg_dtypes, const void* const* args,
               const bool* arg_scalar, void* out, int64_t n) {
  DType d = arg_dtypes[0];
  if (node.dtype == DType::F32 && is_binary(node.op) && d == DType::F32 &&
      arg_dtypes[1] == DType::F32 && arg_scalar[0] != arg_scalar[1]) {
    const int v = arg_scalar[0] ? 1 : 0;  // the operand that varies
    const float s = *static_cast<const float*>(args[1 - v]);
    if (f32_elementwise_scalar(node.op, static_cast<const float*>(args[v]), s, v == 1,
                               static_cast<float*>(out), n))
      return;
  }
  if (node.op == Op::cast && (is_half(d) || is_half(node.dtype))) {
    cast_half(d, args[0], node.dtype, out, n);
    return;
  }
  if (node.op == Op::cast) {
    dispatch_dtype(d, [&](auto t) {
      using T = decltype(t);
      cast_from<T>(static_cast<const T*>(args[0]), node.dtype, out, n);
    });
    return;
  }
  if (node.dtype == DType::F32) {
    auto f = [&](int i) { return static_cast<const float*>(args[i]); };
    float* o = static_cast<float*>(out);
    if (node.op == Op::select) {
      if (arg_dtypes[1] == DType::F32 &&
          f32_elementwise(Op::select, f(1), f(2), static_cast<const uint8_t*>(args[0]), o, n))
        return;
    } else if (d == DType::F32 && (is_unary(node.op) || is_binary(node.op))) {
      if (f32_elementwise(node.op, f(0), is_unary(node.op) ? nullptr : f(1), nullptr, o, n))
        return;
    }
  }
  if (node.op == Op::select) {
    const uint8_t* c = static_cast<const uint8_t*>(args[0]);
    switch (dtype_size(arg_dtypes[1])) {
      case 1: select_bytes<uint8_t>(c, args[1], args[2], out, n); break;
      case 4: select_bytes<uint32_t>(c, args[1], args[2], out, n); break;
      default: select_bytes<uint64_t>(c, args[1], args[2], out, n); break;
    }
    return;
  }
  if (node.op == Op::normalize) {
    if (d == DType::F32) normalize<float>(args, static_cast<float>(node.fparam), out, n);
    else normalize<double>(args, node.fparam, out, n);
    return;
  }
  if (node.op == Op::logical_not) {
    const uint8_t* a = static_cast<const uint8_t*>(args[0]);
    uint8_t* o = static_cast<uint8_t*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = !a[i];
    return;
  }
  dispatch_dtype(d, [&](auto t) {
    using T = decltype(t);
    const T* a = static_cast<const T*>(args[0]);
    if (is_unary(node.op)) {
      if constexpr (std::is_floating_point_v<T>) unary_float<T>(node.op, a, out, n);
      else unary_numeric<T>(node.op, a, static_cast<T*>(out), n);
    } else {
      binary<T>(node.op, a, static_cast<const T*>(args[1]), out, n);
    }
  });
}

bool is_slow_per_element(Op op) {
  switch (op) {
    case Op::div: case Op::sqrt: case Op::rsqrt: case Op::reciprocal: case Op::exp:
    case Op::expm1: case Op::log: case Op::log1p: case Op::sin: case Op::cos: case Op::tan:
    case Op::tanh: case Op::sigmoid: case Op::erf: case Op::pow: case Op::atan2:
    case Op::normalize:
      return true;
    default:
      return false;
  }
}

// An input's broadcast view over the collapsed output dimensions.
struct InputView {
  int slot;
  size_t esize;
  bool direct;  // same shape as the output: read in place
  bool scalar;  // one element: filled once
  std::vector<int64_t> strides;
  int64_t extent = 0;  // elements in the input's buffer
  // Elements of one period when the leading collapsed dims are broadcast (stride 0) and the rest
  // is small: element i of the broadcast view is element i % period of the first period, which
  // run() expands once (0: read through load_block per block).
  int64_t period = 0;
};

// A BatchNorm operand [1, C, 1, 1] over [N, C, H, W] collapses to strides [0, 1, 0]: load_block
// would fill one run of H*W copies at a time (runs of 4 or 16 elements on a ResNet's late
// stages, ~10 cycles each), so such views are expanded once per run when one period (C*H*W
// elements) is at most this large, and blocks then read the expansion in place.
constexpr int64_t kMaxBroadcastPeriod = 1 << 14;

int64_t broadcast_period(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                         int64_t total) {
  size_t lead = 0;
  while (lead < dims.size() && strides[lead] == 0) ++lead;
  if (lead == 0 || lead == dims.size()) return 0;
  int64_t period = 1;
  for (size_t d = lead; d < dims.size(); ++d) period *= dims[d];
  return period <= kMaxBroadcastPeriod && 2 * period <= total ? period : 0;
}

void fill_elements(uint8_t* dst, const uint8_t* src, int64_t count, size_t esize) {
  switch (esize) {
    case 1: std::memset(dst, *src, static_cast<size_t>(count)); break;
    case 2: { uint16_t v; std::memcpy(&v, src, 2); std::fill_n(reinterpret_cast<uint16_t*>(dst), count, v); break; }
    case 4: { uint32_t v; std::memcpy(&v, src, 4); std::fill_n(reinterpret_cast<uint32_t*>(dst), count, v); break; }
    default: { uint64_t v; std::memcpy(&v, src, 8); std::fill_n(reinterpret_cast<uint64_t*>(dst), count, v); break; }
  }
}

void load_block(const InputView& v, const std::vector<int64_t>& dims, const uint8_t* base,
                int64_t start, int64_t n, uint8_t* dst) {
  int r = static_cast<int>(dims.size());
  int64_t idx[kMaxDims];
  int64_t off = 0, rem = start;
  for (int d = r - 1; d >= 0; --d) {
    idx[d] = rem % dims[d];
    rem /= dims[d];
    off += idx[d] * v.strides[d];
  }
  const int64_t inner = dims[r - 1], s = v.strides[r - 1];
  while (n > 0) {
    int64_t run = std::min(n, inner - idx[r - 1]);
    if (s == 1) std::memcpy(dst, base + off * v.esize, run * v.esize);
    else fill_elements(dst, base + off * v.esize, run, v.esize);
    dst += run * v.esize;
    n -= run;
    idx[r - 1] += run;
    off += run * s;
    for (int d = r - 1; d > 0 && idx[d] == dims[d]; --d) {
      idx[d] = 0;
      off -= dims[d] * v.strides[d];
      ++idx[d - 1];
      off += v.strides[d - 1];
    }
  }
}

// Runs longer than this are not summed on the fly (their buffer would leave L2); shorter runs
// than kMinReducedRun neither: summing 2 x 2 or 4 x 4 planes block by block cost more than the
// pass it saves (the channel sums walk them faster on their own).
constexpr int64_t kMaxReducedRun = 1 << 16;
constexpr int64_t kMinReducedRun = 64;

// out[r] = sum_run of run r of `runs` runs of `len` floats; the AVX-512 copy compiles the same
// source (no FMA contraction), so both give the same bits.
// Short runs (BatchNorm over 1 x 1 to 4 x 4 planes) get a compile-time length, so sum_run's
// tail loop unrolls and the runs' additions overlap.
template <int64_t kLen>
[[gnu::always_inline]] inline void sum_runs_of(const float* x, int64_t runs, int64_t len,
                                               double* out) {
  const int64_t n = kLen > 0 ? kLen : len;
  for (int64_t r = 0; r < runs; ++r) out[r] = sum_run(x + r * n, n);
}
[[gnu::always_inline]] inline void sum_runs_body(const float* x, int64_t runs, int64_t len,
                                                 double* out) {
  switch (len) {
    case 1: return sum_runs_of<1>(x, runs, len, out);
    case 2: return sum_runs_of<2>(x, runs, len, out);
    case 4: return sum_runs_of<4>(x, runs, len, out);
    case 16: return sum_runs_of<16>(x, runs, len, out);
    default: return sum_runs_of<0>(x, runs, len, out);
  }
}
void sum_runs_baseline(const float* x, int64_t runs, int64_t len, double* out) {
  sum_runs_body(x, runs, len, out);
}
LUCID_TARGET_AVX512 void sum_runs_avx512(const float* x, int64_t runs, int64_t len, double* out) {
  sum_runs_body(x, runs, len, out);
}
void sum_runs(bool wide, const float* x, int64_t runs, int64_t len, double* out) {
  if (wide) sum_runs_avx512(x, runs, len, out);
  else sum_runs_baseline(x, runs, len, out);
}

struct ElementwisePlan {
  std::vector<int64_t> dims;  // collapsed output dims
  int64_t total = 0;
  std::vector<InputView> inputs;
  std::vector<ExprNode> nodes;
  std::vector<DType> dtypes;  // per value: inputs then nodes
  // Output slots and the node each takes. An output is written straight into its slot while
  // the block is computed unless its buffer overlaps an input that a later node still reads
  // (outputs may be in-place feeds): such an output is copied from scratch once the whole
  // block is computed, so every read of an input element happens before it is overwritten.
  std::vector<int> out_slots, out_nodes;
  // Per output: the inputs read by nodes after the output's node.
  std::vector<std::vector<int>> read_after;
  // Scratch: one region of kBlock elements of `region_esize` bytes per live value. Values share
  // regions by liveness, so a long chain (Adam's 13 nodes) keeps a few regions hot in L1
  // instead of one per node.
  std::vector<int> region;  // per value: its region, -1 for an input read in place
  int n_regions = 0;
  size_t region_esize = 1;
  bool compute_bound = false;  // has a division, root or transcendental
  size_t period_bytes = 0;  // the periodic views' expansions, each rounded up to 8 bytes

  void run(void* const* slots) const {
    if (total == 0) return;
    const uint64_t direct_mask = direct_outputs(slots);
    // Periodic broadcast views, expanded before any output is written (an output may be an
    // in-place feed); the calling thread's buffer outlives the parallel_for below.
    thread_local std::vector<uint64_t> period_store;
    const uint8_t* periods[kMaxInputs] = {};
    expand_periods(slots, period_store, periods);
    const int64_t blocks = (total + kBlock - 1) / kBlock;
    if (total < (compute_bound ? kParallelMinElements : kParallelMemoryBoundMinElements))
      return run_blocks(slots, periods, direct_mask, 0, blocks);
    parallel_for(blocks, kParallelMinElements / kBlock / 2, [&](int64_t b0, int64_t b1) {
      run_blocks(slots, periods, direct_mask, b0, b1);
    });
  }

  // run() with output `reduced` (viewed as [R0, K, R1]) summed over R0 and R1 into y[K] (its
  // mean with `mean`) instead of being written. Each run of R1 elements is evaluated whole into
  // scratch and summed by sum_run, and each channel adds its runs' sums in r0 order afterwards:
  // the bits of the elementwise step followed by reduce.cpp's channel sums, at any split.
  void run_reduced(void* const* slots, int reduced, int64_t R0, int64_t K, int64_t R1, bool mean,
                   float* y) const {
    const uint64_t direct_mask = direct_outputs(slots) & ~(uint64_t(1) << reduced);
    thread_local std::vector<uint64_t> period_store;
    const uint8_t* periods[kMaxInputs] = {};
    expand_periods(slots, period_store, periods);
    std::vector<double> run_sums(R0 * K);
    double* sums = run_sums.data();
    const bool wide = sgemm_isa() == 2;
    const int64_t grain = std::max<int64_t>(1, kParallelMinElements / 2 / std::min(R1, kBlock));
    if (R1 <= kBlock) {
      // Blocks of whole runs.
      const int64_t per_block = kBlock / R1 * R1, blocks = (total + per_block - 1) / per_block;
      auto range = [&](int64_t b, int64_t* start, int64_t* n) {
        *start = b * per_block;
        *n = std::min(per_block, total - *start);
      };
      auto sink = [&](int64_t start, int64_t n, const void* values) {
        sum_runs(wide, static_cast<const float*>(values), n / R1, R1, sums + start / R1);
      };
      auto part = [&](int64_t b0, int64_t b1) {
        run_ranges(slots, periods, direct_mask, b0, b1, range, reduced, sink);
      };
      if (total < kParallelMinElements) part(0, blocks);
      else parallel_for(blocks, std::max<int64_t>(1, grain * R1 / per_block), part);
    } else {
      // Runs longer than a block: each run's blocks in order on one thread, into a run buffer.
      const int64_t per_run = (R1 + kBlock - 1) / kBlock;
      auto range = [&](int64_t b, int64_t* start, int64_t* n) {
        const int64_t run = b / per_run, piece = b % per_run;
        *start = run * R1 + piece * kBlock;
        *n = std::min(kBlock, R1 - piece * kBlock);
      };
      parallel_for(R0 * K, std::max<int64_t>(1, kParallelMinElements / R1), [&](int64_t r0, int64_t r1) {
        thread_local std::vector<float> run_buffer;
        if (static_cast<int64_t>(run_buffer.size()) < R1) run_buffer.resize(R1);
        float* buf = run_buffer.data();
        auto sink = [&](int64_t start, int64_t n, const void* values) {
          const int64_t run = start / R1, at = start - run * R1;
          std::memcpy(buf + at, values, static_cast<size_t>(n) * sizeof(float));
          if (at + n == R1) sum_runs(wide, buf, 1, R1, sums + run);
        };
        run_ranges(slots, periods, direct_mask, r0 * per_run, r1 * per_run, range, reduced, sink);
      });
    }
    const double count = static_cast<double>(R0 * R1);
    for (int64_t k = 0; k < K; ++k) {
      double a = 0;
      for (int64_t r = 0; r < R0; ++r) a += sums[r * K + k];
      if (mean) a /= count;
      y[k] = static_cast<float>(a);
    }
  }

  // Which outputs go straight into their slot (decided per run: buffers differ per run).
  uint64_t direct_outputs(void* const* slots) const {
    uint64_t direct_mask = 0;
    for (size_t j = 0; j < out_slots.size(); ++j) {
      const uint8_t* o = static_cast<const uint8_t*>(slots[out_slots[j]]);
      const size_t o_bytes = static_cast<size_t>(total) * dtype_size(nodes[out_nodes[j]].dtype);
      bool clear = j < 64;
      for (int i : read_after[j]) {
        const InputView& v = inputs[i];
        const uint8_t* b = static_cast<const uint8_t*>(slots[v.slot]);
        const size_t b_bytes = static_cast<size_t>(v.scalar ? 1 : v.extent) * v.esize;
        if (o < b + b_bytes && b < o + o_bytes) clear = false;
      }
      if (clear) direct_mask |= uint64_t(1) << j;
    }
    return direct_mask;
  }

  // Elements [start, start + n) of a periodic broadcast view: in place in the expansion when
  // they do not wrap around the period, else copied into `dst` piece by piece.
  static const void* periodic_block(const InputView& v, const uint8_t* period, int64_t start,
                                    int64_t n, uint8_t* dst) {
    int64_t off = start % v.period;
    if (off + n <= v.period) return period + off * v.esize;
    uint8_t* at = dst;
    while (n > 0) {
      const int64_t run = std::min(n, v.period - off);
      std::memcpy(at, period + off * v.esize, static_cast<size_t>(run) * v.esize);
      at += run * v.esize;
      n -= run;
      off = 0;
    }
    return dst;
  }

  // Blocks [b0, b1) of the output; scratch is per thread, so parts run concurrently.
  void run_blocks(void* const* slots, const uint8_t* const* periods, uint64_t direct_mask,
                  int64_t b0, int64_t b1) const {
    run_ranges(
        slots, periods, direct_mask, b0, b1,
        [&](int64_t b, int64_t* start, int64_t* n) {
          *start = b * kBlock;
          *n = std::min(kBlock, total - *start);
        },
        -1, [](int64_t, int64_t, const void*) {});
  }

  // Periodic views expanded for one run (see run()); `store` keeps them.
  void expand_periods(void* const* slots, std::vector<uint64_t>& store,
                      const uint8_t** periods) const {
    if (period_bytes == 0) return;
    if (store.size() < period_bytes / 8 + inputs.size()) store.resize(period_bytes / 8 + inputs.size());
    uint8_t* at = reinterpret_cast<uint8_t*>(store.data());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const InputView& v = inputs[i];
      if (v.period == 0) continue;
      load_block(v, dims, static_cast<const uint8_t*>(slots[v.slot]), 0, v.period, at);
      periods[i] = at;
      at += (v.period * v.esize + 7) / 8 * 8;
    }
  }

  // Blocks [b0, b1), block b being elements [start, start + n) (n <= kBlock) as range(b)
  // says; output `reduced` (-1: none) is computed into scratch and handed to sink(start, n,
  // values) instead of being written.
  template <class Range, class Sink>
  void run_ranges(void* const* slots, const uint8_t* const* periods, uint64_t direct_mask,
                  int64_t b0, int64_t b1, Range&& range, int reduced, Sink&& sink) const {
    const size_t n_in = inputs.size(), n_val = n_in + nodes.size();
    const size_t region_bytes = static_cast<size_t>(kBlock) * region_esize;
    thread_local std::vector<uint64_t> scratch;
    const size_t words = (n_regions * region_bytes + 7) / 8;
    if (scratch.size() < words) scratch.resize(words);
    uint8_t* base_scratch = reinterpret_cast<uint8_t*>(scratch.data());
    auto area = [&](size_t v) { return base_scratch + region[v] * region_bytes; };
    thread_local std::vector<const void*> ptr;
    if (ptr.size() < n_val) ptr.resize(n_val);
    // Per node: the output slot it writes straight into (null: its scratch region).
    thread_local std::vector<uint8_t*> direct_out;
    direct_out.assign(nodes.size(), nullptr);
    for (size_t j = 0; j < out_slots.size(); ++j)
      if (direct_mask >> j & 1)
        direct_out[out_nodes[j]] = static_cast<uint8_t*>(slots[out_slots[j]]);
    const void* args[5];
    DType arg_dtypes[5];
    bool arg_scalar[5];
    for (size_t i = 0; i < n_in; ++i)
      if (inputs[i].scalar) {
        fill_elements(area(i), static_cast<const uint8_t*>(slots[inputs[i].slot]),
                      std::min(total, kBlock), inputs[i].esize);
        ptr[i] = area(i);
      }
    for (int64_t b = b0; b < b1; ++b) {
      int64_t start, n;
      range(b, &start, &n);
      if (n <= 0) continue;
      for (size_t i = 0; i < n_in; ++i) {
        const InputView& v = inputs[i];
        const uint8_t* base = static_cast<const uint8_t*>(slots[v.slot]);
        if (v.direct) ptr[i] = base + start * v.esize;
        else if (v.period > 0) ptr[i] = periodic_block(v, periods[i], start, n, area(i));
        else if (!v.scalar) { load_block(v, dims, base, start, n, area(i)); ptr[i] = area(i); }
      }
      for (size_t k = 0; k < nodes.size(); ++k) {
        const ExprNode& node = nodes[k];
        for (size_t j = 0; j < node.args.size(); ++j) {
          const size_t a = node.args[j];
          args[j] = ptr[a];
          arg_dtypes[j] = dtypes[a];
          arg_scalar[j] = a < n_in && inputs[a].scalar;
        }
        void* dst = direct_out[k] ? direct_out[k] + start * dtype_size(node.dtype)
                                  : static_cast<void*>(area(n_in + k));
        eval_node(node, arg_dtypes, args, arg_scalar, dst, n);
        ptr[n_in + k] = dst;
      }
      if (reduced >= 0) sink(start, n, ptr[n_in + out_nodes[reduced]]);
      for (size_t j = 0; j < out_slots.size(); ++j) {
        if (direct_mask >> j & 1 || static_cast<int>(j) == reduced) continue;
        const size_t es = dtype_size(nodes[out_nodes[j]].dtype);
        std::memcpy(static_cast<uint8_t*>(slots[out_slots[j]]) + start * es,
                    area(n_in + out_nodes[j]), static_cast<size_t>(n) * es);
      }
    }
  }

  // Regions by liveness: an input that is not read in place holds its region for the whole
  // block; a node's region is free again after its last reader has run (an output's only at the
  // block's end, as it may be copied out then). A node never takes an argument's region, so
  // a cast to a wider type never overwrites what it reads.
  void assign_regions() {
    const size_t n_in = inputs.size(), n_val = n_in + nodes.size();
    std::vector<size_t> last_use(n_val, 0);
    for (size_t k = 0; k < nodes.size(); ++k)
      for (int a : nodes[k].args) last_use[a] = std::max(last_use[a], n_in + k);
    for (int o : out_nodes) last_use[n_in + o] = n_val;
    region.assign(n_val, -1);
    std::vector<int> free_regions;
    for (size_t i = 0; i < n_in; ++i) {
      if (inputs[i].direct) continue;
      region[i] = n_regions++;
      region_esize = std::max(region_esize, inputs[i].esize);
    }
    for (size_t k = 0; k < nodes.size(); ++k) {
      const size_t v = n_in + k;
      region_esize = std::max(region_esize, dtype_size(nodes[k].dtype));
      if (free_regions.empty()) {
        region[v] = n_regions++;
      } else {
        region[v] = free_regions.back();
        free_regions.pop_back();
      }
      for (size_t j = 0; j < nodes[k].args.size(); ++j) {
        const int a = nodes[k].args[j];
        bool repeat = false;  // mul(g, g) frees g's region once
        for (size_t i = 0; i < j; ++i) repeat |= nodes[k].args[i] == a;
        if (!repeat && static_cast<size_t>(a) >= n_in && last_use[a] == v)
          free_regions.push_back(region[a]);
      }
      // A node nobody reads (and no output takes) frees its region at once.
      if (last_use[v] == 0) free_regions.push_back(region[v]);
    }
  }
};

std::shared_ptr<ElementwisePlan> plan_elementwise(const Program& p, const Instr& in) {
  auto plan = std::make_shared<ElementwisePlan>();
  const Slot& out = p.slots[in.out[0]];
  plan->nodes = decode_expr(p, in);
  plan->out_slots = in.out;
  plan->out_nodes = expr_outputs(in, plan->nodes.size());
  plan->total = out.size();
  const size_t rank = out.shape.size();
  // Broadcast strides of every input, right-aligned on the output shape (0 on broadcast dims).
  std::vector<std::vector<int64_t>> strides;
  for (int s : in.in) {
    const Shape& sh = p.slots[s].shape;
    std::vector<int64_t> cs = contiguous_strides(sh), st(rank, 0);
    for (size_t d = 0; d < sh.size(); ++d)
      st[rank - sh.size() + d] = sh[d] == 1 ? 0 : cs[d];
    strides.push_back(st);
    plan->dtypes.push_back(p.slots[s].dtype);
  }
  for (const ExprNode& node : plan->nodes) {
    plan->dtypes.push_back(node.dtype);
    plan->compute_bound |= is_slow_per_element(node.op);
  }
  // Collapse dims: drop size-1 dims, merge neighbours that are contiguous for every input.
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> cst(in.in.size());
  for (size_t d = 0; d < rank; ++d) {
    if (out.shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t i = 0; merge && i < in.in.size(); ++i)
      if (cst[i].back() != strides[i][d] * out.shape[d]) merge = false;
    if (merge) {
      dims.back() *= out.shape[d];
      for (size_t i = 0; i < in.in.size(); ++i) cst[i].back() = strides[i][d];
    } else {
      dims.push_back(out.shape[d]);
      for (size_t i = 0; i < in.in.size(); ++i) cst[i].push_back(strides[i][d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (auto& c : cst) c.push_back(0);
  }
  plan->dims = dims;
  for (size_t i = 0; i < in.in.size(); ++i) {
    const Slot& s = p.slots[in.in[i]];
    InputView v{in.in[i], dtype_size(s.dtype), s.size() == out.size(), s.size() == 1, cst[i],
                s.size()};
    if (v.direct && v.scalar) v.scalar = false;
    if (!v.direct && !v.scalar && in.in.size() <= kMaxInputs) {
      v.period = broadcast_period(dims, v.strides, plan->total);
      plan->period_bytes += (v.period * v.esize + 7) / 8 * 8;
    }
    plan->inputs.push_back(v);
  }
  const size_t n_in = in.in.size();
  plan->read_after.resize(plan->out_nodes.size());
  for (size_t j = 0; j < plan->out_nodes.size(); ++j)
    for (size_t k = plan->out_nodes[j] + 1; k < plan->nodes.size(); ++k)
      for (int a : plan->nodes[k].args)
        if (static_cast<size_t>(a) < n_in) plan->read_after[j].push_back(a);
  plan->assign_regions();
  return plan;
}

// Ops whose float32 result is one correctly rounded value per element, whatever the block
// boundaries (no approximated transcendental whose vector body and tail could differ).
bool exactly_rounded(Op op) {
  switch (op) {
    case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::neg: case Op::abs:
    case Op::square: case Op::relu: case Op::sqrt: case Op::maximum: case Op::minimum:
    case Op::select: case Op::eq: case Op::ne: case Op::lt: case Op::le: case Op::gt:
    case Op::ge: case Op::normalize:
      return true;
    default:
      return false;
  }
}

}  // namespace

Step make_elementwise_step(const Program& p, const Instr& in) {
  std::shared_ptr<ElementwisePlan> plan = plan_elementwise(p, in);
  Step generic = [plan](void* const* slots) { plan->run(slots); };
  if (Step update = make_update_step(p, in, plan->nodes, plan->out_nodes, generic)) return update;
  return generic;
}

namespace {
std::atomic<bool>& fused_reductions_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("LUCID_FUSED_REDUCTIONS");
    return !(env && std::strcmp(env, "0") == 0);
  }()};
  return on;
}
}  // namespace

bool fused_reductions_enabled() { return fused_reductions_flag().load(); }
void set_fused_reductions(bool on) { fused_reductions_flag().store(on); }

Step make_elementwise_reduce_step(const Program& p, const Instr& ew, int out_index,
                                  const Instr& red) {
  int64_t R0, K, R1;
  if (out_index < 0 || out_index >= 64 || static_cast<size_t>(out_index) >= ew.out.size() ||
      red.in[0] != ew.out[out_index] || !reduce_channel_view(p, red, &R0, &K, &R1) ||
      R1 < kMinReducedRun || R1 > kMaxReducedRun || R0 * K * R1 == 0)
    return {};
  std::shared_ptr<ElementwisePlan> plan = plan_elementwise(p, ew);
  if (plan->total != R0 * K * R1 || plan->nodes[plan->out_nodes[out_index]].dtype != DType::F32)
    return {};
  for (const ExprNode& n : plan->nodes)
    if (!exactly_rounded(n.op)) return {};
  Step generic = [plan](void* const* slots) { plan->run(slots); };
  if (make_update_step(p, ew, plan->nodes, plan->out_nodes, generic)) return {};
  const bool mean = red.op == Op::reduce_mean;
  const int y = red.out[0];
  return [plan, out_index, R0, K, R1, mean, y](void* const* slots) {
    plan->run_reduced(slots, out_index, R0, K, R1, mean, static_cast<float*>(slots[y]));
  };
}

}  // namespace lucid
