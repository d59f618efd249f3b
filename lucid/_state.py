"""Per-thread state of the eager core: grad mode and the one compiler hook (the active tracer)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference_mode = False
        # The only thing the eager core knows about compilation: when a tracer is installed on this
        # thread, the dispatch point hands every op to ``tracer.record`` instead of computing it.
        self.tracer = None
        # lucid.autocast's active policy (an object with ``cast_operands``), or None when off.
        self.autocast = None


state = _ThreadState()


def is_grad_enabled() -> bool:
    return state.grad_enabled


def is_inference_mode_enabled() -> bool:
    """Whether ``lucid.inference_mode`` is on for this thread."""
    return state.inference_mode


def current_tracer():
    """The tracer recording on this thread, or None."""
    return state.tracer


@contextmanager
def autocast_suspended() -> Iterator[None]:
    """Autocast off inside (gradients are computed in the types the forward pass chose)."""
    saved, state.autocast = state.autocast, None
    try:
        yield
    finally:
        state.autocast = saved
