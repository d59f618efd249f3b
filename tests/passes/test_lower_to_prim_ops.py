"""Every registry op through ``lower-to-prim``: a one-op trace per op (random shapes and values),
the lucid interpreter vs the prim interpreter after lowering, both vs eager.

``SAMPLES`` (op name -> sample makers) is shared with the native end-to-end tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lucid
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ir import import_trace, interpret
from lucid.ir.importer import forward_func
from lucid.ir.prim.dialect import PrimIROp
from lucid.ir.prim.interpreter import interpret_prim
from lucid.ops._registry import REGISTRY
from lucid.passes import PassManager
from lucid.passes.lower_to_prim import LoweringError, lower_module, lowering_status
from lucid.passes.lowering import RULES, UNSUPPORTED
from lucid.trace import trace

# --- operand makers (numpy arrays become traced inputs; Python scalars stay weak constants)


def f(rng, *shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


def pos(rng, *shape, dtype=np.float32):
    return np.asarray(rng.random(shape) + 0.5, dtype=dtype)


def unit(rng, *shape):
    return np.asarray(rng.random(shape) * 0.9 + 0.05, dtype=np.float32)


def ints(rng, *shape, lo=-5, hi=6, dtype=np.int64):
    return rng.integers(lo, hi, shape).astype(dtype)


def nz_ints(rng, *shape):
    v = ints(rng, *shape)
    return np.where(v == 0, 3, v)


def bools(rng, *shape):
    return rng.random(shape) < 0.5


Sample = tuple[list, dict]
Maker = Callable[[np.random.Generator], Sample]
SAMPLES: dict[str, list[Maker]] = {}


def sample(name: str, *makers: Maker) -> None:
    SAMPLES.setdefault(name, []).extend(makers)


def _shape(rng) -> tuple:
    return tuple(int(d) for d in rng.integers(1, 5, rng.integers(1, 4)))


# elementwise binary: broadcasting, mixed dtypes, weak scalars
for _name in ("add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4), f(r, 4)], {}),
        lambda r: ([ints(r, 2, 3), f(r, 2, 1, dtype=np.float64)], {}),
        lambda r: ([f(r, 3), 2], {}),
        lambda r: ([ints(r, 2, 3, dtype=np.int32), 2.5], {}),
    )
    if _name != "sub":  # numpy has no bool subtraction
        sample(_name, lambda r: ([bools(r, 3), bools(r, 3)], {}))
for _name in ("clamp_min", "clamp_max"):
    sample(_name, lambda r: ([f(r, 3, 4), 0.2], {}), lambda r: ([ints(r, 5), f(r, 5)], {}))
sample("div", lambda r: ([f(r, 3, 4), pos(r, 4)], {}), lambda r: ([ints(r, 4), nz_ints(r, 4)], {}))
for _name in ("floor_divide", "remainder", "trunc_divide"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4), pos(r, 4)], {}),
        lambda r: ([ints(r, 6), nz_ints(r, 6)], {}),
        lambda r: ([f(r, 5, dtype=np.float64), -1.5], {}),
    )
sample(
    "pow",
    lambda r: ([pos(r, 3, 4), f(r, 4)], {}),
    lambda r: ([ints(r, 5, lo=0, hi=4), ints(r, 5, lo=0, hi=4)], {}),
    lambda r: ([f(r, 4), 2], {}),
)
for _name in ("exp", "sin", "cos", "tanh", "sigmoid", "erf", "expm1"):
    sample(_name, lambda r: ([f(r, *_shape(r))], {}), lambda r: ([ints(r, 4)], {}))
for _name in ("log", "sqrt", "reciprocal", "log1p"):
    sample(
        _name,
        lambda r: ([pos(r, *_shape(r))], {}),
        lambda r: ([f(r, 3, dtype=np.float64) ** 2 + 1], {}),
    )
for _name in ("neg", "abs", "sign"):
    sample(_name, lambda r: ([f(r, *_shape(r))], {}), lambda r: ([ints(r, 6, dtype=np.int32)], {}))
for _name in ("floor", "ceil", "trunc"):
    sample(_name, lambda r: ([f(r, 3, 4) * 3], {}), lambda r: ([ints(r, 4)], {}))
sample(
    "round",
    lambda r: ([f(r, 3, 4) * 3], {"decimals": 0}),
    lambda r: ([np.array([0.5, 1.5, 2.5, -0.5], np.float32)], {}),
    lambda r: ([f(r, 5, dtype=np.float64) * 100], {"decimals": 2}),
    lambda r: ([f(r, 5, dtype=np.float64) * 1000], {"decimals": -1}),
)
_SPECIAL = np.array([0.0, np.nan, np.inf, -np.inf, 1.5], np.float32)
for _name in ("isnan", "isinf", "isfinite"):
    sample(_name, lambda r: ([_SPECIAL.copy()], {}), lambda r: ([ints(r, 3)], {}))
sample(
    "nan_to_num",
    lambda r: ([_SPECIAL.copy()], {}),
    lambda r: ([_SPECIAL.astype(np.float64)], {"nan": 1.0, "posinf": 9.0, "neginf": -9.0}),
)
for _name in ("logical_and", "logical_or", "logical_xor"):
    sample(
        _name, lambda r: ([bools(r, 3, 4), bools(r, 4)], {}), lambda r: ([f(r, 4), ints(r, 4)], {})
    )
sample("logical_not", lambda r: ([bools(r, 5)], {}), lambda r: ([ints(r, 5)], {}))
_EXTREMES = np.array([0, -1, 2**63 - 1, -(2**63), 12345, -777], np.int64)
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    sample(
        _name,
        lambda r: ([bools(r, 3, 4), bools(r, 4)], {}),
        lambda r: ([ints(r, 3, 4, lo=-300, hi=300), ints(r, 4, lo=-300, hi=300)], {}),
        lambda r: ([_EXTREMES.copy(), _EXTREMES[::-1].copy()], {}),
        lambda r: ([ints(r, 5, lo=-99, hi=99, dtype=np.int32), 6], {}),
    )
sample("bitwise_not", lambda r: ([bools(r, 6)], {}), lambda r: ([_EXTREMES.copy()], {}))
sample(
    "clamp",
    lambda r: ([f(r, 3, 4), -0.5, 0.5], {}),
    lambda r: ([f(r, 3, 4), f(r, 4) - 1, f(r, 3, 1) + 1], {}),
)
sample(
    "where",
    lambda r: ([bools(r, 3, 4), f(r, 4), f(r, 3, 4)], {}),
    lambda r: ([bools(r, 5), ints(r, 5), 0.5], {}),
)
sample("fill", lambda r: ([f(r, 3, 4), 1.5], {}), lambda r: ([ints(r, 3), 7], {}))
sample(
    "cast",
    lambda r: ([f(r, 3, 4) * 4], {"dtype": lucid.int32}),
    lambda r: ([ints(r, 5)], {"dtype": lucid.float64}),
    lambda r: ([ints(r, 5)], {"dtype": lucid.bool_}),
)
sample("detach", lambda r: ([f(r, 3)], {}))
for _name in ("zeros_like", "ones_like"):
    sample(_name, lambda r: ([f(r, 2, 3)], {}), lambda r: ([f(r, 4)], {"dtype": lucid.int64}))
sample(
    "full_like",
    lambda r: ([f(r, 2, 3)], {"fill_value": 2.5}),
    lambda r: ([ints(r, 3)], {"fill_value": 4}),
)

# activations
sample("relu", lambda r: ([f(r, *_shape(r))], {}), lambda r: ([ints(r, 5)], {}))
sample("elu", lambda r: ([f(r, 3, 4)], {"alpha": 0.7}))
sample("elu_backward", lambda r: ([f(r, 3, 4), f(r, 3, 4)], {"alpha": 0.7}))
for _approx in ("none", "tanh"):
    sample("gelu", lambda r, a=_approx: ([f(r, 3, 4)], {"approximate": a}))
    sample("gelu_backward", lambda r, a=_approx: ([f(r, 3, 4), f(r, 3, 4)], {"approximate": a}))
sample("hardtanh", lambda r: ([f(r, 3, 4) * 2], {"min_val": -0.5, "max_val": 1.0}))
sample("hardtanh_backward", lambda r: ([f(r, 3, 4), f(r, 3, 4) * 2], {}))
sample("leaky_relu", lambda r: ([f(r, 3, 4)], {"negative_slope": 0.2}))
sample("leaky_relu_backward", lambda r: ([f(r, 3, 4), f(r, 3, 4)], {"negative_slope": 0.2}))
sample("softplus", lambda r: ([f(r, 3, 4) * 10], {"beta": 2.0, "threshold": 5.0}))
sample(
    "softplus_backward", lambda r: ([f(r, 3, 4), f(r, 3, 4) * 10], {"beta": 2.0, "threshold": 5.0})
)
sample("threshold_backward", lambda r: ([f(r, 3, 4), f(r, 3, 4)], {"threshold": 0.1}))
for _name in ("softmax", "log_softmax"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4, 5)], {"dim": 1}),
        lambda r: ([f(r, 6, dtype=np.float64)], {"dim": -1}),
    )

# reductions
for _name in ("sum", "mean", "prod", "amax", "amin", "logsumexp"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4, 5)], {"dim": 1}),
        lambda r: ([f(r, 3, 4)], {"dim": None, "keepdim": True}),
        lambda r: ([f(r, 3, 4, 2)], {"dim": (0, 2), "keepdim": False}),
    )
sample("sum", lambda r: ([ints(r, 3, 4)], {"dim": 0}), lambda r: ([bools(r, 5)], {}))
sample("mean", lambda r: ([f(r, 3, 4)], {"dim": 0, "dtype": lucid.float64}))
sample("prod", lambda r: ([ints(r, 3, 4, lo=1, hi=4)], {"dim": 1}))
sample("amax", lambda r: ([ints(r, 3, 4)], {"dim": 1}))
for _name in ("all", "any"):
    sample(_name, lambda r: ([bools(r, 3, 4)], {"dim": 1}), lambda r: ([f(r, 3, 4)], {}))
for _name in ("argmax", "argmin"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4, 5)], {"dim": 1}),
        lambda r: ([f(r, 3, 4)], {"dim": None}),
        lambda r: ([ints(r, 3, 4)], {"dim": 0, "keepdim": True}),
    )
for _name in ("max_dim", "min_dim"):
    sample(
        _name,
        lambda r: ([f(r, 3, 4, 5)], {"dim": 1}),
        lambda r: ([f(r, 3, 4)], {"dim": -1, "keepdim": True}),
    )
sample(
    "var",
    lambda r: ([f(r, 3, 4, 5)], {"dim": 1}),
    lambda r: ([f(r, 3, 4)], {"dim": None, "correction": 0, "keepdim": True}),
)
sample("cumsum", lambda r: ([f(r, 3, 4)], {"dim": 1}), lambda r: ([ints(r, 5)], {"dim": 0}))
sample(
    "cumprod",
    lambda r: ([f(r, 3, 5)], {"dim": 1}),
    lambda r: ([f(r, 4, 2)], {"dim": -2}),
    lambda r: ([ints(r, 5)], {"dim": 0}),
)
sample("iota", lambda r: ([f(r, 3, 4)], {"dim": 1}))
sample("sum_to_size", lambda r: ([f(r, 2, 3, 4)], {"shape": (3, 1)}))
sample(
    "norm",
    lambda r: ([f(r, 3, 4)], {"p": 2.0, "dim": 1}),
    lambda r: ([f(r, 3, 4)], {"p": 1.0}),
    lambda r: ([f(r, 3, 4)], {"p": math.inf, "dim": 0, "keepdim": True}),
    lambda r: ([f(r, 3, 4)], {"p": 3.0, "dim": 1}),
)

# shape
sample(
    "reshape",
    lambda r: ([f(r, 3, 4)], {"shape": (2, 6)}),
    lambda r: ([f(r, 3, 4)], {"shape": (-1,)}),
)
sample("expand", lambda r: ([f(r, 3, 1)], {"shape": (2, 3, 4)}))
sample("permute", lambda r: ([f(r, 2, 3, 4)], {"dims": (2, 0, 1)}))
sample(
    "cat",
    lambda r: ([[f(r, 2, 3), f(r, 1, 3)]], {"dim": 0}),
    lambda r: ([[f(r, 2, 3), ints(r, 2, 2)]], {"dim": -1}),
)
sample(
    "pad",
    lambda r: ([f(r, 2, 3, 4)], {"pad": (1, 2), "value": 0.5}),
    lambda r: ([f(r, 2, 3, 4)], {"pad": (1, -1, -1, 2)}),
)
sample("flip", lambda r: ([f(r, 2, 3, 4)], {"dims": (0, 2)}))
sample(
    "roll",
    lambda r: ([f(r, 3, 4)], {"shifts": (1, -2), "dims": (0, 1)}),
    lambda r: ([f(r, 3, 4)], {"shifts": (5,), "dims": None}),
)
for _name in ("tril", "triu"):
    sample(
        _name,
        lambda r: ([f(r, 2, 4, 5)], {"diagonal": 1}),
        lambda r: ([f(r, 4, 3)], {"diagonal": -1}),
    )

# linalg
sample(
    "matmul",
    lambda r: ([f(r, 3, 4), f(r, 4, 5)], {}),
    lambda r: ([f(r, 2, 3, 4), f(r, 4)], {}),
    lambda r: ([f(r, 4), f(r, 2, 4, 3)], {}),
    lambda r: ([ints(r, 3, 4), ints(r, 4, 2)], {}),
)
sample(
    "einsum",
    lambda r: ([[f(r, 3, 4), f(r, 4, 5)]], {"equation": "ij,jk->ik"}),
    lambda r: ([[f(r, 2, 3, 4), f(r, 2, 4, 5)]], {"equation": "bij,bjk->bik"}),
    lambda r: ([[f(r, 3, 4)]], {"equation": "ij->ji"}),
    lambda r: ([[f(r, 3), f(r, 4)]], {"equation": "i,j"}),
    lambda r: ([[f(r, 2, 3, 4, 5), f(r, 2, 3, 6, 5)]], {"equation": "bhqd,bhkd->bhqk"}),
    lambda r: ([[f(r, 3, 4, 2), f(r, 4, 5)]], {"equation": "ijx,jk->ki"}),
    lambda r: ([[f(r, 3, 4), f(r, 3, 4)]], {"equation": "ij,ij->"}),
    lambda r: ([[f(r, 3, 1), f(r, 3, 4)]], {"equation": "ij,ij->ij"}),
    lambda r: ([[ints(r, 3, 4), ints(r, 4)]], {"equation": "ij,j->i"}),
)
sample(
    "linear",
    lambda r: ([f(r, 3, 4), f(r, 5, 4), f(r, 5)], {}),
    lambda r: ([f(r, 2, 3, 4), f(r, 5, 4), 0.0], {}),
)

# convolution and pooling
_CONV = {"stride": (2, 1), "padding": (1, 0, 1, 2), "dilation": (1, 2), "groups": 2}
sample(
    "conv2d",
    lambda r: ([f(r, 2, 4, 7, 8), f(r, 6, 2, 3, 3), f(r, 6)], dict(_CONV)),
    lambda r: ([f(r, 1, 3, 5, 5), f(r, 2, 3, 3, 3), 0.0], {}),
)
sample(
    "conv2d_input_grad",
    lambda r: ([f(r, 2, 6, 3, 7), f(r, 6, 2, 3, 3)], {**_CONV, "input_shape": (2, 4, 7, 8)}),
)
sample(
    "conv2d_weight_grad",
    lambda r: ([f(r, 2, 4, 7, 8), f(r, 2, 6, 3, 7)], {**_CONV, "weight_shape": (6, 2, 3, 3)}),
)
sample(
    "conv_transpose2d",
    lambda r: (
        [f(r, 2, 4, 3, 5), f(r, 4, 3, 3, 2), f(r, 6)],
        {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2), "dilation": (1, 2),
         "groups": 2},
    ),
    lambda r: ([f(r, 1, 2, 4, 4, dtype=np.float64), f(r, 2, 3, 2, 2, dtype=np.float64), 0.0], {}),
)  # fmt: skip
for _up in (
    {"output_size": (7, 3), "mode": "nearest"},
    {"output_size": (8, 4), "mode": "nearest", "scales": (2.0, 0.8)},
    {"output_size": (7, 3), "mode": "bilinear"},
    {"output_size": (6, 9), "mode": "bilinear", "align_corners": True},
    {"output_size": (4, 7), "mode": "bilinear", "scales": (1.0, 1.5)},
):
    sample("upsample2d", lambda r, a=_up: ([f(r, 2, 3, 4, 5)], dict(a)))
    sample(
        "upsample2d_backward",
        lambda r, a=_up: ([f(r, 2, 3, *a["output_size"])], {**a, "input_size": (4, 5)}),
    )
sample(
    "upsample2d",
    lambda r: ([f(r, 1, 2, 3, 3, dtype=np.float64)], {"output_size": (5, 4), "mode": "bilinear"}),
)
_POOL = {"kernel_size": (3, 2), "stride": (2, 2), "padding": (1, 1)}
sample(
    "max_pool2d",
    lambda r: ([f(r, 2, 3, 7, 6)], dict(_POOL)),
    lambda r: ([f(r, 1, 2, 7, 7)], {**_POOL, "ceil_mode": True, "dilation": (1, 2)}),
    lambda r: ([ints(r, 1, 2, 5, 5, lo=-(2**31), hi=2**31 - 1, dtype=np.int32)], dict(_POOL)),
)
sample(
    "max_pool2d_backward",
    lambda r: ([f(r, 2, 3, 4, 4), ints(r, 2, 3, 4, 4, lo=0, hi=42)], {"input_shape": (2, 3, 7, 6)}),
)
sample(
    "avg_pool2d",
    lambda r: ([f(r, 2, 3, 7, 6)], dict(_POOL)),
    lambda r: ([f(r, 2, 3, 7, 6)], {**_POOL, "count_include_pad": False}),
    lambda r: ([f(r, 1, 2, 7, 7)], {**_POOL, "ceil_mode": True}),
    lambda r: ([f(r, 1, 2, 6, 6)], {**_POOL, "divisor_override": 5}),
)
sample(
    "avg_pool2d_backward",
    lambda r: ([f(r, 2, 3, 4, 4)], {**_POOL, "input_shape": (2, 3, 7, 6)}),
    lambda r: (
        [f(r, 2, 3, 4, 4)],
        {**_POOL, "input_shape": (2, 3, 7, 6), "count_include_pad": False},
    ),
    lambda r: ([f(r, 1, 2, 4, 4)], {**_POOL, "input_shape": (1, 2, 7, 7), "ceil_mode": True}),
)
sample("adaptive_avg_pool2d", lambda r: ([f(r, 2, 3, 7, 5)], {"output_size": (3, 2)}))
sample(
    "adaptive_avg_pool2d_backward",
    lambda r: ([f(r, 2, 3, 3, 2)], {"input_shape": (2, 3, 7, 5), "output_size": (3, 2)}),
)

# normalization
sample(
    "layer_norm",
    lambda r: ([f(r, 2, 3, 4), f(r, 4), f(r, 4)], {"normalized_shape": (4,), "eps": 1e-5}),
    lambda r: ([f(r, 2, 3, 4), 1.0, 0.0], {"normalized_shape": (3, 4)}),
)
sample(
    "layer_norm_backward",
    lambda r: ([f(r, 2, 3, 4), f(r, 2, 3, 4), f(r, 4)], {"normalized_shape": (4,), "eps": 1e-5}),
    lambda r: ([f(r, 2, 3, 4), f(r, 2, 3, 4), 1.0], {"normalized_shape": (3, 4)}),
)
sample(
    "lstm_recurrence",
    # (projected (L, N, 4H), h0, c0 (N, H), w_hh (4H, H), b_hh): L=3, N=2, H=3.
    lambda r: ([f(r, 3, 2, 12), f(r, 2, 3), f(r, 2, 3), f(r, 12, 3), f(r, 12)], {}),
    lambda r: ([f(r, 3, 2, 12), f(r, 2, 3), f(r, 2, 3), f(r, 12, 3), 0.0], {"reverse": True}),
)
sample(
    "lstm_recurrence_backward",
    # (d_out, d_h_n, d_c_n, d_cells, d_gates, h0, c0, w_hh, outputs, cells, gates); the saved
    # values need not come from a forward for the lowering to equal eager.
    lambda r: (
        [f(r, 3, 2, 3), f(r, 2, 3), f(r, 2, 3), 0.0, 0.0, f(r, 2, 3), f(r, 2, 3), f(r, 12, 3)]
        + [f(r, 3, 2, 3), f(r, 3, 2, 3), unit(r, 3, 2, 12)],
        {},
    ),
    lambda r: (
        [f(r, 3, 2, 3), f(r, 2, 3), f(r, 2, 3), f(r, 3, 2, 3), f(r, 3, 2, 12), f(r, 2, 3)]
        + [f(r, 2, 3), f(r, 12, 3), f(r, 3, 2, 3), f(r, 3, 2, 3), unit(r, 3, 2, 12)],
        {"reverse": True},
    ),
)
sample(
    "batch_norm",
    lambda r: ([f(r, 4, 3, 2, 2), f(r, 3), f(r, 3)], {"eps": 1e-5}),
    lambda r: ([f(r, 5, 3), 1.0, 0.0], {}),
)
sample(
    "rms_norm",
    lambda r: ([f(r, 2, 3, 4), f(r, 4)], {"normalized_shape": (4,), "eps": 1e-6}),
    lambda r: ([f(r, 2, 4), 1.0], {"normalized_shape": (4,)}),
)

# attention
sample(
    "scaled_dot_product_attention",
    lambda r: ([f(r, 2, 3, 4), f(r, 2, 5, 4), f(r, 2, 5, 6), 0.0], {}),
    lambda r: ([f(r, 2, 2, 3, 4), f(r, 2, 2, 3, 4), f(r, 2, 2, 3, 4), 0.0], {"is_causal": True}),
    lambda r: ([f(r, 3, 4), f(r, 5, 4), f(r, 5, 4), f(r, 3, 5)], {"scale": 0.3}),
    lambda r: ([f(r, 3, 4), f(r, 5, 4), f(r, 5, 4), np.tril(np.ones((3, 5), bool))], {}),
)
sample(
    "scaled_dot_product_attention_backward",
    lambda r: ([f(r, 2, 3, 6), f(r, 2, 3, 4), f(r, 2, 5, 4), f(r, 2, 5, 6), 0.0], {}),
    lambda r: ([f(r, 3, 4), f(r, 3, 4), f(r, 3, 4), f(r, 3, 4), 0.0], {"is_causal": True}),
)

# losses
for _name in ("l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss"):
    for _red in ("none", "mean", "sum"):
        sample(_name, lambda r, red=_red: ([f(r, 3, 4), f(r, 3, 4)], {"reduction": red}))
    if _name != "mse_loss":
        sample(
            f"{_name}_backward",
            lambda r: ([f(r, 3, 4), f(r, 3, 4), f(r, 3, 4)], {"reduction": "none"}),
        )
        sample(f"{_name}_backward", lambda r: ([f(r), f(r, 3, 4), f(r, 4)], {"reduction": "mean"}))
sample("smooth_l1_loss", lambda r: ([f(r, 5), f(r, 5)], {"beta": 0.0}))
for _red in ("none", "mean", "sum"):
    sample(
        "binary_cross_entropy",
        lambda r, red=_red: ([unit(r, 3, 4), unit(r, 3, 4), pos(r, 4)], {"reduction": red}),
    )
    sample(
        "binary_cross_entropy_with_logits",
        lambda r, red=_red: ([f(r, 3, 4), unit(r, 3, 4), 1.0, pos(r, 4)], {"reduction": red}),
    )
sample(
    "binary_cross_entropy_backward",
    lambda r: ([f(r), unit(r, 3, 4), unit(r, 3, 4), 1.0], {"reduction": "mean"}),
)
sample(
    "binary_cross_entropy_with_logits_backward",
    lambda r: ([f(r, 3, 4), f(r, 3, 4), unit(r, 3, 4), pos(r, 4), 1.0], {"reduction": "none"}),
)
for _name in ("cross_entropy", "nll_loss"):
    for _red in ("none", "mean", "sum"):
        sample(
            _name,
            lambda r, red=_red: (
                [f(r, 4, 5), np.array([0, 4, -100, 2]), pos(r, 5)],
                {"reduction": red},
            ),
        )
    sample(_name, lambda r: ([f(r, 2, 3, 4), ints(r, 2, 4, lo=0, hi=3), 1.0], {}))
    sample(
        f"{_name}_backward",
        lambda r: ([f(r), f(r, 4, 5), np.array([0, 4, -100, 2]), pos(r, 5)], {}),
    )
    sample(
        f"{_name}_backward",
        lambda r: (
            [f(r, 2, 4), f(r, 2, 3, 4), ints(r, 2, 4, lo=0, hi=3), 1.0],
            {"reduction": "none"},
        ),
    )
sample(
    "cross_entropy", lambda r: ([f(r, 4, 5), ints(r, 4, lo=0, hi=5), 1.0], {"label_smoothing": 0.1})
)
sample("cross_entropy", lambda r: ([f(r, 4, 5), unit(r, 4, 5), 1.0], {"label_smoothing": 0.2}))
sample(
    "cross_entropy_backward",
    lambda r: ([f(r), f(r, 4, 5), unit(r, 4, 5), pos(r, 5)], {"label_smoothing": 0.1}),
    lambda r: (
        [f(r), f(r, 4, 5), ints(r, 4, lo=0, hi=5), 1.0],
        {"label_smoothing": 0.1, "reduction": "sum"},
    ),
)

# indexing
_FULL = ("slice", None, None, None)
sample(
    "index",
    lambda r: ([f(r, 4, 5, 6), []], {"index": (("int", 1), ("slice", 1, None, 2), ("new",))}),
    lambda r: ([f(r, 4, 5), []], {"index": (("slice", None, None, -1), ("int", -1))}),
    lambda r: ([f(r, 4, 5, 6), [ints(r, 2, 3, lo=-4, hi=4)]], {"index": (_FULL, ("tensor",))}),
    lambda r: (
        [f(r, 4, 5, 6), [ints(r, 3, lo=0, hi=4), ints(r, 2, 1, lo=0, hi=6)]],
        {"index": (("tensor",), _FULL, ("tensor",))},
    ),
    lambda r: (
        [f(r, 4, 5, 6), [ints(r, 3, lo=0, hi=5), ints(r, 3, lo=0, hi=6)]],
        {"index": (("int", 2), ("tensor",), ("tensor",))},
    ),
    lambda r: ([f(r, 4, 5), [ints(r, 3, lo=0, hi=5)]], {"index": (("new",), _FULL, ("tensor",))}),
)
sample(
    "index_put",
    lambda r: ([f(r, 4, 5), f(r, 2, 5), []], {"index": (("slice", 1, 3, None),)}),
    lambda r: ([f(r, 4, 5), 2.0, []], {"index": (_FULL, ("int", 2))}),
    lambda r: (
        [f(r, 4, 5), f(r, 6, 5), [ints(r, 6, lo=-4, hi=4)]],
        {"index": (("tensor",),), "accumulate": True},
    ),
    lambda r: (  # repeated positions with assignment: the last write wins
        [f(r, 4, 5), f(r, 2, 3), [np.array([1, 3, 1]), np.array([[0], [4]])]],
        {"index": (("tensor",), ("tensor",)), "accumulate": False},
    ),
)
sample(
    "gather",
    lambda r: ([f(r, 3, 4), ints(r, 3, 2, lo=0, hi=4)], {"dim": 1}),
    lambda r: ([f(r, 3, 4), ints(r, 2, 4, lo=-3, hi=3)], {"dim": 0}),
)
sample("scatter_add", lambda r: ([f(r, 3, 4), ints(r, 2, 3, lo=0, hi=4), f(r, 2, 4)], {"dim": 1}))
sample(
    "scatter",  # repeated indices: the last write wins, as in eager
    lambda r: ([f(r, 3, 4), ints(r, 2, 3, lo=0, hi=2), f(r, 2, 4)], {"dim": 1}),
    lambda r: ([f(r, 3, 4), np.array([[0, 1, 2, 0], [0, 1, 2, 1]]), f(r, 2, 4)], {"dim": 0}),
    lambda r: ([ints(r, 5), np.array([4, 0, 4]), 9], {"dim": 0}),
    lambda r: ([f(r, 4), np.array([1, 1]), np.array([-0.0, -0.0], np.float32)], {"dim": 0}),
)
sample(
    "masked_fill",
    lambda r: ([f(r, 3, 4), bools(r, 4), -1.5], {}),
    lambda r: ([ints(r, 3, 4), bools(r, 3, 4), 7], {}),
)
sample("embedding", lambda r: ([ints(r, 2, 3, lo=0, hi=6), f(r, 6, 4)], {}))
sample(
    "embedding_backward",
    lambda r: ([f(r, 2, 3, 4), ints(r, 2, 3, lo=0, hi=5)], {"num_weights": 5}),
    lambda r: (
        [f(r, 2, 3, 4), ints(r, 2, 3, lo=0, hi=5)],
        {"num_weights": 5, "padding_idx": 1, "scale_grad_by_freq": True},
    ),
)
sample("one_hot", lambda r: ([ints(r, 2, 3, lo=0, hi=4)], {"num_classes": 5}))

# NaN and infinities propagate as in eager (numpy): appended last so earlier case ids stay put.
_NAN_ROWS = np.array([[1.0, np.nan, 2.0], [3.0, -np.inf, 0.0], [np.inf, -1.0, -0.0]], np.float32)
for _name, _attrs in (
    ("amax", {"dim": 1}),
    ("amin", {"dim": 0}),
    ("max_dim", {"dim": 1}),
    ("argmax", {"dim": 1}),
    ("relu", {}),
    ("sign", {}),
):
    sample(_name, lambda r, a=_attrs: ([_NAN_ROWS.copy()], dict(a)))
sample("maximum", lambda r: ([_NAN_ROWS.copy(), 1.5], {}))
sample("clamp", lambda r: ([_NAN_ROWS.copy(), 0.0, 1.0], {}))


# random ops: eager draws from the backends' Philox stream, so compiled draws are the same numbers
def state(r):
    return np.array([r.integers(0, 2**62), r.integers(0, 2**40)], np.int64)


for _dt in (lucid.float32, lucid.float64):
    sample(
        "uniform",
        lambda r, d=_dt: ([state(r)], {"shape": (3, 5), "dtype": d, "low": -1.0, "high": 2.0}),
    )
    sample(
        "normal",
        lambda r, d=_dt: ([state(r)], {"shape": (7,), "dtype": d, "mean": 1.0, "std": 2.0}),
    )
    sample("bernoulli_mask", lambda r, d=_dt: ([state(r), np.zeros((4, 6), d.numpy)], {"p": 0.3}))
sample("randint", lambda r: ([state(r)], {"shape": (4, 5), "low": -3, "high": 9}))
sample("bernoulli_mask", lambda r: ([state(r), np.zeros(5, np.float32)], {"p": 1.0}))
# sort/topk: ties (rounded ints), NaN and infinities, every dim, bool and integer rows
_TIES = np.array([[2.0, np.nan, 1.0, 2.0, -np.inf], [0.0, -0.0, np.nan, 3.0, 0.0]], np.float32)
for _desc in (False, True):
    sample("sort", lambda r, d=_desc: ([_TIES.copy()], {"dim": 1, "descending": d}))
    sample("sort", lambda r, d=_desc: ([np.round(f(r, 3, 4, 2))], {"dim": 1, "descending": d}))
    sample("sort", lambda r, d=_desc: ([ints(r, 4, 3, lo=0, hi=3)], {"dim": 0, "descending": d}))
    sample("sort", lambda r, d=_desc: ([bools(r, 6)], {"dim": 0, "descending": d}))
    sample("topk", lambda r, d=_desc: ([_TIES.copy()], {"k": 3, "dim": -1, "largest": d}))
    sample(
        "topk",
        lambda r, d=_desc: ([f(r, 2, 5, 3, dtype=np.float64)], {"k": 2, "dim": 1, "largest": d}),
    )
sample("topk", lambda r: ([ints(r, 3, 6, lo=0, hi=4, dtype=np.int32)], {"k": 6, "dim": 1}))
sample("topk", lambda r: ([f(r, 4)], {"k": 4, "dim": 0, "largest": False}))

# searchsorted: 1-d and batched sequences, ties, NaN on both sides, mixed dtypes
_SEQ_NAN = np.array([-1.0, 0.5, 0.5, 2.0, np.nan], dtype=np.float32)
_VALUES_NAN = np.array([[0.5, np.nan], [-3.0, 2.0], [np.inf, 1.0]], dtype=np.float32)
for _right in (False, True):
    sample(
        "searchsorted",
        lambda r, rt=_right: ([_SEQ_NAN.copy(), _VALUES_NAN.copy()], {"right": rt}),
        lambda r, rt=_right: (
            [np.sort(np.round(f(r, 2, 3, 5)), -1), np.round(f(r, 2, 3, 4))],
            {"right": rt},
        ),
        lambda r, rt=_right: ([np.arange(6, dtype=np.int64), f(r, 4) * 6], {"right": rt}),
        lambda r, rt=_right: ([np.sort(ints(r, 5)), ints(r, 3, 2)], {"right": rt}),
    )
for _repl in (False, True):
    sample(
        "multinomial",
        lambda r, p=_repl: (
            [state(r), np.array([[0.1, 0.0, 0.6, 0.3], [1.0, 2.0, 3.0, 0.5]], np.float32)],
            {"num_samples": 3, "replacement": p},
        ),
        lambda r, p=_repl: (
            [state(r), r.random(7) + np.array([0, 0, 1, 0, 0, 0, 0]) * 5],
            {"num_samples": 4 + 3 * p, "replacement": p},
        ),
        lambda r, p=_repl: (
            [state(r), np.array([[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 0.0]], np.float32)],
            {"num_samples": 1, "replacement": p},
        ),
    )
# randperm: a permutation of the same law, not eager's (which argsorts raw 32-bit words)
RANDOM_OPS = {"randperm"}


def _tensors(operands: list) -> tuple[list, list[np.ndarray]]:
    """Operands with arrays wrapped as Tensors, and the arrays in order."""
    arrays: list[np.ndarray] = []

    def wrap(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            arrays.append(v)
            return Tensor._wrap(v)
        if isinstance(v, list):
            return [wrap(e) for e in v]
        return v

    return [wrap(v) for v in operands], arrays


def build(name: str, operands: list, attrs: dict):
    """(module after lowering, lucid module before lowering, feeds, eager outputs)."""
    wrapped, arrays = _tensors(operands)
    eager = apply(name, *wrapped, **attrs)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    positions: list[int] = []

    def fn(*inputs):
        it = iter(inputs)

        def sub(v: Any) -> Any:
            if isinstance(v, Tensor):
                return next(it)
            if isinstance(v, list):
                return [sub(e) for e in v]
            return v

        return apply(name, *(sub(v) for v in wrapped), **attrs)

    del positions
    tensors = [Tensor._wrap(a) for a in arrays]
    module = import_trace(trace(fn, *tensors))
    return module, arrays, [e.numpy() for e in eager]


def tolerance(dtype: np.dtype) -> dict:
    return {"rtol": 2e-5, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, err_msg=what, equal_nan=True, **tolerance(want.dtype))
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


CASES = [(n, i) for n in sorted(SAMPLES) for i in range(len(SAMPLES[n]))]


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_op_lowers_and_matches_lucid_interpreter_and_eager(name, i):
    rng = np.random.default_rng(1000 + i + sum(map(ord, name)))
    operands, attrs = SAMPLES[name][i](rng)
    module, arrays, eager = build(name, operands, attrs)
    before = interpret(module, arrays)
    PassManager("lower-to-prim").run(module)
    module.verify()
    ops = list(forward_func(module).body.blocks.first.ops)
    assert all(isinstance(op, PrimIROp) for op in ops[:-1]), [op.name for op in ops]
    after = interpret_prim(module, arrays)
    for k, (got, ref, want) in enumerate(zip(after, before, eager, strict=True)):
        assert_same(ref, want, f"{name} output {k}: lucid interpreter vs eager")
        assert_same(got, want, f"{name} output {k}: prim interpreter vs eager")


def test_every_registry_op_has_a_sample_or_a_reasoned_refusal():
    for name in REGISTRY:
        assert (name in RULES) != (name in UNSUPPORTED), f"{name}: needs a rule or a reasoned mark"
        status = lowering_status(name)
        assert status == "yes" or status.startswith("no: "), (name, status)
        if status == "yes":
            assert name in SAMPLES or name in RANDOM_OPS, f"{name} lowers but has no test sample"
        else:
            assert len(status) > len("no: ") + 10, f"{name}: the reason is too short: {status!r}"


def test_an_op_without_a_lowering_is_refused_with_its_reason():
    # nonzero cannot even be traced (a graph break); check its mark and the pass's message on
    # a hand-built module instead.
    from lucid.ir import _xdsl as x
    from lucid.ir.dialect import get_op_class
    from lucid.ir.types import tensor_type

    t = tensor_type((3,), lucid.float32)
    block = x.Block(arg_types=[t])
    op = get_op_class("nonzero").create(
        operands=list(block.args), result_types=[tensor_type((2, 1), lucid.int64)]
    )
    block.add_ops([op, x.func.ReturnOp(*op.results)])
    fn = x.func.FuncOp("forward", ([t], [op.results[0].type]), x.Region(block))
    with pytest.raises(LoweringError) as info:
        lower_module(x.ModuleOp([fn]))
    assert info.value.op == "nonzero"
    assert lowering_status("nonzero") == f"no: {info.value.reason}"
    assert "depends on the input's values" in str(info.value)
