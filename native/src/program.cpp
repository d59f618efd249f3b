// The program model's helpers and its validator: every malformed program raises, none crashes.
#include "lucid/program.h"
#include "lucid/sgemm.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace lucid {

namespace {

const char* const kOpNames[] = {
#define LUCID_NAME(name) #name,
    LUCID_ALL_OPS(LUCID_NAME)
#undef LUCID_NAME
};

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

std::string slot_str(const Slot& s) { return std::string(dtype_name(s.dtype)) + shape_str(s.shape); }

const AttrValue& get_attr(const Instr& in, const char* name) {
  auto it = in.attrs.find(name);
  if (it == in.attrs.end()) fail(std::string("missing attribute '") + name + "'");
  return it->second;
}

[[noreturn]] void attr_kind_error(const char* name, const char* kind) {
  fail(std::string("attribute '") + name + "' must be " + kind);
}

}  // namespace

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::Bool: return 1;
    case DType::F16: case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "bool";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

bool parse_dtype(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"f32", DType::F32}, {"f64", DType::F64}, {"i32", DType::I32},
      {"i64", DType::I64}, {"bool", DType::Bool},
      {"f16", DType::F16}, {"bf16", DType::BF16}};
  for (auto& [n, d] : table)
    if (name == n) { *out = d; return true; }
  return false;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(std::string(what) + " overflows 64-bit integers");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(std::string(what) + " overflows 64-bit integers");
  return r;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }

bool parse_op(const std::string& name, Op* out) {
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i)
    if (name == kOpNames[i]) { *out = static_cast<Op>(i); return true; }
  return false;
}

bool is_unary(Op op) { return op <= Op::isfinite; }
bool is_binary(Op op) { return op >= Op::add && op <= Op::logical_xor; }
bool may_throw_at_run_time(Op op) {
  return op == Op::gather || op == Op::gather_along_axis || op == Op::scatter_add ||
         op == Op::scatter_add_along_axis || op == Op::check_index;
}

bool is_elementwise(Op op) {
  return is_unary(op) || is_binary(op) || op == Op::select || op == Op::cast || op == Op::normalize;
}
int elementwise_arity(Op op) {
  if (is_unary(op) || op == Op::cast) return 1;
  if (is_binary(op)) return 2;
  if (op == Op::select) return 3;
  if (op == Op::normalize) return 5;
  return -1;
}

int64_t attr_int(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind != AttrValue::Int) attr_kind_error(name, "an int");
  return a.i;
}
double attr_float(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind == AttrValue::Int) return static_cast<double>(a.i);
  if (a.kind != AttrValue::Float) attr_kind_error(name, "a float");
  return a.f;
}
bool attr_bool(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind != AttrValue::Bool) attr_kind_error(name, "a bool");
  return a.b;
}
DType attr_dtype(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  DType d;
  if (a.kind != AttrValue::Str || !parse_dtype(a.s, &d))
    attr_kind_error(name, "a dtype name (f32, f64, i32, i64, bool)");
  return d;
}
const std::vector<int64_t>& attr_ints(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind != AttrValue::Ints && a.kind != AttrValue::EmptyList)
    attr_kind_error(name, "a list of ints");
  return a.ints;
}
const std::vector<double>& attr_floats(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind != AttrValue::Floats && a.kind != AttrValue::EmptyList)
    attr_kind_error(name, "a list of floats");
  return a.floats;
}
const std::vector<std::string>& attr_strs(const Instr& in, const char* name) {
  const AttrValue& a = get_attr(in, name);
  if (a.kind != AttrValue::Strs && a.kind != AttrValue::EmptyList)
    attr_kind_error(name, "a list of strings");
  return a.strs;
}

int64_t normalize_axis(int64_t axis, int64_t ndim) {
  int64_t n = std::max<int64_t>(ndim, 1);
  if (axis < -n || axis >= n)
    fail("axis " + std::to_string(axis) + " out of range for rank " + std::to_string(ndim));
  return axis < 0 ? axis + n : axis;
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out) {
  size_t rank = std::max(a.size(), b.size());
  Shape r(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    r[i] = da == 1 ? db : da;
  }
  *out = r;
  return true;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) { st[i] = acc; acc *= s[i]; }
  return st;
}

namespace {

// ---- elementwise rules ----------------------------------------------------------------------

DType elementwise_dtype(Op op, const std::vector<DType>& args, DType cast_target) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) {
      std::string got;
      for (DType d : args) got += std::string(got.empty() ? "" : ", ") + dtype_name(d);
      fail(std::string(op_name(op)) + " needs " + what + " operands, got (" + got + ")");
    }
  };
  auto all_same = [&](size_t from) {
    for (size_t i = from + 1; i < args.size(); ++i)
      if (args[i] != args[from]) return false;
    return true;
  };
  if (op == Op::cast) return cast_target;
  for (DType d : args)
    if (d == DType::F16 || d == DType::BF16)
      fail(std::string(op_name(op)) + " does not take " + dtype_name(d) +
           " operands (half values are storage only: cast them to f32)");
  if (op == Op::select) {
    need(args[0] == DType::Bool && args[1] == args[2], "(bool, T, T)");
    return args[1];
  }
  if (op == Op::normalize) {
    need(all_same(0) && is_float(args[0]), "same-dtype float");
    return args[0];
  }
  if (is_unary(op)) {
    DType d = args[0];
    switch (op) {
      case Op::neg: case Op::abs: case Op::sign: case Op::square: case Op::relu:
        need(is_numeric(d), "numeric");
        return d;
      case Op::logical_not:
        need(d == DType::Bool, "bool");
        return d;
      case Op::isnan: case Op::isinf: case Op::isfinite:
        need(is_float(d), "float");
        return DType::Bool;
      default:
        need(is_float(d), "float");
        return d;
    }
  }
  need(all_same(0), "same-dtype");
  DType d = args[0];
  switch (op) {
    case Op::add: case Op::sub: case Op::mul: case Op::maximum: case Op::minimum:
    case Op::floor_divide: case Op::remainder:
      need(is_numeric(d), "numeric");
      return d;
    case Op::div: case Op::pow: case Op::atan2:
      need(is_float(d), "float");
      return d;
    case Op::logical_and: case Op::logical_or: case Op::logical_xor:
      need(d == DType::Bool, "bool");
      return d;
    default:  // comparisons
      return DType::Bool;
  }
}

// ---- per-op output rule -----------------------------------------------------------------------

struct Ctx {
  const Program& p;
  const Instr& in;
  const Slot& arg(size_t i) const { return p.slots[in.in[i]]; }
};

void need_dtype(bool ok, const Slot& s, const char* what) {
  if (!ok) fail(std::string("operand dtype ") + dtype_name(s.dtype) + " not supported; needs " + what);
}

void same_dtype(const Ctx& c) {
  for (size_t i = 1; i < c.in.in.size(); ++i)
    if (c.arg(i).dtype != c.arg(0).dtype)
      fail("operands must share one dtype, got " + slot_str(c.arg(0)) + " and " + slot_str(c.arg(i)));
}

Shape reduce_shape(const Shape& x, const std::vector<int64_t>& axes, bool keepdims,
                   std::vector<bool>* reduced_out = nullptr) {
  std::vector<bool> reduced(x.size(), false);
  for (int64_t a : axes) {
    int64_t n = normalize_axis(a, static_cast<int64_t>(x.size()));
    if (x.empty()) continue;
    if (reduced[n]) fail("repeated axis " + std::to_string(a));
    reduced[n] = true;
  }
  Shape out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!reduced[i]) out.push_back(x[i]);
    else if (keepdims) out.push_back(1);
  }
  if (reduced_out) *reduced_out = reduced;
  return out;
}

void check_nonneg_shape(const Shape& s) {
  for (int64_t d : s)
    if (d < 0) fail("negative dimension in shape " + shape_str(s));
  if (s.size() > 16) fail("rank above 16 is not supported");
  int64_t total = 1;
  for (int64_t d : s) {
    int64_t extent = std::max<int64_t>(d, 1);
    if (total > kMaxElements / extent)
      fail("shape " + shape_str(s) + " exceeds 2^40 elements (zero dimensions counted as 1)");
    total *= extent;
  }
}

int64_t window(int64_t size, int64_t k, int64_t stride, int64_t dil, int64_t lo, int64_t hi) {
  int64_t span = checked_add(checked_mul(dil, k - 1, "dilation * (kernel - 1)"), 1, "window span");
  int64_t padded = checked_add(checked_add(size, lo, "padded size"), hi, "padded size");
  int64_t extent = padded - span;
  if (extent < 0)
    fail("window " + std::to_string(span) + " larger than padded size " + std::to_string(padded));
  return extent / stride + 1;
}

void check_pair(const std::vector<int64_t>& v, size_t n, int64_t min, const char* name) {
  if (v.size() != n) fail(std::string(name) + " needs " + std::to_string(n) + " entries");
  for (int64_t x : v)
    if (x < min) fail(std::string(name) + " entries must be >= " + std::to_string(min));
}

Shape conv_shape(const Instr& in, const Shape& x, const Shape& w) {
  const auto& st = attr_ints(in, "strides");
  const auto& dl = attr_ints(in, "dilation");
  const auto& pd = attr_ints(in, "padding");
  int64_t g = attr_int(in, "groups");
  check_pair(st, 2, 1, "strides");
  check_pair(dl, 2, 1, "dilation");
  check_pair(pd, 4, 0, "padding");
  if (g < 1) fail("groups must be >= 1");
  if (x.size() != 4 || w.size() != 4)
    fail("input and weight need rank 4 (NCHW, OIHW), got " + shape_str(x) + " and " + shape_str(w));
  if (x[1] != checked_mul(w[1], g, "weight channels * groups") || w[0] % g)
    fail("channels do not fit groups=" + std::to_string(g) + ": input " + shape_str(x) +
         ", weight " + shape_str(w));
  if (w[2] < 1 || w[3] < 1) fail("kernel size must be >= 1");
  return {x[0], w[0], window(x[2], w[2], st[0], dl[0], pd[0], pd[1]),
          window(x[3], w[3], st[1], dl[1], pd[2], pd[3])};
}

Shape pool_shape(const Instr& in, const Shape& x, bool has_dilation) {
  const auto& k = attr_ints(in, "kernel");
  const auto& st = attr_ints(in, "strides");
  const auto& pd = attr_ints(in, "padding");
  check_pair(k, 2, 1, "kernel");
  check_pair(st, 2, 1, "strides");
  check_pair(pd, 4, 0, "padding");
  std::vector<int64_t> dl = {1, 1};
  if (has_dilation) {
    dl = attr_ints(in, "dilation");
    check_pair(dl, 2, 1, "dilation");
  } else {
    attr_bool(in, "count_include_pad");
  }
  if (x.size() != 4) fail("input needs rank 4 (NCHW), got " + shape_str(x));
  return {x[0], x[1], window(x[2], k[0], st[0], dl[0], pd[0], pd[1]),
          window(x[3], k[1], st[1], dl[1], pd[2], pd[3])};
}

}  // namespace

HeadView head_view(const Instr& in, int i) {
  static const char* const names[] = {"c_view", "a_view", "b_view"};
  const char* name = names[i + 1];
  if (in.op != Op::gemm || in.attrs.find(name) == in.attrs.end()) return {};
  const auto& v = attr_ints(in, name);
  if (v.size() != (i < 0 ? 2u : 3u))
    fail(std::string(name) + " needs " + (i < 0 ? "[heads, dim]" : "[heads, dim, col0]"));
  if (v[0] < 1 || v[1] < 1 || (i >= 0 && v[2] < 0))
    fail(std::string(name) + " needs heads >= 1, dim >= 1 and col0 >= 0");
  return {v[0], v[1], i < 0 ? 0 : v[2]};
}

GemmActivation gemm_activation(const Instr& in) {
  const auto it = in.attrs.find("activation");
  if (in.op != Op::gemm || it == in.attrs.end()) return GemmActivation::none;
  const AttrValue& a = it->second;
  if (a.kind == AttrValue::Str && a.s == "relu") return GemmActivation::relu;
  if (a.kind == AttrValue::Str && a.s == "gelu") return GemmActivation::gelu;
  fail("activation needs \"relu\" or \"gelu\"");
}

Shape gemm_logical_shape(const Program& p, const Instr& in, int i) {
  const Slot& s = p.slots[i < 0 ? in.out[0] : in.in[i]];
  const HeadView v = head_view(in, i);
  if (v.heads == 0) return s.shape;
  if (s.shape.size() != 3) fail("a head view needs a rank-3 slot [B, L, W], got " + shape_str(s.shape));
  const int64_t width =
      checked_add(checked_mul(v.heads, v.dim, "head view width"), v.col0, "head view width");
  if (i >= 0 ? width > s.shape[2] : width != s.shape[2])
    fail("head view of " + std::to_string(v.heads) + " x " + std::to_string(v.dim) + " from column " +
         std::to_string(v.col0) + " does not fit " + shape_str(s.shape));
  return {s.shape[0], v.heads, s.shape[1], v.dim};
}

namespace {

size_t expected_operands(Op op) {
  if (is_elementwise(op)) return static_cast<size_t>(elementwise_arity(op));
  switch (op) {
    case Op::matmul: case Op::gather: case Op::gather_along_axis: case Op::conv2d:
    case Op::conv2d_data_grad: case Op::conv2d_weights_grad: case Op::max_pool2d_grad:
    case Op::max_pool2d_relu_grad:
      return 2;
    case Op::scatter_add: case Op::scatter_add_along_axis: return 3;
    case Op::matmul_accumulate: return 4;
    case Op::layer_norm: case Op::attention: return 3;
    case Op::attention_grad: return 5;
    case Op::constant: return 0;
    default: return 1;
  }
}

void check_along_axis(const Slot& x, const Slot& idx, int64_t axis) {
  if (!is_int(idx.dtype)) fail("indices must be i32 or i64");
  if (x.shape.empty() || idx.shape.size() != x.shape.size())
    fail("index rank must equal source rank (>= 1)");
  int64_t a = normalize_axis(axis, static_cast<int64_t>(x.shape.size()));
  for (size_t i = 0; i < x.shape.size(); ++i)
    if (static_cast<int64_t>(i) != a && x.shape[i] != idx.shape[i])
      fail("index shape " + shape_str(idx.shape) + " must match " + shape_str(x.shape) +
           " off axis " + std::to_string(a));
}

Shape gather_shape(const Slot& x, const Slot& idx, int64_t axis) {
  if (!is_int(idx.dtype)) fail("indices must be i32 or i64");
  if (x.shape.empty()) fail("source needs rank >= 1");
  int64_t a = normalize_axis(axis, static_cast<int64_t>(x.shape.size()));
  Shape out(x.shape.begin(), x.shape.begin() + a);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + a + 1, x.shape.end());
  return out;
}

// One slot per output: every node is evaluated over the outputs' common shape.
std::vector<Slot> infer_fused(const Program& p, const Instr& in) {
  std::vector<ExprNode> nodes = decode_expr(p, in);
  if (nodes.empty()) fail("fused instruction has no nodes");
  std::vector<int> outs = expr_outputs(in, nodes.size());
  Shape out_shape;
  std::vector<Slot> values;
  for (int i : in.in) values.push_back(p.slots[i]);
  for (const ExprNode& n : nodes) {
    std::vector<DType> dts;
    Shape shape;
    for (int a : n.args) {
      dts.push_back(values[a].dtype);
      if (!broadcast_shapes(shape, values[a].shape, &shape))
        fail("fused node " + std::string(op_name(n.op)) + ": shapes do not broadcast");
    }
    DType d = elementwise_dtype(n.op, dts, n.dtype);
    if (d != n.dtype)
      fail("fused node " + std::string(op_name(n.op)) + " declares dtype " + dtype_name(n.dtype) +
           " but its rule gives " + dtype_name(d));
    values.push_back(Slot{shape, d});
  }
  const Slot& result = values[in.in.size() + outs.back()];
  std::vector<Slot> out_slots;
  for (int k : outs) {
    const Slot& v = values[in.in.size() + k];
    if (v.shape != result.shape)
      fail("fused output node " + std::to_string(k) + " has shape " + shape_str(v.shape) +
           ", the other outputs " + shape_str(result.shape));
    out_slots.push_back(v);
  }
  // Every node is evaluated at the output shape, so each must broadcast to it; so must every
  // input, read by a node or not: the evaluator walks each input over the output's blocks (an
  // unread [2, 1] input of a [] result was read out of bounds).
  for (size_t i = 0; i < values.size(); ++i) {
    Shape b;
    if (!broadcast_shapes(values[i].shape, result.shape, &b) || b != result.shape) {
      const bool input = i < in.in.size();
      fail("fused " + std::string(input ? "input " : "node ") +
           std::to_string(input ? i : i - in.in.size()) + " shape " + shape_str(values[i].shape) +
           " does not broadcast to the result " + shape_str(result.shape));
    }
  }
  return out_slots;
}

Slot infer(const Program& p, const Instr& in) {
  Ctx c{p, in};
  Op op = in.op;
  if (op == Op::fused) return infer_fused(p, in).back();
  if (op == Op::concat) {
    if (in.in.empty()) fail("concat needs at least one operand");
  } else if (op == Op::gemm) {
    if (in.in.size() < 2 || in.in.size() > 4)
      fail("takes 2 to 4 operands (a, b, then an optional bias row and an optional addend of "
           "the output's shape), got " + std::to_string(in.in.size()));
  } else if (op == Op::conv2d_bias) {
    if (in.in.size() < 3 || in.in.size() > 5)
      fail("takes 3 to 5 operands (x, w, a bias, then an optional scale and an optional residual "
           "of the output's shape), got " + std::to_string(in.in.size()));
  } else if (in.in.size() != expected_operands(op)) {
    fail("takes " + std::to_string(expected_operands(op)) + " operand(s), got " +
         std::to_string(in.in.size()));
  }
  if (is_elementwise(op)) {
    std::vector<DType> dts;
    Shape shape;
    for (size_t i = 0; i < in.in.size(); ++i) {
      dts.push_back(c.arg(i).dtype);
      if (!broadcast_shapes(shape, c.arg(i).shape, &shape)) {
        std::string all;
        for (size_t j = 0; j < in.in.size(); ++j) all += (j ? " and " : "") + shape_str(c.arg(j).shape);
        fail("shapes " + all + " do not broadcast");
      }
    }
    DType target = op == Op::cast ? attr_dtype(in, "dtype") : DType::F32;
    if (op == Op::normalize) attr_float(in, "epsilon");
    return Slot{shape, elementwise_dtype(op, dts, target)};
  }
  const Slot& x = in.in.empty() ? p.slots[0] : c.arg(0);
  switch (op) {
    case Op::matmul: case Op::gemm: {
      // A gemm may read and write half values (gemm_types); every other product one dtype.
      const GemmTypes types = gemm_types(p, in);
      const DType out_dtype = types.has_half ? types.out_dtype : x.dtype;
      if (!types.has_half) {
        same_dtype(c);
        need_dtype(op == Op::gemm ? is_float(x.dtype) : is_numeric(x.dtype), x,
                   op == Op::gemm ? "a float dtype" : "a numeric dtype");
      }
      if (op == Op::gemm) {
        attr_float(in, "alpha");
        gemm_activation(in);
      }
      const Shape a = gemm_logical_shape(p, in, 0), b = gemm_logical_shape(p, in, 1);
      if (a.size() < 2 || b.size() < 2)
        fail("operands need rank >= 2, got " + shape_str(a) + " and " + shape_str(b));
      bool ta = attr_bool(in, "transpose_a"), tb = attr_bool(in, "transpose_b");
      int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2];
      int64_t ka = ta ? a[a.size() - 2] : a[a.size() - 1];
      int64_t kb = tb ? b[b.size() - 1] : b[b.size() - 2];
      int64_t n = tb ? b[b.size() - 2] : b[b.size() - 1];
      if (ka != kb) fail("contraction sizes differ: " + shape_str(a) + " @ " + shape_str(b));
      Shape batch;
      if (!broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), &batch))
        fail("batch dimensions of " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
      batch.push_back(m);
      batch.push_back(n);
      // gemm's extra operands: at most one bias row [N], then at most one addend of the
      // output's shape (rank >= 2, so the two never look alike).
      for (size_t i = 2; i < in.in.size(); ++i) {
        const Shape& e = c.arg(i).shape;
        const bool bias = e.size() == 1 && i == 2;
        if (bias ? e != Shape{n} : e != batch)
          fail("extra operand " + std::to_string(i) + " has shape " + shape_str(e) +
               ", expected a bias [" + std::to_string(n) + "] then an addend " +
               shape_str(batch));
      }
      const HeadView cv = head_view(in, -1);
      if (cv.heads == 0) return Slot{batch, out_dtype};
      if (in.in.size() > 2) fail("an output head view takes no bias or addend");
      if (batch.size() != 4 || batch[1] != cv.heads || batch[3] != cv.dim)
        fail("c_view [" + std::to_string(cv.heads) + ", " + std::to_string(cv.dim) +
             "] does not match the product " + shape_str(batch));
      return Slot{{batch[0], batch[2], checked_mul(batch[1], batch[3], "c_view width")}, out_dtype};
    }
    case Op::attention: case Op::attention_grad:
      return infer_attention(p, in)[0];
    case Op::layer_norm: {
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      if (x.shape.empty()) fail("input needs rank >= 1");
      for (int i : {1, 2})
        if (c.arg(i).shape != Shape{x.shape.back()})
          fail("weight and bias need shape [" + std::to_string(x.shape.back()) + "], got " +
               shape_str(c.arg(i).shape));
      attr_float(in, "epsilon");
      return x;
    }
    case Op::matmul_accumulate: {
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      const Shape &a = c.arg(0).shape, &b = c.arg(1).shape;
      if (a.size() != 2 || b.size() != 2)
        fail("operands need rank 2, got " + shape_str(a) + " and " + shape_str(b));
      bool ta = attr_bool(in, "transpose_a"), tb = attr_bool(in, "transpose_b");
      int64_t m = ta ? a[1] : a[0], ka = ta ? a[0] : a[1];
      int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
      if (ka != kb) fail("contraction sizes differ: " + shape_str(a) + " @ " + shape_str(b));
      Shape out{m, n};
      if (c.arg(2).shape != out)
        fail("accumulator has shape " + shape_str(c.arg(2).shape) + ", the product " +
             shape_str(out));
      if (!c.arg(3).shape.empty()) fail("alpha must be 0-d, got " + shape_str(c.arg(3).shape));
      return Slot{out, x.dtype};
    }
    case Op::reduce_sum: case Op::reduce_max: case Op::reduce_min: case Op::reduce_prod:
    case Op::reduce_mean: case Op::variance: {
      bool float_only = op == Op::reduce_mean || op == Op::variance;
      need_dtype(float_only ? is_float(x.dtype) : is_numeric(x.dtype), x,
                 float_only ? "a float dtype" : "a numeric dtype");
      std::vector<bool> reduced;
      Shape s = reduce_shape(x.shape, attr_ints(in, "axes"), attr_bool(in, "keepdims"), &reduced);
      if (op == Op::reduce_max || op == Op::reduce_min)
        for (size_t i = 0; i < reduced.size(); ++i)
          if (reduced[i] && x.shape[i] == 0) fail("cannot reduce an empty axis");
      return Slot{s, x.dtype};
    }
    case Op::argmax: case Op::argmin: {
      need_dtype(is_numeric(x.dtype), x, "a numeric dtype");
      int64_t axis = normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(x.shape.size()));
      if (!x.shape.empty() && x.shape[axis] == 0) fail("cannot reduce an empty axis");
      return Slot{reduce_shape(x.shape, {axis}, attr_bool(in, "keepdims")), DType::I64};
    }
    case Op::argsort: {
      if (!x.shape.empty()) normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(x.shape.size()));
      attr_bool(in, "descending");
      return Slot{x.shape, DType::I64};
    }
    case Op::softmax: case Op::log_softmax: case Op::cumsum: {
      bool float_only = op != Op::cumsum;
      need_dtype(float_only ? is_float(x.dtype) : is_numeric(x.dtype), x,
                 float_only ? "a float dtype" : "a numeric dtype");
      normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(x.shape.size()));
      if (op == Op::cumsum) { attr_bool(in, "exclusive"); attr_bool(in, "reverse"); }
      return x;
    }
    case Op::reshape: {
      const auto& s = attr_ints(in, "shape");
      check_nonneg_shape(s);
      if (numel(s) != x.size())
        fail("cannot reshape " + shape_str(x.shape) + " to " + shape_str(s));
      return Slot{s, x.dtype};
    }
    case Op::transpose: {
      const auto& perm = attr_ints(in, "perm");
      std::vector<int64_t> sorted(perm);
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i)
        if (sorted[i] != static_cast<int64_t>(i)) sorted.clear();
      if (perm.size() != x.shape.size() || sorted.size() != perm.size())
        fail("perm " + shape_str(perm) + " is not a permutation of rank " +
             std::to_string(x.shape.size()));
      Shape s;
      for (int64_t q : perm) s.push_back(x.shape[q]);
      return Slot{s, x.dtype};
    }
    case Op::broadcast_to: {
      const auto& s = attr_ints(in, "shape");
      check_nonneg_shape(s);
      Shape b;
      if (s.size() < x.shape.size() || !broadcast_shapes(x.shape, s, &b) || b != s)
        fail("cannot broadcast " + shape_str(x.shape) + " to " + shape_str(s));
      return Slot{s, x.dtype};
    }
    case Op::slice: {
      const auto &st = attr_ints(in, "starts"), &en = attr_ints(in, "ends"),
                 &sd = attr_ints(in, "strides");
      if (st.size() != x.shape.size() || en.size() != x.shape.size() || sd.size() != x.shape.size())
        fail("starts/ends/strides need " + std::to_string(x.shape.size()) + " entries each");
      Shape s;
      for (size_t i = 0; i < x.shape.size(); ++i) {
        if (sd[i] < 1 || st[i] < 0 || st[i] > en[i] || en[i] > x.shape[i])
          fail("axis " + std::to_string(i) + ": need 0 <= start <= end <= " +
               std::to_string(x.shape[i]) + " and stride >= 1");
        s.push_back(en[i] == st[i] ? 0 : (en[i] - st[i] - 1) / sd[i] + 1);
      }
      return Slot{s, x.dtype};
    }
    case Op::concat: {
      same_dtype(c);
      if (x.shape.empty()) fail("operands need rank >= 1");
      int64_t axis = normalize_axis(attr_int(in, "axis"), static_cast<int64_t>(x.shape.size()));
      Shape s = x.shape;
      for (size_t i = 1; i < in.in.size(); ++i) {
        const Shape& o = c.arg(i).shape;
        bool ok = o.size() == s.size();
        for (size_t d = 0; ok && d < s.size(); ++d)
          if (static_cast<int64_t>(d) != axis && o[d] != s[d]) ok = false;
        if (!ok) fail("shapes " + shape_str(x.shape) + " and " + shape_str(o) + " differ off the axis");
        s[axis] = checked_add(s[axis], o[axis], "concatenated size");
      }
      return Slot{s, x.dtype};
    }
    case Op::pad: {
      const auto &lo = attr_ints(in, "low"), &hi = attr_ints(in, "high");
      attr_float(in, "value");
      if (lo.size() != x.shape.size() || hi.size() != x.shape.size())
        fail("low/high need " + std::to_string(x.shape.size()) + " entries");
      Shape s = x.shape;
      for (size_t i = 0; i < s.size(); ++i) {
        if (lo[i] < 0 || hi[i] < 0) fail("pad widths must be >= 0");
        s[i] = checked_add(s[i], checked_add(lo[i], hi[i], "pad widths"), "padded size");
      }
      return Slot{s, x.dtype};
    }
    case Op::gather:
      return Slot{gather_shape(x, c.arg(1), attr_int(in, "axis")), x.dtype};
    case Op::gather_along_axis:
      check_along_axis(x, c.arg(1), attr_int(in, "axis"));
      return Slot{c.arg(1).shape, x.dtype};
    case Op::scatter_add: case Op::scatter_add_along_axis: {
      need_dtype(is_numeric(x.dtype), x, "a numeric dtype");
      if (c.arg(2).dtype != x.dtype) fail("updates dtype must equal data dtype");
      Shape expect;
      if (op == Op::scatter_add) {
        expect = gather_shape(x, c.arg(1), attr_int(in, "axis"));
      } else {
        check_along_axis(x, c.arg(1), attr_int(in, "axis"));
        expect = c.arg(1).shape;
      }
      if (c.arg(2).shape != expect)
        fail("updates shape " + shape_str(c.arg(2).shape) + " must be " + shape_str(expect));
      return x;
    }
    case Op::one_hot: {
      if (!is_int(x.dtype)) fail("indices must be i32 or i64");
      int64_t depth = attr_int(in, "depth"), axis = attr_int(in, "axis");
      int64_t r = static_cast<int64_t>(x.shape.size());
      if (depth < 0) fail("depth must be >= 0");
      if (axis < -(r + 1) || axis > r) fail("axis out of range");
      if (axis < 0) axis += r + 1;
      Shape s = x.shape;
      s.insert(s.begin() + axis, depth);
      DType d = attr_dtype(in, "dtype");
      if (d == DType::F16 || d == DType::BF16) fail("dtype must not be half (storage only)");
      return Slot{s, d};
    }
    case Op::check_index: {
      if (!is_int(x.dtype)) fail("indices must be i32 or i64");
      if (attr_int(in, "low") > attr_int(in, "high")) fail("low must be <= high");
      if (get_attr(in, "message").kind != AttrValue::Str) attr_kind_error("message", "a string");
      return x;
    }
    case Op::conv2d:
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      return Slot{conv_shape(in, x.shape, c.arg(1).shape), x.dtype};
    case Op::conv2d_bias: {
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      attr_bool(in, "relu");
      Shape out = conv_shape(in, x.shape, c.arg(1).shape);
      const int64_t o = out[1];
      for (size_t i = 2; i < std::min<size_t>(in.in.size(), 4); ++i) {
        const Shape& b = c.arg(i).shape;
        if (b != Shape{o} && b != Shape{o, 1, 1} && b != Shape{1, o, 1, 1})
          fail(std::string(i == 2 ? "bias" : "scale") + " needs one value per output channel ([" +
               std::to_string(o) + "], [" + std::to_string(o) + ", 1, 1] or [1, " +
               std::to_string(o) + ", 1, 1]), got " + shape_str(b));
      }
      if (in.in.size() > 4 && c.arg(4).shape != out)
        fail("residual needs the output's shape " + shape_str(out) + ", got " +
             shape_str(c.arg(4).shape));
      return Slot{out, x.dtype};
    }
    case Op::conv2d_data_grad: {
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      const auto& xs = attr_ints(in, "input_shape");
      check_nonneg_shape(xs);
      Shape expect = conv_shape(in, xs, c.arg(1).shape);
      if (x.shape != expect) fail("gradient shape " + shape_str(x.shape) + " must be " + shape_str(expect));
      return Slot{xs, x.dtype};
    }
    case Op::conv2d_weights_grad: {
      same_dtype(c);
      need_dtype(is_float(x.dtype), x, "a float dtype");
      const auto& ws = attr_ints(in, "weight_shape");
      check_nonneg_shape(ws);
      Shape expect = conv_shape(in, x.shape, ws);
      if (c.arg(1).shape != expect)
        fail("gradient shape " + shape_str(c.arg(1).shape) + " must be " + shape_str(expect));
      return Slot{ws, x.dtype};
    }
    case Op::max_pool2d: case Op::avg_pool2d:
      need_dtype(is_float(x.dtype), x, "a float dtype");
      return Slot{pool_shape(in, x.shape, op == Op::max_pool2d), x.dtype};
    case Op::max_pool2d_grad: case Op::max_pool2d_relu_grad: {
      same_dtype(c);
      const Slot& src = c.arg(1);
      need_dtype(is_float(src.dtype), src, "a float dtype");
      Shape expect = pool_shape(in, src.shape, true);
      if (x.shape != expect) fail("gradient shape " + shape_str(x.shape) + " must be " + shape_str(expect));
      return src;
    }
    case Op::avg_pool2d_grad: {
      need_dtype(is_float(x.dtype), x, "a float dtype");
      const auto& xs = attr_ints(in, "input_shape");
      check_nonneg_shape(xs);
      Shape expect = pool_shape(in, xs, false);
      if (x.shape != expect) fail("gradient shape " + shape_str(x.shape) + " must be " + shape_str(expect));
      return Slot{xs, x.dtype};
    }
    case Op::constant: {
      const auto& s = attr_ints(in, "shape");
      check_nonneg_shape(s);
      size_t n = attr_floats(in, "value").size();
      if (n != 1 && static_cast<int64_t>(n) != numel(s))
        fail("value needs 1 or " + std::to_string(numel(s)) + " entries, got " + std::to_string(n));
      return Slot{s, attr_dtype(in, "dtype")};
    }
    case Op::fill: {
      if (!x.shape.empty()) fail("value must be a scalar (shape [])");
      const auto& s = attr_ints(in, "shape");
      check_nonneg_shape(s);
      return Slot{s, x.dtype};
    }
    case Op::random_uniform: case Op::random_normal: {
      if (x.dtype != DType::I64 || x.shape != Shape{2}) fail("state must be i64[2] (key, counter)");
      const auto& s = attr_ints(in, "shape");
      check_nonneg_shape(s);
      DType d = attr_dtype(in, "dtype");
      if (!is_float(d)) fail("dtype must be f32 or f64");
      if (op == Op::random_uniform) { attr_float(in, "low"); attr_float(in, "high"); }
      else { attr_float(in, "mean"); attr_float(in, "std"); }
      return Slot{s, d};
    }
    default:
      fail("no rule for this op");
  }
}

}  // namespace

std::vector<ExprNode> decode_expr(const Program& p, const Instr& in) {
  std::vector<ExprNode> nodes;
  if (in.op != Op::fused) {
    ExprNode n{in.op, p.slots[in.out[0]].dtype, {}, 0.0};
    for (size_t i = 0; i < in.in.size(); ++i) n.args.push_back(static_cast<int>(i));
    if (in.op == Op::normalize) n.fparam = attr_float(in, "epsilon");
    nodes.push_back(n);
    return nodes;
  }
  const auto& ops = attr_strs(in, "sub_ops");
  const auto& args = attr_ints(in, "sub_args");
  const auto& dts = attr_strs(in, "sub_dtypes");
  const auto& fps = attr_floats(in, "sub_floats");
  if (dts.size() != ops.size() || fps.size() != ops.size())
    fail("fused: sub_ops, sub_dtypes and sub_floats need equal lengths");
  if (ops.size() > 256) fail("fused: more than 256 nodes");
  size_t pos = 0;
  int n_in = static_cast<int>(in.in.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    ExprNode n{};
    if (!parse_op(ops[k], &n.op) || !is_elementwise(n.op))
      fail("fused: node " + std::to_string(k) + " has unknown or non-elementwise op '" + ops[k] + "'");
    if (!parse_dtype(dts[k], &n.dtype)) fail("fused: node " + std::to_string(k) + " has bad dtype");
    int arity = elementwise_arity(n.op);
    if (pos + arity > args.size()) fail("fused: sub_args too short");
    for (int j = 0; j < arity; ++j) {
      int64_t a = args[pos++];
      if (a < 0 || a >= n_in + static_cast<int64_t>(k))
        fail("fused: node " + std::to_string(k) + " argument " + std::to_string(a) +
             " is not an input or an earlier node");
      n.args.push_back(static_cast<int>(a));
    }
    n.fparam = fps[k];
    nodes.push_back(n);
  }
  if (pos != args.size()) fail("fused: sub_args has extra entries");
  return nodes;
}

std::vector<int> expr_outputs(const Instr& in, size_t n_nodes) {
  auto it = in.attrs.find("sub_outputs");
  if (in.op != Op::fused || it == in.attrs.end()) {
    // Callers index one node per output slot: without sub_outputs there is exactly one.
    if (in.out.size() != 1)
      fail("fused: " + std::to_string(in.out.size()) +
           " output slots need sub_outputs (one node index per output slot)");
    return {static_cast<int>(n_nodes) - 1};
  }
  std::vector<int> outs;
  std::vector<bool> taken(n_nodes, false);
  for (int64_t k : attr_ints(in, "sub_outputs")) {
    if (k < 0 || k >= static_cast<int64_t>(n_nodes))
      fail("fused: sub_outputs entry " + std::to_string(k) + " is not a node");
    // The evaluator writes each node to one output slot: a second slot of the same node would
    // never be written.
    if (taken[k]) fail("fused: sub_outputs names node " + std::to_string(k) + " twice");
    taken[k] = true;
    outs.push_back(static_cast<int>(k));
  }
  if (outs.size() != in.out.size())
    fail("fused: " + std::to_string(in.out.size()) + " output slot(s) but " +
         std::to_string(outs.size()) + " sub_outputs");
  return outs;
}

namespace {

// a * b, or INT64_MAX when that overflows: work estimates only need to exceed the bound.
int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

// The GEMM shapes of a conv instruction: (N, C, O, KH, KW, HO, WO, groups).
struct ConvDims {
  int64_t n, c, o, kh, kw, ho, wo, g;
};
ConvDims conv_dims(const Program& p, const Instr& in) {
  const Shape *x, *w, *y;
  if (in.op == Op::conv2d || in.op == Op::conv2d_bias) {
    x = &p.slots[in.in[0]].shape; w = &p.slots[in.in[1]].shape; y = &p.slots[in.out[0]].shape;
  } else if (in.op == Op::conv2d_data_grad) {
    x = &p.slots[in.out[0]].shape; w = &p.slots[in.in[1]].shape; y = &p.slots[in.in[0]].shape;
  } else {
    x = &p.slots[in.in[0]].shape; w = &p.slots[in.out[0]].shape; y = &p.slots[in.in[1]].shape;
  }
  return {(*x)[0], (*x)[1], (*w)[0], (*w)[2], (*w)[3], (*y)[2], (*y)[3], attr_int(in, "groups")};
}

// Sizes the kernels hand to BLAS (32-bit) and the im2col scratch they allocate.
void check_kernel_sizes(const Program& p, const Instr& in) {
  auto blas_dim = [](int64_t d, const char* what) {
    if (d > kMaxBlasDim)
      fail(std::string(what) + " " + std::to_string(d) + " exceeds the BLAS limit 2^31-1");
  };
  if (in.op == Op::matmul || in.op == Op::matmul_accumulate || in.op == Op::gemm) {
    const Shape a = gemm_logical_shape(p, in, 0), o = gemm_logical_shape(p, in, -1);
    const bool ta = attr_bool(in, "transpose_a");
    const int64_t m = o[o.size() - 2], n = o.back(), k = ta ? a[a.size() - 2] : a.back();
    blas_dim(m, "matmul rows");
    blas_dim(n, "matmul columns");
    blas_dim(k, "matmul contraction size");
    blas_dim(sat_mul(m, numel(Shape(o.begin(), o.end() - 2))), "matmul rows times batch");
  } else if (in.op == Op::conv2d || in.op == Op::conv2d_bias || in.op == Op::conv2d_data_grad ||
             in.op == Op::conv2d_weights_grad) {
    ConvDims d = conv_dims(p, in);
    const int64_t ckk = sat_mul(d.c / d.g, sat_mul(d.kh, d.kw));
    const int64_t cols = sat_mul(d.n, sat_mul(d.ho, d.wo));
    blas_dim(d.o, "conv output channels");
    blas_dim(ckk, "conv channels times kernel area");
    blas_dim(cols, "conv batch times output area");
    if (sat_add(sat_mul(ckk, cols), sat_mul(d.o, cols)) > kMaxElements)
      fail("conv im2col scratch exceeds 2^40 elements");
  }
}

}  // namespace

int64_t instr_work(const Program& p, const Instr& in) {
  auto size_of = [&](int s) { return std::max<int64_t>(p.slots[s].size(), 1); };
  constexpr int64_t kPerElement = 2, kPerTap = 64;
  int64_t moved = 0;
  for (int s : in.in) moved = sat_add(moved, size_of(s));
  for (int s : in.out) moved = sat_add(moved, size_of(s));
  const int64_t base = sat_add(1, sat_mul(moved, kPerElement));
  switch (in.op) {
    case Op::fused: {
      const int64_t nodes = static_cast<int64_t>(attr_strs(in, "sub_ops").size());
      return sat_add(base, sat_mul(sat_mul(size_of(in.out[0]), nodes), kPerElement));
    }
    case Op::matmul: case Op::matmul_accumulate: case Op::gemm: {
      const Shape a = gemm_logical_shape(p, in, 0);
      const int64_t k = attr_bool(in, "transpose_a") ? a[a.size() - 2] : a.back();
      return sat_add(base, sat_mul(size_of(in.out[0]), std::max<int64_t>(k, 1)));
    }
    case Op::conv2d: case Op::conv2d_bias: case Op::conv2d_data_grad:
    case Op::conv2d_weights_grad: {
      ConvDims d = conv_dims(p, in);
      const int64_t cols = sat_mul(d.n, sat_mul(d.ho, d.wo));
      const int64_t taps = sat_mul(d.kh, d.kw);
      // The GEMM's multiply-adds plus the im2col / col2im copies.
      const int64_t gemm = sat_mul(sat_mul(cols, d.o), sat_mul(d.c / d.g, taps));
      return sat_add(base, sat_add(gemm, sat_mul(sat_mul(cols, d.c), sat_mul(taps, kPerElement))));
    }
    case Op::attention: case Op::attention_grad:
      return sat_add(base, attention_work(p, in));
    case Op::lstm: case Op::lstm_grad:
      return sat_add(base, lstm_work(p, in));
    case Op::max_pool2d: case Op::avg_pool2d: case Op::max_pool2d_grad:
    case Op::max_pool2d_relu_grad: case Op::avg_pool2d_grad: {
      const auto& k = attr_ints(in, "kernel");
      const bool forward = in.op == Op::max_pool2d || in.op == Op::avg_pool2d;
      const int64_t windows = forward ? size_of(in.out[0]) : size_of(in.in[0]);
      return sat_add(base, sat_mul(sat_mul(windows, sat_mul(k[0], k[1])), kPerTap));
    }
    default:
      return base;
  }
}

void validate(const Program& p) {
  int n = static_cast<int>(p.slots.size());
  for (int i = 0; i < n; ++i) {
    try {
      check_nonneg_shape(p.slots[i].shape);
    } catch (const std::invalid_argument& e) {
      fail("slot " + std::to_string(i) + ": " + e.what());
    }
  }
  std::vector<bool> defined(n, false);
  int64_t work = 0;
  auto check_slot = [&](int s, const std::string& where) {
    if (s < 0 || s >= n)
      fail(where + ": slot " + std::to_string(s) + " out of range (program has " + std::to_string(n) + " slots)");
  };
  for (size_t i = 0; i < p.feeds.size(); ++i) {
    check_slot(p.feeds[i], "feed " + std::to_string(i));
    if (defined[p.feeds[i]]) fail("feed " + std::to_string(i) + ": slot " + std::to_string(p.feeds[i]) + " fed twice");
    defined[p.feeds[i]] = true;
  }
  for (size_t k = 0; k < p.instrs.size(); ++k) {
    const Instr& in = p.instrs[k];
    std::string where = "instruction " + std::to_string(k) + " (" + op_name(in.op) + ")";
    for (int s : in.in) {
      check_slot(s, where + " input");
      if (!defined[s]) fail(where + ": input slot " + std::to_string(s) + " is used before it is defined");
    }
    const bool attention = in.op == Op::attention || in.op == Op::attention_grad;
    const bool lstm = in.op == Op::lstm || in.op == Op::lstm_grad;
    const bool multi = in.op == Op::fused || is_row_kernel(in.op) || attention || lstm;
    if (in.out.empty() || (!multi && in.out.size() != 1))
      fail(where + ": needs exactly 1 output slot, got " + std::to_string(in.out.size()));
    for (int o : in.out) {
      check_slot(o, where + " output");
      if (defined[o]) fail(where + ": output slot " + std::to_string(o) + " is already defined");
    }
    if (in.op != Op::fused && in.op != Op::cast && in.op != Op::constant && in.op != Op::gemm) {
      for (int s : in.in)
        if (p.slots[s].dtype == DType::F16 || p.slots[s].dtype == DType::BF16)
          fail(where + ": does not take " + dtype_name(p.slots[s].dtype) +
               " values (half values are storage only: cast them to f32)");
    }
    std::vector<Slot> expect;
    try {
      if (in.op == Op::fused) expect = infer_fused(p, in);
      else if (is_row_kernel(in.op)) expect = infer_row_kernel(p, in);
      else if (attention) expect = infer_attention(p, in);
      else if (lstm) expect = infer_lstm(p, in);
      else expect = {infer(p, in)};
    } catch (const std::invalid_argument& e) {
      fail(where + ": " + e.what());
    }
    for (size_t j = 0; j < in.out.size(); ++j) {
      int o = in.out[j];
      const Slot& got = p.slots[o];
      if (expect[j].dtype != got.dtype || expect[j].shape != got.shape)
        fail(where + ": output slot " + std::to_string(o) + " is declared " + slot_str(got) +
             " but the op gives " + slot_str(expect[j]));
      if (defined[o]) fail(where + ": output slot " + std::to_string(o) + " is written twice");
      defined[o] = true;
    }
    try {
      check_kernel_sizes(p, in);
    } catch (const std::invalid_argument& e) {
      fail(where + ": " + e.what());
    }
    work = sat_add(work, instr_work(p, in));
    if (work > kMaxWork)
      fail(where + ": the program describes more than 2^42 units of work (minutes of CPU; "
           "see instr_work); split it");
  }
  for (size_t i = 0; i < p.results.size(); ++i) {
    check_slot(p.results[i], "result " + std::to_string(i));
    if (!defined[p.results[i]]) fail("result " + std::to_string(i) + ": slot " + std::to_string(p.results[i]) + " is never defined");
  }
  std::set<int> inplace_feeds, inplace_results;
  for (auto [r, f] : p.inplace) {
    if (r < 0 || r >= static_cast<int>(p.results.size()))
      fail("inplace result index " + std::to_string(r) + " out of range");
    if (f < 0 || f >= static_cast<int>(p.feeds.size()))
      fail("inplace feed index " + std::to_string(f) + " out of range");
    if (!inplace_feeds.insert(f).second || !inplace_results.insert(r).second)
      fail("inplace: feed " + std::to_string(f) + " or result " + std::to_string(r) + " used twice");
    const Slot &rs = p.slots[p.results[r]], &fs = p.slots[p.feeds[f]];
    if (rs.dtype != fs.dtype || rs.shape != fs.shape)
      fail("inplace: result " + std::to_string(r) + " " + slot_str(rs) + " does not match feed " +
           std::to_string(f) + " " + slot_str(fs));
  }
}

namespace {
void key_attr(std::ostringstream& os, const AttrValue& a) {
  os.precision(17);
  switch (a.kind) {
    case AttrValue::Int: os << "i" << a.i; break;
    case AttrValue::Float: os << "f" << a.f; break;
    case AttrValue::Bool: os << (a.b ? "T" : "F"); break;
    case AttrValue::Str: os << "s'" << a.s << "'"; break;
    case AttrValue::Ints: os << "I"; for (auto v : a.ints) os << v << ","; break;
    case AttrValue::Floats: os << "D"; for (auto v : a.floats) os << v << ","; break;
    case AttrValue::Strs: os << "S"; for (auto& v : a.strs) os << v << ","; break;
    case AttrValue::EmptyList: os << "[]"; break;
  }
}
}  // namespace

std::string structural_key(const Program& p) {
  std::ostringstream os;
  for (const Slot& s : p.slots) os << dtype_name(s.dtype) << shape_str(s.shape) << ";";
  os << "|";
  for (const Instr& in : p.instrs) {
    os << op_name(in.op) << "(";
    for (int s : in.in) os << s << ",";
    os << ")->";
    for (int o : in.out) os << o << ",";
    os << "{";
    for (auto& [k, v] : in.attrs) { os << k << "="; key_attr(os, v); os << ";"; }
    os << "}";
  }
  os << "|F";
  for (int f : p.feeds) os << f << ",";
  os << "|R";
  for (int r : p.results) os << r << ",";
  os << "|P";
  for (auto [r, f] : p.inplace) os << r << ":" << f << ",";
  return os.str();
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) { h ^= ch; h *= 1099511628211ull; }
  return h;
}

std::string dump(const Program& p) {
  // Also dumps programs that did not validate: a slot index out of range prints as '?'.
  std::ostringstream os;
  auto sl = [&](int s) { return "%" + std::to_string(s); };
  auto ty = [&](int s) {
    return s >= 0 && s < static_cast<int>(p.slots.size()) ? slot_str(p.slots[s]) : std::string("?");
  };
  os << "program(";
  for (size_t i = 0; i < p.feeds.size(); ++i)
    os << (i ? ", " : "") << sl(p.feeds[i]) << ": " << ty(p.feeds[i]);
  os << ")\n";
  for (const Instr& in : p.instrs) {
    os << "  ";
    for (size_t j = 0; j < in.out.size(); ++j)
      os << (j ? ", " : "") << sl(in.out[j]) << ": " << ty(in.out[j]);
    os << " = " << op_name(in.op);
    if (!in.attrs.empty()) {
      os << "{";
      bool first = true;
      for (auto& [k, v] : in.attrs) {
        os << (first ? "" : ", ") << k << "=";
        key_attr(os, v);
        first = false;
      }
      os << "}";
    }
    os << "(";
    for (size_t i = 0; i < in.in.size(); ++i) os << (i ? ", " : "") << sl(in.in[i]);
    os << ")\n";
  }
  os << "  return ";
  for (size_t i = 0; i < p.results.size(); ++i) os << (i ? ", " : "") << sl(p.results[i]);
  os << "\n";
  return os.str();
}

}  // namespace lucid
