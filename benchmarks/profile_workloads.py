"""Per-instruction profiles of compiled workloads (where a call's time goes).

    python benchmarks/profile_workloads.py [--workloads AD] [--mode infer|train|all]
        [--optimizer sgd|sgd_momentum|adam|adamw] [--repeats 50] [--top 25] [--threads 2]
        [--json PATH]

Any of the workloads A–H (``workloads.py``); F–H are the large ones (their training
profile uses their own optimizer unless ``--optimizer`` says otherwise).

Inference profiles come from ``CompiledModule.profile(x)``; training profiles read the executable
of the ``fused_step`` entry (one run per repeat; the in-place parameter updates are applied to
copies of the feeds). Shares (each instruction's part of the summed time) stay meaningful on a
busy machine, where absolute times do not; ops are also summed by opcode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="AD")
    ap.add_argument("--mode", choices=["infer", "train", "all"], default="all")
    ap.add_argument(
        "--optimizer",
        choices=["sgd", "sgd_momentum", "adam", "adamw"],
        default=None,
        help="the training step's optimizer (workloads.OPTIMIZER_SETTINGS; default: the "
        "workload's first, SGD for A-E)",
    )
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bad = set(args.workloads) - set("ABCDEFGH")
    if bad:
        ap.error(f"unknown workloads {''.join(sorted(bad))!r}; name them as letters: FGH")
    return args


ARGS = parse() if __name__ == "__main__" else None
if ARGS is not None:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "LUCID_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402


def infer_profile(wl: str, repeats: int) -> list[dict]:
    import lucid

    model = W.lucid_model(wl).eval()
    x = lucid.tensor(W.data(wl)[0])
    cm = lucid.compile(model)
    with lucid.no_grad():
        cm(x)
    return cm.profile(x, repeats=repeats)


def train_profile(wl: str, repeats: int, optimizer: str | None = None) -> list[dict]:
    import lucid

    x_np, y_np = W.data(wl)
    model = W.lucid_model(wl)
    opt = W.optimizer(lucid.optim, optimizer or W.train_optimizers(wl)[0], model.parameters())
    step = lucid.compile.fused_step(model, W.lucid_loss(wl), opt)
    args = (lucid.tensor(x_np),) + ((lucid.tensor(y_np),) if y_np is not None else ())
    step(*args)
    step(*args)
    entry = next(iter(step._entries.values()))
    feeds = [r._data if r is not None else None for r in entry.refs]
    for fi, ii in entry.input_pos:
        feeds[fi] = args[ii]._data
    if entry.rng_slot is not None:
        feeds[entry._rng_index] = entry.rng_slot._data
    feeds = [np.array(f, copy=True) if f is not None else None for f in feeds]
    ex = entry.executable
    lines = ex.dump().splitlines()[1:]
    kernels = ex.update_kernels  # an optimizer update run as one native pass: "fused[adam]"
    rows = [
        {
            "index": i,
            "op": f"{op}[{kernels[i]}]" if kernels[i] else op,
            "ms": s * 1e3,
            "instr": lines[i].strip(),
        }
        for i, op, s in ex.profile(feeds, repeats)
    ]
    return sorted(rows, key=lambda r: -r["ms"])


def report(title: str, rows: list[dict], top: int) -> dict:
    total = sum(r["ms"] for r in rows)
    print(f"\n== {title}: {len(rows)} instructions, {total:.3f} ms summed")
    by_op: dict = defaultdict(float)
    for r in rows:
        by_op[r["op"]] += r["ms"]
    print(
        "by op: "
        + ", ".join(
            f"{op} {ms / total:.1%}" for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])
        )
    )
    for r in rows[:top]:
        print(f"{r['ms'] / total:6.1%} {r['ms']:8.3f} ms  #{r['index']:<4d} {r['instr'][:110]}")
    return {"total_ms": total, "by_op": dict(by_op), "rows": rows}


def main() -> None:
    args = ARGS
    out = {}
    modes = ["infer", "train"] if args.mode == "all" else [args.mode]
    for wl in args.workloads:
        for mode in modes:
            if mode == "infer":
                rows, title = infer_profile(wl, args.repeats), f"infer {wl}"
            else:
                opt_name = args.optimizer or W.train_optimizers(wl)[0]
                rows = train_profile(wl, args.repeats, opt_name)
                title = f"train {wl}" + (f" ({opt_name})" if opt_name != "sgd" else "")
            out[title] = report(title, rows, args.top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
