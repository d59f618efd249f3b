"""Compiled training: ``builder`` traces a whole training step into one module in the ``lucid``
dialect (``build_training_module``); ``steps`` wraps it in the callables ``make_step``,
``compiled_step``, ``fused_step`` and ``compile_optimizer`` return.
"""

from lucid.compile.training.builder import (
    GradClip,
    TrainingModule,
    build_optimizer_module,
    build_training_module,
)
from lucid.compile.training.steps import (
    CompiledOptimizerStep,
    FusedStep,
    TrainStep,
    compile_optimizer,
    compiled_step,
    fused_step,
    make_step,
)

__all__ = [
    "CompiledOptimizerStep",
    "FusedStep",
    "GradClip",
    "TrainStep",
    "TrainingModule",
    "build_optimizer_module",
    "build_training_module",
    "compile_optimizer",
    "compiled_step",
    "fused_step",
    "make_step",
]
