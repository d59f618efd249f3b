// Optimizer update chains recognized in a `fused` instruction and run as one pass in registers.
//
// The generic evaluator (elementwise.cpp) computes a fused chain node by node over blocks of
// 1024 elements. For Adam's 13 nodes that costs about the sum of 13 passes: its three divider
// operations (two divisions, a square root) cannot overlap the loads of the parameter, the
// gradient and the moments, which the cheap nodes pay for. Here the whole update of one element
// (read p, g, m, v once; write p, m, v) is one loop body, so the divider stays busy while the
// memory streams: 2.5-3x less time on workload A's 200k-parameter update. Recognized: Adam and
// AdamW with all their options ("adam"), RMSprop without centering or momentum ("rmsprop") and
// Adagrad ("adagrad"), each with maximization and L2 weight decay.
//
// Each recognized chain is matched structurally from its outputs, operand by operand (add and
// mul in either order), against the ops the optimizer's eager update traces, and the kernel
// performs exactly those operations in that order (no FMA contraction, no reciprocal in place of
// a division), so its results are bit-identical to the generic evaluator and to eager Lucid.
// Anything else (another wiring, a broadcast operand, mixed dtypes, an output overlapping an
// input other than the one it replaces) stays with the generic evaluator.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <set>

#include "lucid/kernels.h"
#include "lucid/optim.h"
#include "lucid/parallel.h"

namespace lucid {

namespace {

// Below this many elements one thread does it all (a worker's wake-up costs more); each part
// gets at least half of it.
constexpr int64_t kUpdateParallelMinElements = 1 << 15;

// Adam / AdamW (lucid/optim/adam.py, `adam_update`): which optional pieces the chain has.
struct AdamForm {
  bool maximize = false;   // g = -grad
  bool l2 = false;         // g = g + p * weight_decay
  bool decoupled = false;  // the update is subtracted from p * decay_factor
  bool amsgrad = false;    // the denominator uses max(max_exp_avg_sq, exp_avg_sq)
};

// Input positions (in the instruction's inputs) of the chain's operands.
struct AdamOperands {
  int p = -1, g = -1, m = -1, v = -1, vmax = -1;  // tensors
  int beta1 = -1, one_minus_beta1 = -1, beta2 = -1, one_minus_beta2 = -1;  // 0-d
  int bias_correction2_sqrt = -1, eps = -1, step_size = -1, weight_decay = -1, decay = -1;
  // Nodes whose values are the new moments, the running max and the new parameter.
  int m_node = -1, v_node = -1, vmax_node = -1, p_node = -1;
};

// Structural matching over the decoded nodes: values < n_in are inputs, the rest nodes.
class Matcher {
 public:
  Matcher(const Program& p, const Instr& in, const std::vector<ExprNode>& nodes, DType dtype)
      : p_(p), in_(in), nodes_(nodes), n_in_(static_cast<int>(in.in.size())), dtype_(dtype) {}

  // `v` is node `op` (unary: a, binary: a, b); for add and mul, b and a may be swapped by the
  // caller trying both orders.
  bool node(int v, Op op, int* a, int* b = nullptr) {
    if (v < n_in_) return false;
    const ExprNode& n = nodes_[v - n_in_];
    if (n.op != op || n.dtype != dtype_) return false;
    if (b == nullptr) {
      if (n.args.size() != 1) return false;
      *a = n.args[0];
    } else {
      if (n.args.size() != 2) return false;
      *a = n.args[0];
      *b = n.args[1];
    }
    used_.insert(v - n_in_);
    return true;
  }
  // An input of the chain's dtype with the output's size (read in place), or a 0-d one.
  bool tensor(int v) const { return input(v) && p_.slots[in_.in[v]].size() == total(); }
  bool scalar(int v) const { return input(v) && p_.slots[in_.in[v]].shape.empty(); }
  // `v` = x * s with s a 0-d input (either order); sets x and s.
  bool times_scalar(int v, int* x, int* s) {
    int a, b;
    if (!node(v, Op::mul, &a, &b)) return false;
    if (scalar(b)) { *x = a; *s = b; return true; }
    if (scalar(a)) { *x = b; *s = a; return true; }
    return false;
  }
  // `v` = t * s with t a tensor input and s a 0-d input (either order).
  bool tensor_times_scalar(int v, int* t, int* s) {
    return times_scalar(v, t, s) && tensor(*t);
  }
  // `v` = (x * s1) + (y * s2), x a tensor input, either order of the two sums and products;
  // y must be `want_y` unless that is -1.
  bool moment(int v, int* x, int* s1, int* y, int* s2, int want_y = -1) {
    int a, b;
    if (!node(v, Op::add, &a, &b)) return false;
    for (int swap = 0; swap < 2; ++swap) {
      const int l = swap ? b : a, r = swap ? a : b;
      auto saved = used_;
      if (tensor_times_scalar(l, x, s1) && times_scalar(r, y, s2) &&
          (want_y < 0 || *y == want_y))
        return true;
      used_ = saved;
    }
    return false;
  }
  const std::set<int>& used() const { return used_; }

 private:
  bool input(int v) const { return v >= 0 && v < n_in_ && p_.slots[in_.in[v]].dtype == dtype_; }
  int64_t total() const { return p_.slots[in_.out[0]].size(); }

  const Program& p_;
  const Instr& in_;
  const std::vector<ExprNode>& nodes_;
  const int n_in_;
  const DType dtype_;
  std::set<int> used_;
};

// The gradient as `begin_step` prepares it from input `grad`: grad, -grad, or either of them
// plus p * weight_decay (L2 decay, `p` the parameter input); sets the gradient input, the decay
// input and the form's flags.
template <class Form>
bool match_grad(Matcher& mt, int v, int p, int* grad, int* weight_decay, Form* form) {
  int a, b;
  if (mt.node(v, Op::add, &a, &b)) {  // grad + p * weight_decay, either order
    int t = -1, s = -1;
    if (mt.tensor_times_scalar(b, &t, &s) && t == p) v = a;
    else if (mt.tensor_times_scalar(a, &t, &s) && t == p) v = b;
    else return false;
    *weight_decay = s;
    form->l2 = true;
  }
  if (mt.node(v, Op::neg, &a)) {
    v = a;
    form->maximize = true;
  }
  if (!mt.tensor(v)) return false;
  *grad = v;
  return true;
}

// Matches Adam's chain ending at node value `pv` (the new parameter); fills `ops` and `form`.
//   p' = P - (m' / (sqrt(S) / bc2 + eps)) * step_size,  P = p or p * decay
//   m' = m * beta1 + G * (1 - beta1),  v' = v * beta2 + (G * G) * (1 - beta2)
//   S = v' or max(vmax, v'),  G = grad, -grad, or (grad or -grad) + p * weight_decay
bool match_adam(Matcher& mt, int pv, AdamOperands* ops, AdamForm* form) {
  int decayed, delta, quotient, m_new, denom, scaled, root, second;
  if (!mt.node(pv, Op::sub, &decayed, &delta)) return false;
  if (!mt.times_scalar(delta, &quotient, &ops->step_size)) return false;
  if (!mt.node(quotient, Op::div, &m_new, &denom)) return false;
  {
    int a, b;
    if (!mt.node(denom, Op::add, &a, &b)) return false;
    if (mt.scalar(b)) { scaled = a; ops->eps = b; }
    else if (mt.scalar(a)) { scaled = b; ops->eps = a; }
    else return false;
  }
  if (!mt.node(scaled, Op::div, &root, &ops->bias_correction2_sqrt)) return false;
  if (!mt.scalar(ops->bias_correction2_sqrt)) return false;
  if (!mt.node(root, Op::sqrt, &second)) return false;
  if (mt.tensor(decayed)) {
    ops->p = decayed;
  } else {
    if (!mt.tensor_times_scalar(decayed, &ops->p, &ops->decay)) return false;
    form->decoupled = true;
  }
  int v_new = second;
  {
    int a, b;
    if (mt.node(second, Op::maximum, &a, &b)) {
      if (!mt.tensor(a)) return false;
      ops->vmax = a;
      v_new = b;
      form->amsgrad = true;
      ops->vmax_node = second;
    }
  }
  // The second moment first: its g * g names the gradient expression unambiguously (in the
  // first moment, m * beta1 and grad * (1 - beta1) are both a tensor times a 0-d value).
  int g2, g;
  if (!mt.moment(v_new, &ops->v, &ops->beta2, &g2, &ops->one_minus_beta2)) return false;
  {
    int a, b;
    if (!mt.node(g2, Op::mul, &a, &b) || a != b) return false;
    g = a;
  }
  int g1;
  if (!mt.moment(m_new, &ops->m, &ops->beta1, &g1, &ops->one_minus_beta1, g)) return false;
  if (!match_grad(mt, g, ops->p, &ops->g, &ops->weight_decay, form)) return false;
  ops->m_node = m_new;
  ops->v_node = v_new;
  ops->p_node = pv;
  return true;
}

// One element range of Adam's update; mirrors adam_update's ops in order.
template <class T, bool kMaximize, bool kL2, bool kDecoupled, bool kAmsgrad>
struct AdamLoop {
  static void run(const AdamOperands& o, const T* const* in, T* const* out, const T* s,
                  int64_t i0, int64_t i1);
};

#define LUCID_ADAM_BODY                                                                     \
  const T* P = in[0];                                                                       \
  const T* G = in[1];                                                                       \
  const T* M = in[2];                                                                       \
  const T* V = in[3];                                                                       \
  const T* VM = in[4];                                                                      \
  T* Po = out[0];                                                                           \
  T* Mo = out[1];                                                                           \
  T* Vo = out[2];                                                                           \
  T* VMo = out[3];                                                                          \
  const T b1 = s[0], omb1 = s[1], b2 = s[2], omb2 = s[3], bc2 = s[4], eps = s[5],           \
          ss = s[6], wd = s[7], decay = s[8];                                               \
  (void)VM; (void)VMo; (void)wd; (void)decay;                                               \
  _Pragma("GCC ivdep") for (int64_t i = i0; i < i1; ++i) {                                  \
    const T p = P[i];                                                                       \
    T g = G[i];                                                                             \
    if constexpr (kMaximize) g = -g;                                                        \
    if constexpr (kL2) g = g + p * wd;                                                      \
    const T mn = M[i] * b1 + g * omb1;                                                      \
    const T vn = V[i] * b2 + (g * g) * omb2;                                                \
    T second = vn;                                                                          \
    if constexpr (kAmsgrad) {                                                               \
      const T a = VM[i];                                                                    \
      /* nan_max of the generic evaluator: NaN wins, else a > b ? a : b */                  \
      second = a != a ? a : (vn != vn ? vn : (a > vn ? a : vn));                            \
      VMo[i] = second;                                                                      \
    }                                                                                       \
    const T denom = std::sqrt(second) / bc2 + eps;                                          \
    T base = p;                                                                             \
    if constexpr (kDecoupled) base = p * decay;                                             \
    Mo[i] = mn;                                                                             \
    Vo[i] = vn;                                                                             \
    Po[i] = base - (mn / denom) * ss;                                                       \
  }

// An output may be the very buffer of the input it replaces (m' over m): each element is read
// before it is written, in one iteration, and no other element is touched, so `ivdep` (the
// vectorizer's overlap check dropped, as in elementwise_f32.cpp) keeps the loop exact. Other
// overlaps never get here (checked per run).
template <class T, bool kMaximize, bool kL2, bool kDecoupled, bool kAmsgrad>
void adam_range_baseline(const T* const* in, T* const* out, const T* s, int64_t i0, int64_t i1) {
  LUCID_ADAM_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
template <class T, bool kMaximize, bool kL2, bool kDecoupled, bool kAmsgrad>
__attribute__((target("avx2,fma"))) void adam_range_avx2(const T* const* in, T* const* out,
                                                         const T* s, int64_t i0, int64_t i1) {
  LUCID_ADAM_BODY
}

bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

template <class T>
using AdamRange = void (*)(const T* const*, T* const*, const T*, int64_t, int64_t);

template <class T, bool A, bool B, bool C, bool D>
AdamRange<T> adam_range_for() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx2()) return &adam_range_avx2<T, A, B, C, D>;
#endif
  return &adam_range_baseline<T, A, B, C, D>;
}

template <class T>
AdamRange<T> pick_adam_range(const AdamForm& f) {
  const int key = (f.maximize ? 8 : 0) | (f.l2 ? 4 : 0) | (f.decoupled ? 2 : 0) | (f.amsgrad ? 1 : 0);
  switch (key) {
#define LUCID_ADAM_CASE(k) \
  case k: return adam_range_for<T, (k & 8) != 0, (k & 4) != 0, (k & 2) != 0, (k & 1) != 0>();
    LUCID_ADAM_CASE(0) LUCID_ADAM_CASE(1) LUCID_ADAM_CASE(2) LUCID_ADAM_CASE(3)
    LUCID_ADAM_CASE(4) LUCID_ADAM_CASE(5) LUCID_ADAM_CASE(6) LUCID_ADAM_CASE(7)
    LUCID_ADAM_CASE(8) LUCID_ADAM_CASE(9) LUCID_ADAM_CASE(10) LUCID_ADAM_CASE(11)
    LUCID_ADAM_CASE(12) LUCID_ADAM_CASE(13) LUCID_ADAM_CASE(14) LUCID_ADAM_CASE(15)
#undef LUCID_ADAM_CASE
  }
  return nullptr;
}

// RMSprop (without centering or momentum) and Adagrad (lucid/optim/rmsprop.py, adagrad.py):
//   s' = s * alpha + (G * G) * (1 - alpha)   (RMSprop)   or   s' = s + G * G   (Adagrad)
//   p' = p - (G / (sqrt(s') + eps)) * lr,  G as for Adam (maximize, L2 decay)
struct RmsForm {
  bool maximize = false, l2 = false, adagrad = false;
};

struct RmsOperands {
  int p = -1, g = -1, s = -1;
  int alpha = -1, one_minus_alpha = -1, eps = -1, lr = -1, weight_decay = -1;
  int p_node = -1, s_node = -1;
};

bool match_rms(Matcher& mt, int pv, RmsOperands* ops, RmsForm* form) {
  int delta, quotient, gexpr, denom, root = -1, acc;
  if (!mt.node(pv, Op::sub, &ops->p, &delta) || !mt.tensor(ops->p)) return false;
  if (!mt.times_scalar(delta, &quotient, &ops->lr)) return false;
  if (!mt.node(quotient, Op::div, &gexpr, &denom)) return false;
  {
    int a, b;
    if (!mt.node(denom, Op::add, &a, &b)) return false;
    if (mt.scalar(b)) { root = a; ops->eps = b; }
    else if (mt.scalar(a)) { root = b; ops->eps = a; }
    else return false;
  }
  if (!mt.node(root, Op::sqrt, &acc)) return false;
  int sq;
  if (mt.moment(acc, &ops->s, &ops->alpha, &sq, &ops->one_minus_alpha)) {
    form->adagrad = false;
  } else {
    int a, b;
    if (!mt.node(acc, Op::add, &a, &b)) return false;
    if (mt.tensor(a)) { ops->s = a; sq = b; }
    else if (mt.tensor(b)) { ops->s = b; sq = a; }
    else return false;
    form->adagrad = true;
  }
  {
    int a, b;
    if (!mt.node(sq, Op::mul, &a, &b) || a != b || a != gexpr) return false;
  }
  if (!match_grad(mt, gexpr, ops->p, &ops->g, &ops->weight_decay, form)) return false;
  ops->p_node = pv;
  ops->s_node = acc;
  return true;
}

#define LUCID_RMS_BODY                                                                      \
  const T* P = in[0];                                                                       \
  const T* G = in[1];                                                                       \
  const T* S = in[2];                                                                       \
  T* Po = out[0];                                                                           \
  T* So = out[1];                                                                           \
  const T alpha = s[0], oma = s[1], eps = s[5], lr = s[6], wd = s[7];                       \
  (void)alpha; (void)oma; (void)wd;                                                         \
  _Pragma("GCC ivdep") for (int64_t i = i0; i < i1; ++i) {                                  \
    const T p = P[i];                                                                       \
    T g = G[i];                                                                             \
    if constexpr (kMaximize) g = -g;                                                        \
    if constexpr (kL2) g = g + p * wd;                                                      \
    T acc;                                                                                  \
    if constexpr (kAdagrad) acc = S[i] + g * g;                                             \
    else acc = S[i] * alpha + (g * g) * oma;                                                \
    const T denom = std::sqrt(acc) + eps;                                                   \
    So[i] = acc;                                                                            \
    Po[i] = p - (g / denom) * lr;                                                           \
  }

template <class T, bool kMaximize, bool kL2, bool kAdagrad>
void rms_range_baseline(const T* const* in, T* const* out, const T* s, int64_t i0, int64_t i1) {
  LUCID_RMS_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
template <class T, bool kMaximize, bool kL2, bool kAdagrad>
__attribute__((target("avx2,fma"))) void rms_range_avx2(const T* const* in, T* const* out,
                                                        const T* s, int64_t i0, int64_t i1) {
  LUCID_RMS_BODY
}
#endif

template <class T, bool A, bool B, bool C>
AdamRange<T> rms_range_for() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx2()) return &rms_range_avx2<T, A, B, C>;
#endif
  return &rms_range_baseline<T, A, B, C>;
}

template <class T>
AdamRange<T> pick_rms_range(const RmsForm& f) {
  const int key = (f.maximize ? 4 : 0) | (f.l2 ? 2 : 0) | (f.adagrad ? 1 : 0);
  switch (key) {
#define LUCID_RMS_CASE(k) \
  case k: return rms_range_for<T, (k & 4) != 0, (k & 2) != 0, (k & 1) != 0>();
    LUCID_RMS_CASE(0) LUCID_RMS_CASE(1) LUCID_RMS_CASE(2) LUCID_RMS_CASE(3)
    LUCID_RMS_CASE(4) LUCID_RMS_CASE(5) LUCID_RMS_CASE(6) LUCID_RMS_CASE(7)
#undef LUCID_RMS_CASE
  }
  return nullptr;
}

// A recognized update: its operand slots (in the kernel's order) and the loops to run.
struct UpdatePlan {
  const char* name = "";
  DType dtype = DType::F32;
  int64_t total = 0;
  int in_slots[5] = {-1, -1, -1, -1, -1};   // Adam: p, g, m, v, vmax; RMS: p, g, s
  int out_slots[4] = {-1, -1, -1, -1};      // Adam: p', m', v', vmax'; RMS: p', s'
  int scalar_slots[9] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
  int replaces[4] = {-1, -1, -1, -1};  // out_slots[j] may be the buffer of in_slots[replaces[j]]
  AdamRange<float> range_f32 = nullptr;
  AdamRange<double> range_f64 = nullptr;
  Step fallback;

  // True when no output shares memory with another output or with an input other than the
  // one it replaces (p' over p, a moment or accumulator over its old value): then one loop
  // whose iteration reads an element's inputs, then writes its outputs, is exact.
  bool safe(void* const* slots, size_t esize) const {
    const size_t bytes = static_cast<size_t>(total) * esize;
    auto overlap = [&](const void* a, const void* b) {
      auto x = static_cast<const uint8_t*>(a), y = static_cast<const uint8_t*>(b);
      return x < y + bytes && y < x + bytes;
    };
    for (int j = 0; j < 4; ++j) {
      if (out_slots[j] < 0) continue;
      const void* o = slots[out_slots[j]];
      for (int i = 0; i < 5; ++i) {
        if (in_slots[i] < 0 || !overlap(o, slots[in_slots[i]])) continue;
        if (i != replaces[j] || o != slots[in_slots[i]]) return false;
      }
      for (int k = 0; k < j; ++k)
        if (out_slots[k] >= 0 && overlap(o, slots[out_slots[k]])) return false;
    }
    return true;
  }

  template <class T>
  void run_typed(void* const* slots, AdamRange<T> range) const {
    const T* in[5];
    T* out[4];
    T s[9] = {};
    for (int i = 0; i < 5; ++i)
      in[i] = in_slots[i] >= 0 ? static_cast<const T*>(slots[in_slots[i]]) : nullptr;
    for (int j = 0; j < 4; ++j) out[j] = out_slots[j] >= 0 ? static_cast<T*>(slots[out_slots[j]]) : nullptr;
    for (int k = 0; k < 9; ++k)
      if (scalar_slots[k] >= 0) s[k] = *static_cast<const T*>(slots[scalar_slots[k]]);
    if (total < kUpdateParallelMinElements) return range(in, out, s, 0, total);
    // Parts of whole cache lines, so two threads never write one line.
    const int64_t per_line = 64 / static_cast<int64_t>(sizeof(T));
    const int64_t lines = (total + per_line - 1) / per_line;
    parallel_for(lines, kUpdateParallelMinElements / 2 / per_line, [&](int64_t l0, int64_t l1) {
      range(in, out, s, l0 * per_line, std::min(total, l1 * per_line));
    });
  }
};

// Fills the plan's slots from a match: `want` are the result nodes in the kernel's output
// order (-1: absent), `tensors` and `scalars` input positions (-1: absent). False unless the
// instruction's outputs are exactly the present results.
bool bind_plan(const Program& p, const Instr& in, const std::vector<int>& out_nodes,
               const int (&want)[4], const int (&tensors)[5], const int (&scalars)[9],
               UpdatePlan* plan) {
  const int n_in = static_cast<int>(in.in.size());
  int found[4] = {-1, -1, -1, -1};
  for (size_t j = 0; j < out_nodes.size(); ++j) {
    int hit = -1;
    for (int r = 0; r < 4; ++r)
      if (want[r] >= 0 && want[r] == n_in + out_nodes[j]) hit = r;
    if (hit < 0 || found[hit] >= 0) return false;
    found[hit] = in.out[j];
  }
  for (int r = 0; r < 4; ++r)
    if ((want[r] >= 0) != (found[r] >= 0)) return false;
  plan->total = p.slots[in.out[0]].size();
  for (int i = 0; i < 5; ++i) plan->in_slots[i] = tensors[i] >= 0 ? in.in[tensors[i]] : -1;
  for (int j = 0; j < 4; ++j) plan->out_slots[j] = found[j];
  for (int k = 0; k < 9; ++k) plan->scalar_slots[k] = scalars[k] >= 0 ? in.in[scalars[k]] : -1;
  return true;
}

// The plan of a recognized update chain in `in`, else null.
std::shared_ptr<UpdatePlan> plan_update(const Program& p, const Instr& in,
                                        const std::vector<ExprNode>& nodes,
                                        const std::vector<int>& out_nodes) {
  if (nodes.empty()) return nullptr;
  const DType dt = nodes.back().dtype;
  if (dt != DType::F32 && dt != DType::F64) return nullptr;
  const int n_in = static_cast<int>(in.in.size());
  // A one-element update cannot tell its 0-d step scalars from its tensors: left to the generic
  // evaluator.
  if (p.slots[in.out[0]].size() <= 1) return nullptr;
  for (int o = 0; o < static_cast<int>(out_nodes.size()); ++o) {
    auto plan = std::make_shared<UpdatePlan>();
    plan->dtype = dt;
    // Every node must belong to the chain (and, in bind_plan, every output be one of its
    // results).
    Matcher adam(p, in, nodes, dt);
    AdamOperands a;
    AdamForm af;
    if (match_adam(adam, n_in + out_nodes[o], &a, &af)) {
      if (adam.used().size() != nodes.size()) return nullptr;
      if (!bind_plan(p, in, out_nodes, {a.p_node, a.m_node, a.v_node, a.vmax_node},
                     {a.p, a.g, a.m, a.v, a.vmax},
                     {a.beta1, a.one_minus_beta1, a.beta2, a.one_minus_beta2,
                      a.bias_correction2_sqrt, a.eps, a.step_size, a.weight_decay, a.decay},
                     plan.get()))
        return nullptr;
      plan->name = "adam";
      const int replaces[4] = {0, 2, 3, 4};
      std::copy(replaces, replaces + 4, plan->replaces);
      plan->range_f32 = pick_adam_range<float>(af);
      plan->range_f64 = pick_adam_range<double>(af);
      return plan;
    }
    Matcher rms(p, in, nodes, dt);
    RmsOperands r;
    RmsForm rf;
    if (match_rms(rms, n_in + out_nodes[o], &r, &rf)) {
      if (rms.used().size() != nodes.size()) return nullptr;
      if (!bind_plan(p, in, out_nodes, {r.p_node, r.s_node, -1, -1}, {r.p, r.g, r.s, -1, -1},
                     {r.alpha, r.one_minus_alpha, -1, -1, -1, r.eps, r.lr, r.weight_decay, -1},
                     plan.get()))
        return nullptr;
      plan->name = rf.adagrad ? "adagrad" : "rmsprop";
      const int replaces[4] = {0, 2, -1, -1};
      std::copy(replaces, replaces + 4, plan->replaces);
      plan->range_f32 = pick_rms_range<float>(rf);
      plan->range_f64 = pick_rms_range<double>(rf);
      return plan;
    }
  }
  return nullptr;
}

bool update_kernels_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("LUCID_UPDATE_KERNELS");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

}  // namespace

std::string update_kernel_name(const Program& p, const Instr& in) {
  if (in.op != Op::fused || !update_kernels_enabled()) return "";
  const std::vector<ExprNode> nodes = decode_expr(p, in);
  std::shared_ptr<UpdatePlan> plan = plan_update(p, in, nodes, expr_outputs(in, nodes.size()));
  return plan ? plan->name : "";
}

Step make_update_step(const Program& p, const Instr& in, const std::vector<ExprNode>& nodes,
                      const std::vector<int>& out_nodes, Step fallback) {
  if (in.op != Op::fused || !update_kernels_enabled()) return nullptr;
  std::shared_ptr<UpdatePlan> plan = plan_update(p, in, nodes, out_nodes);
  if (!plan) return nullptr;
  plan->fallback = std::move(fallback);
  if (plan->dtype == DType::F32) {
    return [plan](void* const* slots) {
      if (plan->safe(slots, sizeof(float))) plan->run_typed<float>(slots, plan->range_f32);
      else plan->fallback(slots);
    };
  }
  return [plan](void* const* slots) {
    if (plan->safe(slots, sizeof(double))) plan->run_typed<double>(slots, plan->range_f64);
    else plan->fallback(slots);
  };
}

}  // namespace lucid
