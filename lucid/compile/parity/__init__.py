"""Parity checking: a compiled call or training step also runs eagerly and the results are
compared; on a mismatch the culprit (a pass, a lowering rule, the backend) is bisected.

``compare`` holds the comparison and the ``check=`` arguments, ``call`` the bisection of a
compiled call, ``step`` that of a training step.
"""

from lucid._lazy import lazy_attributes
from lucid.compile.parity.compare import Culprit, check_mode, compare, tolerance

# The bisections load on a mismatch only (they import the interpreters): a compile with
# ``check=`` off, the usual case, needs ``compare``'s option checks alone.
_LAZY = {
    "bisect": "lucid.compile.parity.call",
    "bisect_step": "lucid.compile.parity.step",
    "compare_roles": "lucid.compile.parity.step",
    "eager_gradients": "lucid.compile.parity.step",
    "eager_optimizer_step": "lucid.compile.parity.step",
}
__getattr__ = lazy_attributes(__name__, _LAZY)


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
