// CPU kernels: each instruction of a validated program becomes one Step, built once at compile time.
#pragma once

#include <functional>

#include "lucid/program.h"

namespace lucid {

// A step reads and writes slot buffers through the table of slot pointers of one run.
using Step = std::function<void(void* const* slots)>;

Step make_elementwise_step(const Program& p, const Instr& in);  // elementwise.cpp (incl. fused)
Step make_linalg_step(const Program& p, const Instr& in);       // linalg.cpp: matmul, conv, pool
Step make_reduce_step(const Program& p, const Instr& in);       // reduce.cpp: reductions, softmax
Step make_shape_step(const Program& p, const Instr& in);        // shape.cpp: layout, gather, random
Step make_attention_step(const Program& p, const Instr& in);    // attention.cpp: fused attention
Step make_row_kernel_step(const Program& p, const Instr& in);   // norm_gelu.cpp: gelu, layer norm grad
Step make_lstm_step(const Program& p, const Instr& in);         // lstm.cpp: LSTM recurrence

// reduce.cpp: whether `in` (a reduction) sums a float32 input viewed as [R0, K, R1] over R0 and
// R1 into K outputs (BatchNorm's statistics over N, H, W), and that view.
bool reduce_channel_view(const Program& p, const Instr& in, int64_t* R0, int64_t* K,
                         int64_t* R1);
// elementwise.cpp: one step for an elementwise instruction `ew` and the channel reduction `red`
// that is the only reader of ew's output `out_index`: that output's values are summed per run
// as they are computed instead of being written (the same bits as the two steps); an empty Step
// when the pair does not qualify.
// Whether the runtime pairs them (LUCID_FUSED_REDUCTIONS=0 at start or the setter turns it off
// for executables compiled afterwards).
bool fused_reductions_enabled();
void set_fused_reductions(bool on);
Step make_elementwise_reduce_step(const Program& p, const Instr& ew, int out_index,
                                  const Instr& red);

// float32 loops of common elementwise ops (SIMD-dispatched); false when `op` is not one of them.
// Unary ops read `a`; binary ops `a`, `b`; select reads `a` where `mask` is set, else `b`.
bool f32_elementwise(Op op, const float* a, const float* b, const uint8_t* mask, float* out,
                     int64_t n);
// The same for add, sub, mul, div with one 0-d operand `s` (`scalar_first`: s OP a[i]).
bool f32_elementwise_scalar(Op op, const float* a, float s, bool scalar_first, float* out,
                            int64_t n);

// Writes a `constant` instruction's value into `out` (done once, at compile time).
void materialize_constant(const Instr& in, const Slot& out_slot, void* out);

// Calls fn(T{}) with T the C++ type of a dtype (bool is uint8_t).
template <class Fn>
void dispatch_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::F32: fn(float{}); break;
    case DType::F64: fn(double{}); break;
    case DType::I32: fn(int32_t{}); break;
    case DType::I64: fn(int64_t{}); break;
    case DType::Bool: fn(uint8_t{}); break;
  }
}

// A batch of row-major GEMMs C_i = alpha * op(A + a_off[i]) @ op(B + b_off[i]) + beta * C_i,
// C_i at C + c_off[i] (rows ldc apart), all with K > 0.
template <class T>
struct BatchedGemm {
  bool ta, tb;
  int64_t batch, M, N, K;
  T alpha;
  const T* A;
  const int64_t* a_off;
  int64_t lda;
  const T* B;
  const int64_t* b_off;
  int64_t ldb;
  T beta;
  T* C;
  const int64_t* c_off;
  int64_t ldc;
};

// Runs the batch split across the worker pool when its GEMMs are small enough that the BLAS
// keeps each on one thread; false (nothing done) otherwise (batched_gemm.cpp).
bool gemm_batch_parallel(const BatchedGemm<float>& g);
bool gemm_batch_parallel(const BatchedGemm<double>& g);

void blas_set_threads(int n);
int blas_get_threads();

}  // namespace lucid
