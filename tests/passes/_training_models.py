"""Small models (with a loss and example inputs) shared by the training-pass tests; loaded by
path because the tests run with ``--import-mode=importlib``."""

from __future__ import annotations

import numpy as np

import lucid
import lucid.nn as nn
import lucid.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)) + F.relu(self.fc1(x)))


class CNN(nn.Module):
    """Conv + BatchNorm (training mode: batch statistics, running stats updated in place)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 2 * 2, 4)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            8, 2, dim_feedforward=12, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, num_layers=1, batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def _inputs(kind: str, rng: np.random.Generator) -> tuple:
    def f(*shape):
        return lucid.tensor(rng.standard_normal(shape).astype(np.float32))

    if kind == "mlp":
        return f(4, 5), lucid.tensor(rng.integers(0, 3, 4))
    if kind == "cnn":
        return f(3, 2, 4, 4), lucid.tensor(rng.integers(0, 4, 3))
    if kind == "transformer":
        return f(2, 4, 8), f(2, 3)
    return f(2, 4, 3), f(2, 2)


def _loss(kind: str):
    if kind in ("mlp", "cnn"):
        return lambda out, target: F.cross_entropy(out, target)
    return lambda out, target: F.mse_loss(out, target)


MODEL_KINDS = ("mlp", "cnn", "transformer", "lstm")
_CLASSES = {"mlp": MLP, "cnn": CNN, "transformer": Encoder, "lstm": Recurrent}


def make(kind: str, seed: int = 0):
    """``(model, loss_fn, example_inputs)`` for ``kind``; the loss is ``loss_fn(model(x), t)``."""
    lucid.manual_seed(seed)
    model = _CLASSES[kind]()
    model.train()
    return model, _loss(kind), _inputs(kind, np.random.default_rng(seed))
