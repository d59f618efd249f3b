"""Command-line tools: ``lucid-opt`` and ``lucid-inspect-trace``."""
