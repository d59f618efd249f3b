// Reductions (sum, mean, max, min, prod, variance, argmax/argmin), softmax and cumsum.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "lucid/fastmath.h"
#include "lucid/kernels.h"
#include "lucid/parallel.h"
#include "lucid/row_sums.h"
#include "lucid/sgemm.h"

namespace lucid {

namespace {

constexpr int kMaxDims = 16;
// A softmax over fewer elements runs on the calling thread (its exp pass is compute-bound, so
// larger ones are split by rows across the worker pool, like compute-bound elementwise chains).
constexpr int64_t kSoftmaxParallelMinElements = 1 << 16;

template <class T>
T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>) return fast_expf(x);
  else return std::exp(x);
}

// The input's dims merged into alternating kept/reduced groups; the input is walked in memory order.
struct ReducePlan {
  Op op;
  int in, out;
  DType dtype;
  std::vector<int64_t> dims, out_strides;  // out_strides is 0 on reduced groups
  int64_t in_total = 0, out_total = 0, count = 1;
};

std::shared_ptr<ReducePlan> plan_reduce(const Program& p, const Instr& in) {
  auto r = std::make_shared<ReducePlan>();
  const Slot& x = p.slots[in.in[0]];
  r->op = in.op;
  r->in = in.in[0];
  r->out = in.out[0];
  r->dtype = x.dtype;
  std::vector<bool> red(x.shape.size(), false);
  for (int64_t a : attr_ints(in, "axes")) {
    if (x.shape.empty()) break;
    red[normalize_axis(a, static_cast<int64_t>(x.shape.size()))] = true;
  }
  std::vector<bool> kinds;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (red[d]) r->count *= x.shape[d];
    if (x.shape[d] == 1) continue;
    if (!kinds.empty() && kinds.back() == red[d]) r->dims.back() *= x.shape[d];
    else { r->dims.push_back(x.shape[d]); kinds.push_back(red[d]); }
  }
  if (r->dims.empty()) { r->dims.push_back(1); kinds.push_back(false); }
  r->out_strides.assign(r->dims.size(), 0);
  int64_t acc = 1;
  for (size_t d = r->dims.size(); d-- > 0;)
    if (!kinds[d]) { r->out_strides[d] = acc; acc *= r->dims[d]; }
  r->in_total = x.size();
  r->out_total = p.slots[r->out].size();
  return r;
}

// Calls fn(out_offset, in_offset, run, out_step) for runs along the innermost group.
template <class Fn>
void walk(const ReducePlan& r, Fn&& fn) {
  if (r.in_total == 0) return;
  const int nd = static_cast<int>(r.dims.size());
  int64_t idx[kMaxDims] = {0};
  int64_t o = 0, i = 0;
  const int64_t inner = r.dims[nd - 1], step = r.out_strides[nd - 1];
  while (i < r.in_total) {
    fn(o, i, inner, step);
    i += inner;
    for (int d = nd - 2; d >= 0; --d) {
      o += r.out_strides[d];
      if (++idx[d] < r.dims[d]) break;
      idx[d] = 0;
      o -= r.dims[d] * r.out_strides[d];
    }
  }
}

// Sums (and sums of squared deviations) of plans whose innermost group is reduced: the input is
// [R0 reduced, K kept, R1 reduced] (R0 = 1 without a leading reduced group), BatchNorm's
// statistics and gradients over (N, H, W). Each output adds its runs in memory order, as walk()
// does, and each run is sum_run's: the same bits as the walk at any thread count and ISA (no
// FMA contraction in this file). Split across the worker pool over outputs, compiled for AVX-512
// where the sgemm runs it (the baseline build converts two floats to double per instruction).
struct ChannelPlan {
  int64_t R0 = 1, K = 1, R1 = 1;
};

bool channel_plan(const ReducePlan& r, ChannelPlan* c) {
  const auto& d = r.dims;
  if (d.size() == 2 && r.out_strides[0] != 0 && r.out_strides[1] == 0) {
    *c = {1, d[0], d[1]};
    return true;
  }
  if (d.size() == 3 && r.out_strides[0] == 0 && r.out_strides[1] != 0 && r.out_strides[2] == 0) {
    *c = {d[0], d[1], d[2]};
    return true;
  }
  return false;
}

// acc[k] for k in [k0, k1): the sum of output k's runs (`mean` null) or of their squared
// deviations from mean[k]. The chunk is walked in memory order (r0 outer, channels inner): each
// acc[k] still adds its runs in r0 order (the same bits), but the channels' chains are
// independent, so short runs (2 x 2 and 4 x 4 planes: R1 = 4, 16) overlap instead of waiting on
// one add latency per element. Run lengths below one 8-lane chunk are compile-time constants so
// sum_run's tail loop unrolls.
template <class T, int64_t kRun>
[[gnu::always_inline]] inline void channel_sums_walk(const ChannelPlan& c, const T* x,
                                                     const double* mean, double* acc, int64_t k0,
                                                     int64_t k1) {
  const int64_t run_len = kRun > 0 ? kRun : c.R1;
  for (int64_t k = k0; k < k1; ++k) acc[k] = 0;
  for (int64_t r0 = 0; r0 < c.R0; ++r0) {
    const T* row = x + (r0 * c.K) * run_len;
    if (mean) {
      for (int64_t k = k0; k < k1; ++k) acc[k] += sq_dev_run(row + k * run_len, run_len, mean[k]);
    } else {
      for (int64_t k = k0; k < k1; ++k) acc[k] += sum_run(row + k * run_len, run_len);
    }
  }
}

template <class T>
[[gnu::always_inline]] inline void channel_sums_body(const ChannelPlan& c, const T* x,
                                                     const double* mean, double* acc, int64_t k0,
                                                     int64_t k1) {
  switch (c.R1) {
    case 1: return channel_sums_walk<T, 1>(c, x, mean, acc, k0, k1);
    case 2: return channel_sums_walk<T, 2>(c, x, mean, acc, k0, k1);
    case 4: return channel_sums_walk<T, 4>(c, x, mean, acc, k0, k1);
    case 16: return channel_sums_walk<T, 16>(c, x, mean, acc, k0, k1);
    default: return channel_sums_walk<T, 0>(c, x, mean, acc, k0, k1);
  }
}

template <class T>
void channel_sums_baseline(const ChannelPlan& c, const T* x, const double* mean, double* acc,
                           int64_t k0, int64_t k1) {
  channel_sums_body(c, x, mean, acc, k0, k1);
}

template <class T>
LUCID_TARGET_AVX512 void channel_sums_avx512(const ChannelPlan& c, const T* x,
                                             const double* mean, double* acc, int64_t k0,
                                             int64_t k1) {
  channel_sums_body(c, x, mean, acc, k0, k1);
}

template <class T>
void channel_sums(const ChannelPlan& c, const T* x, const double* mean, double* acc) {
  const int64_t per_output = std::max<int64_t>(1, c.R0 * c.R1);
  const bool wide = sgemm_isa() == 2;
  parallel_for(c.K, std::max<int64_t>(1, (int64_t{1} << 16) / per_output),
               [&](int64_t k0, int64_t k1) {
                 if (wide) channel_sums_avx512(c, x, mean, acc, k0, k1);
                 else channel_sums_baseline(c, x, mean, acc, k0, k1);
               });
}

template <class T>
void run_reduce(const ReducePlan& r, void* const* slots) {
  const T* x = static_cast<const T*>(slots[r.in]);
  T* y = static_cast<T*>(slots[r.out]);
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  using UAcc = std::make_unsigned_t<int64_t>;
  std::vector<Acc> acc(r.out_total);
  switch (r.op) {
    case Op::reduce_sum: case Op::reduce_mean: case Op::variance: {
      ChannelPlan cp;
      const bool channels = std::is_floating_point_v<T> && channel_plan(r, &cp);
      if constexpr (std::is_floating_point_v<T>)
        if (channels) channel_sums(cp, x, nullptr, acc.data());
      if (!channels) std::fill(acc.begin(), acc.end(), Acc(0));
      if (!channels) walk(r, [&](int64_t o, int64_t i, int64_t n, int64_t step) {
        if (step == 0) {
          Acc s = 0;
          if constexpr (std::is_integral_v<Acc>) {
            for (int64_t k = 0; k < n; ++k) s = static_cast<Acc>(UAcc(s) + UAcc(x[i + k]));
          } else {
            s = sum_run(x + i, n);
          }
          if constexpr (std::is_integral_v<Acc>) acc[o] = static_cast<Acc>(UAcc(acc[o]) + UAcc(s));
          else acc[o] += s;
        } else {
          for (int64_t k = 0; k < n; ++k) {
            if constexpr (std::is_integral_v<Acc>) acc[o + k] = static_cast<Acc>(UAcc(acc[o + k]) + UAcc(x[i + k]));
            else acc[o + k] += x[i + k];
          }
        }
      });
      if (r.op == Op::reduce_sum) {
        for (int64_t k = 0; k < r.out_total; ++k) y[k] = static_cast<T>(acc[k]);
        return;
      }
      const double cnt = static_cast<double>(r.count);
      if constexpr (std::is_floating_point_v<T>) {
        for (auto& a : acc) a /= cnt;
        if (r.op == Op::reduce_mean) {
          for (int64_t k = 0; k < r.out_total; ++k) y[k] = static_cast<T>(acc[k]);
          return;
        }
        std::vector<double> sq(r.out_total, 0.0);
        if (channels) channel_sums(cp, x, acc.data(), sq.data());
        else walk(r, [&](int64_t o, int64_t i, int64_t n, int64_t step) {
          if (step == 0) {
            sq[o] += sq_dev_run(x + i, n, acc[o]);
            return;
          }
          for (int64_t k = 0; k < n; ++k) {
            double dlt = x[i + k] - acc[o + k];
            sq[o + k] += dlt * dlt;
          }
        });
        for (int64_t k = 0; k < r.out_total; ++k) y[k] = static_cast<T>(sq[k] / cnt);
      }
      return;
    }
    case Op::reduce_prod: {
      std::fill(acc.begin(), acc.end(), Acc(1));
      walk(r, [&](int64_t o, int64_t i, int64_t n, int64_t step) {
        for (int64_t k = 0; k < n; ++k) {
          Acc& a = acc[o + k * step];
          if constexpr (std::is_integral_v<Acc>) a = static_cast<Acc>(UAcc(a) * UAcc(x[i + k]));
          else a *= x[i + k];
        }
      });
      for (int64_t k = 0; k < r.out_total; ++k) y[k] = static_cast<T>(acc[k]);
      return;
    }
    default: {  // max / min keep T: NaN propagates as in numpy
      bool is_max = r.op == Op::reduce_max;
      T init = is_max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
      if constexpr (std::is_floating_point_v<T>)
        init = is_max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
      std::fill_n(y, r.out_total, init);
      walk(r, [&](int64_t o, int64_t i, int64_t n, int64_t step) {
        for (int64_t k = 0; k < n; ++k) {
          T& a = y[o + k * step];
          T v = x[i + k];
          if (is_max ? (v > a || v != v) : (v < a || v != v)) {
            if (a == a) a = v;
          }
        }
      });
    }
  }
}

// [outer, axis, inner] view of one axis.
struct AxisGeom {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisGeom axis_geom(const Shape& s, int64_t axis_attr) {
  AxisGeom g;
  if (s.empty()) return g;
  int64_t axis = normalize_axis(axis_attr, static_cast<int64_t>(s.size()));
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) g.outer *= s[d];
    else if (d == axis) g.len = s[d];
    else g.inner *= s[d];
  }
  return g;
}

template <class T>
void run_arg(bool is_max, const AxisGeom& g, const T* x, int64_t* y) {
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t in = 0; in < g.inner; ++in) {
      const T* col = x + o * g.len * g.inner + in;
      T best = col[0];
      int64_t arg = 0;
      for (int64_t a = 1; a < g.len; ++a) {
        T v = col[a * g.inner];
        if (best != best) break;  // the first NaN wins
        if (v != v || (is_max ? v > best : v < best)) { best = v; arg = a; }
      }
      y[o * g.inner + in] = arg;
    }
}

// One row's softmax (or log_softmax): the maximum (NaN anywhere makes it NaN), exp(x - max)
// in place, the sum in double, then the scaling. Always inlined into the per-ISA copies below,
// which compile the same source (no FMA contraction), so every copy gives the same bits.
template <class T>
[[gnu::always_inline]] inline void softmax_row_body(bool log, const T* xs, T* ys, int64_t n) {
  T part[8];
  for (auto& p : part) p = -std::numeric_limits<T>::infinity();
  bool nan = false;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) {
      T v = xs[k + l];
      nan |= v != v;
      part[l] = v > part[l] ? v : part[l];
    }
  T m = -std::numeric_limits<T>::infinity();
  for (; k < n; ++k) { nan |= xs[k] != xs[k]; m = xs[k] > m ? xs[k] : m; }
  for (T p : part) m = p > m ? p : m;
  if (nan) m = std::numeric_limits<T>::quiet_NaN();
  for (k = 0; k < n; ++k) ys[k] = exp_t<T>(xs[k] - m);
  double total = sum_run(ys, n);
  if (log) {
    const T shift = static_cast<T>(m + std::log(total));
    for (k = 0; k < n; ++k) ys[k] = xs[k] - shift;
  } else {
    const T inv = static_cast<T>(1.0 / total);
    for (k = 0; k < n; ++k) ys[k] *= inv;
  }
}

template <class T>
void softmax_row_baseline(bool log, const T* xs, T* ys, int64_t n) {
  softmax_row_body(log, xs, ys, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The float32 row on 16 (AVX-512) or 8 (AVX2) lanes: one fused pass for the exponentials where
// the row went through a subtraction pass and an exp pass before (workload F's attention
// softmax, [4, 8, 128, 128], ran at ~6 cycles per element).
LUCID_TARGET_AVX512 void softmax_row_avx512(bool log, const float* xs, float* ys, int64_t n) {
  softmax_row_body(log, xs, ys, n);
}
__attribute__((target("avx2,fma"))) void softmax_row_avx2(bool log, const float* xs, float* ys,
                                                          int64_t n) {
  softmax_row_body(log, xs, ys, n);
}
#endif

using SoftmaxRowF32 = void (*)(bool, const float*, float*, int64_t);

// The float32 row kernel for this CPU; set_sgemm_isa("avx2") (LUCID_SGEMM_ISA=avx2) forces the
// AVX2 copy, as it does the GEMM's tile.
SoftmaxRowF32 softmax_row_f32() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (sgemm_isa() == 2) return &softmax_row_avx512;
  if (sgemm_supported()) return &softmax_row_avx2;
#endif
  return &softmax_row_baseline<float>;
}

template <class T>
void run_softmax(bool log, const AxisGeom& g, const T* x, T* y) {
  if (g.inner == 1) {
    // Rows are independent (each computed as one thread would): split them across the cores.
    auto rows = [&](int64_t o0, int64_t o1) {
      if constexpr (std::is_same_v<T, float>) {
        const SoftmaxRowF32 row = softmax_row_f32();
        for (int64_t o = o0; o < o1; ++o) row(log, x + o * g.len, y + o * g.len, g.len);
      } else {
        for (int64_t o = o0; o < o1; ++o)
          softmax_row_baseline(log, x + o * g.len, y + o * g.len, g.len);
      }
    };
    if (g.outer * g.len < kSoftmaxParallelMinElements) return rows(0, g.outer);
    parallel_for(g.outer, std::max<int64_t>(1, kSoftmaxParallelMinElements / 2 / g.len), rows);
    return;
  }
  std::vector<double> mx(g.inner), sum(g.inner);
  for (int64_t o = 0; o < g.outer; ++o) {
    const T* xs = x + o * g.len * g.inner;
    T* ys = y + o * g.len * g.inner;
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t a = 0; a < g.len; ++a)
      for (int64_t i = 0; i < g.inner; ++i) mx[i] = std::max<double>(mx[i], xs[a * g.inner + i]);
    for (int64_t a = 0; a < g.len; ++a)
      for (int64_t i = 0; i < g.inner; ++i) {
        T e = exp_t<T>(static_cast<T>(xs[a * g.inner + i] - mx[i]));
        if (!log) ys[a * g.inner + i] = e;
        sum[i] += e;
      }
    for (int64_t i = 0; i < g.inner; ++i) sum[i] = log ? std::log(sum[i]) : 1.0 / sum[i];
    for (int64_t a = 0; a < g.len; ++a)
      for (int64_t i = 0; i < g.inner; ++i) {
        T* v = &ys[a * g.inner + i];
        if (log) *v = static_cast<T>(xs[a * g.inner + i] - mx[i] - sum[i]);
        else *v = static_cast<T>(*v * sum[i]);
      }
  }
}

// Layer norm over rows of n elements: mean and variance accumulated in double (as reduce_mean
// does), y = (x - mean) * (1 / sqrt(var + eps)) * gamma + beta. The row stays in L1 across its
// three passes, where the prim graph (mean, centred squares, mean, normalize) made five passes
// over the whole tensor and a square root per element.
template <class T>
void layer_norm_row(const T* x, const T* gamma, const T* beta, double eps, T* y, int64_t n) {
  const T mean = static_cast<T>(sum_run(x, n) / static_cast<double>(n));
  const T var = static_cast<T>(sq_dev_run(x, n, static_cast<double>(mean)) / static_cast<double>(n));
  const T inv = static_cast<T>(1.0 / std::sqrt(static_cast<double>(var) + eps));
  for (int64_t k = 0; k < n; ++k) y[k] = (x[k] - mean) * inv * gamma[k] + beta[k];
}

template <class T>
void run_layer_norm(int64_t rows, int64_t n, const T* x, const T* gamma, const T* beta,
                    double eps, T* y) {
  auto some = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) layer_norm_row(x + r * n, gamma, beta, eps, y + r * n, n);
  };
  if (rows * n < kSoftmaxParallelMinElements || n == 0) return some(0, rows);
  parallel_for(rows, std::max<int64_t>(1, kSoftmaxParallelMinElements / 2 / n), some);
}

template <class T>
void run_cumsum(bool exclusive, bool reverse, const AxisGeom& g, const T* x, T* y) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t in = 0; in < g.inner; ++in) {
      Acc acc = 0;
      for (int64_t k = 0; k < g.len; ++k) {
        int64_t a = reverse ? g.len - 1 - k : k;
        int64_t at = (o * g.len + a) * g.inner + in;
        Acc v = static_cast<Acc>(x[at]);
        if (exclusive) { y[at] = static_cast<T>(acc); acc += v; }
        else { acc += v; y[at] = static_cast<T>(acc); }
      }
    }
}

}  // namespace

bool reduce_channel_view(const Program& p, const Instr& in, int64_t* R0, int64_t* K,
                         int64_t* R1) {
  if (in.op != Op::reduce_sum && in.op != Op::reduce_mean) return false;
  if (p.slots[in.in[0]].dtype != DType::F32 || p.slots[in.out[0]].dtype != DType::F32) return false;
  ChannelPlan c;
  if (!channel_plan(*plan_reduce(p, in), &c)) return false;
  *R0 = c.R0;
  *K = c.K;
  *R1 = c.R1;
  return true;
}

Step make_reduce_step(const Program& p, const Instr& in) {
  const Slot& x = p.slots[in.in[0]];
  int a = in.in[0], o = in.out[0];
  DType d = x.dtype;
  switch (in.op) {
    case Op::argmax: case Op::argmin: {
      AxisGeom g = axis_geom(x.shape, attr_int(in, "axis"));
      bool is_max = in.op == Op::argmax;
      return [=](void* const* s) {
        dispatch_dtype(d, [&](auto t) {
          using T = decltype(t);
          run_arg<T>(is_max, g, static_cast<const T*>(s[a]), static_cast<int64_t*>(s[o]));
        });
      };
    }
    case Op::softmax: case Op::log_softmax: {
      AxisGeom g = axis_geom(x.shape, attr_int(in, "axis"));
      bool log = in.op == Op::log_softmax;
      return [=](void* const* s) {
        if (d == DType::F32) run_softmax<float>(log, g, static_cast<const float*>(s[a]), static_cast<float*>(s[o]));
        else run_softmax<double>(log, g, static_cast<const double*>(s[a]), static_cast<double*>(s[o]));
      };
    }
    case Op::layer_norm: {
      const int64_t n = x.shape.back(), rows = n == 0 ? 0 : x.size() / n;
      const int gi = in.in[1], bi = in.in[2];
      const double eps = attr_float(in, "epsilon");
      return [=](void* const* s) {
        if (d == DType::F32)
          run_layer_norm<float>(rows, n, static_cast<const float*>(s[a]),
                                static_cast<const float*>(s[gi]), static_cast<const float*>(s[bi]),
                                eps, static_cast<float*>(s[o]));
        else
          run_layer_norm<double>(rows, n, static_cast<const double*>(s[a]),
                                 static_cast<const double*>(s[gi]),
                                 static_cast<const double*>(s[bi]), eps, static_cast<double*>(s[o]));
      };
    }
    case Op::cumsum: {
      AxisGeom g = axis_geom(x.shape, attr_int(in, "axis"));
      bool ex = attr_bool(in, "exclusive"), rev = attr_bool(in, "reverse");
      return [=](void* const* s) {
        dispatch_dtype(d, [&](auto t) {
          using T = decltype(t);
          if constexpr (!std::is_same_v<T, uint8_t>)
            run_cumsum<T>(ex, rev, g, static_cast<const T*>(s[a]), static_cast<T*>(s[o]));
        });
      };
    }
    default: {
      auto r = plan_reduce(p, in);
      return [r](void* const* s) {
        dispatch_dtype(r->dtype, [&](auto t) {
          using T = decltype(t);
          if constexpr (!std::is_same_v<T, uint8_t>) run_reduce<T>(*r, s);
        });
      };
    }
  }
}

}  // namespace lucid
