"""The FLOP floors of the large workloads F-H against independent counts (no timing)."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
sys.path.insert(0, BENCH)

import workloads as W  # noqa: E402


def test_gpt_forward_is_twelve_d_squared_per_token_and_layer_plus_head_and_attention():
    tokens, d, layers, vocab, seq, batch = 4 * 128, 512, 8, 8192, 128, 4
    # Q, K, V, output (4 d^2) and the 4x feed-forward (8 d^2) per token and layer.
    dense = 2 * tokens * (12 * d * d * layers + d * vocab)
    attention = 2 * 2 * batch * seq * seq * d * layers  # scores and scores @ values
    assert W.flops("F", train=False) == pytest.approx(dense + attention)
    assert W.flops("F", train=True) == pytest.approx(3 * (dense + attention))


def test_resnet18_has_its_twenty_convolutions_ending_at_2x2():
    convs = W.resnet18_convs()
    assert len(convs) == 1 + 16 + 3  # stem, four stages of two blocks, three projections
    assert [c for c in convs if c[2] == 1] == [(64, 128, 1, 8), (128, 256, 1, 4), (256, 512, 1, 2)]
    assert convs[0] == (3, 64, 7, 32) and convs[-1] == (512, 512, 3, 2)
    # ResNet-18 at 224x224 is 1.8 GMAC; at 64x64 the spatial work is (64/224)^2 of it, about
    # 0.15 GMAC per image (less the head).
    macs_per_image = sum(cin * cout * k * k * side * side for cin, cout, k, side in convs)
    assert macs_per_image == pytest.approx(1.82e9 * (64 / 224) ** 2, rel=0.05)


def test_lstm_lm_counts_eight_h_squared_per_token_and_layer_plus_the_head():
    tokens, h, vocab = 16 * 128, 512, 8192
    forward = 2 * tokens * (2 * 8 * h * h + h * vocab)
    assert W.flops("H", train=False) == pytest.approx(forward)
    assert W.flops("H", train=True) == pytest.approx(3 * forward)


@pytest.mark.parametrize("wl", "FGH")
def test_large_workloads_have_data_and_optimizers(wl):
    x, y = W.data(wl)
    assert x.shape[0] == W.batch_of(wl) and y is not None
    assert W.train_optimizers(wl)[0] in W.OPTIMIZER_SETTINGS
