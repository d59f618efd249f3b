"""The workloads A–H of docs/performance.md, built for each framework from the same random weights.

Each builder returns ``(forward, inputs)`` for inference and ``(step, inputs)`` for training,
where calling ``forward(*inputs)`` / ``step(*inputs)`` runs one call. Peers (torch, jax) are
optional: their builders raise ImportError when the package is missing.
"""

from __future__ import annotations

import numpy as np

WORKLOADS = {
    "A": "MLP 784-256-10, batch 64",
    "B": "MLP 784-1024-1024-10, batch 256",
    "C": "CNN conv16-pool-conv32-pool-linear, 28x28, batch 64",
    "D": "transformer encoder block d128 h4 ffn512 seq64, batch 16",
    "E": "relu(x @ W + b), x 8x16, W 16x16",
    "F": "GPT decoder 8 layers d512 h8 seq128 vocab 8192, batch 4",
    "G": "ResNet-18-shaped CNN (BatchNorm) on 64x64, batch 16",
    "H": "2-layer LSTM language model T128 hidden 512 vocab 8192, batch 16",
}
# The workloads at the sizes people train: not in the default run of the benchmarks.
LARGE = "FGH"
# Each training row's optimizer(s); SGD elsewhere.
TRAIN_OPTIMIZERS = {"A": ("sgd", "adam"), "F": ("adamw",), "G": ("sgd_momentum",), "H": ("adam",)}

# F: a pre-LN GPT decoder (learned positions, causal self-attention, GELU, final LayerNorm, an
# untied linear head); G: ResNet-18's layout (7x7/2 stem, 3x3/2 max pool, four stages of two
# basic blocks at 64-128-256-512 channels, 1x1/2 projections) with 200 classes; H: embedding,
# a 2-layer nn.LSTM (batch first) and a linear head.
GPT = {"layers": 8, "d": 512, "heads": 8, "seq": 128, "vocab": 8192, "ffn": 2048}
RESNET18 = {"side": 64, "stages": (64, 128, 256, 512), "classes": 200}
LSTM_LM = {"seq": 128, "hidden": 512, "layers": 2, "vocab": 8192}


def train_optimizers(wl: str) -> tuple[str, ...]:
    """The optimizers of ``wl``'s training rows."""
    return TRAIN_OPTIMIZERS.get(wl, ("sgd",))


# name -> (class name in lucid.optim and torch.optim, keyword arguments): the same in both.
OPTIMIZER_SETTINGS = {
    "sgd": ("SGD", {"lr": 0.01}),
    "sgd_momentum": ("SGD", {"lr": 0.01, "momentum": 0.9}),
    "adam": ("Adam", {"lr": 1e-3}),
    "adamw": ("AdamW", {"lr": 1e-3, "weight_decay": 0.01}),
}


def optimizer(optim_module, opt_name: str, params):
    """``opt_name``'s optimizer from ``optim_module`` (``lucid.optim`` or ``torch.optim``)."""
    cls, kwargs = OPTIMIZER_SETTINGS[opt_name]
    return getattr(optim_module, cls)(params, **kwargs)


def _mlp_sizes(wl: str) -> list[int]:
    return [784, 256, 10] if wl == "A" else [784, 1024, 1024, 10]


def batch_of(wl: str) -> int:
    return {"A": 64, "B": 256, "C": 64, "D": 16, "E": 8, "F": 4, "G": 16, "H": 16}[wl]


def data(wl: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    b = batch_of(wl)
    if wl in ("A", "B"):
        x = rng.standard_normal((b, 784)).astype(np.float32)
        return x, rng.integers(0, 10, b).astype(np.int64)
    if wl == "C":
        x = rng.standard_normal((b, 1, 28, 28)).astype(np.float32)
        return x, rng.integers(0, 10, b).astype(np.int64)
    if wl == "D":
        return rng.standard_normal((b, 64, 128)).astype(np.float32), None
    if wl in ("F", "H"):
        seq, vocab = (GPT["seq"], GPT["vocab"]) if wl == "F" else (LSTM_LM["seq"], LSTM_LM["vocab"])
        tokens = rng.integers(0, vocab, (b, seq + 1)).astype(np.int64)
        return tokens[:, :-1], tokens[:, 1:]  # next-token prediction
    if wl == "G":
        side = RESNET18["side"]
        x = rng.standard_normal((b, 3, side, side)).astype(np.float32)
        return x, rng.integers(0, RESNET18["classes"], b).astype(np.int64)
    return rng.standard_normal((8, 16)).astype(np.float32), None


def resnet18_convs() -> list[tuple[int, int, int, int]]:
    """(in channels, out channels, kernel, output side) of every convolution of G, in order."""
    side = RESNET18["side"] // 2  # the 7x7/2 stem
    convs = [(3, 64, 7, side)]
    side //= 2  # the max pool
    cin = 64
    for k, cout in enumerate(RESNET18["stages"]):
        if k:
            side //= 2
            convs.append((cin, cout, 1, side))  # the projection of the first block
        convs += [(cin, cout, 3, side), (cout, cout, 3, side), (cout, cout, 3, side)]
        convs.append((cout, cout, 3, side))
        cin = cout
    return convs


# --- FLOP floors ------------------------------------------------------------------------------
# The sgemm rate the floors assume when none was measured: about what OpenBLAS reaches on both
# cores of the reference machine on a quiet morning (a multiply-add is 2 FLOP). The per-process
# benchmark measures the machine's rate at the start and end of each run instead
# (bench_per_process.py, SGEMM_SHAPE): this VM's speed wanders over the day (54-150 GFLOP/s).
FLOOR_GFLOPS = 150.0


def flops(wl: str, train: bool) -> float | None:
    """FLOPs of the GEMMs and convolutions of one call (training: forward, the weight gradients,
    and the input gradients every layer but the first needs); None for E, which is all overhead.
    Elementwise work is left out: the floor is the matrix work at the sgemm rate."""
    b = batch_of(wl)
    if wl in ("A", "B"):
        dims = _mlp_sizes(wl)
        layers = [b * i * o for i, o in zip(dims[:-1], dims[1:], strict=True)]
        forward = 2.0 * sum(layers)
        return forward + (2.0 * sum(layers) + 2.0 * sum(layers[1:]) if train else 0.0)
    if wl == "C":
        conv1, conv2 = b * 16 * 28 * 28 * 1 * 9, b * 32 * 14 * 14 * 16 * 9
        linear = b * 32 * 7 * 7 * 10
        layers = [conv1, conv2, linear]
        forward = 2.0 * sum(layers)
        return forward + (2.0 * sum(layers) + 2.0 * sum(layers[1:]) if train else 0.0)
    if wl == "D":
        seq, d, ffn, heads = 64, 128, 512, 4
        rows = b * seq
        proj = [rows * d * 3 * d, rows * d * d, rows * d * ffn, rows * ffn * d]
        attention = 2 * b * heads * seq * seq * (d // heads)  # scores, then scores @ values
        forward = 2.0 * (sum(proj) + attention)
        # Backward: every projection's weight gradient, their input gradients except QKV's (the
        # block's input needs none), and four attention products (dP, dV, dQ, dK).
        backward = 2.0 * (sum(proj) + sum(proj[1:]) + 2 * attention)
        return forward + (backward if train else 0.0)
    if wl == "F":
        rows, d, ffn, t = b * GPT["seq"], GPT["d"], GPT["ffn"], GPT["seq"]
        proj = [rows * d * 3 * d, rows * d * d, rows * d * ffn, rows * ffn * d] * GPT["layers"]
        head = rows * d * GPT["vocab"]
        attention = 2 * b * GPT["heads"] * t * t * (d // GPT["heads"]) * GPT["layers"]
        forward = 2.0 * (sum(proj) + head + attention)
        # Every weight gradient and every input gradient (the embeddings train), four attention
        # products per layer.
        backward = 2.0 * (2 * (sum(proj) + head) + 2 * attention)
        return forward + (backward if train else 0.0)
    if wl == "G":
        layers = [b * cin * cout * k * k * side * side for cin, cout, k, side in resnet18_convs()]
        layers.append(b * RESNET18["stages"][-1] * RESNET18["classes"])
        forward = 2.0 * sum(layers)
        return forward + (2.0 * sum(layers) + 2.0 * sum(layers[1:]) if train else 0.0)
    if wl == "H":
        h, t, rows = LSTM_LM["hidden"], LSTM_LM["seq"], b * LSTM_LM["seq"]
        # Per layer: the input product of all steps at once and the recurrent one per step.
        gates = LSTM_LM["layers"] * 2 * rows * h * 4 * h
        head = rows * h * LSTM_LM["vocab"]
        forward = 2.0 * (gates + head)
        return forward + (2.0 * 2 * (gates + head) if train else 0.0)
    return None


def floor_ms(wl: str, train: bool, gflops: float = FLOOR_GFLOPS) -> float | None:
    """The FLOP floor of one call at ``gflops`` GFLOP/s of sgemm (default FLOOR_GFLOPS), in ms."""
    if not gflops > 0:
        raise ValueError(f"the sgemm rate must be positive, got {gflops!r} GFLOP/s")
    f = flops(wl, train)
    return None if f is None else f / (gflops * 1e9) * 1e3


# --- F, G, H: one definition for Lucid and PyTorch (their nn APIs and parameter names agree) ---
def large_model(wl: str, lib, nn):
    """Workload F, G or H built with ``lib`` (``lucid`` or ``torch``) and its ``nn``."""
    if wl == "F":
        return _gpt(lib, nn)
    if wl == "G":
        return _resnet18(nn)
    if wl == "H":

        class LstmLM(nn.Module):
            def __init__(self):
                super().__init__()
                h = LSTM_LM["hidden"]
                self.embed = nn.Embedding(LSTM_LM["vocab"], h)
                self.lstm = nn.LSTM(h, h, LSTM_LM["layers"], batch_first=True)
                self.head = nn.Linear(h, LSTM_LM["vocab"])

            def forward(self, idx):
                return self.head(self.lstm(self.embed(idx))[0])

        return LstmLM()
    raise ValueError(f"workload {wl!r} is not one of {LARGE!r}")


def _gpt(lib, nn):
    d, t = GPT["d"], GPT["seq"]

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(GPT["vocab"], d)
            self.pos = nn.Parameter(lib.randn(1, t, d) * 0.02)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    d,
                    GPT["heads"],
                    GPT["ffn"],
                    dropout=0.0,
                    activation="gelu",
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(GPT["layers"])
            )
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, GPT["vocab"], bias=False)
            # PyTorch's layer wants the mask with is_causal; Lucid's takes is_causal alone.
            self.mask = (
                nn.Transformer.generate_square_subsequent_mask(t)
                if lib.__name__ == "torch"
                else None
            )

        def forward(self, idx):
            x = self.embed(idx) + self.pos
            for layer in self.layers:
                x = layer(x, src_mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return Gpt()


def _resnet18(nn):
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (x if self.down is None else self.down(x)))

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for k, cout in enumerate(RESNET18["stages"]):
        layers += [Block(cin, cout, 1 if k == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, RESNET18["classes"])]
    return nn.Sequential(*layers)


def _token_loss(F):
    """Cross-entropy of next-token logits (batch, seq, vocab) against (batch, seq) targets."""
    return lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# --- Lucid ------------------------------------------------------------------------------------
def lucid_model(wl: str):
    import lucid
    import lucid.nn as nn
    import lucid.nn.functional as F

    lucid.manual_seed(0)
    if wl in LARGE:
        return large_model(wl, lucid, nn)
    if wl in ("A", "B"):
        sizes = _mlp_sizes(wl)
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)
    if wl == "C":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 10),
        )
    if wl == "D":
        return nn.TransformerEncoderLayer(
            128, 4, 512, dropout=0.0, activation="gelu", batch_first=True
        )

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.W = nn.Parameter(lucid.randn(16, 16) * 0.25)
            self.b = nn.Parameter(lucid.zeros(16))

        def forward(self, x):
            return F.relu(x @ self.W + self.b)

    return Tiny()


def lucid_loss(wl: str):
    import lucid.nn.functional as F

    if wl in ("F", "H"):
        return _token_loss(F)
    if wl in ("A", "B", "C", "G"):
        return F.cross_entropy
    return lambda out: (out * out).mean()


# --- PyTorch ----------------------------------------------------------------------------------
def torch_model(wl: str, lucid_ref=None):
    import torch
    import torch.nn as tnn

    torch.manual_seed(0)
    if wl in LARGE:
        m = large_model(wl, torch, tnn)
    elif wl in ("A", "B"):
        sizes = _mlp_sizes(wl)
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(tnn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(tnn.ReLU())
        m = tnn.Sequential(*layers)
    elif wl == "C":
        m = tnn.Sequential(
            tnn.Conv2d(1, 16, 3, padding=1),
            tnn.ReLU(),
            tnn.MaxPool2d(2),
            tnn.Conv2d(16, 32, 3, padding=1),
            tnn.ReLU(),
            tnn.MaxPool2d(2),
            tnn.Flatten(),
            tnn.Linear(32 * 7 * 7, 10),
        )
    elif wl == "D":
        m = tnn.TransformerEncoderLayer(
            128, 4, 512, dropout=0.0, activation="gelu", batch_first=True
        )
    else:

        class Tiny(tnn.Module):
            def __init__(self):
                super().__init__()
                self.W = tnn.Parameter(torch.randn(16, 16) * 0.25)
                self.b = tnn.Parameter(torch.zeros(16))

            def forward(self, x):
                return torch.relu(x @ self.W + self.b)

        m = Tiny()
    if lucid_ref is not None:
        sd = {k: torch.from_numpy(np.array(v.numpy())) for k, v in lucid_ref.state_dict().items()}
        m.load_state_dict(sd, strict=False)
    return m


def torch_loss(wl: str):
    import torch.nn.functional as TF

    if wl in ("F", "H"):
        return _token_loss(TF)
    if wl in ("A", "B", "C", "G"):
        return TF.cross_entropy
    return lambda out: (out * out).mean()


# --- JAX --------------------------------------------------------------------------------------
def jax_forward(wl: str, train: bool = False):
    """(apply(params, x), params) for workload ``wl``, pure functions for jax.jit. ``train``:
    G's BatchNorm normalizes with the batch's statistics (and does not keep running ones),
    else with its running statistics (their initial values)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    if wl in LARGE:
        return _jax_large(wl, train, rng)

    def dense(n_in, n_out):
        bound = 1 / np.sqrt(n_in)
        return (
            jnp.asarray(rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32)),
            jnp.asarray(rng.uniform(-bound, bound, n_out).astype(np.float32)),
        )

    if wl in ("A", "B"):
        sizes = _mlp_sizes(wl)
        params = [dense(sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1)]

        def apply(params, x):
            for i, (w, b) in enumerate(params):
                x = x @ w + b
                if i < len(params) - 1:
                    x = jax.nn.relu(x)
            return x

        return apply, params
    if wl == "C":

        def conv_w(cin, cout):
            bound = 1 / np.sqrt(cin * 9)
            return (
                jnp.asarray(rng.uniform(-bound, bound, (cout, cin, 3, 3)).astype(np.float32)),
                jnp.asarray(rng.uniform(-bound, bound, cout).astype(np.float32)),
            )

        params = [conv_w(1, 16), conv_w(16, 32), dense(32 * 7 * 7, 10)]

        def conv(x, w, b):
            y = jax.lax.conv_general_dilated(
                x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
            )
            return y + b[None, :, None, None]

        def pool(x):
            return jax.lax.reduce_window(
                x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"
            )

        def apply(params, x):
            (w1, b1), (w2, b2), (w3, b3) = params
            x = pool(jax.nn.relu(conv(x, w1, b1)))
            x = pool(jax.nn.relu(conv(x, w2, b2)))
            return x.reshape(x.shape[0], -1) @ w3 + b3

        return apply, params
    if wl == "D":
        d, h, f = 128, 4, 512
        params = {
            "qkv": dense(d, 3 * d),
            "out": dense(d, d),
            "ff1": dense(d, f),
            "ff2": dense(f, d),
            "ln1": (jnp.ones(d), jnp.zeros(d)),
            "ln2": (jnp.ones(d), jnp.zeros(d)),
        }

        def ln(x, g, b):
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            return (x - mu) / jnp.sqrt(var + 1e-5) * g + b

        def apply(p, x):
            bsz, t, _ = x.shape
            qkv = x @ p["qkv"][0] + p["qkv"][1]
            q, k, v = jnp.split(qkv, 3, axis=-1)
            q, k, v = (z.reshape(bsz, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
            a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h), axis=-1) @ v
            a = a.transpose(0, 2, 1, 3).reshape(bsz, t, d) @ p["out"][0] + p["out"][1]
            x = ln(x + a, *p["ln1"])
            ff = jax.nn.gelu(x @ p["ff1"][0] + p["ff1"][1], approximate=False)
            return ln(x + ff @ p["ff2"][0] + p["ff2"][1], *p["ln2"])

        return apply, params
    params = (
        jnp.asarray(rng.standard_normal((16, 16)).astype(np.float32) * 0.25),
        jnp.zeros(16, jnp.float32),
    )

    def apply(p, x):
        return jax.nn.relu(x @ p[0] + p[1])

    return apply, params


def jax_loss(wl: str):
    import jax
    import jax.numpy as jnp

    def ce(logits, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    if wl in ("F", "H"):
        return lambda out, y: ce(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    if wl in ("A", "B", "C", "G"):
        return ce
    return lambda out: jnp.mean(out * out)


def _jax_large(wl: str, train: bool, rng):
    import jax
    import jax.numpy as jnp

    def uniform(shape, fan_in):
        bound = 1 / np.sqrt(fan_in)
        return jnp.asarray(rng.uniform(-bound, bound, shape).astype(np.float32))

    def dense(n_in, n_out, bias=True):
        return {"w": uniform((n_in, n_out), n_in), "b": uniform(n_out, n_in) if bias else None}

    def linear(p, x):
        y = x @ p["w"]
        return y if p["b"] is None else y + p["b"]

    def layer_norm(p, x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]

    if wl == "F":
        d, h, t = GPT["d"], GPT["heads"], GPT["seq"]

        def norm(size=d):
            return {"g": jnp.ones(size), "b": jnp.zeros(size)}

        params = {
            "embed": jnp.asarray(rng.standard_normal((GPT["vocab"], d)).astype(np.float32)),
            "pos": jnp.asarray(rng.standard_normal((1, t, d)).astype(np.float32) * 0.02),
            "layers": [
                {
                    "qkv": dense(d, 3 * d),
                    "out": dense(d, d),
                    "ff1": dense(d, GPT["ffn"]),
                    "ff2": dense(GPT["ffn"], d),
                    "ln1": norm(),
                    "ln2": norm(),
                }
                for _ in range(GPT["layers"])
            ],
            "norm": norm(),
            "head": dense(d, GPT["vocab"], bias=False),
        }
        causal = jnp.tril(jnp.ones((t, t), bool))

        def block(p, x):
            b = x.shape[0]
            q, k, v = jnp.split(linear(p["qkv"], layer_norm(p["ln1"], x)), 3, axis=-1)
            q, k, v = (z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
            scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h), -jnp.inf)
            a = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + linear(p["out"], a)
            ff = jax.nn.gelu(linear(p["ff1"], layer_norm(p["ln2"], x)), approximate=False)
            return x + linear(p["ff2"], ff)

        def apply(p, idx):
            x = p["embed"][idx] + p["pos"]
            for layer in p["layers"]:
                x = block(layer, x)
            return linear(p["head"], layer_norm(p["norm"], x))

        return apply, params
    if wl == "G":

        def conv_w(cin, cout, k):
            return uniform((cout, cin, k, k), cin * k * k)

        def bn_p(c):
            return {"g": jnp.ones(c), "b": jnp.zeros(c)}

        def conv(x, w, stride):
            pad = w.shape[-1] // 2
            return jax.lax.conv_general_dilated(
                x, w, (stride, stride), ((pad, pad), (pad, pad)),
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
            )  # fmt: skip

        def bn(p, x):
            if train:
                mu = x.mean((0, 2, 3), keepdims=True)
                var = ((x - mu) ** 2).mean((0, 2, 3), keepdims=True)
                x = (x - mu) / jnp.sqrt(var + 1e-5)
            else:  # running statistics at their initial values (mean 0, variance 1)
                x = x / np.sqrt(1.0 + 1e-5)
            return x * p["g"][None, :, None, None] + p["b"][None, :, None, None]

        blocks, cin = [], 64
        for k, cout in enumerate(RESNET18["stages"]):
            for stride in (1 if k == 0 else 2, 1):
                blk = {"c1": conv_w(cin, cout, 3), "b1": bn_p(cout), "c2": conv_w(cout, cout, 3),
                       "b2": bn_p(cout), "stride": stride}  # fmt: skip
                if stride != 1 or cin != cout:
                    blk["down"] = (conv_w(cin, cout, 1), bn_p(cout))
                blocks.append(blk)
                cin = cout
        strides = [b.pop("stride") for b in blocks]  # static: kept out of the traced params
        params = {
            "stem": (conv_w(3, 64, 7), bn_p(64)),
            "blocks": blocks,
            "head": dense(cin, RESNET18["classes"]),
        }

        def apply(p, x):
            x = jax.nn.relu(bn(p["stem"][1], conv(x, p["stem"][0], 2)))
            x = jax.lax.reduce_window(
                x, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                ((0, 0), (0, 0), (1, 1), (1, 1)),
            )  # fmt: skip
            for blk, stride in zip(p["blocks"], strides, strict=True):
                y = jax.nn.relu(bn(blk["b1"], conv(x, blk["c1"], stride)))
                y = bn(blk["b2"], conv(y, blk["c2"], 1))
                skip = (
                    x if "down" not in blk else bn(blk["down"][1], conv(x, blk["down"][0], stride))
                )
                x = jax.nn.relu(y + skip)
            return linear(p["head"], x.mean((2, 3)))

        return apply, params
    if wl == "H":
        hid, layers = LSTM_LM["hidden"], LSTM_LM["layers"]
        params = {
            "embed": jnp.asarray(rng.standard_normal((LSTM_LM["vocab"], hid)).astype(np.float32)),
            "lstm": [{"ih": dense(hid, 4 * hid), "hh": dense(hid, 4 * hid)} for _ in range(layers)],
            "head": dense(hid, LSTM_LM["vocab"]),
        }

        def lstm_layer(p, xs):  # xs: (T, B, hid)
            gates_in = linear(p["ih"], xs)  # every step's input product at once

            def step(carry, g_in):
                h, c = carry
                i, f, g, o = jnp.split(g_in + linear(p["hh"], h), 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            zeros = jnp.zeros((xs.shape[1], hid), xs.dtype)
            return jax.lax.scan(step, (zeros, zeros), gates_in)[1]

        def apply(p, idx):
            xs = p["embed"][idx].transpose(1, 0, 2)
            for layer in p["lstm"]:
                xs = lstm_layer(layer, xs)
            return linear(p["head"], xs.transpose(1, 0, 2))

        return apply, params
    raise ValueError(f"workload {wl!r} is not one of {LARGE!r}")
