// Stride-1 convolutions without im2col (conv.cpp): each image is copied once into a zero-padded
// plane, and the convolution is a GEMM whose right operand rows are shifted views of that plane,
// computed by small register-tiled kernels while the image stays in cache, images split across
// the worker pool. float32 3x3 stride-1 convolutions whose weights are too large for that, with
// output planes of more than 64 pixels and enough 2x2 output tiles, run as Winograd F(2x2, 3x3):
// 16 GEMMs over the batch's tiles; other float32 forward convolutions without groups (strided,
// 1x1, large weights on small planes) as one implicit GEMM over the batch (conv_im2col.h) with
// parallel copies and the epilogue in the scatter to NCHW.
// The shifted-view kernels run on AVX-512 registers where Lucid's sgemm runs its AVX-512 tile
// (set_sgemm_isa / LUCID_SGEMM_ISA=avx2 forces both back to AVX2). float32 backward passes
// without groups that the direct kernels leave run as one sgemm over the batch (the weight
// gradient's an implicit GEMM, the data gradient's into an im2col-shaped matrix), with the
// copies on the worker pool. The callers (linalg.cpp) fall back to im2col + BLAS when
// these return false (float64 beyond the direct kernels, groups, very large shapes).
#pragma once

#include <cstdint>

namespace lucid {

// NCHW input [N, C, H, W], OIHW weight [O, C/G, KH, KW], output [N, O, HO, WO]; padding top and
// left (bottom and right follow from the output size).
struct ConvShape {
  int64_t N, C, H, W, O, KH, KW, HO, WO, G, sh, sw, dh, dw, pt, pl;
};

// What a forward convolution applies to each output value v of channel o before storing it:
// relu?(v * scale[o] + bias[o] + residual[i]), i the value's NCHW index in y. Null pointers are
// left out (scale: 1, bias and residual: 0). conv2d_bias's operands: an inference BatchNorm
// folded into its convolution is the scale and bias, the skip of a residual block the residual.
template <class T>
struct ConvEpilogue {
  const T* scale = nullptr;
  const T* bias = nullptr;
  const T* residual = nullptr;  // [N, O, HO, WO], like y (never y itself)
  bool relu = false;
};

// y = epilogue(conv(x, w)).
bool conv2d_direct_forward(const ConvShape& s, const float* x, const float* w,
                           const ConvEpilogue<float>& ep, float* y);
bool conv2d_direct_forward(const ConvShape& s, const double* x, const double* w,
                           const ConvEpilogue<double>& ep, double* y);
// dx = the gradient of conv(x, w) with respect to x, given dy.
bool conv2d_direct_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx);
bool conv2d_direct_data_grad(const ConvShape& s, const double* dy, const double* w, double* dx);
// dw = the gradient of conv(x, w) with respect to w, given x and dy.
bool conv2d_direct_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw);
bool conv2d_direct_weights_grad(const ConvShape& s, const double* x, const double* dy, double* dw);

}  // namespace lucid
