// Layout ops (reshape, transpose, broadcast, slice, concat, pad, fill), gather/scatter, one_hot,
// constants and counter-based random numbers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>

#include "lucid/half.h"
#include "lucid/kernels.h"

namespace lucid {

namespace {

constexpr int kMaxDims = 16;

// dst[index] = src[index] over `shape`, with element strides on both sides.
void copy_strided(const Shape& shape, const uint8_t* src, const std::vector<int64_t>& ss,
                  uint8_t* dst, const std::vector<int64_t>& ds, size_t esize) {
  int64_t total = numel(shape);
  if (total == 0) return;
  if (shape.empty()) { std::memcpy(dst, src, esize); return; }
  const int nd = static_cast<int>(shape.size());
  int64_t idx[kMaxDims] = {0};
  int64_t so = 0, dof = 0;
  const int64_t inner = shape[nd - 1], si = ss[nd - 1], di = ds[nd - 1];
  for (int64_t done = 0; done < total; done += inner) {
    if (si == 1 && di == 1) {
      std::memcpy(dst + dof * esize, src + so * esize, inner * esize);
    } else {
      switch (esize) {
        case 1: for (int64_t k = 0; k < inner; ++k) dst[dof + k * di] = src[so + k * si]; break;
        case 4: {
          auto* d = reinterpret_cast<uint32_t*>(dst) + dof;
          auto* s = reinterpret_cast<const uint32_t*>(src) + so;
          for (int64_t k = 0; k < inner; ++k) d[k * di] = s[k * si];
          break;
        }
        default: {
          auto* d = reinterpret_cast<uint64_t*>(dst) + dof;
          auto* s = reinterpret_cast<const uint64_t*>(src) + so;
          for (int64_t k = 0; k < inner; ++k) d[k * di] = s[k * si];
        }
      }
    }
    for (int d = nd - 2; d >= 0; --d) {
      so += ss[d];
      dof += ds[d];
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
      so -= shape[d] * ss[d];
      dof -= shape[d] * ds[d];
    }
  }
}

void fill_value(uint8_t* dst, int64_t n, DType d, double value) {
  if (is_half(d)) {
    std::fill_n(reinterpret_cast<uint16_t*>(dst), n, f64_to_half(value, d));
    return;
  }
  dispatch_dtype(d, [&](auto t) {
    using T = decltype(t);
    T v = std::is_same_v<T, uint8_t> ? T(value != 0.0) : static_cast<T>(value);
    std::fill_n(reinterpret_cast<T*>(dst), n, v);
  });
}

int64_t read_index(const void* p, DType d, int64_t i) {
  return d == DType::I32 ? static_cast<const int32_t*>(p)[i] : static_cast<const int64_t*>(p)[i];
}

int64_t checked_index(int64_t v, int64_t size, const char* op) {
  if (v < -size || v >= size)
    throw std::out_of_range(std::string("prim.") + op + ": index " + std::to_string(v) +
                            " out of range for axis of size " + std::to_string(size));
  return v < 0 ? v + size : v;
}

struct Axis3 {
  int64_t outer = 1, len = 1, inner = 1;
};
Axis3 split(const Shape& s, int64_t axis) {
  Axis3 g;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) g.outer *= s[d];
    else if (d == axis) g.len = s[d];
    else g.inner *= s[d];
  }
  return g;
}

template <class T>
void add_into(uint8_t* dst, const uint8_t* src, int64_t n) {
  auto* d = reinterpret_cast<T*>(dst);
  auto* s = reinterpret_cast<const T*>(src);
  if constexpr (std::is_integral_v<T>) {
    using UT = std::make_unsigned_t<T>;  // wraps instead of signed-overflow UB
    for (int64_t k = 0; k < n; ++k) d[k] = static_cast<T>(static_cast<UT>(d[k]) + static_cast<UT>(s[k]));
  } else {
    for (int64_t k = 0; k < n; ++k) d[k] += s[k];
  }
}

void add_elements(DType d, uint8_t* dst, const uint8_t* src, int64_t n) {
  switch (d) {
    case DType::F32: add_into<float>(dst, src, n); break;
    case DType::F64: add_into<double>(dst, src, n); break;
    case DType::I32: add_into<int32_t>(dst, src, n); break;
    default: add_into<int64_t>(dst, src, n); break;
  }
}

// ---- Philox-4x32-10 ------------------------------------------------------------------------------

inline void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    uint32_t n0 = uint32_t(p1 >> 32) ^ c[1] ^ k0, n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c[3] ^ k1, n3 = uint32_t(p0);
    c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// Word i of the stream: block i/4, lane i%4 (matches prim_ops.random_words).
void random_words(const int64_t* state, uint32_t* out, int64_t count) {
  uint64_t key = static_cast<uint64_t>(state[0]), ctr = static_cast<uint64_t>(state[1]);
  for (int64_t b = 0; b * 4 < count; ++b) {
    uint32_t c[4] = {uint32_t(b), uint32_t(uint64_t(b) >> 32), uint32_t(ctr), uint32_t(ctr >> 32)};
    philox(c, uint32_t(key), uint32_t(key >> 32));
    for (int l = 0; l < 4 && b * 4 + l < count; ++l) out[b * 4 + l] = c[l];
  }
}

void uniform01(const int64_t* state, bool f32, int64_t n, double* out) {
  std::vector<uint32_t> w(f32 ? n : 2 * n);
  random_words(state, w.data(), static_cast<int64_t>(w.size()));
  for (int64_t i = 0; i < n; ++i) {
    if (f32) out[i] = static_cast<double>(w[i] >> 8) * 0x1.0p-24;
    else out[i] = static_cast<double>((uint64_t(w[2 * i]) << 21) ^ (w[2 * i + 1] >> 11)) * 0x1.0p-53;
  }
}

void run_random(const Instr& in, const Slot& out_slot, const int64_t* state, void* out) {
  bool f32 = out_slot.dtype == DType::F32;
  int64_t n = out_slot.size();
  std::vector<double> v;
  if (in.op == Op::random_uniform) {
    v.resize(n);
    uniform01(state, f32, n, v.data());
    double lo = attr_float(in, "low"), hi = attr_float(in, "high");
    for (auto& x : v) x = lo + (hi - lo) * x;
  } else {
    int64_t pairs = (n + 1) / 2;
    std::vector<double> u(2 * pairs);
    uniform01(state, f32, 2 * pairs, u.data());
    double mean = attr_float(in, "mean"), sd = attr_float(in, "std");
    v.resize(2 * pairs);
    for (int64_t k = 0; k < pairs; ++k) {
      double radius = std::sqrt(-2.0 * std::log(1.0 - u[2 * k]));
      double theta = 2.0 * M_PI * u[2 * k + 1];
      v[2 * k] = mean + sd * radius * std::cos(theta);
      v[2 * k + 1] = mean + sd * radius * std::sin(theta);
    }
  }
  if (f32) for (int64_t i = 0; i < n; ++i) static_cast<float*>(out)[i] = static_cast<float>(v[i]);
  else std::memcpy(out, v.data(), n * sizeof(double));
}

}  // namespace

void materialize_constant(const Instr& in, const Slot& out_slot, void* out) {
  const auto& values = attr_floats(in, "value");
  int64_t n = out_slot.size();
  auto* dst = static_cast<uint8_t*>(out);
  if (values.size() == 1) { fill_value(dst, n, out_slot.dtype, values[0]); return; }
  size_t es = dtype_size(out_slot.dtype);
  for (int64_t i = 0; i < n; ++i) fill_value(dst + i * es, 1, out_slot.dtype, values[i]);
}

Step make_shape_step(const Program& p, const Instr& in) {
  const Slot& x = p.slots[in.in[0]];
  const Slot& y = p.slots[in.out[0]];
  const int a = in.in[0], o = in.out[0];
  const size_t es = dtype_size(y.dtype);
  const std::vector<int64_t> xs = contiguous_strides(x.shape), ys = contiguous_strides(y.shape);
  switch (in.op) {
    case Op::reshape: {
      size_t bytes = y.bytes();
      return [=](void* const* s) { std::memcpy(s[o], s[a], bytes); };
    }
    case Op::transpose: case Op::broadcast_to: case Op::slice: case Op::fill: {
      std::vector<int64_t> ss(y.shape.size(), 0);
      int64_t offset = 0;
      if (in.op == Op::transpose) {
        const auto& perm = attr_ints(in, "perm");
        for (size_t d = 0; d < perm.size(); ++d) ss[d] = xs[perm[d]];
      } else if (in.op == Op::broadcast_to) {
        size_t lead = y.shape.size() - x.shape.size();
        for (size_t d = 0; d < x.shape.size(); ++d) ss[lead + d] = x.shape[d] == 1 ? 0 : xs[d];
      } else if (in.op == Op::slice) {
        const auto &st = attr_ints(in, "starts"), &sd = attr_ints(in, "strides");
        for (size_t d = 0; d < ss.size(); ++d) {
          ss[d] = xs[d] * sd[d];
          offset += st[d] * xs[d];
        }
      }
      Shape shape = y.shape;
      return [=](void* const* s) {
        copy_strided(shape, static_cast<const uint8_t*>(s[a]) + offset * es, ss,
                     static_cast<uint8_t*>(s[o]), ys, es);
      };
    }
    case Op::pad: {
      const auto& lo = attr_ints(in, "low");
      double value = attr_float(in, "value");
      int64_t offset = 0;
      for (size_t d = 0; d < lo.size(); ++d) offset += lo[d] * ys[d];
      Shape shape = x.shape;
      DType d = y.dtype;
      int64_t total = y.size();
      return [=](void* const* s) {
        auto* dst = static_cast<uint8_t*>(s[o]);
        fill_value(dst, total, d, value);
        copy_strided(shape, static_cast<const uint8_t*>(s[a]), xs, dst + offset * es, ys, es);
      };
    }
    case Op::concat: {
      int64_t axis = normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(y.shape.size()));
      std::vector<int> srcs(in.in.begin(), in.in.end());
      std::vector<Shape> shapes;
      std::vector<std::vector<int64_t>> strides;
      std::vector<int64_t> offsets;
      int64_t at = 0;
      for (int sidx : srcs) {
        const Shape& sh = p.slots[sidx].shape;
        shapes.push_back(sh);
        strides.push_back(contiguous_strides(sh));
        offsets.push_back(at * ys[axis]);
        at += sh[axis];
      }
      return [=](void* const* s) {
        for (size_t i = 0; i < srcs.size(); ++i)
          copy_strided(shapes[i], static_cast<const uint8_t*>(s[srcs[i]]), strides[i],
                       static_cast<uint8_t*>(s[o]) + offsets[i] * es, ys, es);
      };
    }
    case Op::gather: case Op::gather_along_axis: case Op::scatter_add:
    case Op::scatter_add_along_axis: {
      const Slot& idx = p.slots[in.in[1]];
      int64_t axis = normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(x.shape.size()));
      Axis3 g = split(x.shape, axis);
      int ib = in.in[1], ub = in.in.size() > 2 ? in.in[2] : -1;
      DType idt = idx.dtype, dt = x.dtype;
      int64_t k_count = in.op == Op::gather || in.op == Op::scatter_add ? idx.size()
                                                                        : split(idx.shape, axis).len;
      Op op = in.op;
      size_t bytes = x.bytes();
      return [=](void* const* s) {
        auto* src = static_cast<const uint8_t*>(s[a]);
        auto* dst = static_cast<uint8_t*>(s[o]);
        const void* ip = s[ib];
        const char* name = op_name(op);
        if (op == Op::gather) {
          for (int64_t k = 0; k < k_count; ++k) {
            int64_t j = checked_index(read_index(ip, idt, k), g.len, name);
            for (int64_t q = 0; q < g.outer; ++q)
              std::memcpy(dst + ((q * k_count + k) * g.inner) * es,
                          src + ((q * g.len + j) * g.inner) * es, g.inner * es);
          }
        } else if (op == Op::gather_along_axis) {
          for (int64_t q = 0; q < g.outer; ++q)
            for (int64_t k = 0; k < k_count; ++k)
              for (int64_t i = 0; i < g.inner; ++i) {
                int64_t at = (q * k_count + k) * g.inner + i;
                int64_t j = checked_index(read_index(ip, idt, at), g.len, name);
                std::memcpy(dst + at * es, src + ((q * g.len + j) * g.inner + i) * es, es);
              }
        } else {
          // Check every index before touching the output, so an error leaves nothing half-done.
          const int64_t n_idx = op == Op::scatter_add ? k_count : g.outer * k_count * g.inner;
          for (int64_t k = 0; k < n_idx; ++k)
            checked_index(read_index(ip, idt, k), g.len, name);
          std::memcpy(dst, src, bytes);
          auto* upd = static_cast<const uint8_t*>(s[ub]);
          if (op == Op::scatter_add) {
            for (int64_t k = 0; k < k_count; ++k) {
              int64_t j = checked_index(read_index(ip, idt, k), g.len, name);
              for (int64_t q = 0; q < g.outer; ++q)
                add_elements(dt, dst + ((q * g.len + j) * g.inner) * es,
                             upd + ((q * k_count + k) * g.inner) * es, g.inner);
            }
          } else {
            for (int64_t q = 0; q < g.outer; ++q)
              for (int64_t k = 0; k < k_count; ++k)
                for (int64_t i = 0; i < g.inner; ++i) {
                  int64_t at = (q * k_count + k) * g.inner + i;
                  int64_t j = checked_index(read_index(ip, idt, at), g.len, name);
                  add_elements(dt, dst + ((q * g.len + j) * g.inner + i) * es, upd + at * es, 1);
                }
          }
        }
      };
    }
    case Op::one_hot: {
      int64_t depth = attr_int(in, "depth");
      int64_t axis = attr_int(in, "axis");
      int64_t r = static_cast<int64_t>(x.shape.size());
      if (axis < 0) axis += r + 1;
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x.shape[d];
      DType idt = x.dtype, od = y.dtype;
      int64_t total = y.size();
      return [=](void* const* s) {
        auto* dst = static_cast<uint8_t*>(s[o]);
        fill_value(dst, total, od, 0.0);
        for (int64_t q = 0; q < outer; ++q)
          for (int64_t i = 0; i < inner; ++i) {
            int64_t v = read_index(s[a], idt, q * inner + i);
            if (v >= 0 && v < depth) fill_value(dst + ((q * depth + v) * inner + i) * es, 1, od, 1.0);
          }
      };
    }
    case Op::check_index: {
      // The user op's own range check (its message names the op); the values pass through.
      const int64_t low = attr_int(in, "low"), high = attr_int(in, "high");
      const std::string message = in.attrs.at("message").s;
      const DType idt = x.dtype;
      const int64_t n = x.size();
      const size_t bytes = x.bytes();
      return [=](void* const* s) {
        for (int64_t k = 0; k < n; ++k) {
          const int64_t v = read_index(s[a], idt, k);
          if (v < low || v >= high) {
            std::string text = message;
            const size_t at = text.find("{}");
            if (at != std::string::npos) text.replace(at, 2, std::to_string(v));
            throw std::out_of_range(text);
          }
        }
        if (s[o] != s[a]) std::memcpy(s[o], s[a], bytes);
      };
    }
    case Op::argsort: {
      // A stable sort of every row along `axis`; NaN is the largest value (numpy's and
      // PyTorch's order), so equal keys keep their positions ascending or descending.
      const int64_t r = static_cast<int64_t>(x.shape.size());
      const int64_t axis = r ? normalize_axis(attr_int(in, "axis"), r) : 0;
      const bool desc = attr_bool(in, "descending");
      int64_t outer = 1, len = 1, inner = 1;
      for (int64_t d = 0; d < r; ++d) (d < axis ? outer : d == axis ? len : inner) *= x.shape[d];
      const DType d = x.dtype;
      return [=](void* const* s) {
        auto* out = static_cast<int64_t*>(s[o]);
        std::vector<int64_t> order(static_cast<size_t>(len));
        dispatch_dtype(d, [&](auto t) {
          using T = decltype(t);
          const T* xs = static_cast<const T*>(s[a]);
          for (int64_t q = 0; q < outer; ++q)
            for (int64_t i = 0; i < inner; ++i) {
              const T* row = xs + q * len * inner + i;
              auto before = [&](int64_t p, int64_t k) {
                const T u = row[p * inner], v = row[k * inner];
                if constexpr (std::is_floating_point_v<T>) {
                  const bool un = std::isnan(u), vn = std::isnan(v);
                  if (un || vn) return desc ? (un && !vn) : (vn && !un);
                }
                return desc ? v < u : u < v;
              };
              for (int64_t k = 0; k < len; ++k) order[k] = k;
              std::stable_sort(order.begin(), order.end(), before);
              int64_t* dst = out + q * len * inner + i;
              for (int64_t k = 0; k < len; ++k) dst[k * inner] = order[k];
            }
        });
      };
    }
    case Op::random_uniform: case Op::random_normal: {
      Instr copy = in;
      Slot out_slot = y;
      return [=](void* const* s) {
        run_random(copy, out_slot, static_cast<const int64_t*>(s[a]), s[o]);
      };
    }
    default:
      throw std::logic_error(std::string("no CPU kernel for ") + op_name(in.op));
  }
}

}  // namespace lucid
