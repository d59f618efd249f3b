"""Loads ``lucid._native`` after the BLAS it links against.

On Linux the OpenBLAS library comes from the ``scipy-openblas32`` wheel; importing that package
first loads the library globally so the extension's symbols resolve whatever the install layout.
"""

from __future__ import annotations

import sys

if sys.platform != "darwin":
    import scipy_openblas32  # noqa: F401  (side effect: loads libscipy_openblas)

from lucid import _native  # noqa: E402
from lucid._threads import apply_thread_env  # noqa: E402

apply_thread_env(_native)

__all__ = ["_native"]
