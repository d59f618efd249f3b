// The program model: typed value slots + instructions + feed and result slots, and its validator.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace lucid {

// F16 and BF16 are storage only: the one op that reads or writes them is cast (see lucid/half.h).
enum class DType : uint8_t { F32, F64, I32, I64, Bool, F16, BF16 };

size_t dtype_size(DType d);
const char* dtype_name(DType d);
bool parse_dtype(const std::string& name, DType* out);
inline bool is_float(DType d) { return d == DType::F32 || d == DType::F64; }
inline bool is_int(DType d) { return d == DType::I32 || d == DType::I64; }
inline bool is_numeric(DType d) { return d != DType::Bool && d != DType::F16 && d != DType::BF16; }

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);

struct Slot {
  Shape shape;
  DType dtype = DType::F32;
  int64_t size() const { return numel(shape); }
  size_t bytes() const { return static_cast<size_t>(size()) * dtype_size(dtype); }
};

struct AttrValue {
  enum Kind { Int, Float, Bool, Str, Ints, Floats, Strs, EmptyList } kind = Int;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strs;
};
using Attrs = std::map<std::string, AttrValue>;

// Every prim op, plus the CPU-only `fused` (an elementwise expression tree), `gemm` (alpha *
// matmul, plus an optional bias row) and `layer_norm` (over the last axis, one pass per row),
// `attention` / `attention_grad` (softmax(alpha * Q Kᵀ) V per head, and its gradient; see
// attention.cpp), which the CPU backend's kernel fusion (lucid/backends/cpu/kernel_fusion.py)
// emits, and `conv2d_bias` (x, w, bias[, scale[, residual]]: conv2d times an optional
// per-channel scale, plus a per-channel bias and an optional residual of the output's shape, then
// ReLU if `relu`) and `max_pool2d_relu_grad` (max_pool2d_grad masked where the pooled input is
// not > 0) from conv_fusion.py.
#define LUCID_UNARY_OPS(X)                                                                       \
  X(neg) X(abs) X(sign) X(square) X(relu) X(exp) X(expm1) X(log) X(log1p) X(sqrt) X(rsqrt)       \
  X(reciprocal) X(sin) X(cos) X(tan) X(tanh) X(sigmoid) X(erf) X(floor) X(ceil) X(round)         \
  X(logical_not) X(isnan) X(isinf) X(isfinite)
#define LUCID_BINARY_OPS(X)                                                                      \
  X(add) X(sub) X(mul) X(div) X(pow) X(atan2) X(maximum) X(minimum) X(floor_divide) X(remainder) \
  X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(logical_and) X(logical_or) X(logical_xor)
#define LUCID_OTHER_OPS(X)                                                                       \
  X(select) X(cast) X(normalize) X(matmul) X(matmul_accumulate) X(reduce_sum) X(reduce_mean) X(reduce_max)            \
  X(reduce_min) X(reduce_prod) X(variance) X(argmax) X(argmin) X(argsort) X(softmax) X(log_softmax) \
  X(cumsum) X(reshape) X(transpose) X(broadcast_to) X(slice) X(concat) X(pad) X(gather)          \
  X(gather_along_axis) X(scatter_add) X(scatter_add_along_axis) X(one_hot) X(check_index)   \
  X(conv2d)                                                                                      \
  X(conv2d_data_grad) X(conv2d_weights_grad) X(max_pool2d) X(max_pool2d_grad) X(avg_pool2d)      \
  X(avg_pool2d_grad) X(constant) X(fill) X(random_uniform) X(random_normal) X(fused) X(gemm)    \
  X(layer_norm) X(attention) X(attention_grad) X(conv2d_bias) X(max_pool2d_relu_grad)           \
  X(lstm) X(lstm_grad)
// CPU-only row kernels with several outputs (norm_gelu.cpp): GELU, its gradient, layer norm's
// backward.
#define LUCID_ROW_KERNEL_OPS(X) X(gelu) X(gelu_grad) X(layer_norm_grad)
#define LUCID_ALL_OPS(X) LUCID_UNARY_OPS(X) LUCID_BINARY_OPS(X) LUCID_OTHER_OPS(X) LUCID_ROW_KERNEL_OPS(X)

enum class Op : uint16_t {
#define LUCID_ENUM(name) name,
  LUCID_ALL_OPS(LUCID_ENUM)
#undef LUCID_ENUM
      kCount
};

const char* op_name(Op op);
bool parse_op(const std::string& name, Op* out);
bool is_unary(Op op);
bool is_binary(Op op);
// Ops the elementwise evaluator runs (and that `fused` may contain).
bool is_elementwise(Op op);
// Ops whose kernels can throw while a program runs (index range checks); every other kernel runs
// to completion once the program validated.
bool may_throw_at_run_time(Op op);
int elementwise_arity(Op op);

struct Instr {
  Op op = Op::add;
  std::vector<int> in, out;
  Attrs attrs;
};

struct Program {
  std::vector<Slot> slots;
  std::vector<Instr> instrs;
  std::vector<int> feeds, results;
  std::vector<std::pair<int, int>> inplace;  // (result index, feed index)
};

// Limits the validator enforces. Per slot (and per shape attribute): the product of its
// dimensions, zeros counted as one, so no loop over a huge dimension hides behind an empty one.
constexpr int64_t kMaxElements = int64_t(1) << 40;
// Per program: the summed work estimate of its instructions (instr_work), a few minutes of CPU.
// Bounds how long a run can take (one instruction cannot be interrupted) and keeps every index
// computation of the kernels far from overflow.
constexpr int64_t kMaxWork = int64_t(1) << 42;
// BLAS takes 32-bit sizes (scipy-openblas32).
constexpr int64_t kMaxBlasDim = (int64_t(1) << 31) - 1;

// Size arithmetic on values a program supplies (shapes, attributes): overflow throws
// std::invalid_argument naming `what` instead of wrapping. Every size the validator derives goes
// through these two.
int64_t checked_add(int64_t a, int64_t b, const char* what);
int64_t checked_mul(int64_t a, int64_t b, const char* what);

// Checks everything; throws std::invalid_argument (ValueError in Python) naming the problem.
void validate(const Program& p);
// The row kernels (LUCID_ROW_KERNEL_OPS, norm_gelu.cpp): their output slots, one per output the
// instruction declares; throws std::invalid_argument when operands or output count are wrong.
bool is_row_kernel(Op op);
std::vector<Slot> infer_row_kernel(const Program& p, const Instr& in);
// Work estimate of one instruction of a validated program, >= 1, in units of about one GEMM
// multiply-add: a GEMM's multiply-adds, 2 per element read, written or computed by a fused
// node, 64 per pooling tap (scalar, with a bounds check each).
int64_t instr_work(const Program& p, const Instr& in);
// A canonical text of the program: equal programs (ops, attrs, shapes, dtypes) give equal keys.
std::string structural_key(const Program& p);
uint64_t fnv1a(const std::string& s);
std::string dump(const Program& p);

// Attribute access for validated programs (they throw std::invalid_argument otherwise).
int64_t attr_int(const Instr& in, const char* name);
double attr_float(const Instr& in, const char* name);

// gemm's head views: operand i (0: a, 1: b) given `a_view`/`b_view` = [H, D, col0] is a [B, L, W]
// slot read as [B, H, L, D] (element (b, h, l, d) at (b*L + l)*W + col0 + h*D + d: the heads
// of a projection sliced out of its last axis, with no copy); the output (i = -1) given
// `c_view` = [H, D] is a [B, L, H*D] slot written as [B, H, L, D]. heads == 0: no view.
struct HeadView {
  int64_t heads = 0, dim = 0, col0 = 0;
};
HeadView head_view(const Instr& in, int i);
// The shape gemm (or matmul) computes with for operand i, or its output for i = -1.
Shape gemm_logical_shape(const Program& p, const Instr& in, int i);
bool attr_bool(const Instr& in, const char* name);
DType attr_dtype(const Instr& in, const char* name);
const std::vector<int64_t>& attr_ints(const Instr& in, const char* name);
// attention / attention_grad (attention.cpp): the output slots the instruction computes (the
// output, and attention's optional weights P; throws std::invalid_argument on bad operands,
// attributes or output count), and its work estimate.
std::vector<Slot> infer_attention(const Program& p, const Instr& in);
int64_t attention_work(const Program& p, const Instr& in);
// lstm / lstm_grad (lstm.cpp): the LSTM recurrence of one layer and direction, and its
// gradient; their output slots (throws std::invalid_argument on bad operands) and work estimate.
std::vector<Slot> infer_lstm(const Program& p, const Instr& in);
int64_t lstm_work(const Program& p, const Instr& in);
const std::vector<double>& attr_floats(const Instr& in, const char* name);
const std::vector<std::string>& attr_strs(const Instr& in, const char* name);

// Shared shape helpers.
int64_t normalize_axis(int64_t axis, int64_t ndim);  // throws on out-of-range
bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out);
std::vector<int64_t> contiguous_strides(const Shape& s);

// Decoded expression of an elementwise or fused instruction.
struct ExprNode {
  Op op;
  DType dtype;             // output dtype of the node
  std::vector<int> args;   // < n_inputs: instruction input; else node (index - n_inputs)
  double fparam = 0.0;     // normalize epsilon
};
std::vector<ExprNode> decode_expr(const Program& p, const Instr& in);
// The node each output slot of an elementwise instruction takes: a `fused` instruction's
// `sub_outputs` (one node index per output slot), by default its last node.
std::vector<int> expr_outputs(const Instr& in, size_t n_nodes);

}  // namespace lucid
