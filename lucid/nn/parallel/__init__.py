"""``lucid.nn.parallel``: ``DataParallel`` as a pass-through on Lucid's one device, and
``DistributedDataParallel`` over MPI processes (see ``lucid.distributed``).

PyTorch programs wrap models in ``nn.DataParallel`` when several GPUs are visible; Lucid has one
device, so the wrapper runs the module as it is, keeping PyTorch's ``module.`` prefix in state
dicts so checkpoints load either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lucid.nn.modules.module import Module
from lucid.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DataParallel", "DistributedDataParallel", "data_parallel"]


def _check_device_ids(device_ids: Sequence[Any] | None) -> None:
    # One device: a list naming more than one would silently not parallelise, so refuse it.
    if device_ids is not None and len(list(device_ids)) > 1:
        raise ValueError(
            f"DataParallel: device_ids {list(device_ids)} name several devices; Lucid has one "
            "device, so pass None or a single id"
        )


class DataParallel(Module):
    """Runs ``module`` unchanged (one device): ``DataParallel(m)(x) == m(x)``."""

    def __init__(
        self,
        module: Module,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be a lucid.nn.Module, got {module!r}")
        _check_device_ids(device_ids)
        self.module = module
        self.device_ids = list(device_ids) if device_ids is not None else []
        self.output_device = output_device
        self.dim = dim

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)


def data_parallel(
    module: Module,
    inputs: Any,
    device_ids: Sequence[Any] | None = None,
    output_device: Any = None,
    dim: int = 0,
    module_kwargs: dict | None = None,
) -> Any:
    """The functional form: ``module(*inputs, **module_kwargs)`` on the one device."""
    _check_device_ids(device_ids)
    if not isinstance(inputs, tuple):
        inputs = (inputs,)
    return module(*inputs, **(module_kwargs or {}))
