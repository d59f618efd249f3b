"""Stage 3: passes over the ``lucid`` dialect and the pass manager that runs them.

A pass is an xDSL ``ModulePass`` dataclass whose fields are its options. Find passes with
``available_passes()``/``get_pass(name)``, add one with ``register_pass`` or the ``lucid.passes``
entry-point group, and run a pipeline with ``PassManager("canonicalize,cse,dce").run(module)``.
See docs/passes.md.

The names below are imported on first use (PEP 562): a compile that a disk-cache hit ends
before any pass runs loads neither the pass manager nor xDSL.
"""

from lucid._lazy import lazy_attributes

_MANAGER = "lucid.passes.manager"
_REGISTRY = "lucid.passes.registry"
_HOMES = {
    "ModulePass": "lucid.ir._xdsl",
    "Instrumentation": "lucid.passes.instrumentation",
    "PassFailure": _MANAGER,
    "PassManager": _MANAGER,
    "PassRecord": _MANAGER,
    "PipelineError": _MANAGER,
    "PipelineReport": _MANAGER,
    "parse_pipeline_spec": _MANAGER,
    "ENTRY_POINT_GROUP": _REGISTRY,
    "available_passes": _REGISTRY,
    "get_pass": _REGISTRY,
    "register_pass": _REGISTRY,
}
__getattr__ = lazy_attributes(__name__, _HOMES)
__all__ = sorted(_HOMES)
