"""Models shared by the compile tests (imported by path; tests use --import-mode=importlib)."""

import lucid
import lucid.nn as nn
import lucid.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class BasicBlock(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class TinyGPT(nn.Module):
    def __init__(self, vocab=20, d=16, heads=2, seq=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, 4 * d)
        self.ff2 = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        pos = lucid.arange(t)
        x = self.tok(idx) + self.pos(pos)
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        d = q.shape[-1] // self.heads
        q = q.reshape(b, t, self.heads, d).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
        return self.head(x)


class LSTMModel(nn.Module):
    def __init__(self, d_in=6, hidden=8, d_out=3):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, d_out)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])
