"""Optimizers (``torch.optim``) and learning-rate schedulers (``lucid.optim.lr_scheduler``).

Every optimizer's update is a pure per-parameter function written with Lucid ops, plus a small
function computing its Python scalars, so ``lucid.compile`` can trace ``step()``; see
``lucid.optim.optimizer``.
"""

from lucid.optim import lr_scheduler
from lucid.optim.adadelta import Adadelta
from lucid.optim.adafactor import Adafactor
from lucid.optim.adagrad import Adagrad
from lucid.optim.adam import Adam, AdamW
from lucid.optim.adamax import Adamax
from lucid.optim.asgd import ASGD
from lucid.optim.lbfgs import LBFGS
from lucid.optim.muon import Muon
from lucid.optim.nadam import NAdam
from lucid.optim.optimizer import Optimizer
from lucid.optim.radam import RAdam
from lucid.optim.rmsprop import RMSprop
from lucid.optim.rprop import Rprop
from lucid.optim.sgd import SGD

__all__ = [
    "ASGD",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "LBFGS",
    "Muon",
    "NAdam",
    "Optimizer",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
    "lr_scheduler",
]
