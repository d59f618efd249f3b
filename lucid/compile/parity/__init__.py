"""Parity checking: a compiled call or training step also runs eagerly and the results are
compared; on a mismatch the culprit (a pass, a lowering rule, the backend) is bisected.

``compare`` holds the comparison and the ``check=`` arguments, ``call`` the bisection of a
compiled call, ``step`` that of a training step.
"""

from lucid.compile.parity.call import bisect
from lucid.compile.parity.compare import Culprit, check_mode, compare, tolerance
from lucid.compile.parity.step import (
    bisect_step,
    compare_roles,
    eager_gradients,
    eager_optimizer_step,
)

__all__ = [
    "Culprit",
    "bisect",
    "bisect_step",
    "check_mode",
    "compare",
    "compare_roles",
    "eager_gradients",
    "eager_optimizer_step",
    "tolerance",
]
