"""Stage 3: passes over the ``lucid`` dialect and the pass manager that runs them.

A pass is an xDSL ``ModulePass`` dataclass whose fields are its options. Find passes with
``available_passes()``/``get_pass(name)``, add one with ``register_pass`` or the ``lucid.passes``
entry-point group, and run a pipeline with ``PassManager("canonicalize,cse,dce").run(module)``.
See docs/passes.md.
"""

from lucid.ir._xdsl import ModulePass
from lucid.passes.manager import (
    Instrumentation,
    PassFailure,
    PassManager,
    PassRecord,
    PipelineError,
    PipelineReport,
    parse_pipeline_spec,
)
from lucid.passes.registry import ENTRY_POINT_GROUP, available_passes, get_pass, register_pass

__all__ = [
    "ENTRY_POINT_GROUP",
    "Instrumentation",
    "ModulePass",
    "PassFailure",
    "PassManager",
    "PassRecord",
    "PipelineError",
    "PipelineReport",
    "available_passes",
    "get_pass",
    "parse_pipeline_spec",
    "register_pass",
]
