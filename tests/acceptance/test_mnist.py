"""examples/mnist.py: the pytorch/examples MNIST script (Adadelta, StepLR, clip_grad_norm_,
DataLoader shuffling from a seeded generator) run with Lucid, eager and compiled; checkpoints
written with lucid.save resume a run exactly; and PyTorch running the same text (``lucid``
renamed ``torch``) from the same weights, data and batch order gives the same numbers."""

import numpy as np
import pytest

import lucid

TINY = [
    "--n-train", "192", "--n-test", "48", "--image-size", "10", "--channels", "4", "6",
    "--hidden", "16", "--batch-size", "32", "--test-batch-size", "32", "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def mnist(load_example):
    return load_example("mnist")


def _state(model):
    return {k: np.array(v.detach().numpy()) for k, v in model.state_dict().items()}


def test_resumed_run_equals_uninterrupted_run(mnist, tmp_path):
    straight = tmp_path / "straight"
    interrupted = tmp_path / "interrupted"
    model, history = mnist.main([*TINY, "--epochs", "3", "--save-model", "--checkpoint-dir",
                                 str(straight)])  # fmt: skip
    mnist.main([*TINY, "--epochs", "2", "--save-model", "--checkpoint-dir", str(interrupted)])
    # A fresh model, optimizer, scheduler and loader continue from the files alone (another
    # global seed, so nothing but the checkpoint can make the runs agree).
    resumed, resumed_history = mnist.main(
        [*TINY, "--epochs", "3", "--resume", "--checkpoint-dir", str(interrupted), "--seed", "1"]
    )
    assert len(resumed_history) == 1
    assert resumed_history[0] == history[2]  # the same batches, dropout masks and losses
    final = _state(model)
    for name, value in _state(resumed).items():
        np.testing.assert_array_equal(value, final[name], err_msg=name)
    losses = [sum(epoch[0]) / len(epoch[0]) for epoch in history]
    assert losses[2] < losses[0]


def test_checkpoint_files_hold_the_state_dicts(mnist, tmp_path):
    model, _ = mnist.main([*TINY, "--epochs", "1", "--save-model", "--checkpoint-dir",
                           str(tmp_path)])  # fmt: skip
    weights = lucid.load(tmp_path / "mnist_cnn.pt")
    assert list(weights) == list(model.state_dict())
    for name, value in _state(model).items():
        np.testing.assert_array_equal(weights[name].numpy(), value)
    opt_state = lucid.load(tmp_path / "optimizer.pt")
    assert opt_state["param_groups"][0]["lr"] == pytest.approx(0.7)  # StepLR stepped once
    assert {"square_avg", "acc_delta"} <= set(opt_state["state"][0])
    train_state = lucid.load(tmp_path / "train_state.pt")
    assert train_state["epoch"] == 1 and train_state["scheduler"]["last_epoch"] == 1


def test_compiled_model_trains_as_eager(mnist):
    """Dropout included: compiled training draws the masks eager training draws."""
    model, history = mnist.main([*TINY, "--epochs", "2"])
    compiled_model, compiled_history = mnist.main([*TINY, "--epochs", "2", "--compile"])
    for (losses, test_loss, correct), (ref_losses, ref_test_loss, ref_correct) in zip(
        compiled_history, history, strict=True
    ):
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        np.testing.assert_allclose(test_loss, ref_test_loss, rtol=1e-5)
        assert correct == ref_correct
    reference = _state(model)
    for name, value in _state(compiled_model).items():
        np.testing.assert_allclose(value, reference[name], atol=1e-5, err_msg=name)


def _train_and_test_compiled(mnist):
    args = mnist.parse_args(TINY)
    lucid.manual_seed(0)
    model = mnist.Net((4, 6), 16, 10)
    forward = lucid.compile(model)
    optimizer = lucid.optim.Adadelta(model.parameters(), lr=1.0)
    train_set = mnist.synthetic_mnist(64, 10, seed=3)
    loader = lucid.utils.data.DataLoader(train_set, batch_size=32)
    for epoch in range(2):
        mnist.train(args, forward, "cpu", loader, optimizer, epoch)
        mnist.test(args, forward, "cpu", loader)
    return forward.cache_info()


def test_compiled_forward_has_no_fallback(mnist):
    info = _train_and_test_compiled(mnist)
    assert info["entries"] >= 1 and not info["eager_only"] and not info["reasons"]


def test_compiled_forward_keeps_its_entries_across_epochs(mnist):
    """model.train()/model.eval() every epoch switch between two cached signatures."""
    info = _train_and_test_compiled(mnist)
    assert sorted(info["n_calls"].values()) == [4, 4]  # train+grad and eval signatures


def _fixed_loader(module, dataset, batch_size, order):
    return module.DataLoader(dataset, batch_size=batch_size, sampler=list(order))


def test_matches_pytorch(mnist, load_example):
    tmnist = load_example("mnist", "torch")
    torch = tmnist.torch
    args = mnist.parse_args([*TINY, "--clip", "0.5"])

    lucid.manual_seed(0)
    ours = mnist.Net((4, 6), 16, 10)
    theirs = tmnist.Net((4, 6), 16, 10)
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in _state(ours).items()})
    for model in (ours, theirs):  # the two frameworks draw different dropout masks
        model.dropout1.p = model.dropout2.p = 0.0

    train_set, test_set = mnist.synthetic_mnist(96, 10, seed=1), mnist.synthetic_mnist(40, 10, 2)

    def torch_dataset(dataset):
        return tmnist.TensorDataset(*(torch.from_numpy(t.numpy()) for t in dataset.tensors))

    order = np.random.default_rng(0).permutation(96).tolist()
    runs = []
    for module, model, train_ds, test_ds in [
        (mnist, ours, train_set, test_set),
        (tmnist, theirs, torch_dataset(train_set), torch_dataset(test_set)),
    ]:
        optimizer = module.optim.Adadelta(model.parameters(), lr=args.lr)
        scheduler = module.StepLR(optimizer, step_size=1, gamma=args.gamma)
        history = []
        for epoch in range(1, 3):
            loader = _fixed_loader(module, train_ds, 32, order)
            losses = module.train(args, model, "cpu", loader, optimizer, epoch)
            test_loader = module.DataLoader(test_ds, batch_size=16)
            history.append((losses, *module.test(args, model, "cpu", test_loader)))
            scheduler.step()
        runs.append(history)

    for (losses, test_loss, correct), (ref_losses, ref_test_loss, ref_correct) in zip(
        *runs, strict=True
    ):
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        np.testing.assert_allclose(test_loss, ref_test_loss, rtol=1e-5)
        assert correct == ref_correct
    reference = _state(theirs)
    for name, value in _state(ours).items():
        np.testing.assert_allclose(value, reference[name], atol=1e-5, err_msg=name)


def test_the_renamed_script_is_a_working_pytorch_script(load_example, tmp_path):
    """The PyTorch original (this file renamed back) runs, saves and resumes exactly in torch."""
    tmnist = load_example("mnist", "torch")
    _, history = tmnist.main([*TINY, "--epochs", "2", "--save-model", "--checkpoint-dir",
                              str(tmp_path / "a")])  # fmt: skip
    tmnist.main([*TINY, "--epochs", "1", "--save-model", "--checkpoint-dir", str(tmp_path / "b")])
    _, resumed = tmnist.main([*TINY, "--epochs", "2", "--resume", "--checkpoint-dir",
                              str(tmp_path / "b")])  # fmt: skip
    assert resumed == history[1:]
