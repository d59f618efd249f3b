"""Per-family lowering rules of ``lower-to-prim``, one table keyed by lucid op name.

Each family module registers its rules (``@rule("name")``) and its reasoned refusals
(``unsupported("name", "why")``) into ``RULES`` and ``UNSUPPORTED`` on import; an op appears in
exactly one family.
"""

from lucid.passes.lowering import (  # noqa: F401  (registers rules)
    elementwise,
    indexing,
    linalg,
    loss,
    nn,
    random,
    reduction,
    rnn,
    shape,
    sorting,
)
from lucid.passes.lowering._core import RULES, UNSUPPORTED, LoweringUnsupported

__all__ = ["RULES", "UNSUPPORTED", "LoweringUnsupported"]
