"""``python -m lucid.demo``: the same model eager and compiled.

Inference: ``lucid.compile(model)`` against eager calls (same outputs, the speedup, the cache).
Training: a small classifier trained eagerly and with ``lucid.compile.fused_step`` (forward + loss
+ backward + Adam update as one native executable); both give the same model. Prints the
speedups, the cache info and where to look at the IR."""

from __future__ import annotations

import argparse
import time

import numpy as np

import lucid
import lucid.nn as nn
import lucid.nn.functional as F


def make_data(n: int, d: int, classes: int, seed: int = 0) -> tuple[lucid.Tensor, lucid.Tensor]:
    """Gaussian blobs: each class around its own random centre."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, d)) * 2.0
    labels = rng.integers(0, classes, n)
    x = centres[labels] + rng.standard_normal((n, d))
    return lucid.tensor(x.astype(np.float32)), lucid.tensor(labels)


def make_model(d: int, classes: int) -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, classes))


def train_eager(model, x, y, steps: int) -> tuple[list[float], float]:
    opt = lucid.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - t0


def train_fused(model, x, y, steps: int):
    opt = lucid.optim.Adam(model.parameters(), lr=1e-2)
    step = lucid.compile.fused_step(model, F.cross_entropy, opt)
    t0 = time.perf_counter()
    losses = [step(x, y).item()]  # the first call traces and compiles
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        losses.append(step(x, y).item())
    return losses, time.perf_counter() - t0, compile_s, step


def per_call_ms(fn, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e3


def inference(model, x, calls: int) -> None:
    print("== inference: lucid.compile(model)")
    cm = lucid.compile(model)
    with lucid.no_grad():
        t0 = time.perf_counter()
        got = cm(x)  # traces, compiles, runs
        compile_s = time.perf_counter() - t0
        want = model(x)
        err = float(np.abs(got.numpy() - want.numpy()).max())
        eager_ms = per_call_ms(lambda: model(x), calls)
        compiled_ms = per_call_ms(lambda: cm(x), calls)
    print(f"first call (trace + compile): {compile_s:.2f} s; max |compiled - eager| = {err:.1e}")
    print(
        f"eager: {eager_ms * 1e3:.1f} us/call; compiled: {compiled_ms * 1e3:.1f} us/call "
        f"({eager_ms / compiled_ms:.1f}x faster)"
    )
    info = cm.cache_info()
    print(
        f"cm.cache_info(): entries={info['entries']}, eager_only={len(info['eager_only'])}, "
        f"calls={sum(info['n_calls'].values())}, keys={info['keys']}"
    )
    print("the optimized IR of that signature (cm.ir(stage='optimized')):")
    print(cm.ir(stage="optimized"))
    if err > 1e-4:
        raise SystemExit("demo: compiled and eager inference disagree")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (used by CI)")
    args = parser.parse_args(argv)
    steps = 40 if args.quick else 300
    d, classes = 16, 4
    x, y = make_data(128, d, classes)

    inference(make_model(d, classes), x[:8], 200 if args.quick else 2000)
    print("== training: lucid.compile.fused_step(model, loss_fn, optimizer)")
    eager_model, fused_model = make_model(d, classes), make_model(d, classes)
    eager_losses, eager_s = train_eager(eager_model, x, y, steps)
    fused_losses, fused_s, compile_s, step = train_fused(fused_model, x, y, steps)

    for i in range(0, steps, max(1, steps // 5)):
        print(f"step {i:3d}  loss eager {eager_losses[i]:.5f}  fused {fused_losses[i]:.5f}")
    print(f"loss fell from {fused_losses[0]:.4f} to {fused_losses[-1]:.4f}")
    eager_ms = eager_s / steps * 1e3
    fused_ms = fused_s / (steps - 1) * 1e3
    print(
        f"eager training: {eager_ms:.3f} ms/step; fused_step: {fused_ms:.3f} ms/step "
        f"(first call, tracing + compiling: {compile_s:.2f} s)"
    )
    print(f"fused_step speedup over eager training: {eager_ms / fused_ms:.1f}x")
    info = step.cache_info()
    (key,) = info["keys"]
    print(
        f"fused_step cache_info(): {info['entries']} entry, compiled in "
        f"{info['compile_ms'][0]:.0f} ms, keyed on input signature {key[0]}"
    )
    print(
        "IR: lucid.ir.print_ir(step.module()) prints the compiled training step (forward, "
        "backward and Adam update in one prim-dialect function); "
        "lucid.compile(model).ir(stage=...) shows an inference signature at 'imported', "
        "'optimized', 'prim' or 'final'."
    )

    drift = max(
        float(np.abs(p.numpy() - q.numpy()).max())
        for p, q in zip(fused_model.parameters(), eager_model.parameters(), strict=True)
    )
    print(f"largest parameter difference, fused vs eager: {drift:.2e}")
    if not fused_losses[-1] < fused_losses[0]:
        raise SystemExit("demo: the loss did not fall")
    if drift > 1e-3:
        raise SystemExit("demo: fused_step and eager training disagree")


if __name__ == "__main__":
    main()
