"""Lucid: a PyTorch-style deep-learning framework with an MLIR-style compiler, lucid.compile."""

from lucid import (
    _threads,  # noqa: F401  (first: the BLAS threading policy, before any BLAS loads)
    autograd,  # noqa: F401,E402
    ops,  # noqa: F401
)
from lucid._autograd import (  # noqa: F401
    enable_grad,
    inference_mode,
    no_grad,
    set_grad_enabled,
)
from lucid._dtype import (  # noqa: F401
    bfloat16,
    bool_,
    double,
    dtype,
    finfo,
    float,
    float16,
    float32,
    float64,
    get_default_dtype,
    half,
    int,
    int8,
    int16,
    int32,
    int64,
    long,
    set_default_dtype,
    short,
    uint8,
)
from lucid._native_loader import _native
from lucid._state import is_grad_enabled, is_inference_mode_enabled  # noqa: F401
from lucid._tensor import LEGACY_TENSOR_TYPES as _LEGACY_TENSOR_TYPES
from lucid._tensor import Tensor, _tensor_from, device  # noqa: F401
from lucid.ops.activation import *  # noqa: F401,F403
from lucid.ops.attention import *  # noqa: F401,F403
from lucid.ops.conv import *  # noqa: F401,F403
from lucid.ops.creation import *  # noqa: F401,F403

# Every op family registers its ops on import and lists its public fronts in __all__.
from lucid.ops.elementwise import *  # noqa: F401,F403
from lucid.ops.embedding import *  # noqa: F401,F403
from lucid.ops.indexing import *  # noqa: F401,F403
from lucid.ops.linalg import *  # noqa: F401,F403
from lucid.ops.loss import *  # noqa: F401,F403
from lucid.ops.norm import *  # noqa: F401,F403
from lucid.ops.pool import *  # noqa: F401,F403
from lucid.ops.random import *  # noqa: F401,F403
from lucid.ops.reduction import *  # noqa: F401,F403
from lucid.ops.rnn import *  # noqa: F401,F403
from lucid.ops.shape import *  # noqa: F401,F403
from lucid.ops.sorting import *  # noqa: F401,F403
from lucid.ops.torch_functions import *  # noqa: F401,F403
from lucid.ops.upsample import *  # noqa: F401,F403

__version__ = _native.__version__

# lucid.FloatTensor, lucid.LongTensor, ...: PyTorch's legacy typed constructors.
globals().update(_LEGACY_TENSOR_TYPES)


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:  # noqa: F811
    """A new tensor holding a copy of ``data`` (nested lists, scalars, numpy arrays, tensors)."""
    if device is not None:
        globals()["device"](device)
    out = _tensor_from(data, dtype)
    if requires_grad:
        out.requires_grad_(True)
    return out


def from_numpy(array) -> Tensor:
    """A tensor sharing memory with a numpy array (dtype kept)."""
    from lucid._dtype import from_numpy as _dt

    _dt(array.dtype)
    return Tensor._wrap(array)


from lucid import (  # noqa: E402,F401  (torch-style lucid.nn / lucid.optim access)
    accelerator,
    amp,
    cuda,
    distributed,
    linalg,
    nn,
    optim,
    sparse,
    utils,  # noqa: E402,F401
)
from lucid._generator import Generator  # noqa: E402,F401
from lucid.amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402,F401
from lucid.serialization import load, save  # noqa: E402,F401
from lucid.sparse import sparse_coo_tensor, spmm  # noqa: E402,F401

_MATMUL_PRECISIONS = ("highest", "high", "medium")
_float32_matmul_precision = "highest"


def set_float32_matmul_precision(precision: str) -> None:
    """Accepted for PyTorch scripts; Lucid's float32 matmuls always run in full float32
    (``"highest"``): there are no TF32 or bfloat16 tensor cores on its devices to trade for."""
    global _float32_matmul_precision
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError(
            f"set_float32_matmul_precision: expected one of {_MATMUL_PRECISIONS}, got {precision!r}"
        )
    _float32_matmul_precision = precision


def get_float32_matmul_precision() -> str:
    """The value last given to ``set_float32_matmul_precision`` (``"highest"`` by default)."""
    return _float32_matmul_precision


def is_tensor(obj: object) -> bool:
    """Whether ``obj`` is a Lucid tensor (or a Parameter)."""
    return isinstance(obj, Tensor)


def __getattr__(name: str):
    # The compiler is imported on first use, so `import lucid` stays light (xDSL loads lazily).
    import importlib

    if name == "compile":
        return importlib.import_module("lucid.compile")
    if name == "backends":
        # torch.backends.cudnn is reachable after `import torch`; the compiler backends stay
        # lazy (importing the package and its flags module loads no backend).
        importlib.import_module("lucid.backends.cudnn")
        return importlib.import_module("lucid.backends")
    if name == "onnx":
        return importlib.import_module("lucid.onnx")
    raise AttributeError(f"module 'lucid' has no attribute {name!r}")
