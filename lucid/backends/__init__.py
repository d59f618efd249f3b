"""Backends: compile final programs to executables (CPU runtime; MPSGraph on Apple)."""

from lucid.backends.base import Backend, Executable

__all__ = ["Backend", "Executable"]
