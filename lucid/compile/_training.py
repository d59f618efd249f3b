"""Old path of ``lucid.compile.training.builder``, kept for the callers that import it from here."""

from lucid.compile.training.builder import (
    GradClip,
    TrainingModule,
    build_optimizer_module,
    build_training_module,
)

__all__ = ["GradClip", "TrainingModule", "build_optimizer_module", "build_training_module"]
