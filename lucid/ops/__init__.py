"""The op registry (``_registry``) and the op families, one module per family.

Importing ``lucid`` imports every family module, which registers its ops.
"""

from lucid.ops._registry import REGISTRY, AVal, OpDef, get, register

__all__ = ["REGISTRY", "AVal", "OpDef", "get", "register"]
