"""``lucid.backends.cudnn``: PyTorch's cuDNN flags, for scripts that set them.

Lucid has no cuDNN: ``is_available()`` is False and the flags change nothing (Lucid's kernels are
deterministic and never autotuned), as in PyTorch on a machine without CUDA. This module sits in
the compiler-backends package only because PyTorch spells the path ``torch.backends.cudnn``.
"""

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    """False: Lucid has no cuDNN."""
    return False


def version() -> None:
    """None: no cuDNN library is loaded."""
    return None
