"""A small MLP and a small transformer trained 50 steps under ``lucid.autocast``, eager (PyTorch's
recipe: autocast around the forward pass and the loss, ``GradScaler`` around backward and step)
vs ``fused_step`` called inside the same autocast region: the same loss curve within the half
format's precision, the same skipped steps, the same scale sequence.

Recipes, as PyTorch documents them: float16 autocast with a ``GradScaler``; bfloat16 autocast
alone (PyTorch's CPU example uses no scaler: bfloat16 has float32's range); and bfloat16 with a
scaler, which PyTorch allows (the scaler only sees float32 gradients). Overflows are forced:
batches that hold an inf (every recipe with a scaler) and, with float16, a huge initial scale
(2**40 times the activation gradients overflows float16: the scale backs off for a run of steps,
and its growth every five steps overflows again now and then). With bfloat16 (float32's range) the
scale starts at 2**127, the largest float32 power of two, where growth must stop as in PyTorch.

Tolerance: eager and compiled code round the same half values, each op's result once, but their
float32 arithmetic inside an op may order differently, so a half activation can come out one ulp
apart, and training carries such differences on. The loss is a mean squared error of outputs and
targets of order 1: its square root (the RMS error) moves by at most as much as the outputs do,
so it is compared to within one ulp of the autocast format at 1 (``eps``, absolute). The MLP
trains with Adam; the transformer with SGD and momentum, because Adam's normalised update turns
last-bit differences of near-zero gradients into steps of the learning rate's size, so two
correct runs of a deeper model drift apart faster.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.amp import GradScaler
from lucid.compile import fused_step

STEPS = 50
POISONED = (20, 33)  # batches holding an inf

pytestmark = pytest.mark.filterwarnings(  # the overflows are the point
    "ignore:.*(invalid value|overflow):RuntimeWarning"
)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x: lucid.Tensor) -> lucid.Tensor:
        return self.head(self.encoder(x).mean(1))


def _mlp() -> tuple[nn.Module, lucid.optim.Optimizer]:
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))
    return model, lucid.optim.Adam(model.parameters(), lr=1e-2)


def _transformer() -> tuple[nn.Module, lucid.optim.Optimizer]:
    lucid.manual_seed(0)
    model = TinyTransformer()
    return model, lucid.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


MODELS = {"mlp": (_mlp, (16, 8)), "transformer": (_transformer, (4, 6, 16))}

# name -> (autocast dtype, GradScaler options or None for no scaler)
RECIPES = {
    "float16-scaler": (lucid.float16, {"init_scale": 2.0**40, "growth_interval": 5}),
    "bfloat16": (lucid.bfloat16, None),
    # bfloat16 has float32's range: at the largest float32 scale gradients below 2 stay finite,
    # so the batches with an inf force the skips, and growth stops at the top of float32.
    "bfloat16-scaler": (lucid.bfloat16, {"init_scale": 2.0**127, "growth_interval": 5}),
}


def _batches(shape: tuple, poisoned: bool) -> list[tuple[lucid.Tensor, lucid.Tensor]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(STEPS):
        x = rng.standard_normal(shape).astype(np.float32)
        if poisoned and i in POISONED:
            x.flat[5] = np.inf
        # Learnable by both models: of the features averaged over the sequence (if any).
        y = np.tanh(2 * x.reshape(shape[0], -1, shape[-1]).mean(1)[:, :4]).astype(np.float32)
        out.append((lucid.tensor(x), lucid.tensor(y)))
    return out


def _params(model: nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def _train(model_name: str, recipe: str, compiled: bool):
    """(losses, scales, skipped steps, the step's cache_info() or None) of one 50-step run."""
    make, shape = MODELS[model_name]
    dtype, options = RECIPES[recipe]
    model, opt = make()
    scaler = GradScaler(**options) if options else None
    step = fused_step(model, F.mse_loss, opt, scaler=scaler) if compiled else None
    losses, scales, skipped = [], [], []
    for x, y in _batches(shape, poisoned=scaler is not None):
        before = _params(model)
        if compiled:
            with lucid.autocast("cpu", dtype=dtype):
                loss = step(x, y)
        else:
            opt.zero_grad()
            with lucid.autocast("cpu", dtype=dtype):
                loss = F.mse_loss(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        assert loss.dtype is lucid.float32  # autocast runs mse_loss in float32
        losses.append(loss.item())
        scales.append(scaler.get_scale() if scaler else None)
        skipped.append(
            all(np.array_equal(a, b) for a, b in zip(before, _params(model), strict=True))
        )
    info = None if step is None else step.cache_info()
    return losses, scales, [i for i, s in enumerate(skipped) if s], info


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_autocast_training_fused_step_equals_eager(model_name, recipe):
    losses_e, scales_e, skipped_e, _ = _train(model_name, recipe, compiled=False)
    losses_c, scales_c, skipped_c, info = _train(model_name, recipe, compiled=True)
    assert info["entries"] == 1 and not info["eager_only"], info  # compiled, one region
    assert skipped_c == skipped_e
    assert scales_c == scales_e
    dtype, options = RECIPES[recipe]
    if options:
        # The forced overflows: the huge scale backs off for a run of steps, and the batches
        # with an inf are skipped wherever they fall.
        assert set(POISONED) <= set(skipped_e)
        if dtype is lucid.float16:  # 2**40 times the activation gradients overflows float16
            assert skipped_e[:10] == list(range(10)), skipped_e
        else:  # growth never passes the largest float32 power of two
            assert max(scales_e) == options["init_scale"] == 2.0**127
    else:
        assert skipped_e == []
    eps = float(ml_dtypes.finfo(dtype.numpy).eps)
    rms_c, rms_e = np.sqrt(losses_c), np.sqrt(losses_e)  # inf and NaN where a batch held an inf
    np.testing.assert_allclose(rms_c, rms_e, rtol=0, atol=eps, equal_nan=True)
    trained = [v for i, v in enumerate(losses_e) if i not in skipped_e]
    assert np.mean(trained[-5:]) < 0.7 * np.mean(trained[:5]), "it learns"
