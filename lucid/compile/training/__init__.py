"""Compiled training: ``make_step``, ``compiled_step``, ``compile_optimizer`` and ``fused_step``.

``builder`` traces a whole training step into one module in the ``lucid`` dialect
(``build_training_module``); ``entries`` compiles it into a cache entry with its feed plan;
``make_step``, ``fused`` and ``optimizer`` hold the step objects of each kind, ``base`` what they
share (options, parity helpers, introspection over their ``SignatureCache``).

All four build on ``build_training_module`` (``lucid.compile.training.builder``): one traced
module in the ``lucid`` dialect with roles on its feeds and results, lowered and compiled by the
backend chosen with ``backend=`` (through the registry) into one executable. Results with role
``update:<feed role>`` are written by the run straight into that feed's array (parameters,
optimizer state, BatchNorm running statistics, the RNG state), at the end of a successful run, so
a run that raises leaves them untouched.

>>> step = lucid.compile.fused_step(model, F.cross_entropy, opt)
>>> loss = step(x, target)            # forward + loss + backward + optimizer update, one call

The per-step path does no dict work: feeds are bound by a plan computed once per cache entry (a
list of tensor references read in feed order), and step scalars (learning rate, bias
corrections...) are preallocated 0-d arrays (in the dtype the update uses them in) overwritten
each step, so a learning-rate scheduler takes effect without recompiling.

Thread safety: every call of a step object (``make_step``'s, ``fused_step``'s, the step
``compile_optimizer`` installs, and ``compiled_step``'s cached one) holds that object's lock, so
calls from several threads run one after the other, each a whole read-modify-write of the
parameters and optimizer state; different step objects run concurrently.
"""

from lucid.compile.training.builder import (
    TrainingModule,
    build_optimizer_module,
    build_training_module,
)
from lucid.compile.training.fused import FusedStep, fused_step
from lucid.compile.training.make_step import TrainStep, compiled_step, make_step
from lucid.compile.training.optimizer import CompiledOptimizerStep, compile_optimizer
from lucid.compile.training.update_terms import GradClip

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
