"""End to end: small models train for a few steps of plain gradient descent and their loss falls."""

import numpy as np

import lucid
import lucid.nn as nn

RNG = np.random.default_rng(3)


def _train(model, loss_fn, inputs, target, steps, lr):
    losses = []
    for _ in range(steps):
        model.zero_grad()
        loss = loss_fn(model(inputs), target)
        loss.backward()
        with lucid.no_grad():
            for p in model.parameters():
                p.sub_(lr * p.grad)
        losses.append(loss.item())
    return losses


def test_mlp_classifier():
    lucid.manual_seed(0)
    centres = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])
    labels = RNG.integers(0, 3, 60)
    x = lucid.tensor(centres[labels] + 0.5 * RNG.standard_normal((60, 2)), dtype=lucid.float32)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    losses = _train(model, nn.CrossEntropyLoss(), x, lucid.tensor(labels), 30, 0.5)
    assert losses[-1] < 0.3 * losses[0]
    assert losses[-1] < 0.3


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x):
        return self.classifier(self.features(x))


def test_lenet_with_batchnorm():
    lucid.manual_seed(0)
    # Class k lights up a different quadrant of the image.
    labels = RNG.integers(0, 3, 12)
    images = 0.3 * RNG.standard_normal((12, 1, 10, 10))
    for i, k in enumerate(labels):
        images[i, 0, (k % 2) * 5 : (k % 2) * 5 + 5, (k // 2) * 5 : (k // 2) * 5 + 5] += 2.0
    model = LeNet()
    x = lucid.tensor(images, dtype=lucid.float32)
    losses = _train(model, nn.CrossEntropyLoss(), x, lucid.tensor(labels), 15, 0.2)
    assert losses[-1] < 0.5 * losses[0]
    bn = model.features[1]
    assert bn.num_batches_tracked.item() == 15
    assert np.abs(bn.running_mean._data).sum() > 0
    model.eval()
    preds = model(x).argmax(1)
    assert (preds._data == labels).mean() > 0.8


class TinyTransformer(nn.Module):
    def __init__(self, vocab=8, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.block = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.block(self.embed(tokens))).reshape(-1, 8)


def test_one_block_transformer():
    lucid.manual_seed(0)
    tokens = lucid.tensor(RNG.integers(0, 8, (4, 6)))
    target = lucid.tensor(np.roll(tokens._data, 1, axis=1).reshape(-1))  # previous token
    model = TinyTransformer()
    losses = _train(model, nn.CrossEntropyLoss(), tokens, target, 20, 0.3)
    assert losses[-1] < 0.6 * losses[0]


class LastValueLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 8, batch_first=True)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.out(h[0])


def test_lstm_sequence_regression():
    lucid.manual_seed(0)
    seqs = RNG.uniform(-1, 1, (16, 4, 1))
    x = lucid.tensor(seqs, dtype=lucid.float32)
    y = lucid.tensor(seqs[:, -1], dtype=lucid.float32)  # recall the latest input
    losses = _train(LastValueLSTM(), nn.MSELoss(), x, y, 30, 0.5)
    assert losses[-1] < 0.3 * losses[0]
