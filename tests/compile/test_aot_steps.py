"""save_compiled / load_compiled of training steps: a step saved after a few updates and loaded
in a fresh process continues bit-identically to the original process's next steps (parameters,
optimizer state, step counters, scheduler, BatchNorm statistics, dropout's RNG stream)."""

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile import fused_step, load_compiled, make_step, save_compiled

N_BEFORE, N_AFTER = 3, 3


class Net(nn.Module):
    """BatchNorm (buffers), dropout (the RNG) and two layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(n)]
    ys = [rng.integers(0, 3, 4).astype(np.int64) for _ in range(n)]
    return xs, ys


def _optimizer(kind, model):
    if kind == "sgd":
        return lucid.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return lucid.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.99), weight_decay=1e-3)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import lucid
    from lucid.compile import load_compiled

    plan = json.load(open(sys.argv[1]))
    data = np.load(plan["data"])
    step = load_compiled(plan["path"])
    assert set(step.cache_info()["sources"].values()) == {plan["source"]}, step.cache_info()
    sgd = lucid.optim.SGD(step.parameters(), lr=0.1) if plan["kind"] == "make_step" else None
    losses = []
    for i in range(plan["n"]):
        x, y = lucid.tensor(data[f"x{i}"]), lucid.tensor(data[f"y{i}"])
        loss = step(x, y)
        if sgd is not None:
            sgd.zero_grad()
            loss.backward()
            sgd.step()
        if step.scheduler is not None:
            step.scheduler.step()
        losses.append(loss.detach().numpy())
    out = {f"loss{i}": l for i, l in enumerate(losses)}
    out.update({f"p:{n}": p.numpy() for n, p in step.named_parameters()})
    out.update({f"b:{n}": b.numpy() for n, b in step.named_buffers()})
    if step.optimizer is not None:
        for p, st in step.optimizer.state.items():
            name = next(n for n, q in step.named_parameters() if q is p)
            out.update({f"s:{name}.{k}": np.asarray(v.numpy()) for k, v in st.items()})
    np.savez(plan["out"], **out)
    print("ok")
    """
)


def _run_child(tmp_path, plan):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "child.py").write_text(_CHILD)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    got = np.load(plan["out"])
    return {k: got[k] for k in got.files}


def _continue_here(kind, model, step, opt, sched, xs, ys):
    """The original process's next steps, and what the child reports for them."""
    sgd = lucid.optim.SGD(model.parameters(), lr=0.1) if kind == "make_step" else None
    want = {}
    for i in range(N_BEFORE, N_BEFORE + N_AFTER):
        loss = step(lucid.tensor(xs[i]), lucid.tensor(ys[i]))
        if sgd is not None:
            sgd.zero_grad()
            loss.backward()
            sgd.step()
        if sched is not None:
            sched.step()
        want[f"loss{i - N_BEFORE}"] = loss.detach().numpy()
    want.update({f"p:{n}": p.numpy() for n, p in model.named_parameters()})
    want.update({f"b:{n}": b.numpy() for n, b in model.named_buffers()})
    if opt is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        for p, st in opt.state.items():
            want.update({f"s:{names[id(p)]}.{k}": np.asarray(v.numpy()) for k, v in st.items()})
    return want


def _train_and_save(tmp_path, kind, opt_kind="adam", with_scheduler=False):
    lucid.manual_seed(0)
    model = Net()
    opt = sched = None
    if kind == "fused_step":
        opt = _optimizer(opt_kind, model)
        if with_scheduler:
            sched = lucid.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        step = fused_step(model, F.cross_entropy, opt, backend="cpu")
    else:
        step = make_step(model, F.cross_entropy, backend="cpu")
    xs, ys = _batches(N_BEFORE + N_AFTER)
    sgd = lucid.optim.SGD(model.parameters(), lr=0.1) if kind == "make_step" else None
    for i in range(N_BEFORE):
        loss = step(lucid.tensor(xs[i]), lucid.tensor(ys[i]))
        if sgd is not None:
            sgd.zero_grad()
            loss.backward()
            sgd.step()
        if sched is not None:
            sched.step()
    path = tmp_path / "step.lucidc"
    assert save_compiled(step, path, scheduler=sched)
    data = {f"x{i - N_BEFORE}": xs[i] for i in range(N_BEFORE, N_BEFORE + N_AFTER)}
    data.update({f"y{i - N_BEFORE}": ys[i] for i in range(N_BEFORE, N_BEFORE + N_AFTER)})
    np.savez(tmp_path / "data.npz", **data)
    plan = {"path": str(path), "data": str(tmp_path / "data.npz"), "n": N_AFTER, "kind": kind,
            "out": str(tmp_path / "out.npz"), "source": "program"}  # fmt: skip
    return model, step, opt, sched, xs, ys, plan


def _assert_same(got, want):
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert got[k].tobytes() == w.tobytes(), k


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
@pytest.mark.parametrize(
    ("kind", "opt_kind", "with_scheduler"),
    [
        ("fused_step", "sgd", False),
        ("fused_step", "adam", True),
        ("make_step", None, False),
    ],
)
def test_a_resumed_step_continues_bit_identically_in_a_fresh_process(
    tmp_path, kind, opt_kind, with_scheduler
):
    model, step, opt, sched, xs, ys, plan = _train_and_save(tmp_path, kind, opt_kind,
                                                           with_scheduler)  # fmt: skip
    got = _run_child(tmp_path, plan)
    want = _continue_here(kind, model, step, opt, sched, xs, ys)
    if opt is not None:  # Adam's step counter and moments, SGD's momentum buffers
        assert any(k.startswith("s:") for k in want)
    _assert_same(got, want)


def _rewrite_manifest(path, edit):
    import hashlib

    from lucid import serialization

    obj = serialization.load(path)
    manifest = json.loads(obj["manifest"])
    edit(manifest)
    obj["manifest"] = json.dumps(manifest, sort_keys=True)
    obj["manifest_sha256"] = hashlib.sha256(obj["manifest"].encode()).hexdigest()
    serialization.save(obj, path)


def test_rebuilt_from_the_saved_ir_when_the_program_is_not_usable(tmp_path):
    model, step, opt, sched, xs, ys, plan = _train_and_save(tmp_path, "fused_step", "adam")
    _rewrite_manifest(plan["path"], lambda m: m.update(lucid_version="0.0.0-elsewhere"))
    state = lucid.get_rng_state()
    loaded = load_compiled(plan["path"])
    assert set(loaded.cache_info()["sources"].values()) == {"ir"}
    lucid.set_rng_state(state)  # loading restored the saved stream: run the original on it too
    for i in range(N_BEFORE, N_BEFORE + N_AFTER):
        x, y = lucid.tensor(xs[i]), lucid.tensor(ys[i])
        rng = lucid.get_rng_state()
        want = step(x, y).numpy()
        lucid.set_rng_state(rng)
        assert loaded(x, y).numpy().tobytes() == want.tobytes()
    for (n, p), (n2, q) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert n == n2 and p.numpy().tobytes() == q.numpy().tobytes(), n


def test_a_deeply_nested_step_program_is_rebuilt_from_the_ir_and_bad_match_refused(tmp_path):
    import hashlib

    from lucid import serialization

    *_, plan = _train_and_save(tmp_path, "fused_step", "sgd")
    obj = serialization.load(plan["path"])
    manifest = json.loads(obj["manifest"])
    for name in obj["parts"]:
        if name.startswith("program"):
            obj["parts"][name] = "[" * 100_000 + "]" * 100_000
            manifest["parts"][name] = hashlib.sha256(obj["parts"][name].encode()).hexdigest()
    obj["manifest"] = json.dumps(manifest, sort_keys=True)
    obj["manifest_sha256"] = hashlib.sha256(obj["manifest"].encode()).hexdigest()
    serialization.save(obj, plan["path"])
    assert set(load_compiled(plan["path"]).cache_info()["sources"].values()) == {"ir"}
    _rewrite_manifest(plan["path"], lambda m: m["entries"][0].update(match=[["x"]]))
    with pytest.raises(ValueError, match="step.lucidc.*malformed"):
        load_compiled(plan["path"])


def test_model_given_is_trained_in_place(tmp_path):
    model, step, opt, _, xs, ys, plan = _train_and_save(tmp_path, "fused_step", "sgd")
    other = Net()
    loaded = load_compiled(plan["path"], model=other)
    before = other.fc1.weight.numpy().copy()
    loaded(lucid.tensor(xs[N_BEFORE]), lucid.tensor(ys[N_BEFORE]))
    assert loaded.parameters()[0] is other.fc1.weight
    assert not np.array_equal(before, other.fc1.weight.numpy())
    assert loaded.optimizer.param_groups[0]["params"][0] is other.fc1.weight
    wrong = nn.Sequential(nn.Linear(8, 4))
    wrong.fc1 = nn.Linear(3, 16)
    with pytest.raises(ValueError, match=r"param:fc1.weight of shape \(16, 3\)"):
        load_compiled(plan["path"], model=wrong)


def test_unsaved_signature_and_changed_structure_raise_clearly(tmp_path):
    *_, plan = _train_and_save(tmp_path, "fused_step", "adam")
    loaded = load_compiled(plan["path"])
    x = lucid.tensor(np.zeros((5, 8), np.float32))
    with pytest.raises(ValueError, match=r"match no saved entry.*saved: \(\(\(\(4, 8\)"):
        loaded(x, lucid.tensor(np.zeros(5, np.int64)))
    loaded.optimizer.param_groups[0]["amsgrad"] = True
    xs, ys = _batches(1)
    with pytest.raises(ValueError, match="structural options"):
        loaded(lucid.tensor(xs[0]), lucid.tensor(ys[0]))


def test_what_cannot_be_saved_returns_false_or_raises(tmp_path, caplog):
    model = Net()
    opt = lucid.optim.SGD(model.parameters(), lr=0.1)
    step = fused_step(model, F.cross_entropy, opt, backend="cpu")
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        assert save_compiled(step, tmp_path / "a.lucidc") is False
    assert "no compiled entry" in caplog.text
    xs, ys = _batches(1)
    step(lucid.tensor(xs[0]), lucid.tensor(ys[0]))
    lam = lucid.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.9**e)
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        assert save_compiled(step, tmp_path / "b.lucidc", scheduler=lam) is False
    assert "LambdaLR holds functions" in caplog.text
    with pytest.raises(ValueError, match="saved with its weights"):
        save_compiled(step, tmp_path / "c.lucidc", include_weights=False)
    assert not list(tmp_path.iterdir())


def test_tampered_optimizer_class_and_scheduler_state_are_refused(tmp_path):
    *_, plan = _train_and_save(tmp_path, "fused_step", "adam", with_scheduler=True)
    raw = open(plan["path"], "rb").read()
    _rewrite_manifest(plan["path"], lambda m: m["optimizer"].update({"class": "os.system"}))
    with pytest.raises(ValueError, match="unknown optimizer class 'os.system'"):
        load_compiled(plan["path"])

    def shadow_a_method(m):
        m["scheduler"]["state"]["$dict"].append(["get_lr", 1.0])

    open(plan["path"], "wb").write(raw)
    _rewrite_manifest(plan["path"], shadow_a_method)
    with pytest.raises(ValueError, match="names a method"):
        load_compiled(plan["path"])


def test_check_finite_step_leaves_everything_unchanged_on_a_bad_loss(tmp_path):
    lucid.manual_seed(0)
    model = Net()
    opt = _optimizer("adam", model)
    step = fused_step(model, F.cross_entropy, opt, check_finite=True, backend="cpu")
    xs, ys = _batches(2)
    step(lucid.tensor(xs[0]), lucid.tensor(ys[0]))
    path = tmp_path / "f.lucidc"
    assert save_compiled(step, path)
    loaded = load_compiled(path)
    before = [p.numpy().copy() for p in loaded.parameters()]
    bad = xs[1].copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="left unchanged"):
        loaded(lucid.tensor(bad), lucid.tensor(ys[1]))
    after = [p.numpy() for p in loaded.parameters()]
    assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    # Nothing moved: the loaded step still continues as the original does.
    rng = lucid.get_rng_state()
    got = loaded(lucid.tensor(xs[1]), lucid.tensor(ys[1])).numpy()
    lucid.set_rng_state(rng)
    want = step(lucid.tensor(xs[1]), lucid.tensor(ys[1])).numpy()
    assert got.tobytes() == want.tobytes()


def test_fault_injection_on_a_step_file(tmp_path):
    *_, plan = _train_and_save(tmp_path, "fused_step", "sgd")
    raw = open(plan["path"], "rb").read()
    rng = np.random.default_rng(1)
    bad = tmp_path / "bad.lucidc"
    errors = 0
    n = 0
    for i in sorted({0, 8, len(raw) - 1, *rng.integers(0, len(raw), 30).tolist()}):
        flipped = bytearray(raw)
        flipped[i] ^= 1 << int(rng.integers(0, 8))
        for data in (bytes(flipped), raw[:i]):
            n += 1
            bad.write_bytes(data)
            try:
                load_compiled(bad)
            except (ValueError, OSError):
                errors += 1
    assert errors >= n - 5


def test_mpsgraph_reference_step_is_rebuilt_from_its_ir(tmp_path):
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = lucid.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = fused_step(model, F.cross_entropy, opt, backend="mpsgraph-reference")
    xs, ys = _batches(4)
    for i in range(2):
        step(lucid.tensor(xs[i]), lucid.tensor(ys[i]))
    path = tmp_path / "ref.lucidc"
    assert save_compiled(step, path)
    loaded = load_compiled(path, backend="mpsgraph-reference")
    assert set(loaded.cache_info()["sources"].values()) == {"ir"}  # it exports no program
    on_cpu = load_compiled(path, backend="cpu")
    for i in range(2, 4):
        x, y = lucid.tensor(xs[i]), lucid.tensor(ys[i])
        want = step(x, y).numpy()
        assert loaded(x, y).numpy().tobytes() == want.tobytes()
        np.testing.assert_allclose(on_cpu(x, y).numpy(), want, rtol=1e-5, atol=1e-6)


def _state_bytes(loaded):
    out = [p.numpy().tobytes() for p in loaded.parameters()]
    out += [b.numpy().tobytes() for _, b in loaded.named_buffers()]
    if loaded.optimizer is not None:
        for st in loaded.optimizer.state.values():
            out += [np.asarray(v.numpy()).tobytes() for v in st.values() if hasattr(v, "numpy")]
    return out


def test_a_loaded_step_has_the_live_steps_introspection(tmp_path):
    model, step, opt, _, xs, ys, plan = _train_and_save(tmp_path, "fused_step", "adam")
    loaded = load_compiled(plan["path"])
    (live_row,) = step.timing()
    (row,) = loaded.timing()
    assert set(live_row) <= set(row)
    assert row["key"] == repr(step.cache_info()["keys"][0]) and row["n_runs"] == N_BEFORE
    assert row["passes_ms"] == {"load-program": row["compile_ms"]} and row["compile_ms"] > 0
    # ir(): the saved lowered module, and the backend's program built from it, as the live
    # step prints them.
    assert loaded.ir(stage="prim") == step.ir(stage="prim")
    assert loaded.ir() == step.ir(stage="final")
    assert loaded.ir(0, stage="final") == loaded.ir(row["key"])
    with pytest.raises(ValueError, match="stage 'optimized' is not in the file"):
        loaded.ir(stage="optimized")
    with pytest.raises(KeyError, match="no entry 3: 1 saved"):
        loaded.ir(3)
    # profile(): one row per instruction of the same program; nothing moves.
    x, y = lucid.tensor(xs[N_BEFORE]), lucid.tensor(ys[N_BEFORE])
    before, rng = _state_bytes(loaded), lucid.get_rng_state()
    rows = loaded.profile(x, y, repeats=2)
    assert sorted(r["op"] for r in rows) == sorted(r["op"] for r in step.profile(x, y, repeats=1))
    assert all(r["ms"] >= 0 for r in rows) and rows[0]["ms"] >= rows[-1]["ms"]
    assert _state_bytes(loaded) == before
    assert lucid.get_rng_state().numpy().tobytes() == rng.numpy().tobytes()
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        loaded.profile(x, y, repeats=0)
    # A run after profiling is the step the original takes next.
    got = loaded(x, y).numpy()
    lucid.set_rng_state(rng)
    assert got.tobytes() == step(x, y).numpy().tobytes()
    (row,) = loaded.timing()
    assert row["n_runs"] == N_BEFORE + 1 and row["n_hits"] == 1 and row["last_run_ms"] > 0


def test_train_and_eval_choose_the_saved_entries_of_that_mode(tmp_path):
    lucid.manual_seed(0)
    model = Net()
    step = make_step(model, F.cross_entropy, backend="cpu")
    xs, ys = _batches(2)
    x, y = lucid.tensor(xs[0]), lucid.tensor(ys[0])
    step(x, y)
    path = tmp_path / "train-only.lucidc"
    assert save_compiled(step, path)
    model.eval()
    want_eval = step(x, y).detach().numpy()
    model.train()
    assert save_compiled(step, tmp_path / "both.lucidc")

    loaded = load_compiled(path)
    assert loaded.training and loaded.eval() is loaded and not loaded.training
    with pytest.raises(ValueError, match=r"in eval mode and every saved entry.*call train\(\)"):
        loaded(x, y)
    assert loaded.train() is loaded and loaded.training
    loaded(x, y)

    both = load_compiled(tmp_path / "both.lucidc").eval()
    got = both(x, y).detach().numpy()
    assert got.tobytes() == want_eval.tobytes()  # eval: BatchNorm's running stats, no dropout
    n_calls = both.cache_info()["n_calls"]
    assert sorted(n_calls.values()) == [0, 1]
    both.train()(x, y)
    assert sorted(both.cache_info()["n_calls"].values()) == [1, 1]
    # model= follows the loaded step's mode.
    other = Net()
    other.load_state_dict(model.state_dict())
    with_model = load_compiled(tmp_path / "both.lucidc", model=other)
    with_model.eval()
    assert not other.training and not other.bn.training
    assert with_model(x, y).detach().numpy().tobytes() == want_eval.tobytes()
