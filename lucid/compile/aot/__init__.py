"""AOT export: a compiled module or training step written to one ``lucid.compiled`` file and
served again in another process, without the model's Python class.

``file`` holds the file format (constants, checked reading and writing), ``module`` the
compiled modules (``save_compiled``, ``load_compiled``, ``LoadedModule``), ``step`` the
training steps (``LoadedStep``).
"""

from lucid.compile.aot.file import FORMAT, FORMAT_VERSION, READABLE_VERSIONS
from lucid.compile.aot.module import LoadedModule, load_compiled, save_compiled
from lucid.compile.aot.step import LoadedStep

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "LoadedModule",
    "LoadedStep",
    "load_compiled",
    "save_compiled",
]
