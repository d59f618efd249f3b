"""AOT export: a compiled module or training step written to one ``lucid.compiled`` file and
served again in another process, without the model's Python class.

``file`` holds the file format (constants, checked reading and writing); ``module`` writes
compiled modules (``save_compiled``) and ``loaded`` reads them back (``load_compiled``,
``LoadedModule``); ``step`` writes training steps and ``loaded_step`` reads them back
(``LoadedStep``).
"""

from lucid.compile.aot.file import FORMAT, FORMAT_VERSION, READABLE_VERSIONS
from lucid.compile.aot.loaded import LoadedModule, load_compiled
from lucid.compile.aot.loaded_step import LoadedStep
from lucid.compile.aot.module import save_compiled

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "LoadedModule",
    "LoadedStep",
    "load_compiled",
    "save_compiled",
]
