"""The workloads A–E of docs/performance.md, built for each framework from the same random weights.

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
}


def _mlp_sizes(wl: str) -> list[int]:
    return [784, 256, 10] if wl == "A" else [784, 1024, 1024, 10]


def batch_of(wl: str) -> int:
    return {"A": 64, "B": 256, "C": 64, "D": 16, "E": 8}[wl]


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
    return rng.standard_normal((8, 16)).astype(np.float32), None


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
    return None


def floor_ms(wl: str, train: bool, gflops: float = FLOOR_GFLOPS) -> float | None:
    """The FLOP floor of one call at ``gflops`` GFLOP/s of sgemm (default FLOOR_GFLOPS), in ms."""
    if not gflops > 0:
        raise ValueError(f"the sgemm rate must be positive, got {gflops!r} GFLOP/s")
    f = flops(wl, train)
    return None if f is None else f / (gflops * 1e9) * 1e3


# --- Lucid ------------------------------------------------------------------------------------
def lucid_model(wl: str):
    import lucid
    import lucid.nn as nn
    import lucid.nn.functional as F

    lucid.manual_seed(0)
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

    if wl in ("A", "B", "C"):
        return F.cross_entropy
    return lambda out: (out * out).mean()


# --- PyTorch ----------------------------------------------------------------------------------
def torch_model(wl: str, lucid_ref=None):
    import torch
    import torch.nn as tnn

    torch.manual_seed(0)
    if wl in ("A", "B"):
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

    if wl in ("A", "B", "C"):
        return TF.cross_entropy
    return lambda out: (out * out).mean()


# --- JAX --------------------------------------------------------------------------------------
def jax_forward(wl: str):
    """(apply(params, x), params) for workload ``wl``, pure functions for jax.jit."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

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

    if wl in ("A", "B", "C"):

        def ce(logits, y):
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

        return ce
    return lambda out: jnp.mean(out * out)
