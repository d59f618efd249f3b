"""``lucid.nn``: modules, parameters, initialisation and the functional API, as ``torch.nn``."""

from lucid.nn import functional, init, parallel, utils  # noqa: F401
from lucid.nn.modules import *  # noqa: F403
from lucid.nn.modules import (
    activation,
    adaptive,
    container,
    conv,
    conv_transpose,
    distance,
    dropout,
    flatten,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)
from lucid.nn.parallel import DataParallel
from lucid.nn.parameter import Parameter

__all__ = ["DataParallel", "Parameter", "functional", "init", "parallel", "utils"]
for _m in (activation, adaptive, container, conv, conv_transpose, distance, dropout, flatten,
           linear, loss, module, normalization, padding, pixelshuffle, pooling, rnn, sparse,
           transformer, upsampling):  # fmt: skip
    __all__ += _m.__all__
