"""The pytorch/examples MNIST script (a conv net trained with Adadelta and StepLR), on a synthetic
MNIST-like data set, with gradient clipping and checkpoints that resume a run exactly.

Written as PyTorch code and ported by renaming ``torch`` to ``lucid``: this file with every
``lucid`` renamed ``torch`` is the PyTorch original, and tests/acceptance runs both.

    python examples/mnist.py --epochs 3 --save-model
"""

import argparse
import os

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
import lucid.optim as optim
from lucid.optim.lr_scheduler import StepLR
from lucid.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, channels=(32, 64), hidden=128, image_size=28):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 3, 1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(channels[1] * ((image_size - 4) // 2) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = lucid.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def synthetic_mnist(n, image_size=28, seed=0):
    """``n`` noisy copies of ten fixed random 'digit' templates, normalised as MNIST is."""
    templates = lucid.randn(10, 1, image_size, image_size, generator=lucid.Generator())
    g = lucid.Generator().manual_seed(seed)
    targets = lucid.randint(0, 10, (n,), generator=g)
    images = templates[targets] + 2.0 * lucid.randn(n, 1, image_size, image_size, generator=g)
    images = (images - images.mean()) / images.std()
    return TensorDataset(images, targets)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    losses = []
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        lucid.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        losses.append(loss.item())
        if batch_idx % args.log_interval == 0 and not args.quiet:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}"
            )
    return losses


def test(args, model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with lucid.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    if not args.quiet:
        print(
            f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/"
            f"{len(test_loader.dataset)} ({100.0 * correct / len(test_loader.dataset):.0f}%)\n"
        )
    return test_loss, correct


def save_checkpoint(directory, model, optimizer, scheduler, epoch, shuffle_generator):
    os.makedirs(directory, exist_ok=True)
    lucid.save(model.state_dict(), os.path.join(directory, "mnist_cnn.pt"))
    lucid.save(optimizer.state_dict(), os.path.join(directory, "optimizer.pt"))
    lucid.save(
        {
            "epoch": epoch,
            "scheduler": scheduler.state_dict(),
            "rng_state": lucid.get_rng_state(),
            "shuffle_rng_state": shuffle_generator.get_state(),
        },
        os.path.join(directory, "train_state.pt"),
    )


def load_checkpoint(directory, model, optimizer, scheduler, shuffle_generator):
    """Restores everything ``save_checkpoint`` wrote; returns the next epoch to run."""
    model.load_state_dict(lucid.load(os.path.join(directory, "mnist_cnn.pt")))
    optimizer.load_state_dict(lucid.load(os.path.join(directory, "optimizer.pt")))
    state = lucid.load(os.path.join(directory, "train_state.pt"))
    scheduler.load_state_dict(state["scheduler"])
    lucid.set_rng_state(state["rng_state"])
    shuffle_generator.set_state(state["shuffle_rng_state"])
    return state["epoch"] + 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="MNIST-style example (synthetic data)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--n-train", type=int, default=2048)
    parser.add_argument("--n-test", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--channels", type=int, nargs=2, default=(8, 16))
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--no-accel", action="store_true", help="disables accelerator")
    parser.add_argument("--save-model", action="store_true")
    parser.add_argument("--checkpoint-dir", default="mnist_checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    use_accel = not args.no_accel and lucid.accelerator.is_available()
    lucid.manual_seed(args.seed)
    if use_accel:
        device = lucid.accelerator.current_accelerator()
    else:
        device = lucid.device("cpu")
    shuffle_generator = lucid.Generator().manual_seed(args.seed)
    train_kwargs = {"batch_size": args.batch_size, "shuffle": True, "generator": shuffle_generator}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel:
        accel_kwargs = {"num_workers": 1, "persistent_workers": True, "pin_memory": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)

    dataset1 = synthetic_mnist(args.n_train, args.image_size, seed=args.seed)
    dataset2 = synthetic_mnist(args.n_test, args.image_size, seed=args.seed + 1)
    train_loader = DataLoader(dataset1, **train_kwargs)
    test_loader = DataLoader(dataset2, **test_kwargs)

    model = Net(tuple(args.channels), args.hidden, args.image_size).to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    forward = lucid.compile(model) if args.compile else model

    first_epoch = 1
    if args.resume:
        first_epoch = load_checkpoint(
            args.checkpoint_dir, model, optimizer, scheduler, shuffle_generator
        )
    history = []
    for epoch in range(first_epoch, args.epochs + 1):
        losses = train(args, forward, device, train_loader, optimizer, epoch)
        history.append((losses, *test(args, forward, device, test_loader)))
        scheduler.step()
        if args.save_model:
            save_checkpoint(
                args.checkpoint_dir, model, optimizer, scheduler, epoch, shuffle_generator
            )
    return model, history


if __name__ == "__main__":
    main()
