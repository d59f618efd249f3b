"""Loads ``lucid._native`` after the BLAS it links against.

On Linux the OpenBLAS library comes from the ``scipy-openblas32`` wheel; importing that package
first loads the library globally so the extension's symbols resolve whatever the install layout.
"""

from __future__ import annotations

import sys


def _load_openblas() -> None:
    """Load the wheel's ``libscipy_openblas`` with global symbols. Straight from the package's
    folder: importing ``scipy_openblas32`` (which does the same) first reads its own version
    through ``importlib.metadata``, 15-20 ms of ``import lucid``. Any surprise in the layout
    falls back to that import."""
    import ctypes
    import importlib.util
    import os

    spec = importlib.util.find_spec("scipy_openblas32")  # locates it without importing it
    if spec is not None and spec.submodule_search_locations:
        lib_dir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
        try:
            names = sorted(n for n in os.listdir(lib_dir) if n.startswith("libscipy_openblas"))
        except OSError:
            names = []
        if names:
            ctypes.CDLL(os.path.join(lib_dir, names[0]), ctypes.RTLD_GLOBAL)
            return
    import scipy_openblas32  # noqa: F401  (side effect: loads libscipy_openblas)


if sys.platform != "darwin":
    _load_openblas()

from lucid import _native  # noqa: E402
from lucid._threads import apply_thread_env  # noqa: E402

apply_thread_env(_native)

__all__ = ["_native"]
