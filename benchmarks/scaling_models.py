"""The models of the compile-scaling benchmark (``bench_compile_scaling.py``), each of a size ``n``
that grows the program, built for Lucid, PyTorch and JAX.

- ``transformer``: ``n`` pre-LN encoder layers (d 64, 4 heads, feed-forward 256, GELU), input
  batch 4 x sequence 16 x 64.
- ``chain``: ``x * w`` then ``n`` pairs of (``x * c``, ``tanh``) on an 8 x 64 input (``w``, 64
  values, is the one parameter the training step updates).
- ``lstm``: one LSTM cell (input 16, hidden 32, batch 4) unrolled over ``n`` time steps in
  ``forward``.
- ``resnet``: a 3x3 stem to 16 channels, ``n`` basic residual blocks (conv-BN-ReLU-conv-BN, skip,
  ReLU), global mean and a 10-way linear head, on 4 x 3 x 16 x 16 images.

Only compile time and memory are measured, so the peers need not share Lucid's weights. The loss
of every training step is ``mean(out * out)``; the optimizer is Adam (lr 1e-3). JAX's ResNet
normalizes with batch statistics in training and with its (initial) running statistics in
inference, without updating them: the same arithmetic, one output fewer.
"""

from __future__ import annotations

import numpy as np

MODELS = ("transformer", "chain", "lstm", "resnet")
D_MODEL, HEADS, FFN, BATCH, SEQ = 64, 4, 256, 4, 16
CHAIN_WIDTH, CHAIN_ROWS, CHAIN_SCALE = 64, 8, 1.01
LSTM_IN, LSTM_HIDDEN, LSTM_BATCH = 16, 32, 4
RESNET_CHANNELS, RESNET_BATCH, RESNET_SIDE, RESNET_CLASSES = 16, 4, 16, 10


def input_array(model: str, n: int) -> np.ndarray:
    """The model's input for size ``n`` (float32, fixed seed)."""
    rng = np.random.default_rng(0)
    if model == "transformer":
        shape: tuple[int, ...] = (BATCH, SEQ, D_MODEL)
    elif model == "chain":
        shape = (CHAIN_ROWS, CHAIN_WIDTH)
    elif model == "lstm":
        shape = (n, LSTM_BATCH, LSTM_IN)
    elif model == "resnet":
        shape = (RESNET_BATCH, 3, RESNET_SIDE, RESNET_SIDE)
    else:
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
    return rng.standard_normal(shape).astype(np.float32)


# --- Lucid and PyTorch: one definition (their nn APIs agree) ----------------------------------
def lucid_model(model: str, n: int):
    import lucid
    from lucid import nn

    lucid.manual_seed(0)
    return _model(model, n, lucid, nn)


def torch_model(model: str, n: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return _model(model, n, torch, nn)


def _model(model: str, n: int, lib, nn):
    """``model`` of size ``n`` built with ``lib`` (``lucid`` or ``torch``) and its ``nn``."""
    if model == "transformer":
        layer = {"dropout": 0.0, "activation": "gelu", "batch_first": True, "norm_first": True}
        return nn.Sequential(
            *[nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, **layer) for _ in range(n)]
        )
    if model == "chain":

        class Chain(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(lib.ones(CHAIN_WIDTH))

            def forward(self, x):
                x = x * self.w
                for _ in range(n):
                    x = (x * CHAIN_SCALE).tanh()
                return x

        return Chain()
    if model == "lstm":
        hidden = LSTM_HIDDEN

        class UnrolledLSTM(nn.Module):
            def __init__(self):
                super().__init__()
                self.ih = nn.Linear(LSTM_IN, 4 * hidden)
                self.hh = nn.Linear(hidden, 4 * hidden, bias=False)

            def forward(self, x):
                h = c = None
                for t in range(x.shape[0]):
                    g = self.ih(x[t]) if h is None else self.ih(x[t]) + self.hh(h)
                    i, f, gg, o = (g[:, k * hidden : (k + 1) * hidden] for k in range(4))
                    i, f, gg, o = i.sigmoid(), f.sigmoid(), gg.tanh(), o.sigmoid()
                    c = i * gg if c is None else f * c + i * gg
                    h = o * c.tanh()
                return h

        return UnrolledLSTM()
    if model == "resnet":
        ch = RESNET_CHANNELS

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
                self.bn1 = nn.BatchNorm2d(ch)
                self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
                self.bn2 = nn.BatchNorm2d(ch)
                self.relu = nn.ReLU()

            def forward(self, x):
                y = self.relu(self.bn1(self.conv1(x)))
                return self.relu(x + self.bn2(self.conv2(y)))

        class ResNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Sequential(
                    nn.Conv2d(3, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU()
                )
                self.blocks = nn.Sequential(*[Block() for _ in range(n)])
                self.head = nn.Linear(ch, RESNET_CLASSES)

            def forward(self, x):
                return self.head(self.blocks(self.stem(x)).mean((2, 3)))

        return ResNet()
    raise ValueError(f"unknown model {model!r}; choose from {MODELS}")


# --- JAX --------------------------------------------------------------------------------------
def jax_model(model: str, n: int, train: bool):
    """(apply(params, x), params): a pure function for ``jax.jit``; ``train`` picks batch
    statistics for the ResNet's BatchNorm."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

    def dense(n_in, n_out, bias=True):
        bound = 1 / np.sqrt(n_in)
        w = jnp.asarray(rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32))
        b = jnp.asarray(rng.uniform(-bound, bound, n_out).astype(np.float32)) if bias else None
        return {"w": w, "b": b}

    def linear(p, x):
        y = x @ p["w"]
        return y if p["b"] is None else y + p["b"]

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + b

    if model == "transformer":
        d, h = D_MODEL, HEADS

        def layer():
            return {
                "qkv": dense(d, 3 * d),
                "out": dense(d, d),
                "ff1": dense(d, FFN),
                "ff2": dense(FFN, d),
                "ln1": (jnp.ones(d), jnp.zeros(d)),
                "ln2": (jnp.ones(d), jnp.zeros(d)),
            }

        def block(p, x):
            bsz, t, _ = x.shape
            q, k, v = jnp.split(linear(p["qkv"], layer_norm(x, *p["ln1"])), 3, axis=-1)
            q, k, v = (z.reshape(bsz, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
            a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h), axis=-1) @ v
            x = x + linear(p["out"], a.transpose(0, 2, 1, 3).reshape(bsz, t, d))
            ff = jax.nn.gelu(linear(p["ff1"], layer_norm(x, *p["ln2"])), approximate=False)
            return x + linear(p["ff2"], ff)

        def apply(params, x):
            for p in params:
                x = block(p, x)
            return x

        return apply, [layer() for _ in range(n)]
    if model == "chain":

        def apply(params, x):
            x = x * params["w"]
            for _ in range(n):
                x = jnp.tanh(x * CHAIN_SCALE)
            return x

        return apply, {"w": jnp.ones(CHAIN_WIDTH, jnp.float32)}
    if model == "lstm":
        hidden = LSTM_HIDDEN

        def apply(params, x):
            h = c = None
            for t in range(x.shape[0]):
                g = linear(params["ih"], x[t])
                if h is not None:
                    g = g + linear(params["hh"], h)
                i, f, gg, o = jnp.split(g, 4, axis=1)
                i, f, gg, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(gg), jax.nn.sigmoid(o)
                c = i * gg if c is None else f * c + i * gg
                h = o * jnp.tanh(c)
            return h

        return apply, {"ih": dense(LSTM_IN, 4 * hidden), "hh": dense(hidden, 4 * hidden, False)}
    if model == "resnet":
        ch = RESNET_CHANNELS

        def conv_w(cin, cout):
            bound = 1 / np.sqrt(cin * 9)
            return jnp.asarray(rng.uniform(-bound, bound, (cout, cin, 3, 3)).astype(np.float32))

        def bn_p():
            return {"g": jnp.ones(ch), "b": jnp.zeros(ch)}

        def conv(x, w):
            return jax.lax.conv_general_dilated(
                x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
            )

        def bn(p, x):
            if train:
                mu = x.mean((0, 2, 3), keepdims=True)
                var = ((x - mu) ** 2).mean((0, 2, 3), keepdims=True)
            else:  # the initial running statistics
                mu, var = 0.0, 1.0
            y = (x - mu) / jnp.sqrt(var + 1e-5)
            return y * p["g"][None, :, None, None] + p["b"][None, :, None, None]

        params = {
            "stem": conv_w(3, ch),
            "stem_bn": bn_p(),
            "blocks": [
                {"c1": conv_w(ch, ch), "b1": bn_p(), "c2": conv_w(ch, ch), "b2": bn_p()}
                for _ in range(n)
            ],
            "head": dense(ch, RESNET_CLASSES),
        }

        def apply(params, x):
            x = jax.nn.relu(bn(params["stem_bn"], conv(x, params["stem"])))
            for p in params["blocks"]:
                y = jax.nn.relu(bn(p["b1"], conv(x, p["c1"])))
                x = jax.nn.relu(x + bn(p["b2"], conv(y, p["c2"])))
            return linear(params["head"], x.mean((2, 3)))

        return apply, params
    raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
