"""F.ctc_loss / nn.CTCLoss: losses against a brute-force sum over alignments, gradients against
float64 finite differences and PyTorch, reduction modes, zero_infinity and bad input."""

import itertools

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid.testing import gradcheck

STEPS, BATCH, CLASSES = 5, 3, 4
# Sample 0 repeats a label (needs a blank between), sample 2 has an empty target.
TARGETS = np.array([[1, 1, 0], [2, 3, 1], [0, 0, 0]])
TARGET_LENGTHS = [2, 3, 0]
INPUT_LENGTHS = [5, 4, 3]


def _log_probs(seed=0, shape=(STEPS, BATCH, CLASSES)):
    rng = np.random.default_rng(seed)
    return np.log(rng.dirichlet(np.ones(shape[-1]), shape[:-1]))


def _collapse(path, blank):
    out = [c for i, c in enumerate(path) if c != blank and (i == 0 or c != path[i - 1])]
    return out


def _brute_force_nll(log_probs, target, blank=0):
    """-log of the summed probability of every frame-wise path collapsing to ``target``."""
    steps, classes = log_probs.shape
    total = 0.0
    for path in itertools.product(range(classes), repeat=steps):
        if _collapse(path, blank) == list(target):
            total += np.exp(sum(log_probs[t, c] for t, c in enumerate(path)))
    return -np.log(total) if total > 0 else np.inf


def test_losses_match_the_sum_over_alignments():
    lp = _log_probs()
    loss = F.ctc_loss(lucid.tensor(lp), lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS,
                      reduction="none")  # fmt: skip
    expected = [
        _brute_force_nll(lp[:n, i], TARGETS[i, :k])
        for i, (n, k) in enumerate(zip(INPUT_LENGTHS, TARGET_LENGTHS, strict=True))
    ]
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-10)


def test_reductions_blank_and_concatenated_targets():
    lp = lucid.tensor(_log_probs(1))
    none = F.ctc_loss(lp, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS, reduction="none")
    flat = lucid.tensor(np.concatenate([TARGETS[i, :k] for i, k in enumerate(TARGET_LENGTHS)]))
    np.testing.assert_allclose(
        F.ctc_loss(lp, flat, INPUT_LENGTHS, TARGET_LENGTHS, reduction="none").numpy(), none.numpy()
    )
    mean = F.ctc_loss(lp, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS)
    per_label = none.numpy() / np.maximum(TARGET_LENGTHS, 1)
    np.testing.assert_allclose(mean.item(), per_label.mean())
    module = lucid.nn.CTCLoss(reduction="sum")
    np.testing.assert_allclose(
        module(lp, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS).item(), none.numpy().sum()
    )
    # Blank as the last class: the same problem with the classes rotated.
    rotated = lucid.tensor(np.roll(_log_probs(1), -1, axis=2))
    moved = F.ctc_loss(rotated, lucid.tensor(TARGETS - 1), INPUT_LENGTHS, TARGET_LENGTHS,
                       blank=CLASSES - 1, reduction="none")  # fmt: skip
    np.testing.assert_allclose(moved.numpy(), none.numpy(), rtol=1e-12)


def test_unbatched_input():
    lp = _log_probs(2)
    one = F.ctc_loss(lucid.tensor(lp[:, 1]), lucid.tensor(TARGETS[1]), 5, 3, reduction="none")
    assert one.shape == ()
    np.testing.assert_allclose(one.item(), _brute_force_nll(lp[:, 1], TARGETS[1]), rtol=1e-10)


def test_impossible_alignment_is_inf_or_zero_with_zero_gradient():
    # Three repeated labels need five frames; two are given.
    lp = lucid.tensor(_log_probs(3, (2, 1, CLASSES)), requires_grad=True)
    target = lucid.tensor([[1, 1, 1]])
    assert F.ctc_loss(lp, target, [2], [3], reduction="none").item() == np.inf
    loss = F.ctc_loss(lp, target, [2], [3], reduction="sum", zero_infinity=True)
    assert loss.item() == 0.0
    loss.backward()
    np.testing.assert_array_equal(lp.grad.numpy(), 0.0)


def test_gradient_against_finite_differences():
    gradcheck(
        lambda t: F.ctc_loss(
            t, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS, reduction="none"
        ),  # fmt: skip
        lucid.tensor(_log_probs(4), requires_grad=True),
    )


def test_bad_input_is_refused():
    lp = lucid.tensor(_log_probs())
    with pytest.raises(ValueError, match="reduction"):
        F.ctc_loss(lp, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS, reduction="avg")
    with pytest.raises(ValueError, match="blank"):
        F.ctc_loss(lp, lucid.tensor(TARGETS), INPUT_LENGTHS, TARGET_LENGTHS, blank=CLASSES)
    with pytest.raises(ValueError, match="lengths"):
        F.ctc_loss(lp, lucid.tensor(TARGETS), [5, 5], TARGET_LENGTHS)
    with pytest.raises(ValueError, match="add up"):
        F.ctc_loss(lp, lucid.tensor([1, 2]), INPUT_LENGTHS, TARGET_LENGTHS)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_torch_parity_values_and_gradients(reduction):
    # torch's CTC gradient w.r.t. log_probs differs from the true partial derivative by a
    # multiple of exp(log_probs), which log_softmax's backward removes: compare through it.
    torch = pytest.importorskip("torch")
    logits = np.random.default_rng(6).standard_normal((STEPS, BATCH, CLASSES))
    ours, theirs = (
        lucid.tensor(logits, requires_grad=True),
        torch.tensor(logits, requires_grad=True),
    )
    out = F.ctc_loss(F.log_softmax(ours, 2), lucid.tensor(TARGETS), INPUT_LENGTHS,
                     TARGET_LENGTHS, reduction=reduction)  # fmt: skip
    ref = torch.nn.functional.ctc_loss(
        theirs.log_softmax(2), torch.tensor(TARGETS), torch.tensor(INPUT_LENGTHS),
        torch.tensor(TARGET_LENGTHS), reduction=reduction,
    )  # fmt: skip
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    weights = np.random.default_rng(7).standard_normal(tuple(ref.shape))
    (out * lucid.tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-12)


def test_compiled_matches_eager():
    # Composed of registry ops, so the whole loss (its time loop unrolled) compiles.
    targets = lucid.tensor(TARGETS)

    def loss(lp):
        return F.ctc_loss(lp, targets, INPUT_LENGTHS, TARGET_LENGTHS)

    compiled = lucid.compile(loss)
    lp = lucid.tensor(_log_probs(8))
    np.testing.assert_allclose(compiled(lp).numpy(), loss(lp).numpy(), rtol=1e-12)
    assert not compiled.cache_info()["reasons"]
