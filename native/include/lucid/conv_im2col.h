// float32 convolutions without groups as one sgemm over the batch (conv_im2col.cpp): the paths
// conv.cpp takes for the shapes its direct kernels leave (strides, 1x1 projections, weights past
// L2). Forward and weight gradient gather the GEMM's packed operand straight from a zero-padded
// copy of the batch (no im2col matrix); the data gradient writes an im2col-shaped product and
// sums it back into planes. Copies, gathers, col2im planes and the epilogue (scale, bias,
// residual, ReLU) run on the worker pool. Each returns false where it does not apply (groups, no
// AVX2 + FMA for the sgemm, a matrix past 256 MB, negative padding); the caller then falls back.
#pragma once

#include <cstddef>

#include "lucid/conv.h"

namespace lucid {

// y = epilogue(conv(x, w)) (see ConvEpilogue).
bool conv_im2col_forward(const ConvShape& s, const float* x, const float* w,
                         const ConvEpilogue<float>& ep, float* y);
// dw = the gradient of conv(x, w) with respect to w, given x and dy.
bool conv_im2col_weights_grad(const ConvShape& s, const float* x, const float* dy, float* dw);
// dx = the gradient of conv(x, w) with respect to x, given dy.
bool conv_im2col_data_grad(const ConvShape& s, const float* dy, const float* w, float* dx);

// The calling thread's scratch of the convolution paths that need a large one (the im2col
// matrices, Winograd's transformed tiles, a strided layer's phases): one buffer for all, kept
// across calls (no page faults per call), as large as the largest call needed.
float* conv_scratch(size_t n);

}  // namespace lucid
