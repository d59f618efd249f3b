"""examples/resnet.py: a small ResNet (BatchNorm, shortcut convolutions) trained in float64 with
SGD (Nesterov momentum, weight decay) and a cosine schedule, eager and through
``lucid.compile.fused_step``, and against PyTorch running the same text with ``lucid`` renamed
``torch``."""

import numpy as np
import pytest

import lucid

TINY = [
    "--n-train", "48", "--n-test", "20", "--image-size", "8", "--width", "4",
    "--blocks", "1", "1", "--batch-size", "16", "--epochs", "2", "--quiet",
]  # fmt: skip

# fused_step feeds the per-step scalars (lr, momentum, weight decay) in the parameters' dtype,
# so float64 fused training follows eager float64 training to rounding.
FUSED_ATOL = 1e-12


@pytest.fixture(scope="module")
def resnet(load_example):
    return load_example("resnet")


def _state(model):
    return {k: np.array(v.detach().numpy()) for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def eager_run(resnet):
    return resnet.main(TINY)


def test_fused_training_equals_eager_in_float64(resnet, eager_run):
    model, history = eager_run
    fused_model, fused_history = resnet.main([*TINY, "--fused"])
    assert next(fused_model.parameters()).dtype == lucid.float64
    for (losses, test_loss, correct), (ref_losses, ref_test_loss, ref_correct) in zip(
        fused_history, history, strict=True
    ):
        np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=FUSED_ATOL)
        np.testing.assert_allclose(test_loss, ref_test_loss, rtol=0, atol=FUSED_ATOL)
        assert correct == ref_correct
    reference = _state(model)
    for name, value in _state(fused_model).items():  # BatchNorm running stats included
        np.testing.assert_allclose(value, reference[name], rtol=0, atol=FUSED_ATOL, err_msg=name)


def test_training_learns(eager_run):
    _, history = eager_run
    first, last = history[0][0], history[-1][0]
    assert sum(last) / len(last) < sum(first) / len(first)
    assert all(np.isfinite(losses).all() for losses, _, _ in history)


def test_matches_pytorch_in_float64(resnet, load_example):
    tresnet = load_example("resnet", "torch")
    torch = tresnet.torch
    lucid.manual_seed(3)
    ours = resnet.ResNet(resnet.BasicBlock, [1, 1], width=4).double()
    theirs = tresnet.ResNet(tresnet.BasicBlock, [1, 1], width=4).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in _state(ours).items()})
    train_set = resnet.synthetic_cifar(40, 8, seed=1)
    test_set = resnet.synthetic_cifar(20, 8, seed=2)

    def torch_dataset(dataset):
        return tresnet.TensorDataset(*(torch.from_numpy(t.numpy()) for t in dataset.tensors))

    order = np.random.default_rng(0).permutation(40).tolist()
    runs = []
    for module, model, train_ds, test_ds in [
        (resnet, ours, train_set, test_set),
        (tresnet, theirs, torch_dataset(train_set), torch_dataset(test_set)),
    ]:
        criterion = module.nn.CrossEntropyLoss()
        optimizer = module.optim.SGD(
            model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True
        )
        scheduler = module.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2)
        history = []
        for _ in range(2):
            loader = module.DataLoader(train_ds, batch_size=16, sampler=order)
            losses = module.train(model, loader, optimizer, criterion)
            test_loss, correct = module.test(model, module.DataLoader(test_ds, 10), criterion)
            scheduler.step()
            history.append((losses, test_loss, correct))
        runs.append(history)

    for (losses, test_loss, correct), (ref_losses, ref_test_loss, ref_correct) in zip(
        *runs, strict=True
    ):
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
        np.testing.assert_allclose(test_loss, ref_test_loss, rtol=1e-10)
        assert correct == ref_correct
    reference = _state(theirs)
    for name, value in _state(ours).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-10, atol=1e-12, err_msg=name)
