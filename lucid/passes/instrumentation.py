"""The pass manager's switches (``Instrumentation``), apart from the manager so that reading
them (``LUCID_COMPILE_*``) loads neither the manager nor xDSL: a compile checks them before a
disk-cache hit that runs no pass."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Instrumentation"]


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass
class Instrumentation:
    """What the pass manager reports while it runs (all off by default)."""

    print_ir_before_all: bool = False
    print_ir_after_all: bool = False
    print_ir_after_change: bool = False
    print_ir_after_failure: bool = False
    print_ir_tree_dir: str | None = None
    verify_each: bool = False
    timing: bool = False
    statistics: bool = False  # count ops before/after each pass (implied by timing)
    generic: bool = False  # print the generic form
    debuginfo: bool = False  # print each op's loc(...)
    stream: TextIO | None = None  # default: sys.stderr

    @classmethod
    def from_env(cls) -> Instrumentation:
        """Switches from ``LUCID_COMPILE_PRINT_IR_AFTER_ALL`` and friends (``..._BEFORE_ALL``,
        ``..._AFTER_CHANGE``, ``..._AFTER_FAILURE``, ``LUCID_COMPILE_PRINT_IR_TREE_DIR``,
        ``LUCID_COMPILE_VERIFY_EACH``, ``LUCID_COMPILE_PASS_TIMING``)."""
        p = "LUCID_COMPILE_"
        return cls(
            print_ir_before_all=_truthy(p + "PRINT_IR_BEFORE_ALL"),
            print_ir_after_all=_truthy(p + "PRINT_IR_AFTER_ALL"),
            print_ir_after_change=_truthy(p + "PRINT_IR_AFTER_CHANGE"),
            print_ir_after_failure=_truthy(p + "PRINT_IR_AFTER_FAILURE"),
            print_ir_tree_dir=os.environ.get(p + "PRINT_IR_TREE_DIR") or None,
            verify_each=_truthy(p + "VERIFY_EACH"),
            timing=_truthy(p + "PASS_TIMING"),
        )
