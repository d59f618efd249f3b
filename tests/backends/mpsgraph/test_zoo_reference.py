"""The model zoo through mpsgraph-reference at the prim level, against eager: an MLP, a CNN with
BatchNorm (eval, and train with the running statistics written back), a transformer block and an
LSTM. (The same models through ``lucid.compile(..., backend="mpsgraph-reference")`` need the
backend registry in lucid/compile.)"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend

_spec = importlib.util.spec_from_file_location(
    "mpsgraph_zoo", pathlib.Path(__file__).with_name("_zoo.py")
)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

BACKEND = MPSGraphReferenceBackend()


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_zoo_model_matches_eager(name, train):
    eager, got, model, twin = zoo.eager_and_compiled(BACKEND, name, train)
    assert len(got) == len(eager)
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    # BatchNorm in train mode: the running statistics were written back into the compiled
    # twin's buffers, equal to eager's after the same call.
    want, have = zoo.buffers(model), zoo.buffers(twin)
    assert want.keys() == have.keys()
    for k in want:
        np.testing.assert_allclose(have[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    if name == "cnn" and train:
        assert not np.allclose(want["bn.running_mean"], 0.0), "train mode moved the statistics"


def test_index_errors_and_the_random_stream_match_eager():
    zoo.check_index_error_and_random_stream(BACKEND)


@pytest.mark.slow  # ~10-25 s: every zoo model compiled twice; the default run has the pieces
def test_mpsgraph_reference_against_the_cpu_backend_and_eager():
    # The same comparison the macOS module runs for the native backend (mpsgraph vs
    # mpsgraph-reference), here between the two backends this machine runs.
    zoo.compare_backends("mpsgraph-reference", "cpu", {"rtol": 2e-4, "atol": 2e-5})


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm"])
def test_symbolic_batch_over_the_zoo(name):
    import lucid
    from lucid._tensor import Tensor
    from lucid.backends.mpsgraph import SymbolicUnsafe

    make, inputs = zoo.zoo()[name]
    lucid.manual_seed(0)
    model = make()
    model.eval()
    a = inputs(np.random.default_rng(0))
    b = [np.concatenate([x, x[:1]]) for x in a]  # one more row: another batch size
    with lucid.no_grad():
        module, captured = zoo.lowered(model, model, [Tensor._wrap(x) for x in a])
        probe, _ = zoo.lowered(model, model, [Tensor._wrap(x) for x in b])
    if name == "lstm":  # its zero initial state is a batch-shaped constant: MPSGraph would abort
        with pytest.raises(SymbolicUnsafe, match="prim.constant"):
            BACKEND.compile_symbolic(module, probe)
        return
    exe = BACKEND.compile_symbolic(module, probe)
    params = [captured[r]._data for r in exe.feed_roles if not r.startswith("input:")]
    for x in (a[0], b[0], np.concatenate([b[0], b[0]])):
        with lucid.no_grad():
            want = model(Tensor._wrap(x)).numpy()
        (got,) = exe.run([x, *params])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
