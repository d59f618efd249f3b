"""Lucid's dialect and passes for the stock ``xdsl-opt`` (entry-point group ``xdsl.universe``).

xDSL has its own ``canonicalize``/``cse``/``dce``, and names may not clash across universes, so
Lucid's passes are offered as ``lucid-<name>`` there (``lucid-opt`` uses the plain names).
"""

from __future__ import annotations

from collections.abc import Callable

from lucid.ir import _xdsl as x
from lucid.passes.registry import available_passes


def _dialect() -> x.Dialect:
    from lucid.ir.dialect import lucid_dialect

    return lucid_dialect()


def _prefixed(name: str, load: Callable[[], type[x.ModulePass]]) -> Callable:
    def loader() -> type[x.ModulePass]:
        cls = load()
        return type(f"XDSL_{cls.__name__}", (cls,), {"name": f"lucid-{name}"})

    return loader


LUCID_UNIVERSE = x.Universe(
    all_dialects={"lucid": _dialect},
    all_passes={
        f"lucid-{name}": _prefixed(name, load) for name, load in available_passes().items()
    },
)
