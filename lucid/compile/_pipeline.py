"""Old path of the stage chain (now ``errors``, ``options`` and ``session``), kept for the tests
that import ``specialize_batch`` from here."""

from lucid.compile.session import specialize_batch

__all__ = ["specialize_batch"]
