"""Which ops autocast changes, and how: one row per registry op, per device type.

The rows follow PyTorch's autocast registrations (``aten/src/ATen/autocast_mode.cpp``, summarised
at https://pytorch.org/docs/stable/amp.html#autocast-op-reference), mapped onto Lucid's op names:

- ``LOWER`` (``lower_precision_fp``): floating operands are cast to the autocast dtype.
- ``FP32`` (``fp32`` and ``fp32_set_opt_dtype``): floating operands are cast to float32; an op
  given an explicit ``dtype`` attribute runs as asked.
- ``PROMOTE``: floating operands are cast to the widest floating type among them.
- ``NONE``: the op runs on whatever types reach it (ordinary type promotion applies).

float64 operands are never cast (PyTorch's autocast leaves double tensors alone). Backward
helpers (``*_backward``) are NONE: autocast is off while gradients are computed, so backward runs
in the types the forward chose. ``tests/amp`` checks that every registry op has a row.
"""

from __future__ import annotations

LOWER = "lower"
FP32 = "fp32"
PROMOTE = "promote"
NONE = "none"

DEVICE_TYPES = ("cpu", "mps")

# op name: (policy under autocast("cpu"), policy under autocast("mps"))
OP_POLICY: dict[str, tuple[str, str]] = {
    # --- matrix products and convolutions: the ops autocast exists for
    "linear": (LOWER, LOWER),
    "matmul": (LOWER, LOWER),
    "einsum": (NONE, LOWER),
    "conv2d": (LOWER, LOWER),
    "conv_transpose2d": (LOWER, LOWER),
    "scaled_dot_product_attention": (LOWER, NONE),
    # --- losses: float32 on both devices (binary_cross_entropy on CPU only)
    "cross_entropy": (FP32, FP32),  # PyTorch: cross_entropy_loss / log_softmax + nll_loss
    "nll_loss": (FP32, FP32),
    "mse_loss": (FP32, FP32),
    "l1_loss": (FP32, FP32),
    "smooth_l1_loss": (FP32, FP32),
    "huber_loss": (FP32, FP32),
    "binary_cross_entropy_with_logits": (FP32, FP32),
    "binary_cross_entropy": (FP32, NONE),
    # --- reductions, softmax, norms and pointwise functions kept in float32 on MPS
    "prod": (FP32, FP32),
    "sum": (NONE, FP32),
    "cumsum": (NONE, FP32),
    "cumprod": (NONE, FP32),
    "softmax": (NONE, FP32),
    "log_softmax": (NONE, FP32),
    "logsumexp": (NONE, FP32),
    "norm": (NONE, FP32),  # PyTorch: linalg_vector_norm
    "layer_norm": (NONE, FP32),
    "layer_norm_backward": (NONE, NONE),
    "batch_norm": (NONE, FP32),
    "rms_norm": (NONE, FP32),  # PyTorch composes it of pow and rsqrt, both float32 on MPS
    "exp": (NONE, FP32),
    "expm1": (NONE, FP32),
    "log": (NONE, FP32),
    "log1p": (NONE, FP32),
    "reciprocal": (NONE, FP32),
    "pow": (NONE, FP32),
    "softplus": (NONE, FP32),
    # --- linear algebra: float32 on CPU
    "linalg_cholesky": (FP32, NONE),
    "linalg_inv": (FP32, NONE),
    "linalg_qr": (FP32, NONE),
    "linalg_solve": (FP32, NONE),
    "linalg_svd": (FP32, NONE),
    "linalg_eigh": (FP32, NONE),
    "linalg_det": (NONE, NONE),
    "linalg_lu": (NONE, NONE),  # linalg_lu, linalg_matrix_exp, linalg_pinv: in neither list
    "linalg_matrix_exp": (NONE, NONE),
    "linalg_pinv": (NONE, NONE),
    # --- collectives reduce in the type they are given (a gradient bucket keeps its dtype)
    "all_reduce": (NONE, NONE),
    # --- promote to the widest input type
    "cat": (PROMOTE, NONE),
    "index_put": (NONE, PROMOTE),
    "scatter_add": (NONE, PROMOTE),
    # --- everything else runs in the types it is given
    "abs": (NONE, NONE),
    "adaptive_avg_pool2d": (NONE, NONE),
    "adaptive_avg_pool2d_backward": (NONE, NONE),
    "add": (NONE, NONE),
    "all": (NONE, NONE),
    "amax": (NONE, NONE),
    "amin": (NONE, NONE),
    "any": (NONE, NONE),
    "argmax": (NONE, NONE),
    "argmin": (NONE, NONE),
    "avg_pool2d": (NONE, NONE),
    "avg_pool2d_backward": (NONE, NONE),
    "bernoulli_mask": (NONE, NONE),
    "binary_cross_entropy_backward": (NONE, NONE),
    "binary_cross_entropy_with_logits_backward": (NONE, NONE),
    "bincount": (NONE, NONE),
    "bitwise_and": (NONE, NONE),
    "bitwise_not": (NONE, NONE),
    "bitwise_or": (NONE, NONE),
    "bitwise_xor": (NONE, NONE),
    "cast": (NONE, NONE),  # autocast's own casts
    "ceil": (NONE, NONE),
    "clamp": (NONE, NONE),
    "clamp_max": (NONE, NONE),
    "clamp_min": (NONE, NONE),
    "conv2d_input_grad": (NONE, NONE),
    "conv2d_weight_grad": (NONE, NONE),
    "cos": (NONE, NONE),
    "cross_entropy_backward": (NONE, NONE),
    "detach": (NONE, NONE),
    "div": (NONE, NONE),
    "elu": (NONE, NONE),
    "elu_backward": (NONE, NONE),
    "embedding": (NONE, NONE),
    "embedding_backward": (NONE, NONE),
    "eq": (NONE, NONE),
    "erf": (NONE, NONE),
    "expand": (NONE, NONE),
    "fill": (NONE, NONE),
    "flip": (NONE, NONE),
    "floor": (NONE, NONE),
    "floor_divide": (NONE, NONE),
    "full_like": (NONE, NONE),
    "gather": (NONE, NONE),
    "ge": (NONE, NONE),
    "gelu": (NONE, NONE),
    "gelu_backward": (NONE, NONE),
    "gt": (NONE, NONE),
    "hardtanh": (NONE, NONE),
    "hardtanh_backward": (NONE, NONE),
    "huber_loss_backward": (NONE, NONE),
    "index": (NONE, NONE),
    "iota": (NONE, NONE),
    "isfinite": (NONE, NONE),
    "isinf": (NONE, NONE),
    "isnan": (NONE, NONE),
    "l1_loss_backward": (NONE, NONE),
    "le": (NONE, NONE),
    "leaky_relu": (NONE, NONE),
    "leaky_relu_backward": (NONE, NONE),
    "logical_and": (NONE, NONE),
    "logical_not": (NONE, NONE),
    "logical_or": (NONE, NONE),
    "logical_xor": (NONE, NONE),
    "lstm_recurrence": (NONE, NONE),  # its operands promoted to one dtype by lstm()
    "lstm_recurrence_backward": (NONE, NONE),
    "lt": (NONE, NONE),
    "masked_fill": (NONE, NONE),
    "max_dim": (NONE, NONE),
    "max_pool2d": (NONE, NONE),
    "max_pool2d_backward": (NONE, NONE),
    "maximum": (NONE, NONE),
    "mean": (NONE, NONE),
    "min_dim": (NONE, NONE),
    "minimum": (NONE, NONE),
    "mul": (NONE, NONE),
    "multinomial": (NONE, NONE),
    "nan_to_num": (NONE, NONE),
    "ne": (NONE, NONE),
    "neg": (NONE, NONE),
    "nll_loss_backward": (NONE, NONE),
    "nonzero": (NONE, NONE),
    "normal": (NONE, NONE),
    "one_hot": (NONE, NONE),
    "ones_like": (NONE, NONE),
    "pad": (NONE, NONE),
    "permute": (NONE, NONE),
    "randint": (NONE, NONE),
    "randperm": (NONE, NONE),
    "relu": (NONE, NONE),
    "remainder": (NONE, NONE),
    "reshape": (NONE, NONE),
    "roll": (NONE, NONE),
    "round": (NONE, NONE),
    "scaled_dot_product_attention_backward": (NONE, NONE),
    "scatter": (NONE, NONE),
    "searchsorted": (NONE, NONE),
    "sigmoid": (NONE, NONE),
    "sign": (NONE, NONE),
    "sin": (NONE, NONE),
    "smooth_l1_loss_backward": (NONE, NONE),
    "softplus_backward": (NONE, NONE),
    "sort": (NONE, NONE),
    "sqrt": (NONE, NONE),
    "sub": (NONE, NONE),
    "sum_to_size": (NONE, NONE),
    "tanh": (NONE, NONE),
    "threshold_backward": (NONE, NONE),
    "topk": (NONE, NONE),
    "tril": (NONE, NONE),
    "triu": (NONE, NONE),
    "trunc": (NONE, NONE),
    "trunc_divide": (NONE, NONE),
    "uniform": (NONE, NONE),
    "unique": (NONE, NONE),
    "upsample2d": (NONE, NONE),
    "upsample2d_backward": (NONE, NONE),
    "var": (NONE, NONE),
    "where": (NONE, NONE),
    "zeros_like": (NONE, NONE),
}


def policy(op_name: str, device_type: str) -> str:
    """The policy of ``op_name`` under ``autocast(device_type)``; an op without a row is NONE."""
    row = OP_POLICY.get(op_name)
    return NONE if row is None else row[DEVICE_TYPES.index(device_type)]
