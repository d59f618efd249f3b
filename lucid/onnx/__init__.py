"""``lucid.onnx``: importable so PyTorch programs that import ``torch.onnx`` at the top run.

Lucid has no ONNX exporter: ``export`` raises ``ExportNotSupported`` (a ``RuntimeError``) naming
what to use instead. ``lucid.compile.save_compiled`` saves a compiled program in Lucid's own
format.
"""

from __future__ import annotations

from typing import Any

__all__ = ["export", "is_in_onnx_export", "ExportNotSupported"]


class ExportNotSupported(RuntimeError):
    """Raised by ``lucid.onnx.export``: exporting to ONNX is not supported."""


def export(model: Any, args: Any = None, f: Any = None, *rest: Any, **kwargs: Any) -> None:
    """Not supported: raises ``ExportNotSupported`` (Lucid cannot write ONNX files)."""
    raise ExportNotSupported(
        "lucid.onnx.export is not supported: Lucid cannot write ONNX files. Save the weights "
        "with lucid.save(model.state_dict(), path), or a compiled program with "
        "lucid.compile.save_compiled"
    )


def is_in_onnx_export() -> bool:
    """Always False: no ONNX export is ever running."""
    return False
