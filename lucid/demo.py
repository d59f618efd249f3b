"""``python -m lucid.demo``: train a small model on synthetic data and print the loss falling."""

from __future__ import annotations

import argparse

import numpy as np

import lucid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps (used by CI)")
    args = parser.parse_args(argv)
    steps = 20 if args.quick else 100
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((64, 8)))
    true_w = lucid.tensor(rng.standard_normal((8, 1)))
    y = (x.reshape(64, 8, 1) * true_w.reshape(1, 8, 1)).sum(1)
    w = lucid.tensor(np.zeros((1, 8)), requires_grad=True)
    first = last = None
    for step in range(steps):
        pred = (x * w).sum(1, keepdim=True)
        diff = pred - y
        loss = (diff * diff).sum() * (1.0 / 64)
        loss.backward()
        with lucid.no_grad():
            w.sub_(w.grad * 0.1)
        w.grad = None
        first = loss.item() if first is None else first
        last = loss.item()
        if step % max(1, steps // 5) == 0:
            print(f"step {step:3d}  loss {last:.5f}")
    print(f"loss fell from {first:.4f} to {last:.4f}")
    if not last < first:
        raise SystemExit("demo: the loss did not fall")


if __name__ == "__main__":
    main()
