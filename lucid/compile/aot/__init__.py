"""AOT export: a compiled module or training step written to one ``lucid.compiled`` file and
served again in another process, without the model's Python class.

``file`` holds the file format (constants, checked reading and writing); ``module`` writes
compiled modules (``save_compiled``) and ``loaded`` reads them back (``load_compiled``,
``LoadedModule``); ``step`` writes training steps and ``loaded_step`` reads them back
(``LoadedStep``).
"""

from lucid._lazy import lazy_attributes

# Imported on first use: serving a file (``load_compiled`` of a compiled module) needs neither
# the training steps' modules nor, when its saved programs run here, the compiler and xDSL.
_HOMES = {
    "FORMAT": "lucid.compile.aot.file",
    "FORMAT_VERSION": "lucid.compile.aot.file",
    "READABLE_VERSIONS": "lucid.compile.aot.file",
    "LoadedModule": "lucid.compile.aot.loaded",
    "load_compiled": "lucid.compile.aot.loaded",
    "LoadedStep": "lucid.compile.aot.loaded_step",
    "save_compiled": "lucid.compile.aot.module",
}
__getattr__ = lazy_attributes(__name__, _HOMES)
__all__ = sorted(_HOMES)
