"""The layer modules of ``lucid.nn``, one file per family."""

from lucid.nn.modules.activation import *  # noqa: F403
from lucid.nn.modules.adaptive import *  # noqa: F403
from lucid.nn.modules.container import *  # noqa: F403
from lucid.nn.modules.conv import *  # noqa: F403
from lucid.nn.modules.conv_transpose import *  # noqa: F403
from lucid.nn.modules.distance import *  # noqa: F403
from lucid.nn.modules.dropout import *  # noqa: F403
from lucid.nn.modules.flatten import *  # noqa: F403
from lucid.nn.modules.linear import *  # noqa: F403
from lucid.nn.modules.loss import *  # noqa: F403
from lucid.nn.modules.module import *  # noqa: F403
from lucid.nn.modules.normalization import *  # noqa: F403
from lucid.nn.modules.padding import *  # noqa: F403
from lucid.nn.modules.pixelshuffle import *  # noqa: F403
from lucid.nn.modules.pooling import *  # noqa: F403
from lucid.nn.modules.rnn import *  # noqa: F403
from lucid.nn.modules.sparse import *  # noqa: F403
from lucid.nn.modules.transformer import *  # noqa: F403
from lucid.nn.modules.upsampling import *  # noqa: F403
